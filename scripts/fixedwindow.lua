-- fixedwindow.lua: at most `limit` permits per window; a window opens at the
-- first request that finds none open and lasts `window` µs: [start, start + window).
--
-- Joined after prelude.lua, which sets now and n (not after common.lua,
-- whose helpers would cost a closure each per call).
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n        permits asked for (>= 0)
-- ARGV[3] limit    permits per window
-- ARGV[4] window   window length (µs)
-- ARGV[5] "1" when the key may be shared with other configurations
--         (WithPrefix): the window's length is then stored too
--
-- State, a string, in one of two forms; the key always has a TTL:
--   "<count><end>3"         count >= 1, end with 16 digits (every clock reads
--                           between 10^15 and 2^52 µs: 2001 to 2112), and 3
--                           the fixed window's tag (the buckets use 1 and 2),
--                           so that no other algorithm's state reads as a
--                           window. A window of this configuration's length.
--                           Up to 91 permits it is one integer, which Redis
--                           keeps INT-encoded: the smallest value a key holds.
--                           Default keys carry a fingerprint of the
--                           configuration, so only one length meets there.
--   "<count> <end> <len> 3" a window of len µs, which may be another
--                           configuration's (DESIGN property 8).
-- A value of neither shape, or without a TTL where the time says it should
-- have ended, is someone else's: an error, left untouched.
--
-- Configurations sharing a key share one window and its count. Each sees
-- the window last at least its own length from the window's start, and one
-- that grants in a window shorter than its own stretches it to its length:
-- its grants then count against everyone for a whole window of its own.

-- The form with the window's length: each repetition stops at a space, so
-- it matches in one pass. The short form is read without a capture, below.
local WINDOW_LEN = '^([1-9]%d*) ([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d) ([1-9]%d*) 3$'

local window = ARGV[4] + 0

local count, window_end, len = 0, 0, window
-- The short form's count and end as they are stored: the count is only
-- converted off the hot path of an exhausted key, below, and the end's 16
-- digits are written back as they are while the window stands.
local count_text, end_text
-- clamp: the clock went back, and the window must be cut to its length from
-- now, even on a denial, so that the key is never locked out for longer.
local clamp = false
local raw = redis.pcall('GET', KEYS[1])
if raw then
  -- A string, or a table with err when the key holds another type: a
  -- string indexed by err is nil (strings index the string library),
  -- which spares calling type().
  if raw.err then
    return redis.error_reply('NOTOURS holds another type than a fixed window' .. NOT_OURS)
  end
  -- The short form in one linear find, without a pattern that backtracks:
  -- all digits, the tag last; the end is the 16 digits before the tag, the
  -- count the rest (at least one digit, the first not 0).
  local size = #raw
  if size >= 18 and string.find(raw, '^[1-9]%d*3$') then
    count_text = string.sub(raw, 1, size - 17)
    end_text = string.sub(raw, size - 16, size - 1)
    window_end = end_text + 0
    if window_end < 1e15 or window_end >= 5e15 then
      return redis.error_reply('NOTOURS holds a string that is not a fixed window' .. NOT_OURS)
    end
  else
    local c, e, l = string.match(raw, WINDOW_LEN)
    if not c then
      return redis.error_reply('NOTOURS holds a string that is not a fixed window' .. NOT_OURS)
    end
    count, window_end, len = c + 0, e + 0, l + 0
  end
  if window_end <= now or window_end > now + len then
    -- Off the hot path: a window that ended (only a WithClock clock sees
    -- one), or that ends later than its length from now. Our keys always
    -- carry a TTL; a value without one is someone else's.
    local pttl = redis.call('PTTL', KEYS[1])
    if pttl < 0 then
      return redis.error_reply('NOTOURS holds a value without a TTL' .. NOT_OURS)
    end
    -- The server counts the window down to within its length (pttl in
    -- whole ms, len rounded up to them: ttl_ms in common.lua): the clock
    -- went back. Else (a window of the short form, which only a longer
    -- configuration could have left) it stands as it is.
    if window_end > now + len and pttl * 1000 < len + 1000 then
      window_end, clamp = now + len, true
    end
  end
  if count_text then
    -- The hot path of an exhausted key: this configuration's own window
    -- (the short form), not over, its count the limit (both canonical
    -- decimals: equal as text), and a request for one permit. Denied until
    -- the window ends, as below, without converting the count or the limit.
    if count_text == ARGV[3] and n == 1 and window_end > now and not clamp then
      local text = string.format('%d', window_end - now)
      return '0 0 ' .. text .. ' ' .. text .. ' 0 -1'
    end
    count = count_text + 0
  end
end
local limit = ARGV[3] + 0
-- This configuration's view: the window lasts at least its own length.
local start = window_end - len
local view_end = window_end
if start + window > view_end then view_end = start + window end
if count > 0 and view_end <= now then count = 0 end

local allowed, retry, write = false, 0, nil
if n > limit then
  retry = -1
elseif n == 0 then
  allowed = true
elseif count == 0 then
  allowed, count, start, len, write = true, n, now, window, 'PX'
  window_end, view_end = now + window, now + window
elseif count + n <= limit then
  allowed, count, write = true, count + n, 'KEEPTTL'
  if clamp then write = 'PX' end
  if view_end > window_end then
    -- Granting in a shorter configuration's window: stretch it to ours.
    window_end, len, write = view_end, view_end - start, 'PX'
  end
else
  retry = view_end - now
end

local reset = 0
if count > 0 then reset = view_end - now end
if write == 'KEEPTTL' and end_text and count <= 91 and ARGV[5] ~= '1' then
  -- The short form up to a count of 91 is one integer below 2^63: INCRBY
  -- of n * 10^17 adds n to its count in place and keeps the TTL, with no
  -- value to format.
  local step = '100000000000000000'
  if n > 1 then step = string.format('%d00000000000000000', n) end
  redis.call('INCRBY', KEYS[1], step)
elseif write or clamp then
  local value
  if ARGV[5] == '1' or len ~= window then
    value = string.format('%d %016d %d 3', count, window_end, len)
  elseif write == 'KEEPTTL' and end_text then
    value = string.format('%d', count) .. end_text .. '3'
  else
    value = string.format('%d%016d3', count, window_end)
  end
  if write == 'KEEPTTL' then
    redis.call('SET', KEYS[1], value, 'KEEPTTL')
  else
    -- The TTL in ms, rounded up so that expiry never comes before the
    -- window ends (ttl_ms in common.lua; window_end > now here).
    local ttl = window_end - now
    ttl = (ttl - ttl % 1000) / 1000
    if ttl * 1000 < window_end - now then ttl = ttl + 1 end
    if write then
      redis.call('SET', KEYS[1], value, 'PX', ttl)
    else
      -- A denial or n == 0 needs no write: best effort (maxmemory, a replica).
      redis.pcall('SET', KEYS[1], value, 'PX', ttl)
    end
  end
end
-- The reply of six integers (reply in common.lua): allowed, remaining,
-- retry-after, reset-after, the strategy (0) and stable, -1: remaining only
-- changes when the window ends, at reset. Each %d is a sprintf, the dearest
-- part of a reply: a denial with nothing left (the hot path of an exhausted
-- key) formats its one duration once.
local remaining = limit - count
if remaining < 0 then remaining = 0 end
if allowed then
  return string.format('1 %d 0 %d 0 -1', remaining, reset)
end
if remaining == 0 and retry == reset then
  local text = string.format('%d', retry)
  return '0 0 ' .. text .. ' ' .. text .. ' 0 -1'
end
return string.format('0 %d %d %d 0 -1', remaining, retry, reset)
