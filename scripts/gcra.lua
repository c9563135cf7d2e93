-- gcra.lua: state shared by the leaky and the token bucket. Both keep one
-- number, the theoretical arrival time `tat`: when the leaky bucket will have
-- drained empty, which is when the token bucket will have refilled full.
--
-- A rate of `count` permits per `per` µs (the Go side reduces the fraction)
-- is exact in ticks of 1/count µs: one permit is `per` ticks of level, and a
-- full bucket `capacity * per` ticks (kept below 2^52 by the Go side).
--
-- tat is stored as "<µs><tag>" or, when it falls between microseconds,
-- "<µs><tag>+<num>/<den>", meaning µs + num/den. tag is one digit: 1 for
-- the leaky bucket, 2 for the token bucket (3 is the fixed window's), so that
-- no other algorithm's state reads as this one's. The key always has a TTL,
-- and lives until the bucket is back to its initial state.

-- Reads the stored tat as whole µs and ticks of 1/den µs; nil if raw is not a tat.
-- tat has 16 digits: every clock reads between 10^15 and 2^52 µs (2001 to
-- 2112), and a bucket drains in at most 2^52 µs.
local TAT = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)'

local function read_tat(raw, den, tag)
  local whole = string.match(raw, TAT .. tag .. '$')
  if whole then return tonumber(whole), 0 end
  local us, num, old_den = string.match(raw, TAT .. tag .. '%+([1-9]%d*)/([1-9]%d*)$')
  if not us then return nil end
  us, num, old_den = tonumber(us), tonumber(num), tonumber(old_den)
  if num >= old_den then return nil end
  if old_den ~= den then
    -- The rate changed: round the fraction up, so tat is never earlier.
    num = ceil_div(num * den, old_den)
    if num == den then us, num = us + 1, 0 end
  end
  return us, num
end

-- Stores the bucket holding `level` ticks at now; the key lives until it
-- drains. call is redis.call, or redis.pcall for a write a denial does not need.
local function store_level(now, level, den, tag, call)
  local whole = idiv(level, den)
  local num = level - whole * den
  local tat = string.format('%d%s', now + whole, tag)
  if num > 0 then tat = string.format('%s+%d/%d', tat, num, den) end
  call('SET', KEYS[1], tat, 'PX', ttl_ms(ceil_div(level, den)))
end

-- The level in ticks at now, between 0 (empty) and full, and whether it must
-- be stored even if the request is denied; or nil and the error reply for a
-- key that holds something else.
local function load_level(now, full, den, tag, what)
  local raw, foreign = get_string(what)
  if foreign then return nil, foreign end
  if not raw then return 0, false end
  local tat_us, tat_num = read_tat(raw, den, tag)
  if not tat_us then return nil, not_ours('a value that is not ' .. what) end
  local full_us = ceil_div(full, den)
  local level = (tat_us - now) * den + tat_num
  if tat_us >= now and level <= full then
    -- The hot path: a bucket neither empty nor beyond full.
    return level, false
  end
  -- Off it: a bucket that drained (only a WithClock clock still sees its
  -- key) or one that holds more than this configuration's full bucket. Our
  -- keys always carry a TTL; a value without one is someone else's.
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then return nil, not_ours('a value without a TTL') end
  if tat_us < now then return 0, false end
  -- Beyond full. If the server counts the key down within this bucket's
  -- drain time, the clock went back: store the clamp, even on a denial, so
  -- that the key is never locked out for longer than a full bucket drains.
  -- Else a configuration with a larger bucket wrote it: read it as full and
  -- write nothing, so that the larger one never gets permits back.
  return full, pttl <= ttl_ms(full_us)
end
