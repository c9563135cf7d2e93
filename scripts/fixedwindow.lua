-- fixedwindow.lua: at most `limit` permits per window; a window opens at the
-- first request that finds none open and lasts `window` µs: [start, start + window).
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n        permits asked for (>= 0)
-- ARGV[3] limit    permits per window
-- ARGV[4] window   window length (µs)
--
-- State: a string holding one decimal integer, (count * 10^16 + window_end)
-- * 10 + 3: window_end in µs, count >= 1, and 3 the fixed window's tag (the
-- buckets use 1 and 2), so that no other algorithm's state reads as a
-- window. A value that does not have this shape, or has no TTL where the
-- time says it should have ended, is someone else's: an error, untouched. Up to 91 permits it fits in int64 and Redis keeps it INT-encoded,
-- the smallest value a key can hold. The key always has a TTL.

local now = now_us()
local n = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local window = tonumber(ARGV[4])

-- A stored window: a count, then window_end with 16 digits (every clock
-- reads between 10^15 and 2^52 µs: 2001 to 2112), then the tag.
local WINDOW = '^([1-9]%d*)([1-4]' .. string.rep('%d', 15) .. ')3$'

local count, window_end = 0, 0
-- clamp: the clock went back, and the window must be cut to its length from
-- now, even on a denial, so that the key is never locked out for longer.
local clamp = false
local raw, foreign = get_string('a fixed window')
if foreign then return foreign end
if raw then
  local c, e = string.match(raw, WINDOW)
  if not c then return not_ours('a string that is not a fixed window') end
  count, window_end = tonumber(c), tonumber(e)
  if window_end <= now or window_end > now + window then
    -- Off the hot path: a window that ended (only a WithClock clock sees
    -- one), or that ends later than this configuration's window allows.
    -- Our keys always carry a TTL; a value without one is someone else's.
    local pttl = redis.call('PTTL', KEYS[1])
    if pttl < 0 then return not_ours('a value without a TTL') end
    if window_end <= now then
      count, window_end = 0, 0
    elseif pttl <= ttl_ms(window) then
      -- The server counts the window down to within this window's length:
      -- the clock went back, not the configuration.
      window_end, clamp = now + window, true
    end
    -- Else a configuration with a longer window wrote it: it stands as it
    -- is, so that neither configuration gets a window it did not open.
  end
end

local allowed, retry, write = false, 0, nil
if n > limit then
  retry = -1
elseif n == 0 then
  allowed = true
elseif count == 0 then
  allowed, count, window_end, write = true, n, now + window, 'PX'
elseif count + n <= limit then
  allowed, count, write = true, count + n, 'KEEPTTL'
  if clamp then write = 'PX' end
else
  retry = window_end - now
end

local reset = 0
if count > 0 then reset = window_end - now end
if write or clamp then
  local value = string.format('%d%016d3', count, window_end)
  if write == 'KEEPTTL' then
    redis.call('SET', KEYS[1], value, 'KEEPTTL')
  elseif write then
    redis.call('SET', KEYS[1], value, 'PX', ttl_ms(reset))
  else
    -- A denial or n == 0 needs no write: best effort (maxmemory, a replica).
    redis.pcall('SET', KEYS[1], value, 'PX', ttl_ms(reset))
  end
end
-- Remaining only changes when the window ends.
return reply(allowed, limit - count, retry, reset, 0, reset)
