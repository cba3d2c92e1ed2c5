-- The node heartbeat, one call per span of each node (storage/codec.py): the node's entry in
-- the live node set, the live count, and the store's clock.
--
-- KEYS[1]  the live node set (storage/keys.py `nodes`)
-- ARGV[1]  this node's id
-- ARGV[2]  the node's clock in ms: the entry's score (NTP-level skew is noise against the TTL,
--          and reading Redis TIME first would cost a round trip)
-- ARGV[3]  the set's TTL in ms: entries older than that are dropped
--
-- Returns {live nodes, TIME seconds, TIME microseconds}.

redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2] - ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local time = redis.call('TIME')
return {redis.call('ZCARD', KEYS[1]), time[1], time[2]}
