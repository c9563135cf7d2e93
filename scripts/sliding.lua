-- sliding.lua: the sliding window and the sliding log, one strategy or
-- several over one shared set of buckets, allowed only if every strategy
-- allows. The reply names the strategy reported: when denied, the one with
-- the longest retry; when allowed, the one with the fewest permits left.
-- Joined after common.lua and buckets.lua, which holds the state and the
-- rules.
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n          permits asked for (>= 0)
-- ARGV[3] own        the meta's text for this configuration's entries
--                    alone: "W P 1 0 size limit 0" for a sliding window,
--                    "L P E (0 size limit 0)*E" for a sliding log; its
--                    letter names the algorithm
-- ARGV[4] precision  bucket length (µs)
-- ARGV[5], ARGV[6]   limit and size (window / precision) of the shortest
-- ...                strategy, then the next ones, by window ascending,
--                    limits ascending

local now = now_us()
-- n is 1 on most calls: comparing strings spares a conversion.
local n = 1
if ARGV[2] ~= '1' then n = ARGV[2] + 0 end
local own, precision = ARGV[3], ARGV[4] + 0
local limits, sizes = {}, {}
for i = 5, #ARGV, 2 do
  limits[#limits + 1] = ARGV[i] + 0
  sizes[#sizes + 1] = ARGV[i + 1] + 0
end

local raw = redis.pcall('HGET', KEYS[1], 'm')
if type(raw) == 'string' then
  local decided, bad = decide_own(now, n, precision, limits, sizes, own, raw)
  if decided then return decided end
  if bad then return corrupt(string.lower(string.sub(own, 1, 1))) end
end
return general()(now, n, precision, limits, sizes, string.lower(string.sub(own, 1, 1)), raw)
