-- One strict check: every strict limit of a request that lives in one hash slot, decided and
-- counted atomically, dated by the server's own clock (TIME), never the caller's.
-- include: block_flag.lua penalty.lua
--
-- KEYS[1]  a key of the slot (routes the call on Redis Cluster; every key below shares it)
-- ARGV[1]  the key prefix
-- ARGV[2]  a token unique to this call (sliding log members are "<token>:<n>")
-- ARGV[3]  one entry per limit, joined by ";":
--          "algorithm|digest|base|hits|max|window_ms|spans|capacity|cooldown_ms|shadow|penalty"
--          algorithm: 0 fixed window, 1 sliding window, 2 token bucket, 3 sliding log;
--          base: the counter's name after its tag, without its last part (keys.py:
--          counter_suffix(key, "")); hits may be 0 (check only) or negative (quota given back);
--          cooldown_ms > 0: a refusal of hits starts a block for that long (the shared flag,
--          SET NX), as the same count in the limiter's own rule would;
--          shadow 1: a refusal is reported but does not stop the call from counting;
--          penalty: empty, or "factor/max_ms/forgive_after_ms/0/-1" (penalty.lua, which runs
--          first): a block starts at the key's level, and a request refused by a block that
--          has run for the grace, more than the grace before its end, is an offence (its
--          first refusal, which started it, told the client): the level goes to the block's
--          level + 1 (core/penalty.py).
-- ARGV[4]  the channel a block started here is announced on, as the sync scripts do
--          (sync_common.lua, storage/blocks.py); '' or absent: none
--
-- All or nothing: the hits are counted only if no limit refuses them (a shadow limit's refusal
-- does not count as one); then every limit counts them, shadow ones included. Key names and
-- stored values are the eventual sync's (sync.lua), so both count into the same state.
--
-- Returns {now_ms, counted, fits1, remaining1, reset_ms1, fits2, ...}: counted 1 if the hits
-- were applied; per limit, fits 1 if it admits them, what it has left (after them when
-- counted), and whole ms until it resets (admitted) or until a retry would fit (refused).
-- A shared block flag (set by a refusal here or by the eventual sync's cooldown) refuses until
-- it expires.

local prefix, token, blocks_channel = ARGV[1], ARGV[2], ARGV[4] or ''
local entry = '^(%d)|([^|]+)|([^|]*)|(-?%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|([01])|([^|]*)$'
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local function ceil(x)
  return math.ceil(x - 1e-9)
end

local function parse(text)
  local alg, digest, base, hits, max, window, spans, capacity, cooldown, shadow, penalty =
    string.match(text, entry)
  if not alg then
    return redis.error_reply('malformed strict entry')
  end
  local tag = prefix .. '{' .. digest .. '}'
  return {
    alg = tonumber(alg), digest = digest, tag = tag, name = tag .. base, flag = tag .. ':block',
    hits = tonumber(hits), max = tonumber(max), window = tonumber(window),
    spans = tonumber(spans), capacity = tonumber(capacity), cooldown = tonumber(cooldown),
    shadow = shadow == '1', penalty = penalty_of(penalty),
  }
end

-- Fixed window: one counter per epoch window.
local fixed = {}
function fixed.check(l)
  l.key = l.name .. math.floor(now / l.window)
  l.used = tonumber(redis.call('GET', l.key) or '0')
  l.ends = l.window - now % l.window
  l.fits = l.hits <= 0 or l.used + l.hits <= l.max
end
function fixed.count(l)
  local total = redis.call('INCRBY', l.key, math.max(l.hits, -l.used))
  redis.call('PEXPIRE', l.key, 2 * l.window)
  l.used = total
end
function fixed.answer(l)
  if l.fits then
    return math.max(0, l.max - l.used), l.ends
  end
  return 0, l.ends
end

-- Sliding window: counters per span (numbered from the epoch); the trailing window's count is
-- the last N spans in full plus the span before them weighted by the share of it still inside.
local function span_start(s, l)
  local w, k = math.floor(s / l.spans), s % l.spans
  return w * l.window + ceil(k * l.window / l.spans)
end
local sliding = {}
function sliding.check(l)
  local w = math.floor(now / l.window)
  local cur = w * l.spans + math.floor((now % l.window) * l.spans / l.window)
  l.key = l.name .. 's' .. cur
  l.ends = span_start(cur + 1, l) - now -- ms until the current span ends
  l.inside = l.ends - 1 -- ms of the old span still in the trailing window (now - W, now]
  l.len = span_start(cur + 1, l) - span_start(cur, l)
  l.cur, l.counts = cur, {} -- counts[s]: span s of the trailing window and the one leaving it
  l.recent, l.old = 0, tonumber(redis.call('GET', l.name .. 's' .. (cur - l.spans)) or '0')
  l.counts[cur - l.spans] = l.old
  l.own = tonumber(redis.call('GET', l.key) or '0')
  for s = cur - l.spans + 1, cur do
    l.counts[s] = tonumber(redis.call('GET', l.name .. 's' .. s) or '0')
    l.recent = l.recent + l.counts[s]
  end
  -- recent + hits + old * inside / len <= max, in integers (core/sliding_window.py)
  l.fits = l.hits <= 0 or (l.recent + l.hits) * l.len + l.old * l.inside <= l.max * l.len
end
function sliding.count(l)
  local delta = math.max(l.hits, -l.own)
  redis.call('INCRBY', l.key, delta)
  redis.call('PEXPIRE', l.key, l.window + 2 * ceil(l.window / l.spans))
  l.recent = l.recent + delta
end
-- A refusal's wait: the first moment the hits fit if nobody sends more, span by span as the
-- spans leave the window, the oldest one gradually (core/trailing_wait.py).
local function sliding_wait(l)
  if l.hits > l.max then
    return l.window -- never fits: as long as a window
  end
  local whole = 0 -- the spans wholly inside at this step: a running sum, one pass in all
  for j = l.cur - l.spans + 1, l.cur do
    whole = whole + (l.counts[j] or 0)
  end
  for step = 0, l.spans do
    local s = l.cur + step
    local first, after = span_start(s, l), span_start(s + 1, l)
    local at = math.max(now, first)
    if step > 0 then
      whole = whole - (l.counts[s - l.spans] or 0) -- now the oldest, weighted
    end
    local oldest = l.counts[s - l.spans] or 0
    local room = (l.max - whole - l.hits) * (after - first)
    if room >= 0 and oldest * (after - 1 - at) <= room then
      return math.max(1, at - now)
    end
    if room >= 0 then -- later in this span, once enough of the oldest span is out
      return math.max(1, after - 1 - math.floor(room / oldest) - now)
    end
  end
  return l.window
end
function sliding.answer(l)
  local free = l.max * l.len - l.recent * l.len - l.old * l.inside
  if l.fits then
    return math.max(0, math.floor(free / l.len)), l.ends
  end
  return 0, sliding_wait(l)
end

-- Token bucket (GCRA): the theoretical arrival time TAT; each hit moves it T = window/rate on.
local bucket = {}
function bucket.check(l)
  l.key = l.name .. 'tb'
  l.t = l.window / l.max
  l.tat = math.max(tonumber(redis.call('GET', l.key) or '0'), now)
  l.next = math.max(now, l.tat + l.hits * l.t)
  l.fits = l.hits <= 0 or l.next - now <= l.capacity * l.t + 1e-6
end
function bucket.count(l)
  l.tat = l.next
  local ahead = ceil(l.tat - now)
  if ahead > 0 then
    redis.call('SET', l.key, string.format('%.3f', l.tat), 'PX', ahead)
  else
    redis.call('DEL', l.key)
  end
end
function bucket.answer(l)
  local debt = l.tat - now
  if l.fits then
    return math.max(0, math.floor(l.capacity - debt / l.t + 1e-6)), ceil(debt)
  end
  return 0, math.max(1, ceil(l.next - now - l.capacity * l.t))
end

-- Sliding log: one member per admitted hit, scored by its time; the window is (now - W, now].
local log = {}
function log.check(l)
  l.key = l.name .. 'log'
  redis.call('ZREMRANGEBYSCORE', l.key, '-inf', now - l.window)
  l.used = redis.call('ZCARD', l.key)
  l.fits = l.hits <= 0 or l.used + l.hits <= l.max
end
function log.count(l)
  if l.hits > 0 then
    -- A shadow log over its limit is filled to max + 1 members, no further: enough to refuse
    -- everything, and a huge hits_addend cannot keep the server in this loop.
    for n = 1, math.min(l.hits, math.max(0, l.max + 1 - l.used)) do
      redis.call('ZADD', l.key, now, token .. ':' .. l.index .. ':' .. n)
    end
  elseif l.hits < 0 then
    redis.call('ZPOPMAX', l.key, -l.hits)
  end
  redis.call('PEXPIRE', l.key, l.window)
  l.used = redis.call('ZCARD', l.key)
end
local function oldest_end(l, rank)
  local found = redis.call('ZRANGE', l.key, rank, rank, 'WITHSCORES')
  if #found == 0 then
    return l.window
  end
  return math.max(1, tonumber(found[2]) + l.window - now)
end
function log.answer(l)
  if l.fits then
    return math.max(0, l.max - l.used), oldest_end(l, 0)
  end
  if l.hits > l.max then
    return 0, l.window
  end
  return 0, oldest_end(l, l.used + l.hits - l.max - 1) -- the member whose leaving makes room
end

local algorithms = { [0] = fixed, [1] = sliding, [2] = bucket, [3] = log }

-- A request refused by the running block of a penalised limit (core/penalty.py, 2. and 3.).
local function offended(l)
  local at = stored_level(l.flag)
  local ran = penalised_ms(l.cooldown, l.penalty, at) - l.block
  local grace = grace_ms(l.cooldown)
  if ran >= grace and l.block > grace then
    local wanted = math.min(at + 1, top_level(l.cooldown, l.penalty))
    penalty_level(l.tag, l.penalty, wanted)
  end
end

local limits, refused = {}, false
for text in string.gmatch(ARGV[3] or '', '[^;]+') do
  local l = parse(text)
  if l.err then
    return l
  end
  l.index = #limits + 1
  l.algorithm = algorithms[l.alg]
  l.algorithm.check(l)
  l.block = held_left(l.flag, l.max) -- a flag set for a lower limit is lifted (block_flag.lua)
  if l.block > 0 then -- as an eventual key under a block: refused, even a check
    l.fits = false
    if l.penalty and l.hits > 0 and not l.shadow then
      offended(l)
    end
  elseif not l.fits and l.hits > 0 and l.cooldown > 0 then -- over: the cooldown starts now
    local level, ms = 0, l.cooldown
    if l.penalty then
      level = penalty_level(l.tag, l.penalty, 0)
      ms = penalised_ms(l.cooldown, l.penalty, level)
    end
    redis.call('SET', l.flag, flag_value(l.penalty and level or 1, l.max), 'PX', ms, 'NX')
    l.block = ms
    if blocks_channel ~= '' then -- every node refuses the key at once (its eventual checks too)
      local notice = l.digest .. '|' .. ms .. '|' .. level .. '|' .. l.max
      redis.pcall('PUBLISH', blocks_channel, notice) -- best effort
    end
  end
  refused = refused or (not l.fits and not l.shadow)
  limits[#limits + 1] = l
end

local out = { now, refused and 0 or 1 }
for _, l in ipairs(limits) do
  if not refused and l.hits ~= 0 then
    l.algorithm.count(l)
  end
  local remaining, reset = l.algorithm.answer(l)
  if l.block > 0 then
    reset = math.max(reset, l.block)
  end
  out[#out + 1] = l.fits and 1 or 0
  out[#out + 1] = remaining
  out[#out + 1] = reset
end
return out
