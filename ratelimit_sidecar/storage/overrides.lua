-- The runtime overrides on Redis: every read and every write is one call of this script.
--
-- KEYS[1] the set (hash: override id -> its document as JSON), KEYS[2] its version (integer),
-- KEYS[3] the history (list of change records as JSON, newest first). One hash slot.
--
-- ARGV[1] = "read": answers {version, {id, document, ...}, {record, ...}}; ARGV[2] says which of
-- them: "set", "history" or "all".
--
-- ARGV[1] = "restore": ARGV = "restore", version, channel, then id, document pairs (see below).
--
-- Otherwise ARGV = action, expected version ("" = any), now_ms, history cap, channel, then one
-- triple per override touched: id, id as a JSON string, document after ("" = removed).
-- Answers {1, new version, Redis TIME in ms} when applied; {0, version} when the expected version
-- is not the current one (nothing changed); {-1, version} for a delete of an absent override.
-- An applied write raises the version by one, records the change (before and after of every
-- override touched; the caller's now_ms as its time), trims the history and publishes
-- "<version>|<Redis TIME ms>" on the channel, so that every node reads the new set at once.

local set, version_key, history = KEYS[1], KEYS[2], KEYS[3]
local version = tonumber(redis.call('GET', version_key) or '0')

if ARGV[1] == 'read' then
  local documents, records = {}, {}
  if ARGV[2] ~= 'history' then documents = redis.call('HGETALL', set) end
  if ARGV[2] ~= 'set' then records = redis.call('LRANGE', history, 0, -1) end
  return {version, documents, records}
end

if ARGV[1] == 'restore' then
  -- Redis came back without the set (restarted without persistence, flushed): a node puts back
  -- the last set it read, at its version, unless another node or a write was first.
  if redis.call('EXISTS', version_key) == 1 then
    return {0, version}
  end
  for i = 4, #ARGV, 2 do
    redis.call('HSET', set, ARGV[i], ARGV[i + 1])
  end
  redis.call('SET', version_key, ARGV[2])
  redis.pcall('PUBLISH', ARGV[3], ARGV[2] .. '|0')  -- pcall: see the write's announcement
  return {1, tonumber(ARGV[2]), 0}
end

local action, expected, now_ms = ARGV[1], ARGV[2], ARGV[3]
local cap, channel = tonumber(ARGV[4]), ARGV[5]
if expected ~= '' and tonumber(expected) ~= version then
  return {0, version}
end

local touched = {}
for i = 6, #ARGV, 3 do
  local id, id_json, after = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local before = redis.call('HGET', set, id)
  if action == 'delete' and not before then
    return {-1, version}
  end
  if after == '' then
    redis.call('HDEL', set, id)
  else
    redis.call('HSET', set, id, after)
  end
  touched[#touched + 1] = '[' .. id_json .. ',' .. (before or 'null') .. ','
    .. (after ~= '' and after or 'null') .. ']'
end

version = redis.call('INCR', version_key)
local record = '{"version":' .. version .. ',"time_ms":' .. now_ms .. ',"action":"' .. action
  .. '","touched":[' .. table.concat(touched, ',') .. ']}'
redis.call('LPUSH', history, record)
redis.call('LTRIM', history, 0, cap - 1)
local time = redis.call('TIME')
local time_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- pcall: the write is done; a user without rights on the channel must not turn it into an
-- error reply (the caller would say nothing ran). The nodes' periodic read catches up.
redis.pcall('PUBLISH', channel, version .. '|' .. time_ms)
return {1, version, time_ms}
