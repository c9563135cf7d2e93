-- concurrency.lua: at most `limit` leases live on a key at any moment of
-- the key's time. A lease is live from its grant until it is released or
-- `lease` passes without an extend.
--
-- KEYS[1]  the key
-- ARGV[1]  now     Unix time (µs), or "" for the server's TIME
-- ARGV[2]  what    "<n>"           take n leases (>= 0; 0 only reports)
--                  "-<k>:<token>"  release the first k leases of a grant
--                  "=<k>:<token>"  the same, replying only how many of
--                                  them it removed (a bare release)
--                  "+<token>"      extend the leases of a grant
-- ARGV[3]  limit   leases live at once (at most 10000)
-- ARGV[4]  lease   lease length (µs)
--
-- All times are integer µs. The state is a sorted set (docs/internals.md):
-- a member per lease, named by its id (an integer never given twice on
-- the key), scored by its expiry; a lease is live while its expiry is
-- after the key's time. A member "#<recorded>:<last id>:<reach>[s]"
-- scored 0 ranks first: the key's recorded time (of its latest grant or
-- extend), the last id given, and how far past the recorded time the
-- latest lease written lapses: no lease on the key lapses later (releases
-- leave it; a meta without it has the latest lease read); "s" when the
-- server's clock wrote it (below). A grant of n leases takes
-- ids first .. first+n-1, and its token is "<first>.<n>". Lapsed members
-- are trimmed a few per grant.
--
-- The key's time is max(now, recorded). A recorded time ahead of now by
-- more than the longest lease the key holds (its latest expiry less the
-- recorded time, or this lease) is a clock gone wrong: the leases live at
-- the key's time then lapse that long from now at the latest, and a grant
-- or extend writes them so, with now as the recorded time. Denials, n == 0 and
-- releases never move the recorded time. Durations are from now.
--
-- The key's TTL runs to the end of the second (of whole Unix seconds) in
-- which its latest lease lapses. Written on the server's clock (the meta's
-- "s"), it ends there on the clock that counts it, so a grant or extend on
-- the server's clock whose latest lease lapses in the second the meta's
-- reach ends in leaves the TTL as it is.
--
-- Reply: "allowed remaining retry reset 0 stable [token]" (µs; retry -1 =
-- never; token when allowed, see above); a release's:
-- "1 remaining 0 reset 0 -1 given", or "1 0 0 0 0 -1 given" for "=".

local NOT_OURS = 'NOTOURS holds %s, not redlimit state; it was left unchanged'
local META = '^#(%d+):(%d+):?(%d*)(s?)$'
local MOST = 10000   -- the most leases a grant takes, as the largest limit
local TRIM = 8       -- lapsed leases a write trims beyond the ones it adds
local STEP = 1000000 -- µs: the key's TTL ends on a whole second
local PEEK = '4'     -- members the state's read returns: the meta, 3 lapsed leases
local CHUNK = 500    -- members per ZADD or ZREM: Lua's unpack is bounded
local unpack = table.unpack or unpack -- Lua 5.4 (Dragonfly) has no global unpack
local call, format, max, min = redis.call, string.format, math.max, math.min

local key = KEYS[1]
local limit, lease = ARGV[3] + 0, ARGV[4] + 0

