-- leakybucket.lua: a level starts at 0 and drains continuously at `count`
-- permits per `per` µs; a request of n is allowed if level + n <= capacity,
-- which then adds n.
--
-- Joined after common.lua and gcra.lua: decide_gcra (gcra.lua) decides, on
-- the level in ticks of 1/count µs of drain (one permit is `per` ticks),
-- with the state's tag 1. ARGV (see gcra.lua):
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n         permits asked for (>= 0)
-- ARGV[3] capacity  permits the bucket holds
-- ARGV[4] per       leak period (µs), reduced with count
-- ARGV[5] count     permits leaked per period

return decide_gcra('1', 'a leaky bucket')
