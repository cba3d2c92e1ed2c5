-- One span's deltas for many token buckets (key names: storage/keys.py; the rules, in the same
-- order: storage/shared_rules.py).
-- include: block_flag.lua penalty.lua sync_common.lua
--
-- KEYS[1]  a key of the call's hash slot: routes the call on Redis Cluster (all keys below
--          share its slot)
-- ARGV[1]  the key prefix
-- ARGV[2]  one entry per key, joined by ";":
--          "digest|window_suffix|bucket_suffix|count|window_ttl_ms|window_ms|requests|capacity|cooldown_ms|penalty"
--          TAT = prefix{digest}bucket_suffix (epoch ms, a decimal with 3 places); window counter =
--          prefix{digest}window_suffix; flag = prefix{digest}:block. count may be 0 (read only)
--          or negative (tokens given back; the TAT never goes before now).
--          penalty: empty, or "factor/max_ms/forgive_ms/wanted/blocking" (penalty.lua): then the
--          answer ends with "|level|block_level".
-- ARGV[3]  the blocks channel (sync_common.lua)
--
-- Returns one answer per entry, in order, joined by ";": "debt,left" (ceil(TAT - now) in ms
-- after the push, and the remaining ms of the block flag, 0 if none or without a cooldown),
-- or "E:<reason>" when nothing was
-- applied for that key. `now` is this server's TIME, read once per call: the pushes of one
-- call see one clock, so positive pushes commute.
--
-- Keys are isolated as in sync.lua: every command runs under pcall; the TAT is written first,
-- and a failure after it (window counter, flag) costs that part alone.

local prefix = ARGV[1]
local entry = '^([^|]+)|([^|]*)|([^|]*)|(-?%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|([^|]*)$'
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

-- The TAT after the push, as stored (3 decimals), or nil and the error of the read.
local function next_tat(state, count, window_ms, requests)
  local stored = redis.pcall('GET', state)
  if failed(stored) then
    return nil, reason(stored)
  end
  local tat = now
  if stored then
    tat = tonumber(stored)
    if not tat then
      return nil, 'E:not a token bucket state'
    end
  end
  local moved = math.max(tat, now) + count * window_ms / requests
  return string.format('%.3f', math.max(moved, now))
end

local function push(text)
  local digest, window_suffix, state, count, window_ttl, window_ms, requests, capacity, cooldown,
    penalty = string.match(text, entry)
  if not digest then
    return 'E:malformed entry'
  end
  local tag = prefix .. '{' .. digest .. '}'
  window_ms, requests = tonumber(window_ms), tonumber(requests)
  local stored, err = next_tat(tag .. state, tonumber(count), window_ms, requests)
  if not stored then
    return err
  end
  local debt = math.ceil(math.max(0, tonumber(stored) - now))
  -- A read (count 0) leaves the state as it is: it only moves the TAT up to now, which every
  -- push does anyway, and its TTL already ends when the bucket is full.
  if tonumber(count) ~= 0 then
    local written = redis.pcall('SET', tag .. state, stored, 'PX', math.max(1, debt))
    if failed(written) then
      return reason(written)
    end
  end
  redis.pcall('INCRBY', tag .. window_suffix, count)
  redis.pcall('PEXPIRE', tag .. window_suffix, window_ttl)
  local over = debt > tonumber(capacity) * window_ms / requests
  local p, left, levels = penalty_of(penalty), 0, ''
  if p then -- the flag records `requests` (block_flag.lua)
    left, levels = penalised(digest, tag, tonumber(cooldown), over, p, requests)
  else
    left = cooled(digest, tag .. ':block', tonumber(cooldown), over, requests)
  end
  return debt .. ',' .. left .. levels
end

return answer_each(push)
