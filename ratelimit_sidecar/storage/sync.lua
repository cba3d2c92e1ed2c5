-- One span's deltas for many fixed window counters (key names: storage/keys.py; the rules, in
-- the same order: storage/shared_rules.py).
-- include: block_flag.lua penalty.lua sync_common.lua
--
-- KEYS[1]  the first counter of the call: routes the call on Redis Cluster, where the caller
--          only batches keys of one hash slot (all keys below share KEYS[1]'s slot)
-- ARGV[1]  the key prefix
-- ARGV[2]  one "digest|suffix|count|ttl_ms|max|cooldown_ms|announce|penalty" entry per key,
--          joined by ";"
--          (counter = prefix{digest}suffix, flag = prefix{digest}:block; count may be 0: the
--          key is only read; negative: quota given back; announce: 1 for a key its node holds
--          alone, whose every push past NEAR_SHARE (up to max) is announced, 2 for a key at the
--          edge (core/edge.py), whose every push from a total up to max is announced with a
--          trailing "|e", however far from NEAR_SHARE; penalty: empty, or
--          "factor/max_ms/forgive_ms/wanted/blocking" (penalty.lua): the answer then ends with
--          "|level|block_level")
-- ARGV[3]  the blocks channel (sync_common.lua)
-- ARGV[4]  the near channel: a push that takes a window's counter to NEAR_SHARE of max or
--          past it (or an announced one, see above) publishes "digest|window|total" there
--          (storage/blocks.py `parse_near`), so that every node syncs the key from then on
--          and starts it from that total (core/quiet_keys.py); '' or absent: none
--
-- Returns one answer per entry, in order, joined by ";": "total,left" (the counter after its
-- INCRBY, and the remaining ms of its block flag, 0 if none), or "E:<reason>" when nothing was
-- applied for that key. Key names are built here, from one packed string, because the client
-- library encodes every argument in Python: three arguments per call instead of six per key
-- keeps a 100k-key sync well inside a span.
--
-- Keys are isolated from each other: every command runs under pcall, so one bad key (a value
-- of the wrong type, an out-of-range number, a write refused for memory) fails that key alone,
-- and the script never stops after applying anything. The caller may then resend exactly the
-- keys answered "E:", because those were surely not counted.

local prefix = ARGV[1]
local near_channel = ARGV[4] or ''
local entry = '^([^|]+)|([^|]*)|(-?%d+)|(%d+)|(%d+)|(%d+)|([012])|([^|]*)$'

local function push(text)
  local digest, suffix, count, ttl, max, cooldown, announce, penalty = string.match(text, entry)
  if not digest then
    return 'E:malformed entry'
  end
  local tag = prefix .. '{' .. digest .. '}'
  local counter, flag = tag .. suffix, tag .. ':block'
  -- INCRBY even for a count of 0: the answer carries the window's total.
  local total = redis.pcall('INCRBY', counter, count)
  if failed(total) then
    return reason(total)
  end
  -- From here on the count is applied: a later failure only costs this key its block flag.
  -- The TTL is set by the push that made the counter (its total is its own count; a counter
  -- that was at 0 gets it again, harmlessly): one command less for every later push.
  if total == tonumber(count) then
    redis.pcall('PEXPIRE', counter, ttl)
  end
  cooldown = tonumber(cooldown)
  local p = penalty_of(penalty)
  max = tonumber(max)
  local near, before = {{NEAR_SHARE}} * max, total - tonumber(count)
  local again = announce == '1' and before < total and total <= max
  local edge = announce == '2' and before < total and before <= max
  if near_channel ~= '' and (edge or (total >= near and (before < near or again))) then
    local window = string.match(suffix, '(%d+)$')
    local marker = edge and '|e' or ''
    redis.pcall('PUBLISH', near_channel, digest .. '|' .. window .. '|' .. total .. marker)
  end
  if p then -- "total,left|level|block_level" (sync_common.lua)
    local left, levels = penalised(digest, tag, cooldown, total > max, p, max)
    return total .. ',' .. left .. levels
  end
  return total .. ',' .. cooled(digest, flag, cooldown, total > max, max)
end

return answer_each(push)
