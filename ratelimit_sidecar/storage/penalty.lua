-- Progressive penalties: the store's half of core/penalty.py (the rule lives there; the
-- arithmetic here is tested against it). Included by the sync scripts and strict.lua.
--
-- A penalised limit's entry ends with "factor/max_ms/forgive_after_ms/wanted/blocking" (empty
-- without a penalty): `wanted` > 0 reports an offence seen by the pushing node, asking for that
-- level; `blocking` is the level of the node's own running block of the key (-1: none).
-- The level is the key `<tag>:penalty`, with a TTL of forgive_after renewed by every offence
-- reported: without offences it expires, back to 0. A penalised block's flag holds the level
-- the block started at.

local function penalty_of(spec)
  local factor, max, forgive, wanted, blocking =
    string.match(spec or '', '^([%d.]+)/(%d+)/(%d+)/(%d+)/(-?%d+)$')
  if not factor then
    return nil
  end
  return {
    factor = tonumber(factor), max = tonumber(max), forgive = tonumber(forgive),
    wanted = tonumber(wanted), blocking = tonumber(blocking),
  }
end

-- The number stored at `key` (a level; a block flag's "<level>:<max>", block_flag.lua: its
-- level), 0 if none (or unreadable).
local function stored_level(key)
  local stored = redis.pcall('GET', key)
  return (type(stored) == 'string' and tonumber(string.match(stored, '^%d+'))) or 0
end

-- The key's level after a report asking for `wanted` (0: none): the highest asked for, never
-- lowered here; any report renews the TTL.
local function penalty_level(tag, p, wanted)
  local key = tag .. ':penalty'
  local level = stored_level(key)
  if wanted > level then
    level = wanted
    redis.pcall('SET', key, level, 'PX', p.forgive)
  elseif wanted > 0 then
    redis.pcall('PEXPIRE', key, p.forgive)
  end
  return level
end

-- How long a block starting at `level` lasts: core/penalty.py block_ms.
local function penalised_ms(cooldown, p, level)
  if level <= 0 then
    return cooldown
  end
  return math.max(cooldown, math.min(p.max, math.floor(cooldown * p.factor ^ level)))
end

-- The level of a block the store starts at `level` for a push whose node blocks the key itself
-- at level `blocking`: core/penalty.py flag_level.
local function flag_level(level, blocking)
  if blocking >= 0 and level - 1 <= blocking and blocking <= level then
    return blocking
  end
  return level
end

-- The lowest level whose block lasts max: core/penalty.py top_level.
local function top_level(cooldown, p)
  local level = 0
  while level < {{MAX_LEVELS}} and penalised_ms(cooldown, p, level) < p.max do
    level = level + 1
  end
  return level
end

-- core/penalty.py grace_ms: requests in flight with a block's first refusal, and retries this
-- close to its end, are no offence.
local function grace_ms(cooldown)
  return math.min({{MAX_GRACE_MS}}, math.floor(cooldown / 4))
end
