-- What every sync script shares (sync.lua, sync_sliding.lua, sync_bucket.lua, which include
-- it after block_flag.lua and penalty.lua): the same error handling, block flag and answer
-- loop.
--
-- ARGV[3]  the channel a started block is announced on (storage/blocks.py); '' or absent:
--          none (ARGV[1] and ARGV[2] are each script's own)

local blocks_channel = ARGV[3] or ''

local function failed(reply)
  return type(reply) == 'table' and reply.err ~= nil
end

-- The reason of an error reply, short and without the answer's separators.
local function reason(reply)
  return '{{KEY_ERROR}}' .. string.sub(string.gsub(tostring(reply.err), '[;,%c]', ' '), 1, {{MAX_REASON}})
end

-- Start a block of `ms` on `digest`'s flag unless one runs (NX: the first node to see the
-- crossing starts it; later pushes do not extend it). A block that starts is announced at once
-- to every node as "digest|left_ms|level|max" (storage/blocks.py; more may follow): the
-- nodes that do not push this span learn it now instead of at their next span end.
-- The flag holds the level its block started at (core/penalty.py; 1 without a penalty) and the
-- limit's `max` (block_flag.lua). Answers `ms` if the block started, else 0.
local function start_block(digest, flag, ms, level, max)
  local started = redis.pcall('SET', flag, flag_value(level, max), 'PX', ms, 'NX')
  if type(started) ~= 'table' or not started.ok then
    return 0
  end
  if blocks_channel ~= '' then
    local notice = digest .. '|' .. ms .. '|' .. (level or 0) .. '|' .. max
    redis.pcall('PUBLISH', blocks_channel, notice)
  end
  return ms
end

-- The flag's remaining ms (lifted first if the limit was raised past it: block_flag.lua),
-- after starting the cooldown when `over` and no block runs. Without a cooldown the limit has
-- no flag: nothing to read (a flag left by an earlier config with one must not block it).
local function cooled(digest, flag, cooldown, over, max)
  if cooldown <= 0 then
    return 0
  end
  local left = held_left(flag, max)
  if over and left == 0 then
    left = start_block(digest, flag, cooldown, nil, max)
  end
  return left
end

-- Progressive penalties: penalty_of, penalty_level and penalised_ms are penalty.lua's.

-- `cooled` for a penalised key: a block starts at the key's level, for its length, and the
-- answer gains "|level|block_level" (the flag's level, 0 without a block) after the flag's
-- remaining ms.
local function penalised(digest, tag, cooldown, over, p, max)
  local flag = tag .. ':block'
  local level = penalty_level(tag, p, p.wanted)
  if over and cooldown > 0 and held_left(flag, max) == 0 then
    local at = flag_level(level, p.blocking)
    start_block(digest, flag, penalised_ms(cooldown, p, at), at, max)
  end
  local left, at = held_left(flag, max), 0
  if left > 0 then
    at = stored_level(flag)
  end
  return left, '|' .. level .. '|' .. at
end

-- Every entry of ARGV[2] (";"-separated) through `push`, the answers joined by ";".
local function answer_each(push)
  local out = {}
  for text in string.gmatch(ARGV[2] or '', '[^;]+') do
    out[#out + 1] = push(text)
  end
  return table.concat(out, ';')
end