-- A bare release ("=", which no observer reads: Go sends it when none is
-- set) reads no clock and counts nothing: a lease's id is never given
-- twice on the key, so removing the grant's ids frees exactly the places
-- of its leases still live, and nobody else's. It checks that the key's
-- first member is the meta (else the set is not ours), removes the first
-- k ids of the token's grant, and replies how many it removed, live or
-- lapsed. A token that names more leases than its grant took, or more than
-- a grant can, removes nothing.
if string.byte(ARGV[2]) == 61 then
  local first_member = redis.pcall('ZRANGE', key, '0', '0', 'WITHSCORES')
  if first_member.err then
    return redis.error_reply(format(NOT_OURS, 'another type than a sorted set'))
  end
  if not first_member[1] then return '1 0 0 0 0 -1 0' end
  if not string.match(first_member[1], META) or first_member[2] ~= '0' then
    return redis.error_reply(format(NOT_OURS, 'a sorted set that is not leases'))
  end
  local removed, taken, from, count = 0, string.match(ARGV[2], '^=(%d+):(%d+)%.(%d+)$')
  if taken and taken + 0 <= count + 0 and count + 0 <= MOST then
    local ids = {}
    for id = from + 0, from + taken - 1 do ids[#ids + 1] = format('%d', id) end
    for i = 1, #ids, CHUNK do
      removed = removed + call('ZREM', key, unpack(ids, i, min(#ids, i + CHUNK - 1)))
    end
  end
  return format('1 0 0 0 0 -1 %d', removed)
end

-- Read the clock: the caller's, or the server's; as a number, and as the
-- text %d formats it to (the µs zero-padded after the seconds), which the
-- common path writes as it is.
local now, now_text = tonumber(ARGV[1]), ARGV[1]
local server_clock = not now
if not now then
  local clock = call('TIME')
  now, now_text = clock[1] * 1000000 + clock[2], clock[1] .. string.sub('00000' .. clock[2], -6)
end

-- Read the state: the meta (nil: a new key) and its recorded time, last
-- id and bound (the recorded time plus the reach; nil when it does not
-- say), the key's members, and the leases lapsed by now, counted up to
-- PEEK - 1. The meta ranks first (score 0) and the lapsed leases next, so
-- one read returns the meta and the lapsed count of a key that holds
-- fewer than PEEK - 1, and ZCARD counts the live ones with them. Another
-- type, or a sorted set whose first member is not the meta, is not ours.
local head = redis.pcall('ZRANGEBYSCORE', key, '-inf', now_text, 'WITHSCORES', 'LIMIT', '0', PEEK)
if head.err then return redis.error_reply(format(NOT_OURS, 'another type than a sorted set')) end
local members = call('ZCARD', key)
local meta, recorded, last_id, bound, seen, stepped = nil, 0, 0, nil, 0, false
if members > 0 then
  local at, last, reach, s = string.match(head[1] or '', META)
  if not at or head[2] ~= '0' then
    return redis.error_reply(format(NOT_OURS, 'a sorted set that is not leases'))
  end
  meta, recorded, last_id, seen = head[1], at + 0, last + 0, math.floor(#head / 2) - 1
  if reach ~= '' then bound = recorded + reach end
  stepped = s == 's' and bound ~= nil
end

-- The key's time, and the clock gone wrong: ahead of now by more than
-- the longest lease the key holds (another configuration's may be longer).
local t = max(now, recorded)
local window = lease
if recorded > now + lease then
  local latest = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  window = max(lease, latest[2] - recorded)
end
local wrong = recorded > now + window
-- A live lease's expiry as a call reads it: its own, or on a clock gone
-- wrong, at most cap.
local cap = math.huge
if wrong then cap = now + window end

-- Count: members after the meta, lapsed first (score <= t), then live. The
-- read counted those lapsed by now, unless there may be more.
local lapsed, live = seen, 0
if t > now or seen == PEEK - 1 then
  lapsed = call('ZCOUNT', key, '(0', format('%d', t))
end
if meta then live = members - 1 - lapsed end

-- The rest is the decision, top to bottom, in commented steps. Redis
-- builds every function anew on each call, and building one costs about
-- what a short step costs to run, so the script has none: the steps are
-- written once, in line, and shared by the calls that take them: a
-- release, n == 0 and a denial reply after step 3 without writing, and
-- the grants and extends write in steps 4 and 5. Lists of members go to
-- ZADD and ZREM CHUNK at a time (a loop of one turn for a short list).
-- An integer's text is now_text for now, which is not formatted again.

-- 1. The request: n leases, or a grant's token "<first>.<n>" to release
-- (its first k leases) or to extend. A release token that is not ours
-- names no lease, and frees nothing.
local what = ARGV[2]
local sign = string.byte(what)
local release = sign == 45 -- '-'
local n, first, k = 0, 0, 0
if release then
  local taken, from, count = string.match(what, '^%-(%d+):(%d+)%.(%d+)$')
  if taken then k, first, n = taken + 0, from + 0, count + 0 end
elseif sign == 43 then -- '+': an extend
  local from, count = string.match(what, '^%+(%d+)%.(%d+)$')
  if from then first, n = from + 0, count + 0 end
  if n < 1 or n > MOST then
    return redis.error_reply('ERR redlimit: unreadable lease token')
  end
else
  n = what + 0
end

-- 2. A token's leases: those of ids first .. first+k-1 (a release) or
-- first+n-1 (an extend) that are members (found), their expiries, and how
-- many of them are live (mine). A release removes them: those live free
-- their places.
local found, expiries, mine = nil, nil, 0
if release or sign == 43 then
  found, expiries = {}, {}
  local last = first + n - 1
  if release then
    last = first + k - 1
    if k > n or n > MOST then last = first - 1 end
  end
  for id = first, last do
    local member = format('%d', id)
    local score = call('ZSCORE', key, member)
    if score then
      found[#found + 1], expiries[#found + 1] = member, score + 0
      if score + 0 > t then mine = mine + 1 end
    end
  end
end
if release then
  for i = 1, #found, CHUNK do call('ZREM', key, unpack(found, i, min(#found, i + CHUNK - 1))) end
  live = live - mine
end

-- 3. Decide an extend or a request. An extend of a grant whose leases are
-- all live moves them; one with some lapsed is the grant taken afresh
-- with its live leases as room (its ids all go, n new ones come), or
-- denied when there is none: the others must lapse, and the grant's own
-- live ones, interleaved, lapse too. excess: a denial needs the
-- excess-th earliest live lease to lapse (0: never).
local moved, excess = false, nil
if sign == 43 then
  local others = live - mine
  if mine == n then
    moved = true
  elseif n > limit then
    excess = 0
  elseif others + n > limit then
    excess = others + n - limit + mine
  else
    -- The grant's lapsed leases go with it: the trim that follows counts
    -- the lapsed leases left, and never reaches a live one.
    for i = 1, #found, CHUNK do call('ZREM', key, unpack(found, i, min(#found, i + CHUNK - 1))) end
    lapsed, live = lapsed - (#found - mine), others
  end
elseif not release then
  if n > limit then
    excess = 0
  elseif n > 0 and live + n > limit then
    excess = live + n - limit
  end
end

-- A reply that writes nothing: a release, n == 0 or a denial, as
-- "allowed remaining retry reset 0 stable", with reset the time until
-- the latest live lease lapses (the latest member) and, on a denial,
-- stable until the earliest does; a release's ends with what it gave.
if release or n == 0 or excess then
  local reset, remaining = 0, max(0, limit - live)
  if live > 0 then
    reset = min(call('ZRANGE', key, -1, -1, 'WITHSCORES')[2] + 0, cap) - now
  end
  if release then return format('1 %d 0 %d 0 -1 %d', remaining, reset, mine) end
  if not excess then return format('1 %d 0 %d 0 -1', remaining, reset) end
  local retry, stable = -1, -1
  if live > 0 then
    stable = min(call('ZRANGE', key, lapsed + 1, lapsed + 1, 'WITHSCORES')[2] + 0, cap) - now
  end
  if excess > 0 then
    local rank = lapsed + excess
    retry = min(call('ZRANGE', key, rank, rank, 'WITHSCORES')[2] + 0, cap) - now
  end
  return format('0 %d %d %d 0 %d', remaining, retry, reset, stable)
end

-- 4. The write's time: the key's, or, when the clock went wrong, now,
-- after rebasing the state on now's timeline (lapsed leases go, live ones
-- lapse a lease from now at the latest). Then the (score, member) pairs
-- it writes: the moved leases of an extend, each live another lease from
-- that time (the token stays), or n new ones with ids from first, whose
-- token the reply gives; top is the latest of them, most the lapsed
-- leases it may trim. One new lease, the common grant, needs no list:
-- step 5 writes it with the meta.
local w = t
if wrong then
  call('ZREMRANGEBYSCORE', key, '(0', format('%d', t))
  lapsed = 0
  local capped = {}
  local over = call('ZRANGEBYSCORE', key, format('(%d', now + window), '+inf')
  for _, member in ipairs(over) do
    capped[#capped + 1] = now + window
    capped[#capped + 1] = member
  end
  for i = 1, #capped, 2 * CHUNK do
    call('ZADD', key, unpack(capped, i, min(#capped, i + 2 * CHUNK - 1)))
  end
  w = now
end
local leases, top, most = nil, w + lease, TRIM
if moved then
  leases = {}
  for i, member in ipairs(found) do
    leases[#leases + 1] = max(min(expiries[i], cap), w + lease)
    leases[#leases + 1] = member
    top = max(top, leases[#leases - 1])
  end
else
  first = max(last_id + 1, w)
  if n > 1 then
    leases = {}
    for id = first, first + n - 1 do
      leases[#leases + 1] = top
      leases[#leases + 1] = id == now and now_text or format('%d', id)
    end
  end
  last_id, live, most = first + n - 1, live + n, n + TRIM
end

-- 5. Commit: trim up to most lapsed leases, the earliest first, write the
-- leases and the meta recording w, the last id and the latest expiry's
-- reach past w, and keep the key until the end of the second its latest
-- lease lapses in (the TTL, above). The old meta ranks first, just before
-- the lapsed leases, so one ZREMRANGEBYRANK drops it with them and one
-- ZADD writes the leases with the new meta. The latest expiry is top when
-- the old meta's bound is not later (a key of one configuration); else it
-- is read. A reach of a lease is the lease's text, as Go sent it.
local latest = top
if meta then
  call('ZREMRANGEBYRANK', key, '0', min(lapsed, most))
  if not (bound and bound <= top) then
    local last = call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if last[2] then latest = max(top, last[2] + 0) end
  end
end
local reach = ARGV[4]
if latest - w ~= lease then reach = format('%d', latest - w) end
meta = '#' .. (w == now and now_text or format('%d', w)) .. ':' ..
  (last_id == now and now_text or format('%d', last_id)) .. ':' .. reach
if server_clock then meta = meta .. 's' end
if leases then
  leases[#leases + 1] = '0'
  leases[#leases + 1] = meta
  for i = 1, #leases, 2 * CHUNK do
    call('ZADD', key, unpack(leases, i, min(#leases, i + 2 * CHUNK - 1)))
  end
else
  call('ZADD', key, top, first == now and now_text or format('%d', first), '0', meta)
end
-- The TTL ends with the second latest lapses in. One the server's clock
-- set (stepped) ends with the second of the old meta's bound, on the
-- server's clock: it is left when that is the same second.
local ends = latest + (-latest) % STEP
if not (server_clock and stepped and bound + (-bound) % STEP == ends) then
  call('PEXPIRE', key, math.ceil((ends - now) / 1000))
end

-- The reply: allowed, with the token of the n leases from first.
return format('1 %d 0 %d 0 -1 %s.%d', max(0, limit - live), min(latest, cap) - now,
  first == now and now_text or format('%d', first), n)
