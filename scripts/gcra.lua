-- gcra.lua: the decision of the leaky and the token bucket, joined after
-- leakybucket.lua or tokenbucket.lua, which set TAG (the state's tag) and
-- WHAT (the bucket's name in errors).
--
-- A leaky bucket's level is a token bucket's missing tokens, so one rule
-- decides both: the level drains continuously at `count` permits per `per`
-- µs; a request of n is allowed if level + n <= capacity, which then adds
-- n. The level is counted in ticks: one permit is `per` ticks, and the
-- level drains `count` ticks a µs, so every value is an exact integer.
--
-- KEYS[1]  the key
-- ARGV[1]  now       Unix time (µs), or "" for the server's TIME
-- ARGV[2]  n         permits asked for (>= 0)
-- ARGV[3]  capacity  permits the bucket holds
-- ARGV[4]  per       rate period (µs), reduced with count
-- ARGV[5]  count     permits drained (refilled) per period
-- ARGV[6]  shared    "1" when the key may be shared with other
--                    configurations (WithPrefix): the rate is then stored
--
-- All times are integer µs. The state is a string with a TTL: the time
-- the bucket is empty, tat = us + num/count µs, and the rate and capacity
-- it was written with (docs/internals.md):
--   "<us><tag>"                        this configuration's rate, whole µs
--   "<us><tag>+<num>/<count>"          this configuration's rate
--   "<us> <num> <count> <per> <capacity> <tag>"   any configuration's
-- us has 16 digits. Every configuration computes the level at now with the
-- writer's rate and applies its own capacity; a grant writes the level with
-- the granter's rate. Denials and n == 0 write nothing, unless the clock
-- went back.
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

-- read_state returns the stored bucket as a table {us, num, count, per,
-- capacity} (nil when the key is empty), or false and an error reply.
local function read_state(own)
  local value = redis.pcall('GET', KEYS[1])
  if not value then return nil end
  if type(value) ~= 'string' then return false, not_ours('another type than ' .. WHAT) end
  local us, num, count, per, capacity = string.match(value, LONG)
  if us and num + 0 < count + 0 then
    return {us = us + 0, num = num + 0, count = count + 0, per = per + 0, capacity = capacity + 0}
  end
  local den
  us, num, den = string.match(value, FRACTION)
  if not us then us, num, den = string.match(value, WHOLE), 0, 1 end
  if not us or num + 0 >= den + 0 then return false, not_ours('a value that is not ' .. WHAT) end
  -- This configuration's rate; a fraction of a µs of another count (the
  -- previous format) rounds up.
  return {us = us + 0, num = ceil_div(num * own.count, den), count = own.count, per = own.per, capacity = own.capacity}
end

-- The level (ticks of the state's own rate) in ticks of this
-- configuration's rate, never below the exact value. Another period's
-- conversion is in doubles, rounded up by a margin far above their error.
local function own_ticks(level, state, own)
  if state.per == own.per then return level end
  return math.ceil(level * own.per / state.per * (1 + 2 ^ -40))
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
    -- A clamp: best effort when Redis refuses writes.
    redis.pcall('SET', KEYS[1], value, 'PX', ttl)
  end
end

-- remaining, reset and stable of a level of state's rate, by capacity.
local function reply(allowed, level, state, capacity, retry)
  local remaining = capacity - ceil_div(level, state.per)
  if remaining < 0 then remaining = 0 end
  local stable = -1
  if remaining < capacity then
    stable = ceil_div(level - (capacity - remaining - 1) * state.per, state.count)
  end
  return string.format('%d %d %d %d 0 %d', allowed and 1 or 0, remaining, retry,
    ceil_div(level, state.count), stable)
end

local now, n = now_us(), ARGV[2] + 0
local own = {capacity = ARGV[3] + 0, per = ARGV[4] + 0, count = ARGV[5] + 0}

-- Read the state.
local state, err = read_state(own)
if state == false then return err end
state = state or own

-- Advance: the level at now, at the writer's rate. A writer never leaves
-- more than its full bucket, so a level above that means the clock went
-- back: it reads as full, as internal/model does, and is written back
-- even by a denial, so that no key is locked out longer than a full drain.
local level = 0
local full = state.capacity * state.per
local clamped = false
if state ~= own then
  level = (state.us - now) * state.count + state.num
  if (level < 0 or level > full) and redis.call('PTTL', KEYS[1]) < 0 then
    return not_ours('a value without a TTL')
  end
  if level < 0 then level = 0 end
  if level > full then level, clamped = full, true end
end

-- Decide, in the state's ticks: n permits fit if the level is at most
-- (capacity - n) permits.
local allowed, retry = false, 0
if n > own.capacity then
  retry = -1
elseif n == 0 or level <= (own.capacity - n) * state.per then
  allowed = true
else
  retry = ceil_div(level - (own.capacity - n) * state.per, state.count)
end

-- Apply: a grant takes the level to this configuration's rate, within
-- what the decision allowed, and adds n.
if allowed and n > 0 then
  local room = (own.capacity - n) * own.per
  level = own_ticks(level, state, own)
  if level > room then level = room end
  level, state = level + n * own.per, own
end

-- Write: grants, and a level the clock moved.
if (allowed and n > 0) or clamped then
  write(state, level, now, allowed and n > 0)
end

return reply(allowed, level, state, own.capacity, retry)
