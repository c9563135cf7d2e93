-- leakybucket.lua: the leaky bucket's part of its script; gcra.lua follows
-- and decides. A level starts at 0 and drains continuously at the leak
-- rate; a request of n is allowed if level + n <= capacity, which adds n.
-- The state's tag is 1 (the token bucket's 2, the fixed window's 3), so
-- that no other algorithm's state reads as a leaky bucket.
local TAG, WHAT = '1', 'a leaky bucket'
