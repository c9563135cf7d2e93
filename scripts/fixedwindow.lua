-- fixedwindow.lua: at most `limit` permits per window. A window opens at
-- the first grant that finds none open and lasts `window`: [start, end).
--
-- KEYS[1]  the key
-- ARGV[1]  now      Unix time (µs), or "" for the server's TIME
-- ARGV[2]  n        permits asked for (>= 0), or "-<k>:<token>": a refund
--                   of the grant a reply named <token>, until k of its
--                   permits in all have been given back; "=<k>:<token>"
--                   the same, replying only what it gave (a bare refund,
--                   which no observer reads)
-- ARGV[3]  limit    permits per window
-- ARGV[4]  window   window length (µs)
-- ARGV[5]  shared   "1" under WithPrefix: the window's length is stored
--
-- All times are integer µs. The state is a string with a TTL
-- (docs/internals.md, format 3), `end` with 16 digits and 3 the fixed
-- window's tag:
--   "<count><end>3"          a window of this configuration's length (up to
--                            a count of 91 one integer: the least memory)
--   "<count> <end> <len> 3"  a window of len µs, of any configuration
--   "<count> <end> <len> <given> <horizon>[ <lo>:<hi>]* 3"
--                            a window some refund gave <given> back in:
--                            the positions from <lo> to before <hi> (0 =
--                            the window's first permit) were given back,
--                            at most MAX_RANGES ranges, apart and sorted;
--                            a grant starting before <horizon> gives
--                            nothing (docs/refunds.md)
-- A window lasts len for every configuration: len is the longest window of
-- those that granted in it. The key's time is the window's start: a call
-- whose clock reads earlier decides at it, and one more than a window
-- earlier is a clock gone wrong, which reads the window as opened now.
-- Denials, n == 0 and refunds that give nothing write nothing.
--
-- A bare refund on the server's clock reads no clock: it decides at the
-- key's time as the key records it, the window's start. The key's TTL
-- ends with its window, counted by the server, so a key that is there
-- holds a window the server's clock has not closed (within the TTL's
-- millisecond, and a grant counted in a closed window is read as none).
--
-- Reply: "allowed remaining retry reset 0 stable[ token]" (µs; retry -1 =
-- never; stable -1, or 0 for a clock gone wrong); the token,
-- "<start>.<at>.<n>", only for a grant. A refund replies
-- "1 remaining 0 reset 0 -1 given", a bare one "1 0 0 0 0 -1 given".

-- Literal patterns are built once, when the script loads. The short form's
-- count is matched shortest first (%d-): its end's 16 digits are then found
-- in a step or two, where %d* would back off digit by digit from the end.
local SHORT = '^([1-9]%d-)([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)3$'
local LONG = '^([1-9]%d*) ([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d) ([1-9]%d*) 3$'
local REFUNDED = '^(%d+) ([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d) ([1-9]%d*) ([1-9]%d*) (%d+)(.*) 3$'
local RANGE = ' (%d+):([1-9]%d*)'
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

-- The clock: the caller's, or the server's; none yet (nil) for a bare
-- refund on the server's clock, which takes the key's (above).
local mark = string.byte(ARGV[2])
local bare = mark == 61 -- '='
local now = ARGV[1]
if now ~= '' then
  now = now + 0
elseif bare then
  now = nil
else
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local limit, window = ARGV[3] + 0, ARGV[4] + 0
local refund_k, token
local n = 0
if mark == 45 or bare then -- '-' or '=': a refund
  refund_k, token = string.match(ARGV[2], '^[=%-]([1-9]%d*):(.*)$')
end
if not refund_k then n = ARGV[2] + 0 end

-- Read the state: count, start, len, and what refunds gave back (given,
-- horizon, records: the text of the <lo>:<hi> ranges, ranges of them). No
-- value: no window.
local count, start, len, given, horizon, records, ranges = 0, 0, window, 0, 0, '', 0
local value = redis.pcall('GET', KEYS[1])
if value then
  if type(value) ~= 'string' then
    return redis.error_reply(string.format(NOT_OURS, 'another type than a fixed window'))
  end
  local window_end
  count, window_end = string.match(value, SHORT)
  if not count then count, window_end, len = string.match(value, LONG) end
  if not count then
    count, window_end, len, given, horizon, records = string.match(value, REFUNDED)
    if count then
      local rest
      rest, ranges = string.gsub(records, RANGE, '')
      if rest ~= '' then count = nil end
    end
  end
  if not count then
    return redis.error_reply(string.format(NOT_OURS, 'a string that is not a fixed window'))
  end
  count, len, given, horizon = count + 0, len + 0, given + 0, horizon + 0
  start = window_end - len
