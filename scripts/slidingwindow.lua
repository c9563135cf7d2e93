-- slidingwindow.lua: at most `limit` permits in the window/precision buckets
-- (aligned to the Unix epoch) ending with the one that holds now; see
-- buckets.lua for the state.
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n          permits asked for (>= 0)
-- ARGV[3] limit      permits per window
-- ARGV[4] size       window length in buckets (window / precision)
-- ARGV[5] precision  bucket length (µs)

return decide_log(now_us(), tonumber(ARGV[2]), tonumber(ARGV[5]),
  {tonumber(ARGV[3])}, {tonumber(ARGV[4])}, 'w')
