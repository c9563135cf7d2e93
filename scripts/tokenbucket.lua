-- tokenbucket.lua: a bucket starts full with `capacity` tokens and refills
-- continuously at `count` tokens per `per` µs, up to capacity; a request of n
-- is allowed if n tokens are there, and takes them (GCRA: one stored time).
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n         tokens asked for (>= 0)
-- ARGV[3] capacity  tokens the bucket holds
-- ARGV[4] per       refill period (µs), reduced with count
-- ARGV[5] count     tokens refilled per period
--
-- Tokens are in ticks of 1/count µs of refill: one token is `per` ticks.
-- What is stored is the missing part, full - tokens: see gcra.lua.

local now = now_us()
local n = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local per = tonumber(ARGV[4])
local count = tonumber(ARGV[5])
local full = capacity * per

local missing, clamped = load_level(now, full, count, '2', 'a token bucket')
if not missing then return clamped end
local tokens = full - missing

local allowed, retry = false, 0
local need = n * per
if n > capacity then
  retry = -1
elseif tokens >= need then
  allowed, tokens = true, tokens - need
else
  retry = ceil_div(need - tokens, count)
end

if allowed and n > 0 then
  store_level(now, full - tokens, count, '2', redis.call)
elseif clamped then
  -- A denial or n == 0 needs no write: best effort (maxmemory, a replica).
  store_level(now, full - tokens, count, '2', redis.pcall)
end
local remaining = idiv(tokens, per)
-- Remaining grows by one once the next whole token has refilled.
local stable = -1
if remaining < capacity then stable = ceil_div((remaining + 1) * per - tokens, count) end
return reply(allowed, remaining, retry, ceil_div(full - tokens, count), 0, stable)
