-- concurrency.lua: at most `limit` leases live on a key at any moment of
-- the key's time. A lease is live from its grant until it is released or
-- `lease` passes without an extend.
--
-- KEYS[1]  the key
-- ARGV[1]  now     Unix time (µs), or "" for the server's TIME
-- ARGV[2]  what    "<n>"           take n leases (>= 0; 0 only reports)
--                  "-<k>:<token>"  release the first k leases of a grant
--                  "+<token>"      extend the leases of a grant
-- ARGV[3]  limit   leases live at once (at most 10000)
-- ARGV[4]  lease   lease length (µs)
--
-- All times are integer µs. The state is a sorted set (docs/internals.md):
-- a member per lease, named by its id (an integer never given twice on
-- the key), scored by its expiry; a lease is live while its expiry is
-- after the key's time. A member "#<recorded>:<last id>" scored 0 ranks
-- first: the key's recorded time (of its latest grant or extend) and the
-- last id given. A grant of n leases takes ids first .. first+n-1, and its
-- token is "<first>.<n>". Lapsed members are trimmed a few per grant.
--
-- The key's time is max(now, recorded). A recorded time ahead of now by
-- more than the longest lease the key holds (its latest expiry less the
-- recorded time, or this lease) is a clock gone wrong: the leases live at
-- the key's time then lapse that long from now at the latest, and a grant
-- or extend writes them so, with now as the recorded time. Denials, n == 0 and
-- releases never move the recorded time. Durations are from now.
--
-- Reply: "allowed remaining retry reset 0 stable [token]" (µs; retry -1 =
-- never; token when allowed, see above); a release's:
-- "1 remaining 0 reset 0 -1 given".

local NOT_OURS = 'NOTOURS holds %s, not redlimit state; it was left unchanged'
local META = '^#(%d+):(%d+)$'
local MOST = 10000 -- the most leases a grant takes, as the largest limit
local TRIM = 8     -- lapsed leases a write trims beyond the ones it adds
local CHUNK = 500  -- members per ZADD or ZREM: Lua's unpack is bounded
local unpack = table.unpack or unpack -- Lua 5.4 (Dragonfly) has no global unpack

local key = KEYS[1]
local limit, lease = ARGV[3] + 0, ARGV[4] + 0

-- The clock: the caller's, or the server's.
local function read_clock()
  local now = tonumber(ARGV[1])
  if now then return now end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- read_state returns the recorded time, the last id and the meta member
