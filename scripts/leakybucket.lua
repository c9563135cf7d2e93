-- leakybucket.lua: a level starts at 0 and drains continuously at `count`
-- permits per `per` µs; a request of n is allowed if level + n <= capacity,
-- which then adds n.
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n         permits asked for (>= 0)
-- ARGV[3] capacity  permits the bucket holds
-- ARGV[4] per       leak period (µs), reduced with count
-- ARGV[5] count     permits leaked per period
--
-- Level is in ticks of 1/count µs of drain: one permit is `per` ticks.

local now = now_us()
local n = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local per = tonumber(ARGV[4])
local count = tonumber(ARGV[5])
local full = capacity * per

local level, clamped = load_level(now, full, count, '1', 'a leaky bucket')
if not level then return clamped end

local allowed, retry = false, 0
local need = n * per
if n > capacity then
  retry = -1
elseif level + need <= full then
  allowed, level = true, level + need
else
  retry = ceil_div(level + need - full, count)
end

if allowed and n > 0 then
  store_level(now, level, count, '1', redis.call)
elseif clamped then
  -- A denial or n == 0 needs no write: best effort (maxmemory, a replica).
  store_level(now, level, count, '1', redis.pcall)
end
local remaining = idiv(full - level, per)
-- Remaining grows by one once the level has drained to the next permit.
local stable = -1
if remaining < capacity then stable = ceil_div(level - (full - (remaining + 1) * per), count) end
return reply(allowed, remaining, retry, ceil_div(level, count), 0, stable)
