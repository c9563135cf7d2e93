-- common.lua: helpers every redlimit script starts with (the Go side joins
-- this file and the algorithm's body into one script).
--
-- Every script takes one key, KEYS[1], and ARGV[1] = now in Unix µs, or ""
-- to read the Redis server's TIME; ARGV[2] = n, the permits asked for.
-- All times and durations are integer microseconds held in Lua numbers
-- (doubles): exact below 2^53, and the Go side keeps every value under it.
-- Every script replies with one string of five integers, see reply().

-- floor(a / b) for integers a >= 0, b > 0, exact even where a / b rounds.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b) for integers a >= 0, b > 0.
local function ceil_div(a, b)
  local q = idiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- Writing after TIME needs effects replication, the default since Redis 5.
local function now_us()
  if ARGV[1] ~= '' then return tonumber(ARGV[1]) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- A key's TTL in ms for state that is back to its initial value after
-- reset_us: rounded up, so expiry never comes before the state is spent.
local function ttl_ms(reset_us)
  return math.max(1, ceil_div(reset_us, 1000))
end

-- allowed (bool), remaining permits, retry-after µs (-1: never), reset-after
-- µs, the index of the reported strategy (sliding log; 0 otherwise), and
-- stable µs: how long Remaining stays as it is if nothing is granted (-1:
-- until reset), which bounds how long a deny cache may repeat this reply.
local function reply(allowed, remaining, retry_us, reset_us, strategy, stable_us)
  return string.format('%d %d %d %d %d %d', allowed and 1 or 0, math.max(0, remaining),
    retry_us, reset_us, strategy or 0, math.max(-1, stable_us or -1))
end

-- The error for a key whose value is not this script's state. Nothing has
-- been written when it is returned. It does not quote the key (which may be
-- huge, or hold a NUL): the Go side names it, bounded, after the NOTOURS code.
local function not_ours(what)
  return redis.error_reply('NOTOURS holds ' .. what .. ', not redlimit state; it was left unchanged')
end

-- GET, or nil and an error reply when the key holds another type.
local function get_string(what)
  local raw = redis.pcall('GET', KEYS[1])
  if type(raw) == 'table' and raw.err then return nil, not_ours('another type than ' .. what) end
  return raw
end
