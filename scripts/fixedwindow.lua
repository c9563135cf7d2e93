-- fixedwindow.lua: at most `limit` permits per window; a window opens at the
-- first request that finds none open and lasts `window` µs: [start, start + window).
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n        permits asked for (>= 0)
-- ARGV[3] limit    permits per window
-- ARGV[4] window   window length (µs)
--
-- State: a string holding one decimal integer, count * 10^16 + window_end
-- (µs). count >= 1 in any stored window. Up to 922 permits it fits in int64
-- and Redis keeps it INT-encoded, the smallest value a key can hold.

local now = now_us()
local n = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local window = tonumber(ARGV[4])

local count, window_end = 0, 0
local raw, foreign = get_string('a fixed window')
if foreign then return foreign end
if raw then
  if not string.match(raw, '^[1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d+$') then
    return not_ours('a string that is not a fixed window')
  end
  count = tonumber(string.sub(raw, 1, -17))
  window_end = tonumber(string.sub(raw, -16))
end

-- expire: nil (nothing to write), 'KEEPTTL' (the count changed in a window
-- whose TTL already runs to its end) or 'PX' (a window opened or moved).
local expire
if window_end > now + window then
  -- The clock went back: no window may outlast its length from now.
  window_end, expire = now + window, 'PX'
end
if window_end <= now then
  count, window_end, expire = 0, 0, nil
end

local allowed, retry = false, 0
if n > limit then
  retry = -1
elseif n == 0 then
  allowed = true
elseif count == 0 then
  allowed, count, window_end, expire = true, n, now + window, 'PX'
elseif count + n <= limit then
  allowed, count, expire = true, count + n, expire or 'KEEPTTL'
else
  retry = window_end - now
end

local reset = 0
if count > 0 then reset = window_end - now end
local value
if expire then value = string.format('%d%016d', count, window_end) end
if expire == 'PX' then
  redis.call('SET', KEYS[1], value, 'PX', ttl_ms(reset))
elseif expire then
  redis.call('SET', KEYS[1], value, 'KEEPTTL')
end
return reply(allowed, limit - count, retry, reset)