end

-- A bare refund on the server's clock: nothing to give on a missing key,
-- else the key's time is the window's start.
if not now then
  if not value then return '1 0 0 0 0 -1 0' end
  now = start
end

-- The key's time: t = max(now, start), the window's start being the latest
-- time the key recorded. A start more than a window ahead of now is a
-- clock gone wrong: decide at now, reading the window as opened now, so
-- that all it holds counts as used for at most its length; a grant then
-- writes it on now's timeline, and the old window's grants give nothing
-- back. Our keys always carry a TTL: a closed or moved window is ours only
-- if its key has one.
local t, moved = now, false
if value and start - now > math.max(window, len) then
  start, moved, given, horizon, records, ranges = now, true, 0, 0, '', 0
elseif start > now then
  t = start
end
local open = value and t < start + len
if value and (moved or not open) and redis.call('PTTL', KEYS[1]) < 0 then
  return redis.error_reply(string.format(NOT_OURS, 'a value without a TTL'))
end
if not open then count = 0 end

-- A refund: give back into the window the token names, while it is open
-- and on the key's timeline, what the grant took and has not given back
-- yet, at most once, then reply as n == 0 would. The grant holds the
-- window's positions [first, at); what it gave back is the start of them
-- that a range of given-back positions covers (only its refunds touch
-- them), and what it gives now joins that range.
if refund_k then
  local back = 0
  local token_start, at, took = string.match(token, '^(%d+)%.([1-9]%d*)%.([1-9]%d*)$')
  at, took = tonumber(at), tonumber(took)
  if open and not moved and token_start and token_start + 0 == start
      and took <= at and at - took >= horizon and at <= count + given then
    back, records, horizon = give_back(records, ranges, at - took, took, refund_k + 0, count,
      horizon, ' ')
    if back > 0 then
      count, given = count - back, given + back
      set_keeping_ttl(string.format('%d %d %d %d %d%s 3',
        count, start + len, len, given, horizon, records))
    end
  end
  if bare then return string.format('1 0 0 0 0 -1 %d', back) end
  local reset = 0
  if open then reset = start + len - t end
  return string.format('1 %d 0 %d 0 -1 %d', math.max(0, limit - count), reset, back)
end

-- Decide and apply. A grant that finds no window open opens one at t; a
-- grant in a window shorter than its own lengthens it to its own.
local allowed, retry, same_end = 0, 0, false
if n > limit then
  retry = -1
elseif n == 0 then
  allowed = 1
elseif not open then
  allowed, count, start, len, t = 1, n, t, window, t
  given, horizon, records = 0, 0, ''
elseif count + n <= limit then
  same_end = not moved and window <= len
  allowed, count, len = 1, count + n, math.max(len, window)
else
  retry = start + len - t
end

-- Write: grants only.
local granted = allowed == 1 and n > 0
if granted then
  if given > 0 or horizon > 0 then
    value = string.format('%d %d %d %d %d%s 3', count, start + len, len, given, horizon, records)
  elseif ARGV[5] == '1' or len ~= window then
    value = string.format('%d %d %d 3', count, start + len, len)
  else
    value = string.format('%d%d3', count, start + len)
  end
  if same_end then
    set_keeping_ttl(value)
  else
    -- The key lives until the window ends: ms, rounded up (exact in doubles).
    redis.call('SET', KEYS[1], value, 'PX', math.ceil((start + len - t) / 1000))
  end
end

-- Reply. A window read as opened now (a clock gone wrong) is read so
-- again by the next call, its durations not counting down: stable 0, so
-- that no deny cache keeps the answer.
local remaining, reset, stable = limit - count, 0, -1
if remaining < 0 then remaining = 0 end
if open or granted then reset = start + len - t end
if moved then stable = 0 end
if granted then
  return string.format('1 %d 0 %d 0 %d %d.%d.%d', remaining, reset, stable, start, count + given, n)
end
return string.format('%d %d %d %d 0 %d', allowed, remaining, retry, reset, stable)
