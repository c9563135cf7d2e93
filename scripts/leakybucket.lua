-- leakybucket.lua: a level starts at 0 and drains continuously at `count`
-- permits per `per` µs; a request of n is allowed if level + n <= capacity,
-- which then adds n.
--
-- Joined after prelude.lua; gcra.lua follows and decides, on the level
-- in ticks of 1/count µs of drain (one permit is `per` ticks), with the
-- state's tag 1. ARGV (see gcra.lua):
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n         permits asked for (>= 0)
-- ARGV[3] capacity  permits the bucket holds
-- ARGV[4] per       leak period (µs), reduced with count
-- ARGV[5] count     permits leaked per period

-- The state's tag; the whole-µs form's pattern and format with the tag
-- written in, constants rather than built per call (see gcra.lua); what
-- names the bucket in errors.
local TAG, TAT, TAT_FORMAT = '1', '^([1-9]%d*)1$', '%d1'
local WHAT = 'a leaky bucket'
