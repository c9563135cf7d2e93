-- fixedwindow.lua: at most `limit` permits per window. A window opens at
-- the first grant that finds none open and lasts `window`: [start, end).
--
-- KEYS[1]  the key
-- ARGV[1]  now      Unix time (µs), or "" for the server's TIME
-- ARGV[2]  n        permits asked for (>= 0)
-- ARGV[3]  limit    permits per window
-- ARGV[4]  window   window length (µs)
-- ARGV[5]  shared   "1" under WithPrefix: the window's length is stored
--
-- All times are integer µs. The state is a string with a TTL
-- (docs/internals.md), `end` with 16 digits and 3 the fixed window's tag:
--   "<count><end>3"          a window of this configuration's length (up to
--                            a count of 91 one integer: the least memory)
--   "<count> <end> <len> 3"  a window of len µs, of any configuration
-- Every configuration reads a window as lasting at least its own length
-- from its start and applies its own limit to the count; a grant in a
-- window shorter than its own stretches it to its own length. Denials and
-- n == 0 write nothing, unless the clock went back.
--
-- Reply: "allowed remaining retry reset 0 -1" (µs; retry -1 = never).

-- Literal patterns are built once, when the script loads. The short form's
-- count is matched shortest first (%d-): its end's 16 digits are then found
-- in a step or two, where %d* would back off digit by digit from the end.
local SHORT = '^([1-9]%d-)([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)3$'
local LONG = '^([1-9]%d*) ([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d) ([1-9]%d*) 3$'
local NOT_OURS = 'NOTOURS holds %s, not redlimit state; it was left unchanged'

-- set_keeping_ttl writes a grant that left the window's end where it was:
-- the key's TTL, set with that end, is still the time to it. SET KEEPTTL
-- costs Redis half what SET PX does: about a tenth of a grant's time.
local function set_keeping_ttl(value)
  redis.call('SET', KEYS[1], value, 'KEEPTTL')
end

-- The rest is the decision, top to bottom, in commented steps: every
-- function is a closure Redis builds on each call, and calls cost too, so
-- steps used once are not functions.

-- The clock: the caller's, or the server's.
local now, n = tonumber(ARGV[1]), ARGV[2] + 0
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local limit, window = ARGV[3] + 0, ARGV[4] + 0

-- Read the state: count, start, len (count 0: no window).
local count, start, len = 0, 0, window
local value = redis.pcall('GET', KEYS[1])
if value then
  if type(value) ~= 'string' then
    return redis.error_reply(string.format(NOT_OURS, 'another type than a fixed window'))
  end
  local window_end
  count, window_end = string.match(value, SHORT)
  if not count then count, window_end, len = string.match(value, LONG) end
  if not count then
    return redis.error_reply(string.format(NOT_OURS, 'a string that is not a fixed window'))
  end
  count, len = count + 0, len + 0
  start = window_end - len
end

-- Advance: the window closes, for this configuration, at the later of its
-- end and its start plus this configuration's length. It never starts
-- after now: the clock went back, and it is moved to start now, as
-- internal/model does, and written even by a denial, so that no key is
-- locked out longer than a window. Our keys always carry a TTL: a closed
-- or moved window is ours only if its key has one.
local view_end = start + len
if start + window > view_end then view_end = start + window end
local clamped = count > 0 and start > now
if count > 0 and (clamped or view_end <= now) and redis.call('PTTL', KEYS[1]) < 0 then
  return redis.error_reply(string.format(NOT_OURS, 'a value without a TTL'))
end
if clamped then
  view_end = view_end - start + now
  start = now
elseif view_end <= now then
  count = 0
end

-- Decide and apply.
local allowed, retry, same_end = 0, 0, false
if n > limit then
  retry = -1
elseif n == 0 then
  allowed = 1
elseif count == 0 then
  allowed, count, start, len, view_end = 1, n, now, window, now + window
elseif count + n <= limit then
  same_end = not clamped and view_end == start + len
  allowed, count, len = 1, count + n, view_end - start
else
  retry = view_end - now
end

-- Write: grants, and a window the clock moved.
local granted = allowed == 1 and n > 0
if granted or clamped then
  if ARGV[5] == '1' or len ~= window then
    value = string.format('%d %d %d 3', count, start + len, len)
  else
    value = string.format('%d%d3', count, start + len)
  end
  -- The key lives until the window ends: ms, rounded up (exact in doubles).
  if same_end then
    set_keeping_ttl(value)
  elseif granted then
    redis.call('SET', KEYS[1], value, 'PX', math.ceil((start + len - now) / 1000))
  else -- best effort: a clamp
    redis.pcall('SET', KEYS[1], value, 'PX', math.ceil((start + len - now) / 1000))
  end
end

-- Reply.
local remaining, reset = limit - count, 0
if remaining < 0 then remaining = 0 end
if count > 0 then reset = view_end - now end
return string.format('%d %d %d %d 0 -1', allowed, remaining, retry, reset)
