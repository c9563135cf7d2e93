-- slidinglog.lua: the sliding window rule for several strategies at once,
-- over one shared set of buckets; allowed only if every strategy allows. The
-- reply names the strategy reported: when denied, the one with the longest
-- retry; when allowed, the one with the fewest permits left. See buckets.lua.
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n          permits asked for (>= 0)
-- ARGV[3] precision  bucket length (µs)
-- ARGV[4], ARGV[5]   limit and size (window / precision) of the shortest strategy,
-- ...                then the next ones, by window ascending, limits ascending

local limits, sizes = {}, {}
for i = 4, #ARGV, 2 do
  limits[#limits + 1] = tonumber(ARGV[i])
  sizes[#sizes + 1] = tonumber(ARGV[i + 1])
end
return decide_log(now_us(), tonumber(ARGV[2]), tonumber(ARGV[3]), limits, sizes, 'l')
