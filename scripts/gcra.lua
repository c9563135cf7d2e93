-- gcra.lua: the decision shared by the leaky and the token bucket. Joined
-- after common.lua, whose now_us, idiv, ceil_div, ttl_ms, reply and not_ours
-- it uses; leakybucket.lua or tokenbucket.lua follows and calls decide_gcra.
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

-- The two forms. The patterns match in one pass (no repetition but the
-- fraction's, which stops at a fixed character), and the tag is captured,
-- not written into them, so that they are constants: building a pattern
-- per call costs a string.
local TAT = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)([12])$'
local TAT_FRACTION = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)([12])%+([1-9]%d*)/([1-9]%d*)$'

-- Decides on the bucket whose state carries tag ('1' or '2'); what names it
-- in errors. Returns the script's reply.
local function decide_gcra(tag, what)
  local now = now_us()
  -- n is 1 on most calls: comparing ARGV[2] with '1' (interned strings, one
  -- pointer comparison) spares converting it.
  local n = 1
  if ARGV[2] ~= '1' then n = ARGV[2] + 0 end
  local capacity = ARGV[3] + 0
  local per = ARGV[4] + 0
  local count = ARGV[5] + 0
  local full = capacity * per

  -- level: ticks at now, between 0 (empty) and full. clamped: it must be
  -- stored even if the request is denied.
  local level, clamped = 0, false
  local raw = redis.pcall('GET', KEYS[1])
  if raw then
    -- A string, or a table with err when the key holds another type: a
    -- string indexed by err is nil (strings index the string library),
    -- which spares calling type().
    if raw.err then return not_ours('another type than ' .. what) end
    local us, raw_tag = string.match(raw, TAT)
    local num = 0
    if us then
      us = us + 0
    else
      local num_text, den_text
      us, raw_tag, num_text, den_text = string.match(raw, TAT_FRACTION)
      if not us then return not_ours('a value that is not ' .. what) end
      local old_den
      us, num, old_den = us + 0, num_text + 0, den_text + 0
      if num >= old_den then return not_ours('a value that is not ' .. what) end
      if old_den ~= count then
        -- The rate changed: round the fraction up, so tat is never earlier.
        num = ceil_div(num * count, old_den)
        if num == count then us, num = us + 1, 0 end
      end
    end
    if raw_tag ~= tag then return not_ours('a value that is not ' .. what) end
    level = (us - now) * count + num
    if us < now or level > full then
      -- Off the hot path: a bucket that drained (only a WithClock clock
      -- still sees its key) or one that holds more than this
      -- configuration's full bucket. Our keys always carry a TTL; a value
      -- without one is someone else's.
      local pttl = redis.call('PTTL', KEYS[1])
      if pttl < 0 then return not_ours('a value without a TTL') end
      if us < now then
        level = 0
      else
        -- Beyond full. If the server counts the key down within this
        -- bucket's drain time, the clock went back: store the clamp, even
        -- on a denial, so that the key is never locked out for longer than
        -- a full bucket drains. Else a configuration with a larger bucket
        -- wrote it: read it as full and write nothing, so that the larger
        -- one never gets permits back.
        level, clamped = full, pttl <= ttl_ms(ceil_div(full, count))
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
    retry = ceil_div(level + need - full, count)
  end

  local reset = ceil_div(level, count)
  if (allowed and n > 0) or clamped then
    -- tat = now + level / count µs, its whole µs and the ticks left over.
    local num = level % count
    if num < 0 then num = num + count end
    local value = string.format('%d', now + (level - num) / count) .. tag
    if num > 0 then value = string.format('%s+%d/%d', value, num, count) end
    if allowed and n > 0 then
      redis.call('SET', KEYS[1], value, 'PX', ttl_ms(reset))
    else
      -- A denial or n == 0 needs no write: best effort (maxmemory, a replica).
      redis.pcall('SET', KEYS[1], value, 'PX', ttl_ms(reset))
    end
  end
  local remaining = idiv(full - level, per)
  -- Remaining grows by one once the level has drained to the next permit.
  local stable = -1
  if remaining < capacity then stable = ceil_div(level - (full - (remaining + 1) * per), count) end
  return reply(allowed, remaining, retry, reset, 0, stable)
end
