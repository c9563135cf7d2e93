-- gcra.lua: the decision of the leaky and the token bucket, joined after
-- leakybucket.lua or tokenbucket.lua, which set TAG (the state's tag) and
-- WHAT (the bucket's name in errors). A token bucket's missing tokens are
-- a leaky bucket's level, so one rule decides both: the level drains at
-- `count` permits per `per` µs, and n permits are allowed if level + n <=
-- capacity, which then adds n. The level is counted in ticks: a permit is
-- `per` ticks and `count` ticks drain a µs, so every value is an integer.
--
-- KEYS[1]  the key
-- ARGV[1]  now       Unix time (µs), or "" for the server's TIME
-- ARGV[2]  n         permits asked for (>= 0)
-- ARGV[3]  capacity  permits the bucket holds
-- ARGV[4]  per       rate period (µs), reduced with count
-- ARGV[5]  count     permits drained (refilled) per period
-- ARGV[6]  shared    "1" under WithPrefix: the rate and capacity are stored
--
-- All times are integer µs. The state is a string with a TTL: the time the
-- bucket is empty, tat = us + num/count µs (us has 16 digits), with the
-- rate and capacity that wrote it (docs/internals.md):
--   "<us><tag>", "<us><tag>+<num>/<count>"      this configuration's
--   "<us> <num> <count> <per> <capacity> <tag>"  any configuration's
-- Every configuration computes the level at now with the writer's rate and
-- applies its own capacity; a grant writes the level at the granter's rate.
-- Denials and n == 0 write nothing, unless the clock went back.
--
-- Reply: "allowed remaining retry reset 0 stable" (µs; retry -1 = never,
-- stable -1 = until reset).

-- Literal patterns are built once, when the script loads; the tag is
-- captured and compared with TAG, which the file before this one sets.
-- Default keys' short forms are tried first.
local WHOLE = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)(%d)$'
local FRACTION = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)(%d)%+([1-9]%d*)/([1-9]%d*)$'
local LONG = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d) (%d+) ([1-9]%d*) ([1-9]%d*) ([1-9]%d*) (%d)$'
local NOT_OURS = 'NOTOURS holds %s, not redlimit state; it was left unchanged'

-- ceil_div returns ceil(a / b) for integers a >= 0, b > 0.
local function ceil_div(a, b)
  local q = (a - a % b) / b
  if q * b < a then q = q + 1 end
  return q
end

-- The rest is the decision, top to bottom, in commented steps: every
-- function is a closure Redis builds on each call, and calls cost too, so
-- steps used once are not functions.

-- The clock: the caller's, or the server's.
local now, n = tonumber(ARGV[1]), ARGV[2] + 0
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local capacity, per, count = ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0

-- Read the state: tat = us + num/count µs, the bucket's rate (count per
-- per µs) and capacity; this configuration's, and tat = now, when the key
-- is empty.
local us, num, state_count, state_per, state_capacity = now, 0, count, per, capacity
local value = redis.pcall('GET', KEYS[1])
if value then
  if type(value) ~= 'string' then
    return redis.error_reply(string.format(NOT_OURS, 'another type than ' .. WHAT))
  end
  local tag, den
  us, tag = string.match(value, WHOLE)
  if not us then us, tag, num, den = string.match(value, FRACTION) end
  if us then
    if tag ~= TAG or (den and num + 0 >= den + 0) then
      return redis.error_reply(string.format(NOT_OURS, 'a value that is not ' .. WHAT))
    end
    -- A fraction of another count (the previous format) rounds up.
    if den then num = ceil_div(num * count, den) end
  else
    us, num, state_count, state_per, state_capacity, tag = string.match(value, LONG)
    if not us or tag ~= TAG or num + 0 >= state_count + 0 then
      return redis.error_reply(string.format(NOT_OURS, 'a value that is not ' .. WHAT))
    end
    num, state_count, state_per, state_capacity = num + 0, state_count + 0, state_per + 0, state_capacity + 0
  end
  us = us + 0
end

-- Advance: the level at now, at the state's rate. A writer never leaves
-- more than its full bucket, so a level above it means the clock went
-- back: it reads as full, as internal/model does, and is written back
-- even by a denial, so that no key is locked out longer than a full drain.
-- Our keys always carry a TTL: such a level, or a drained one, is ours
-- only if its key has one.
local level = (us - now) * state_count + num
local full = state_capacity * state_per
if (level < 0 or level > full) and redis.call('PTTL', KEYS[1]) < 0 then
  return redis.error_reply(string.format(NOT_OURS, 'a value without a TTL'))
end
local clamped = level > full
if clamped then level = full end
if level < 0 then level = 0 end

-- Decide, in the state's ticks: n permits fit if the level is at most
-- capacity - n permits.
local allowed, retry = 0, 0
if n > capacity then
  retry = -1
elseif n == 0 or level <= (capacity - n) * state_per then
  allowed = 1
else
  retry = ceil_div(level - (capacity - n) * state_per, state_count)
end

-- Apply: a grant takes the level to this configuration's rate, never
-- lower (another period's conversion is in doubles, rounded up by a margin
-- far above their error, and capped at what the decision allowed), adds n
-- and writes it at this configuration's rate and capacity; a clamp is
-- written as the state's.
local granted = allowed == 1 and n > 0
if granted then
  if state_per ~= per then
    level = math.min(math.ceil(level * per / state_per * (1 + 2 ^ -40)), (capacity - n) * per)
  end
  level = level + n * per
  state_count, state_per, state_capacity = count, per, capacity
end

-- Write: grants, and a level the clock moved. The key lives until the
-- level is 0.
local reset = ceil_div(level, state_count)
if granted or clamped then
  local tat_us, tat_num = now + (level - level % state_count) / state_count, level % state_count
  if ARGV[6] == '1' then
    value = string.format('%d %d %d %d %d %s', tat_us, tat_num, state_count, state_per, state_capacity, TAG)
  elseif tat_num == 0 then
    value = string.format('%d%s', tat_us, TAG)
  else
    value = string.format('%d%s+%d/%d', tat_us, TAG, tat_num, state_count)
  end
  local ttl = ceil_div(reset, 1000) -- ms, rounded up
  if granted then
    redis.call('SET', KEYS[1], value, 'PX', ttl)
  else
    redis.pcall('SET', KEYS[1], value, 'PX', ttl) -- best effort: a clamp
  end
end

-- Reply, for a level of the state's rate seen by this configuration's
-- capacity.
local remaining = capacity - ceil_div(level, state_per)
if remaining < 0 then remaining = 0 end
local stable = -1
if remaining < capacity then
  stable = ceil_div(level - (capacity - remaining - 1) * state_per, state_count)
end
return string.format('%d %d %d %d 0 %d', allowed, remaining, retry, reset, stable)
