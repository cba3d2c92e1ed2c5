-- One span's deltas for many counters, atomically (key names: ratelimit_sidecar/storage/keys.py).
--
-- KEYS[1]  the first counter of the call: routes the call on Redis Cluster, where the caller
--          only batches keys of one hash slot (all keys below share KEYS[1]'s slot)
-- ARGV[1]  the key prefix
-- ARGV[2]  one "digest|suffix|count|ttl_ms|max|cooldown_ms" entry per key, joined by ";"
--          (counter = prefix{digest}suffix, flag = prefix{digest}:block; count may be 0: the
--          key is only read; negative: quota given back)
--
-- Returns "total,left;total,left;...": each counter after its INCRBY, and the remaining ms of
-- its block flag (0 if none). Key names are built here, from one packed string, because the
-- client library encodes every argument in Python: three arguments per call instead of six
-- per key keeps a 100k-key sync well inside a span.

local prefix = ARGV[1]
local out = {}
local i = 1
local entry = '([^|;]+)|([^|;]*)|(-?%d+)|(%d+)|(%d+)|(%d+)'
for digest, suffix, count, ttl, max, cooldown in string.gmatch(ARGV[2], entry) do
  local tag = prefix .. '{' .. digest .. '}'
  local counter, flag = tag .. suffix, tag .. ':block'
  -- INCRBY and PEXPIRE even for a count of 0: the work per key is the same whatever the
  -- traffic, and a counter can never be left without a TTL.
  local total = redis.call('INCRBY', counter, count)
  redis.call('PEXPIRE', counter, ttl)
  cooldown = tonumber(cooldown)
  if total > tonumber(max) and cooldown > 0 then
    -- NX: the first node to see the crossing starts the cooldown; later pushes don't extend it.
    redis.call('SET', flag, '1', 'PX', cooldown, 'NX')
  end
  local left = redis.call('PTTL', flag)
  if left < 0 then
    left = 0
  end
  out[i] = total .. ',' .. left
  i = i + 1
end
return table.concat(out, ';')
