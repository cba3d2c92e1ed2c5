-- What every sync script shares (sync.lua, sync_sliding.lua, sync_bucket.lua): the store puts
-- this file in front of each one when it loads it (storage/redis_store.py), so the three run
-- the same error handling, block flag and answer loop.

local function failed(reply)
  return type(reply) == 'table' and reply.err ~= nil
end

-- The reason of an error reply, short and without the answer's separators.
local function reason(reply)
  return 'E:' .. string.sub(string.gsub(tostring(reply.err), '[;,%c]', ' '), 1, 80)
end

-- The remaining ms of a key's shared block flag, 0 if none (or unreadable; a flag without a
-- TTL, never written by these scripts, must not block forever).
local function block_left(flag)
  local left = redis.pcall('PTTL', flag)
  if failed(left) or left < 0 then
    return 0
  end
  return left
end

-- Start the cooldown when `over` (NX: the first node to see the crossing starts it; later
-- pushes do not extend it), then the flag's remaining ms. Without a cooldown the limit has no
-- flag: nothing to read (a flag left by an earlier config with one must not block it).
local function cooled(flag, cooldown, over)
  if cooldown <= 0 then
    return 0
  end
  if over then
    redis.pcall('SET', flag, '1', 'PX', cooldown, 'NX')
  end
  return block_left(flag)
end

-- Every entry of ARGV[2] (";"-separated) through `push`, the answers joined by ";".
local function answer_each(push)
  local out = {}
  for text in string.gmatch(ARGV[2] or '', '[^;]+') do
    out[#out + 1] = push(text)
  end
  return table.concat(out, ';')
end