-- (nil: a new key), or an error reply for a value that is not ours.
local function read_state()
  local first = redis.pcall('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first.err then
    local what = 'another type than a sorted set'
    return nil, nil, nil, redis.error_reply(string.format(NOT_OURS, what))
  end
  if #first == 0 then return 0, 0, nil end
  local recorded, last = string.match(first[1], META)
  if not recorded or first[2] ~= '0' then
    local what = 'a sorted set that is not leases'
    return nil, nil, nil, redis.error_reply(string.format(NOT_OURS, what))
  end
  return recorded + 0, last + 0, first[1]
end

local now = read_clock()
local recorded, last_id, meta, foreign = read_state()
if foreign then return foreign end

-- The key's time, and the clock gone wrong: ahead of now by more than
-- the longest lease the key holds (another configuration's may be longer).
local t = math.max(now, recorded)
local window = lease
if recorded > now + lease then
  local latest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  window = math.max(lease, latest[2] - recorded)
end
local wrong = recorded > now + window

-- Count: members after the meta, lapsed first (score <= t), then live.
local lapsed = redis.call('ZCOUNT', key, '(0', string.format('%d', t))
local live = 0
if meta then live = redis.call('ZCARD', key) - 1 - lapsed end

-- effective is the expiry a call reads for a live lease's own.
local function effective(expiry)
  if wrong then return math.min(expiry, now + window) end
  return expiry
end

-- expiry_at returns the effective expiry of the i-th earliest live lease.
local function expiry_at(i)
  local m = redis.call('ZRANGE', key, lapsed + i, lapsed + i, 'WITHSCORES')
  return effective(m[2] + 0)
end

-- report returns "remaining retry reset" for count live leases, the
-- latest of which lapses at latest (nil: it is read).
local function report(count, retry, latest)
  local reset = 0
  if count > 0 then
    if not latest then
      latest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2] + 0
    end
    reset = effective(latest) - now
  end
  return string.format('%d %d %d', math.max(0, limit - count), retry, reset)
end

-- deny replies a denial that needs the excess-th earliest live lease to
-- lapse (excess 0: never).
local function deny(excess)
  local retry, stable = -1, -1
  if live > 0 then stable = expiry_at(1) - now end
  if excess > 0 then retry = expiry_at(excess) - now end
  return string.format('0 %s 0 %d', report(live, retry), stable)
end

-- each_chunk calls command on the members of list, CHUNK at a time.
local function each_chunk(command, list, per)
  for i = 1, #list, CHUNK * per do
    redis.call(command, key, unpack(list, i, math.min(#list, i + CHUNK * per - 1)))
  end
end

-- ids_of returns the ids first .. first+n-1 that are members, their
-- expiries, and how many of them are live.
local function ids_of(first, n)
  local found, expiries, alive = {}, {}, 0
  for id = first, first + n - 1 do
    local member = string.format('%d', id)
    local score = redis.call('ZSCORE', key, member)
    if score then
      found[#found + 1], expiries[#found + 1] = member, score + 0
      if score + 0 > t then alive = alive + 1 end
    end
  end
  return found, expiries, alive
end

-- write_time rebases the state on now's timeline when the clock went
-- wrong (lapsed leases go, live ones lapse a lease from now at the
-- latest) and returns the time a grant or extend writes from.
local function write_time()
  if not wrong then return t end
  redis.call('ZREMRANGEBYSCORE', key, '(0', string.format('%d', t))
  lapsed = 0
  local capped = {}
  local over = redis.call('ZRANGEBYSCORE', key, string.format('(%d', now + window), '+inf')
  for _, member in ipairs(over) do
    capped[#capped + 1] = now + window
    capped[#capped + 1] = member
  end
  each_chunk('ZADD', capped, 2)
  return now
end

-- commit writes a grant or an extend: it trims up to most lapsed leases,
-- the earliest first, writes the (score, member) pairs of leases and the
-- meta recording w and the last id, and keeps the key until its latest
-- lease lapses, whose expiry it returns. The old meta ranks first, just
-- before the lapsed leases, so one ZREMRANGEBYRANK drops it with them and
-- one ZADD writes the leases with the new meta: a grant sends 3 commands
-- fewer than trimming, replacing the meta and reporting the latest
-- expiry each on its own.
local function commit(w, leases, most)
  local j = math.min(lapsed, most)
  if meta then redis.call('ZREMRANGEBYRANK', key, 0, j) end
  lapsed = lapsed - j
  meta = string.format('#%d:%d', w, last_id)
  leases[#leases + 1] = 0
  leases[#leases + 1] = meta
  each_chunk('ZADD', leases, 2)
  local latest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2] + 0
  redis.call('PEXPIRE', key, math.ceil((latest - now) / 1000))
  return latest
end

-- take adds n leases lapsing a lease after w and returns their token and
-- the latest expiry.
local function take(w, n)
  local first = math.max(last_id + 1, w)
  local added = {}
  for id = first, first + n - 1 do
    added[#added + 1] = w + lease
    added[#added + 1] = string.format('%d', id)
  end
  last_id = first + n - 1
  live = live + n
  return string.format('%d.%d', first, n), commit(w, added, n + TRIM)
end

-- grant replies an allowed call with its token; latest is the latest
-- expiry, as commit returned it.
local function grant(token, latest)
  return string.format('1 %s 0 -1 %s', report(live, 0, latest), token)
end

-- Release: the first k leases of a grant; those live free their places.
local function release(k, first, n)
  local given = 0
  if k <= n and n <= MOST then
    local found, _, alive = ids_of(first, k)
    each_chunk('ZREM', found, 1)
    given, live = alive, live - alive
  end
  return string.format('1 %s 0 -1 %d', report(live, 0), given)
end

-- Extend: all of a grant's leases live another lease from the key's time,
-- or, when some lapsed, the grant taken afresh with its live leases as
-- room (its ids all go, n new ones come); denied when there is none.
local function extend(first, n)
  if n < 1 or n > MOST then
    return redis.error_reply('ERR redlimit: unreadable lease token')
  end
  local found, expiries, mine = ids_of(first, n)
  local others = live - mine
  if mine == n then
    local w = write_time()
    local moved = {}
    for i, member in ipairs(found) do
      moved[#moved + 1] = math.max(effective(expiries[i]), w + lease)
      moved[#moved + 1] = member
    end
    return grant(string.format('%d.%d', first, n), commit(w, moved, TRIM))
  end
  if n > limit then return deny(0) end
  -- The others must lapse: the grant's own, interleaved, lapse too.
  if others + n > limit then return deny(others + n - limit + mine) end
  -- The grant's lapsed leases go with it: the trim that follows counts
  -- the lapsed leases left, and never reaches a live one.
  each_chunk('ZREM', found, 1)
  lapsed, live = lapsed - (#found - mine), others
  return grant(take(write_time(), n))
end

-- Decide: a release, an extend, or a request for n leases.
local what = ARGV[2]
local sign = string.sub(what, 1, 1)
if sign == '-' then
  local k, first, n = string.match(what, '^%-(%d+):(%d+)%.(%d+)$')
  if not k then return release(1, 0, 0) end -- not a token of ours
  return release(k + 0, first + 0, n + 0)
end
if sign == '+' then
  local first, n = string.match(what, '^%+(%d+)%.(%d+)$')
  if not first then return extend(0, 0) end
  return extend(first + 0, n + 0)
end
local n = what + 0
if n > limit then return deny(0) end
if n == 0 then return string.format('1 %s 0 -1', report(live, 0)) end
if live + n > limit then return deny(live + n - limit) end
return grant(take(write_time(), n))
