-- tokenbucket.lua: a bucket starts full with `capacity` tokens and refills
-- continuously at `count` tokens per `per` µs, up to capacity; a request of n
-- is allowed if n tokens are there, and takes them (GCRA: one stored time).
--
-- Joined after prelude.lua; gcra.lua follows and decides, on the
-- missing tokens, full - tokens, in ticks of 1/count µs of refill (one
-- token is `per` ticks): a token bucket's missing tokens are a leaky
-- bucket's level. Its state's tag is 2. ARGV (see gcra.lua):
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n         tokens asked for (>= 0)
-- ARGV[3] capacity  tokens the bucket holds
-- ARGV[4] per       refill period (µs), reduced with count
-- ARGV[5] count     tokens refilled per period

-- The state's tag; the whole-µs form's pattern and format with the tag
-- written in, constants rather than built per call (see gcra.lua); what
-- names the bucket in errors.
local TAG, TAT, TAT_FORMAT = '2', '^([1-9]%d*)2$', '%d2'
local WHAT = 'a token bucket'
