-- A key's shared block flag (`<tag>:block`): its value, and a raised limit lifting it. Included
-- by every script that sets or reads a flag (the sync scripts, strict.lua). The rule lives in
-- storage/shared_rules.py (`lifted`); the simulator's MemoryStorage follows it too.
--
-- A flag holds "<level>:<max>": the penalty level its block started at (core/penalty.py; 1
-- without a penalty) and the requests per unit of the limit it was set for. A push whose limit
-- now carries more was raised since (a runtime override, a reload): the flag is deleted before
-- the push is decided, as core/limiter.py lifts the node's own block, and a block at the new
-- limit may then start. A lowered or unchanged limit keeps it; a flag recording no max (written
-- by an older version) holds.

local function flag_value(level, max)
  return tostring(level or 1) .. ':' .. tostring(max)
end

-- The flag's remaining ms, 0 if none (or unreadable, or without a TTL: never written by these
-- scripts, it must not block forever) or if it was set for a lower max than `max`: deleted.
-- One PTTL for a key without a block; a GET more for a blocked one.
local function held_left(flag, max)
  local left = redis.pcall('PTTL', flag)
  if type(left) ~= 'number' or left <= 0 then
    return 0
  end
  local stored = redis.pcall('GET', flag)
  local set_for = type(stored) == 'string' and tonumber(string.match(stored, ':(%d+)$'))
  if set_for and set_for < tonumber(max) then
    redis.pcall('DEL', flag)
    return 0
  end
  return left
end
