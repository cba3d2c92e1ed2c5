-- Push one span's delta for one key, atomically (see ratelimit_sidecar/storage/keys.py).
--
-- KEYS[1]  counter of the window          KEYS[2]  the key's shared block flag
-- ARGV[1]  hits to add                    ARGV[2]  counter TTL in ms (2 windows)
-- ARGV[3]  the limit (MAX)                ARGV[4]  cooldown in ms
--
-- Returns {total after the INCRBY, remaining ms of the block flag or 0}.
-- Both keys carry the same hash tag, so this is valid on Redis Cluster.

local total = redis.call('INCRBY', KEYS[1], ARGV[1])
-- Refreshed on every push (like the in-memory store): a counter can never be left without a
-- TTL, even if an older version of this script or an operator touched it.
redis.call('PEXPIRE', KEYS[1], ARGV[2])

local cooldown = tonumber(ARGV[4])
if total > tonumber(ARGV[3]) and cooldown > 0 then
  -- NX: the first node to see the crossing starts the cooldown; later pushes don't extend it.
  redis.call('SET', KEYS[2], '1', 'PX', cooldown, 'NX')
end

local left = redis.call('PTTL', KEYS[2])
if left < 0 then
  left = 0
end
return {total, left}
