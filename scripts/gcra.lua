-- gcra.lua: the decision shared by the leaky and the token bucket. Joined
-- after prelude.lua (now and n) and leakybucket.lua or tokenbucket.lua,
-- which name the state's TAG, its whole-µs pattern TAT and format
-- TAT_FORMAT, and WHAT (for errors); this part decides and replies.
--
-- Both keep one number, the theoretical arrival time `tat`: when the leaky
-- bucket will have drained empty, which is when the token bucket will have
-- refilled full. A leaky bucket's level is a token bucket's missing tokens,
-- so the two decide alike: the level rule below is both.
--
-- A rate of `count` permits per `per` µs (the Go side reduces the fraction)
-- is exact in ticks of 1/count µs: one permit is `per` ticks of level, and a
-- full bucket `capacity * per` ticks (kept below 2^52 by the Go side).
--
-- tat is stored as "<µs><tag>" or, when it falls between microseconds,
-- "<µs><tag>+<num>/<den>", meaning µs + num/den. tag is one digit: 1 for
-- the leaky bucket, 2 for the token bucket (3 is the fixed window's), so that
-- no other algorithm's state reads as this one's. µs has 16 digits: every
-- clock reads between 10^15 and 2^52 µs (2001 to 2112), and a bucket drains
-- in at most 2^52 µs. The key always has a TTL, and lives until the bucket
-- is back to its initial state.
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n         permits asked for (>= 0)
-- ARGV[3] capacity  permits the bucket holds
-- ARGV[4] per       period (µs), reduced with count
-- ARGV[5] count     permits leaked (refilled) per period
--
-- Integer division is written out where it is needed, for integers a >= 0
-- and b > 0 below 2^53: q = (a - a % b) / b is floor(a / b), or one more
-- when a / b rounds up to the next integer (a % b is then negative, and
-- a - a % b still an exact multiple of b); ceil(a / b) is q, plus one when
-- q * b < a.

-- The form with a fraction: no repetition but the fraction's, which stops
-- at a fixed character, so it matches in one pass. The tag is captured, so
-- that another bucket's state is told apart from a foreign value.
local TAT_FRACTION = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)([12])%+([1-9]%d*)/([1-9]%d*)$'

local capacity = ARGV[3] + 0
local per = ARGV[4] + 0
-- count is 1 whenever the period is a whole number of µs per permit: as
-- with n, the comparison spares a conversion.
local count = 1
if ARGV[5] ~= '1' then count = ARGV[5] + 0 end
local full = capacity * per

-- level: ticks at now, between 0 (empty) and full. clamped: it must be
-- stored even if the request is denied.
local level, clamped = 0, false
local raw = redis.pcall('GET', KEYS[1])
if raw then
  -- A string, or a table with err when the key holds another type: a
  -- string indexed by err is nil (strings index the string library),
  -- which spares calling type().
  if raw.err then
    return redis.error_reply('NOTOURS holds another type than ' .. WHAT .. NOT_OURS)
  end
  -- The whole-µs form: one repetition, which the tag stops, and a range
  -- check for the 16 digits.
  local us = string.match(raw, TAT)
  local num = 0
  if us then
    us = us + 0
    if us < 1e15 or us >= 1e16 then us = nil end
  else
    local raw_tag, num_text, den_text
    us, raw_tag, num_text, den_text = string.match(raw, TAT_FRACTION)
    if us and raw_tag == TAG then
      local old_den
      us, num, old_den = us + 0, num_text + 0, den_text + 0
      if num >= old_den then
        us = nil
      elseif old_den ~= count then
        -- The rate changed: round the fraction up, so tat is never earlier.
        local ticks = num * count
        num = (ticks - ticks % old_den) / old_den
        if num * old_den < ticks then num = num + 1 end
        if num == count then us, num = us + 1, 0 end
      end
    else
      us = nil
    end
  end
  if not us then
    return redis.error_reply('NOTOURS holds a value that is not ' .. WHAT .. NOT_OURS)
  end
  level = (us - now) * count + num
  if us < now or level > full then
    -- Off the hot path: a bucket that drained (only a WithClock clock
    -- still sees its key) or one that holds more than this
    -- configuration's full bucket. Our keys always carry a TTL; a value
    -- without one is someone else's.
    local pttl = redis.call('PTTL', KEYS[1])
    if pttl < 0 then
      return redis.error_reply('NOTOURS holds a value without a TTL' .. NOT_OURS)
    end
    if us < now then
      level = 0
    else
      -- Beyond full. If the server counts the key down within this
      -- bucket's drain time (in whole ms, rounded up), the clock went
      -- back: store the clamp, even on a denial, so that the key is never
      -- locked out for longer than a full bucket drains. Else a
      -- configuration with a larger bucket wrote it: read it as full and
      -- write nothing, so that the larger one never gets permits back.
      level, clamped = full, pttl * 1000 * count < full + 1000 * count
    end
  end
end

local allowed, retry = false, 0
local need = n * per
if n > capacity then
  retry = -1
elseif level + need <= full then
  allowed, level = true, level + need
else
  -- ceil((level + need - full) / count)
  local over = level + need - full
  retry = (over - over % count) / count
  if retry * count < over then retry = retry + 1 end
end

-- reset = ceil(level / count): when the bucket is back to its initial state.
local reset = (level - level % count) / count
if reset * count < level then reset = reset + 1 end
if (allowed and n > 0) or clamped then
  -- tat = now + level / count µs, its whole µs and the ticks left over.
  local num = level % count
  if num < 0 then num = num + count end
  local value
  if num == 0 then
    value = string.format(TAT_FORMAT, now + level / count)
  else
    value = string.format('%d%s+%d/%d', now + (level - num) / count, TAG, num, count)
  end
  -- The TTL in ms, rounded up: the key lives until the bucket is back to
  -- its initial state (reset >= 1 here).
  local ttl = (reset - reset % 1000) / 1000
  if ttl * 1000 < reset then ttl = ttl + 1 end
  -- As text: cheaper than a number argument, which Redis formats itself
  -- (callgrind: about 600 instructions a grant).
  local ttl_text = string.format('%d', ttl)
  if allowed and n > 0 then
    redis.call('SET', KEYS[1], value, 'PX', ttl_text)
  else
    -- A denial or n == 0 needs no write: best effort (maxmemory, a replica).
    redis.pcall('SET', KEYS[1], value, 'PX', ttl_text)
  end
end
-- remaining = floor((full - level) / per)
local free = full - level
local remaining = (free - free % per) / per
if remaining * per > free then remaining = remaining - 1 end
-- stable: Remaining grows by one once the level has drained to the next
-- permit, ceil((level - (full - (remaining + 1) * per)) / count); -1 when
-- the bucket is empty (until reset).
local stable = -1
if remaining < capacity then
  local over = level - (full - (remaining + 1) * per)
  stable = (over - over % count) / count
  if stable * count < over then stable = stable + 1 end
end
-- The reply of six integers (reply in common.lua): allowed, remaining,
-- retry-after, reset-after, the strategy (0), stable. Each %d is a sprintf,
-- the dearest part of a reply, and one format is cheaper than joining
-- several.
if allowed then
  return string.format('1 %d 0 %d 0 %d', remaining, reset, stable)
end
if remaining == 0 then
  return string.format('0 0 %d %d 0 %d', retry, reset, stable)
end
return string.format('0 %d %d %d 0 %d', remaining, retry, reset, stable)
