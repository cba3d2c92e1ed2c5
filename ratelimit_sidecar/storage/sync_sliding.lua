-- One span's deltas for many sliding window counters (key names: storage/keys.py; the rules,
-- in the same order: storage/shared_rules.py).
-- include: block_flag.lua penalty.lua sync_common.lua
--
-- KEYS[1]  a key of the call's hash slot: routes the call on Redis Cluster (all keys below
--          share its slot)
-- ARGV[1]  the key prefix
-- ARGV[2]  one entry per key, joined by ";":
--          "digest|window_suffix|span_stem|span|count|window_ttl_ms|span_ttl_ms|spans|max|cooldown_ms|penalty"
--          span counter n = prefix{digest}span_stem..n; window counter = prefix{digest}window_suffix;
--          flag = prefix{digest}:block. count may be 0 (read only) or negative (given back).
--          penalty: empty, or "factor/max_ms/forgive_ms/wanted/blocking" (penalty.lua): then the
--          answer ends with "|level|block_level".
-- ARGV[3]  the blocks channel (sync_common.lua)
--
-- Returns one answer per entry, in order, joined by ";": "total,left,t1 t2 ... tN" (t1 .. tN:
-- the totals of spans span-N+1 .. span, oldest first; total: their sum; left: the remaining ms
-- of the block flag, 0 if none or without a cooldown), or "E:<reason>" when nothing was
-- applied for that key.
--
-- Keys are isolated as in sync.lua: every command runs under pcall. The span counter is
-- written first: once it is counted the key is answered, and a failure after it (the window
-- counter, which only feeds the nodes estimate, or the flag) costs that part alone.

local prefix = ARGV[1]
local entry = '^([^|]+)|([^|]*)|([^|]*)|(%d+)|(-?%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|([^|]*)$'

-- The totals of the spans before `span` (oldest first), 0 for a gone or unreadable one;
-- `base` is the span counters' name without the span number.
local function older_totals(base, span, spans)
  local names = {}
  for n = span - spans + 1, span - 1 do
    names[#names + 1] = base .. n
  end
  local totals = {}
  if #names == 0 then
    return totals
  end
  local values = redis.pcall('MGET', unpack(names))
  for i = 1, #names do
    totals[i] = (not failed(values) and tonumber(values[i])) or 0
  end
  return totals
end

local function push(text)
  local digest, window_suffix, stem, span, count, window_ttl, span_ttl, spans, max, cooldown,
    penalty = string.match(text, entry)
  if not digest then
    return 'E:malformed entry'
  end
  local tag = prefix .. '{' .. digest .. '}'
  local base = tag .. stem
  local counter, window = base .. span, tag .. window_suffix
  local pushed = redis.pcall('INCRBY', counter, count)
  if failed(pushed) then
    return reason(pushed)
  end
  redis.pcall('PEXPIRE', counter, span_ttl)
  redis.pcall('INCRBY', window, count)
  redis.pcall('PEXPIRE', window, window_ttl)
  local totals = older_totals(base, tonumber(span), tonumber(spans))
  totals[#totals + 1] = pushed
  local total = 0
  for i = 1, #totals do
    total = total + totals[i]
  end
  max = tonumber(max)
  local over, p, left, levels = total > max, penalty_of(penalty), 0, ''
  if p then
    left, levels = penalised(digest, tag, tonumber(cooldown), over, p, max)
  else
    left = cooled(digest, tag .. ':block', tonumber(cooldown), over, max)
  end
  return total .. ',' .. left .. ',' .. table.concat(totals, ' ') .. levels
end

return answer_each(push)
