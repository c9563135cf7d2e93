-- fixedwindow.lua: at most `limit` permits per window. A window opens at
-- the first grant that finds none open and lasts `window`: [start, end).
--
-- KEYS[1]  the key
-- ARGV[1]  now      Unix time (µs), or "" for the server's TIME
-- ARGV[2]  n        permits asked for (>= 0)
-- ARGV[3]  limit    permits per window
-- ARGV[4]  window   window length (µs)
-- ARGV[5]  shared   "1" when the key may be shared with other
--                   configurations (WithPrefix): the length is then stored
--
-- All times are integer µs. The state is a string with a TTL, in one of
-- two forms (docs/internals.md):
--   "<count><end>3"          a window of this configuration's length; end
--                            has 16 digits, 3 is the fixed window's tag. Up
--                            to a count of 91 this is one integer, which
--                            Redis keeps in the least memory.
--   "<count> <end> <len> 3"  a window of len µs, of any configuration.
-- Every configuration reads a window as lasting at least its own length
-- from its start, applies its own limit to the count, and a grant in a
-- window shorter than its own stretches it to its own length.
-- Denials and n == 0 write nothing, unless the clock went back.
--
-- Reply: "allowed remaining retry reset 0 -1" (µs; retry -1 = never).

local SHORT = '^([1-9]%d*)([1-4]' .. string.rep('%d', 15) .. ')3$'
local LONG = '^([1-9]%d*) ([1-4]' .. string.rep('%d', 15) .. ') ([1-9]%d*) 3$'

local function not_ours(what)
  return redis.error_reply('NOTOURS holds ' .. what .. ', not redlimit state; it was left unchanged')
end

local function now_us()
  if ARGV[1] ~= '' then return ARGV[1] + 0 end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- ceil(a / b) for integers a >= 0, b > 0.
local function ceil_div(a, b)
  local q = (a - a % b) / b
  if q * b < a then q = q + 1 end
  return q
end

-- read_state returns the stored window as count, start, len (no window:
-- count 0), or nil and an error reply for a value that is not ours.
local function read_state(window)
  local value = redis.pcall('GET', KEYS[1])
  if not value then return 0, 0, window end
  if type(value) ~= 'string' then return nil, not_ours('another type than a fixed window') end
  local count, window_end, len = string.match(value, LONG)
  if not count then
    count, window_end = string.match(value, SHORT)
    len = window
  end
  if not count then return nil, not_ours('a string that is not a fixed window') end
  return count + 0, window_end - len, len + 0
end

-- Our keys always carry a TTL: a window that has closed, or that starts
-- after now, is looked at closer before it is taken for ours.
local function has_ttl()
  return redis.call('PTTL', KEYS[1]) >= 0
end

local function write(count, start, len, now, window, granted)
  local value
  if ARGV[5] == '1' or len ~= window then
    value = string.format('%d %d %d 3', count, start + len, len)
  else
    value = string.format('%d%d3', count, start + len)
  end
  local ttl = ceil_div(start + len - now, 1000)
  if granted then
    redis.call('SET', KEYS[1], value, 'PX', ttl)
  else
    -- A clamp: best effort when Redis refuses writes.
    redis.pcall('SET', KEYS[1], value, 'PX', ttl)
  end
end

local function reply(allowed, remaining, retry, reset)
  if remaining < 0 then remaining = 0 end
  return string.format('%d %d %d %d 0 -1', allowed and 1 or 0, remaining, retry, reset)
end

local now, n = now_us(), ARGV[2] + 0
local limit, window = ARGV[3] + 0, ARGV[4] + 0

-- Read the state.
local count, start, len = read_state(window)
if not count then return start end

-- Advance: a window never starts after now (the clock went back: it is
-- moved to start now, as internal/model does, and that is written even by
-- a denial, so that no key is locked out longer than a window); it closes
-- at the later of its end and its start plus this configuration's length.
local clamped = count > 0 and start > now
local view_end = start + len
if start + window > view_end then view_end = start + window end
if (clamped or view_end <= now) and count > 0 and not has_ttl() then
  return not_ours('a value without a TTL')
end
if clamped then
  view_end = view_end - start + now
  start = now
elseif view_end <= now then
  count = 0
end

-- Decide and apply.
local allowed, retry = false, 0
if n > limit then
  retry = -1
elseif n == 0 then
  allowed = true
elseif count == 0 then
  allowed, count, start, len, view_end = true, n, now, window, now + window
elseif count + n <= limit then
  allowed, count, len = true, count + n, view_end - start
else
  retry = view_end - now
end

-- Write: grants, and a window the clock moved.
if (allowed and n > 0) or clamped then
  write(count, start, len, now, window, allowed and n > 0)
end

local reset = 0
if count > 0 then reset = view_end - now end
return reply(allowed, limit - count, retry, reset)
