-- gcra.lua: state shared by the leaky and the token bucket. Both keep one
-- number, the theoretical arrival time `tat`: when the leaky bucket will have
-- drained empty, which is when the token bucket will have refilled full.
--
-- A rate of `count` permits per `per` µs (the Go side reduces the fraction)
-- is exact in ticks of 1/count µs: one permit is `per` ticks of level, and a
-- full bucket `capacity * per` ticks (kept below 2^52 by the Go side).
-- tat is stored as "<µs>" or, when it falls between microseconds,
-- "<µs>+<num>/<den>", meaning µs + num/den.

-- Reads the stored tat as whole µs and ticks of 1/den µs; nil if raw is not a tat.
local function read_tat(raw, den)
  local whole = string.match(raw, '^%d+$')
  if whole then return tonumber(whole), 0 end
  local us, num, old_den = string.match(raw, '^(%d+)%+(%d+)/(%d+)$')
  if not us then return nil end
  us, num, old_den = tonumber(us), tonumber(num), tonumber(old_den)
  if old_den < 1 or num >= old_den then return nil end
  if old_den ~= den then
    -- The rate changed: round the fraction up, so tat is never earlier.
    num = ceil_div(num * den, old_den)
    if num == den then us, num = us + 1, 0 end
  end
  return us, num
end

-- The level in ticks at now, between 0 (empty) and full, and whether it had
-- to be clamped to full: the clock went back, or the capacity was lowered,
-- and the clamp must be stored so the key is never locked out for longer
-- than a full bucket takes to drain.
local function level_at(now, tat_us, tat_num, full, den)
  if tat_us < now then return 0, false end
  local ahead = tat_us - now
  if ahead > ceil_div(full, den) then return full, true end
  local level = ahead * den + tat_num
  if level > full then return full, true end
  return level, false
end

-- Stores the bucket holding `level` ticks at now; the key lives until it drains.
local function store_level(now, level, den)
  local whole = idiv(level, den)
  local num = level - whole * den
  local tat = string.format('%d', now + whole)
  if num > 0 then tat = string.format('%s+%d/%d', tat, num, den) end
  redis.call('SET', KEYS[1], tat, 'PX', ttl_ms(ceil_div(level, den)))
end

-- The level at now, whether it was clamped, or nil and the error reply for
-- a key that holds something else.
local function load_level(now, full, den, what)
  local raw, foreign = get_string(what)
  if foreign then return nil, foreign end
  if not raw then return 0, false end
  local tat_us, tat_num = read_tat(raw, den)
  if not tat_us then return nil, not_ours('a value that is not ' .. what) end
  return level_at(now, tat_us, tat_num, full, den)
end
