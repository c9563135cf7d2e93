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

local US = '([1-9]' .. string.rep('%d', 15) .. ')'
local WHOLE = '^' .. US .. TAG .. '$'
local FRACTION = '^' .. US .. TAG .. '%+([1-9]%d*)/([1-9]%d*)$'
local LONG = '^' .. US .. ' (%d+) ([1-9]%d*) ([1-9]%d*) ([1-9]%d*) ' .. TAG .. '$'

local function not_ours(what)
  return redis.error_reply('NOTOURS holds ' .. what .. ', not redlimit state; it was left unchanged')
end

local function now_us()
  if ARGV[1] ~= '' then return ARGV[1] + 0 end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- ceil(a / b) for integers a >= 0, b > 0.
local function ceil_div(a, b)
  local q = (a - a % b) / b
  if q * b < a then q = q + 1 end
  return q
end

-- read_state returns the stored bucket {us, num, count, per, capacity}:
-- own's rate and capacity, tat = now, when the key is empty; or nil and an
-- error reply for a value that is not ours.
local function read_state(own, now)
  local value = redis.pcall('GET', KEYS[1])
  if not value then return {us = now, num = 0, count = own.count, per = own.per, capacity = own.capacity} end
  if type(value) ~= 'string' then return nil, not_ours('another type than ' .. WHAT) end
  local us, num, count, per, capacity = string.match(value, LONG)
  if us and num + 0 < count + 0 then
    return {us = us + 0, num = num + 0, count = count + 0, per = per + 0, capacity = capacity + 0}
  end
  local den
  us, num, den = string.match(value, FRACTION)
  if not us then us, num, den = string.match(value, WHOLE), 0, 1 end
  if not us or num + 0 >= den + 0 then return nil, not_ours('a value that is not ' .. WHAT) end
  -- A fraction of another count (the previous format) rounds up.
  return {us = us + 0, num = ceil_div(num * own.count, den), count = own.count, per = own.per, capacity = own.capacity}
end

local function write(state, level, now, granted)
  local us, num = now + (level - level % state.count) / state.count, level % state.count
  local value
  if ARGV[6] == '1' then
    value = string.format('%d %d %d %d %d %s', us, num, state.count, state.per, state.capacity, TAG)
  elseif num == 0 then
    value = string.format('%d%s', us, TAG)
  else
    value = string.format('%d%s+%d/%d', us, TAG, num, state.count)
  end
  local ttl = ceil_div(ceil_div(level, state.count), 1000)
  if granted then
    redis.call('SET', KEYS[1], value, 'PX', ttl)
  else
    redis.pcall('SET', KEYS[1], value, 'PX', ttl) -- best effort: a clamp
  end
end

-- The reply for a level of state's rate, seen by a bucket of capacity.
local function reply(allowed, level, state, capacity, retry)
  local remaining = capacity - ceil_div(level, state.per)
  if remaining < 0 then remaining = 0 end
  local stable = -1
  if remaining < capacity then
    stable = ceil_div(level - (capacity - remaining - 1) * state.per, state.count)
  end
  return string.format('%d %d %d %d 0 %d', allowed, remaining, retry, ceil_div(level, state.count), stable)
end

local now, n = now_us(), ARGV[2] + 0
local own = {capacity = ARGV[3] + 0, per = ARGV[4] + 0, count = ARGV[5] + 0}

-- Read the state.
local state, err = read_state(own, now)
if not state then return err end

-- Advance: the level at now, at the writer's rate. A writer never leaves
-- more than its full bucket, so a level above it means the clock went
-- back: it reads as full, as internal/model does, and is written back
-- even by a denial, so that no key is locked out longer than a full drain.
-- Our keys always carry a TTL: such a level, or a drained one, is ours
-- only if its key has one.
local level = (state.us - now) * state.count + state.num
local full = state.capacity * state.per
if (level < 0 or level > full) and redis.call('PTTL', KEYS[1]) < 0 then
  return not_ours('a value without a TTL')
end
local clamped = level > full
if clamped then level = full end
if level < 0 then level = 0 end

-- Decide, in the state's ticks: n permits fit if the level is at most
-- capacity - n permits.
local allowed, retry = 0, 0
if n > own.capacity then
  retry = -1
elseif n == 0 or level <= (own.capacity - n) * state.per then
  allowed = 1
else
  retry = ceil_div(level - (own.capacity - n) * state.per, state.count)
end

-- Apply: a grant takes the level to this configuration's rate, never
-- lower (another period's conversion is in doubles, rounded up by a margin
-- far above their error, and capped at what the decision allowed), adds n
-- and writes it; a clamp is written as the writer's.
local granted = allowed == 1 and n > 0
if granted then
  if state.per ~= own.per then
    level = math.min(math.ceil(level * own.per / state.per * (1 + 2 ^ -40)), (own.capacity - n) * own.per)
  end
  level, state = level + n * own.per, own
end
if granted or clamped then write(state, level, now, granted) end

return reply(allowed, level, state, own.capacity, retry)
