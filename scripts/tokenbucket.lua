-- tokenbucket.lua: a bucket starts full with `capacity` tokens and refills
-- continuously at `count` tokens per `per` µs, up to capacity; a request of n
-- is allowed if n tokens are there, and takes them (GCRA: one stored time).
--
-- Joined after common.lua and gcra.lua: decide_gcra (gcra.lua) decides, on
-- the missing tokens, full - tokens, in ticks of 1/count µs of refill (one
-- token is `per` ticks): a token bucket's missing tokens are a leaky
-- bucket's level. Its state's tag is 2. ARGV (see gcra.lua):
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n         tokens asked for (>= 0)
-- ARGV[3] capacity  tokens the bucket holds
-- ARGV[4] per       refill period (µs), reduced with count
-- ARGV[5] count     tokens refilled per period

return decide_gcra('2', 'a token bucket')
