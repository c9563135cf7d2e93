-- common.lua: helpers of the sliding scripts' general path. The Go side
-- joins prelude.lua, sliding.lua, this file and buckets.lua into one
-- script; sliding.lua decides most calls and returns before this file
-- runs, so these helpers cost their closures only on the calls buckets.lua
-- decides. It uses nothing it does not define. (The fixed window and the
-- buckets join prelude.lua alone, and write the little they need out.)
--
-- Every script takes one key, KEYS[1], and ARGV[1] = now in Unix µs, or ""
-- to read the Redis server's TIME; ARGV[2] = n, the permits asked for.
-- All times and durations are integer microseconds held in Lua numbers
-- (doubles): exact below 2^53, and the Go side keeps every value under it.
-- Every script replies with one string of six integers, see reply(); but
-- for sliding.lua's two shortcuts, a stamped denial and a grant in the
-- tail's bucket, whose replies the Go side completes
-- (internal/engine/reply.go).
--
-- A C function (math.*, tonumber, string.*) costs several times a Lua
-- operator. Hence `%` rather than math.floor, comparisons rather than
-- math.max, and `s + 0` (Lua's own string-to-number coercion) rather than
-- tonumber for the numbers Redis and the Go side send, which are always
-- decimal integers.

-- floor(a / b) for integers a >= 0, b > 0, exact even where a / b rounds:
-- a % b is a - floor(a / b) * b, exact below 2^53, and negative only when
-- a / b rounded up to the next integer.
local function idiv(a, b)
  local r = a % b
  if r < 0 then r = r + b end
  return (a - r) / b
end

-- ceil(a / b) for integers a >= 0, b > 0.
local function ceil_div(a, b)
  local r = a % b
  if r < 0 then r = r + b end
  if r == 0 then return a / b end
  return (a - r) / b + 1
end

-- A key's TTL in ms for state that is back to its initial value after
-- reset_us: rounded up, so expiry never comes before the state is spent.
local function ttl_ms(reset_us)
  local ms = ceil_div(reset_us, 1000)
  if ms < 1 then return 1 end
  return ms
end

-- allowed (bool), remaining permits, retry-after µs (-1: never), reset-after
-- µs, the index of the reported strategy (sliding log; 0 otherwise), and
-- stable µs: how long Remaining stays as it is if nothing is granted (-1:
-- until reset), which bounds how long a deny cache may repeat a denial (an
-- allowed reply may say -1: only denials are cached).
-- An allowed reply's retry-after is 0.
--
-- Each %d is a sprintf, the dearest part of a reply: constant fields are
-- written into the format, and a denial with nothing left (the hot path of
-- an exhausted key) formats each distinct duration once and joins them.
local function reply(allowed, remaining, retry_us, reset_us, strategy, stable_us)
  if remaining < 0 then remaining = 0 end
  if not stable_us or stable_us < -1 then stable_us = -1 end
  if strategy and strategy ~= 0 then
    return string.format('%d %d %d %d %d %d', allowed and 1 or 0, remaining, retry_us, reset_us, strategy, stable_us)
  end
  if allowed then return string.format('1 %d 0 %d 0 %d', remaining, reset_us, stable_us) end
  if remaining > 0 then return string.format('0 %d %d %d 0 %d', remaining, retry_us, reset_us, stable_us) end
  local retry = string.format('%d', retry_us)
  local reset, stable = retry, retry
  if reset_us ~= retry_us then reset = string.format('%d', reset_us) end
  if stable_us == reset_us then
    stable = reset
  elseif stable_us ~= retry_us then
    stable = string.format('%d', stable_us)
  end
  return '0 0 ' .. retry .. ' ' .. reset .. ' 0 ' .. stable
end

-- The error for a key whose value is not this script's state. Nothing has
-- been written when it is returned. It does not quote the key (which may be
-- huge, or hold a NUL): the Go side names it, bounded, after the NOTOURS code.
local function not_ours(what)
  return redis.error_reply('NOTOURS holds ' .. what .. ', not redlimit state; it was left unchanged')
end
