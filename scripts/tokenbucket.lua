-- tokenbucket.lua: the token bucket's part of its script; gcra.lua follows
-- and decides. A bucket starts full and refills continuously at the refill
-- rate; a request of n is allowed if n tokens are there, and takes them.
-- Its missing tokens are a leaky bucket's level, which gcra.lua counts.
-- The state's tag is 2 (the leaky bucket's 1, the fixed window's 3).
local TAG, WHAT = '2', 'a token bucket'
