-- sliding.lua: the sliding window and the sliding log. A configuration has a
-- precision P and one or more strategies (L_i, S_i): at most L_i permits in
-- the S_i buckets of P ending with the bucket of the key's time. A request
-- is allowed only if every strategy allows it.
--
-- KEYS[1]  the key
-- ARGV[1]  now: Unix µs, or "" to read the Redis server's TIME
-- ARGV[2]  n: permits asked for (>= 0); or a refund, "-<k>:<token>": give
--          back permits of the grant the token names until k in all were
-- ARGV[3]  kind: "w" for a sliding window, "l" for a sliding log (each
--          reads the other's state as foreign)
-- ARGV[4]  precision P: this configuration's bucket length (µs)
-- ARGV[5]  limit L_1 of the shortest strategy (permits)
-- ARGV[6]  size S_1 of the shortest strategy (its window in buckets of P)
-- ...      L_i, S_i of each next strategy, windows and limits ascending
-- last     under WithPrefix only: "1", the key may be shared with other
--          configurations (a default key's prefix names its configuration)
--
-- Times are integer µs in Lua numbers, exact below 2^53, sent to Redis
-- through format('%d') (Lua's own conversion keeps 14 digits). Counts are
-- kept modulo COUNTS = 2^52: a count in a window is a difference of two.
--
-- State, format 10 (docs/internals.md), a sorted set:
--   score 0       the note "<kind>:K t", then " d" under WithPrefix: K the
--                 key's count (every permit it granted), t the key's time
--                 (the latest clock a grant decided at), t + d the tail.
--   score 1       the aux, only once the key trimmed buckets or took a
--                 refund: "<kind>+base C H x g", then " lo hi" for each range
--                 of refunded positions (see refund).
--   score e       a bucket before the tail that holds permits: e is its
--                 position (µs), the member the key's count up to it.
--   ENTRY0 + e    under WithPrefix, a configuration that granted, its last
--                 grant at position e: "P L_1 S_1 L_2 S_2 ...".
--   +inf          under WithPrefix, the meta "<kind> Ln Wn Lm": the densest
--                 strategy of any writer, Ln per Wn µs, and their largest Lm.
-- A grant by precision P at the key's time t is recorded at the last µs of
-- its bucket, e = end(t, P), or in the tail when that is later: a bucket's
-- position is never before any of its grants, so every configuration counts
-- it as late as it could have been granted (never looser), and a
-- configuration alone on the key counts its own grants exactly.
--
-- The reply is six integers: allowed (0/1), remaining, retry-after µs (-1:
-- never), reset-after µs, the index of the strategy reported, and stable µs
-- (how long the same request gets the same reply but for its durations:
-- the deny cache's bound); and, after a grant, the grant's token
-- "e.s.n" (its bucket's position, the key's count after it, its permits: its
-- permits are the positions [s - n, s) of the count). A refund
-- replies "1 remaining 0 reset strategy -1 given".
--
-- The steps are the functions below, in the order a decision runs them:
-- read_args, read_state, key_time, strategies, (refund), check, decide,
-- apply, write, reply.

local unpack = table.unpack or unpack
local find, match, format, floor = string.find, string.match, string.format, math.floor
local COUNTS = 4503599627370496 -- 2^52
local ENTRY0 = 4503599627370496 -- entries' scores: 2^52 + a position below 2^52
local FIRST = 2 -- the lowest score a bucket can have (its position is at least 999)
local SCAN = 8 -- most buckets one call reads to find a RetryAfter, or trims
local RANGES = 16 -- most ranges of refunded positions a key keeps
-- Every floor(a / b) here is exact: for integers 0 <= a < 2^53 and b >= 1,
-- a / b never rounds up to an integer.

-- The last µs of the bucket of p µs that holds time t.
local function bucket_end(t, p)
  return t - t % p + p - 1
end

-- The time a bucket at position e leaves the window of S buckets of p µs.
local function leaves(e, S, p)
  return (floor(e / p) + S) * p
end

-- The first µs of the window of S buckets of p µs at time t.
local function window_start(t, S, p)
  return t - t % p - (S - 1) * p
end

-- The densest strategy (most permits per µs) of ARGV's configuration.
local function densest(req)
  local L, W = 0, 1
  for i = 1, req.own do
    local l, w = req.limits[i], req.sizes[i] * req.P
    if l * W > L * w then L, W = l, w end
  end
  return L, W
end

-- read_args: the request (n, or a refund) and the caller's configuration.
local function read_args()
  local req = {key = KEYS[1], kind = ARGV[3], P = ARGV[4] + 0, n = 0}
  local now = ARGV[1]
  if now == '' then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  end
  req.clock = now + 0
  local last = #ARGV
  req.shared = last % 2 == 1
  if req.shared then last = last - 1 end
  req.sig = table.concat(ARGV, ' ', 4, last)
  req.own, req.limits, req.sizes = (last - 4) / 2, {}, {}
  for i = 1, req.own do
    req.limits[i], req.sizes[i] = ARGV[2 * i + 3] + 0, ARGV[2 * i + 4] + 0
  end
  req.smallest, req.longest = req.limits[1], req.sizes[req.own] * req.P
  if find(ARGV[2], '^%-') then
    -- A token this script did not make reads as a grant that gives nothing.
    local k, e, s, n = match(ARGV[2], '^%-(%d+):(%d+)%.(%d+)%.(%d+)$')
    req.refund = {k = (k or 0) + 0, e = (e or -1) + 0, s = (s or 0) + 0, n = (n or 0) + 0}
  else
    req.n = ARGV[2] + 0
  end
  return req
end

-- read_state: the note and the aux (ZRANGE 0 1), then under WithPrefix the
-- entries and the meta. An empty key reads as a state with no grant (t = -1).
-- Anything else at the key is foreign: an error, and the key is left as it is.
local function read_state(req)
  local st = {K = 0, t = -1, T = -1, base = 0, C = 0, H = 0, x = 0, g = 0, ranges = {}}
  local rows = redis.pcall('ZRANGE', req.key, '0', '1')
  if rows.err then return nil, 'another type than sliding state' end
  if not rows[1] then return st end
  local k, t, d = match(rows[1], '^' .. req.kind .. ':(%d+) (%d+) ?(%d*)$')
  if not k or k + 0 >= COUNTS then return nil, 'a sorted set that is not sliding state' end
  st.note, st.K, st.t = rows[1], k + 0, t + 0
  st.T = bucket_end(st.t, req.P)
  if d ~= '' then st.T = st.t + d end
  local aux = rows[2] or ''
  local base, C, H, x, g, at = match(aux, '^' .. req.kind .. '%+(%d+) (%d+) (%d+) (%d+) (%d+)()')
  if base then
    st.aux, st.base, st.C, st.H, st.x, st.g = aux, base + 0, C + 0, H + 0, x + 0, g + 0
    for lo, hi in string.gmatch(string.sub(aux, at), ' (%d+) (%d+)') do
      st.ranges[#st.ranges + 1] = {lo = lo + 0, hi = hi + 0}
    end
  end
  if req.shared then
    local entries = redis.call('ZRANGEBYSCORE', req.key, format('%d', ENTRY0), '+inf', 'WITHSCORES')
    local ln, wn, lm = match(entries[#entries - 1] or '', '^' .. req.kind .. ' (%d+) (%d+) (%d+)$')
    if ln then
      st.meta, st.Ln, st.Wn, st.Lm = entries[#entries - 1], ln + 0, wn + 0, lm + 0
      entries[#entries], entries[#entries - 1] = nil, nil
    end
    st.entries = entries
  end
  return st
end

-- key_time: a call decides at the key's time, the later of its clock and
-- the time the key recorded at its last grant, so that no clock behind
-- another's reopens what the key already counted, and nothing accumulates
-- (the key's time is always a time some clock read). A recorded time ahead
-- of the clock by more than the caller's longest window is a clock gone
-- wrong: the call decides on its own clock, counting all the key holds as
-- used (check), so that the key is stricter for at most that window.
local function key_time(req, st)
  if st.t <= req.clock then return req.clock, false end
  if st.t - req.clock > req.longest then return req.clock, true end
  return st.t, false
end

-- strategies: the caller's own, then those of every other configuration
-- whose last grant is still in its longest window (it binds until then),
-- each {L, S, p, index (0: another's), till}. A configuration that differs
-- from the caller only in its limits (the same precision and windows) is
-- left out: the caller's limits govern those windows, so a plan upgrade
-- keeps what was used. Also R, the longest window of the caller and every
-- live configuration (buckets before it count for no one), stable, the time
-- until the first configuration lapses, and own_at, the caller's entry.
local function strategies(req, st, now)
  local list, R, stable, own_at = {}, req.longest, math.huge, nil
  for i = 1, req.own do
    list[i] = {L = req.limits[i], S = req.sizes[i], p = req.P, index = i}
  end
  local entries = st.entries or {}
  local shape = string.gsub(req.sig, ' %d+ (%d+)', ' %1')
  for j = 1, #entries, 2 do
    local text, at = entries[j], entries[j + 1] - ENTRY0
    local p, limits = match(text, '^(%d+)(.*)$')
    p = p + 0
    local longest = match(limits, '(%d+)$') * p
    local till = leaves(at, longest / p, p)
    if text == req.sig then
      own_at = at
    elseif till > now then
      if longest > R then R = longest end
      if string.gsub(text, ' %d+ (%d+)', ' %1') ~= shape then
        if till - req.clock < stable then stable = till - req.clock end
        for L, S in string.gmatch(limits, ' (%d+) (%d+)') do
          list[#list + 1] = {L = L + 0, S = S + 0, p = p, index = 0, till = till}
        end
      end
    end
  end
  return list, R, stable, own_at
end

-- The refunded positions from lo up to hi (modulo COUNTS: past the wrap,
-- [lo, COUNTS) and [0, hi)), see refund.
local function refunded(st, lo, hi)
  if lo > hi then return refunded(st, lo, COUNTS) + refunded(st, 0, hi) end
  local sum = 0
  for _, r in ipairs(st.ranges) do
    local from, to = math.max(r.lo, lo), math.min(r.hi, hi)
    if to > from then sum = sum + to - from end
  end
  return sum
end

-- The permits refunds gave back at positions from p (a window's first) to
-- the key's count: those of the ranges, and the g of ranges dropped (x g,
-- see refund) when the window holds all of them (p <= x; past the wrap,
-- p > K, it does).
local function refunded_from(st, p)
  local sum = refunded(st, p, st.K)
  if st.g > 0 and (p <= st.x or p > st.K) then sum = sum + st.g end
  return sum
end

-- The permits in the window from ws to the tail: the key's count minus the
-- count before ws (the last bucket before it, else base), minus what
-- refunds gave back there. A window reaching buckets trimmed away (at or
-- before C: a configuration whose window is longer than any that granted
-- since) counts what they held as used, up to what any writer could have
-- granted there: Ln * ceil(U / Wn) + 2 * Lm in U µs.
local function count_from(req, st, ws)
  if st.T < ws then return 0, st.K, 0 end
  local row = redis.call('ZREVRANGEBYSCORE', req.key, format('(%d', ws), FIRST, 'LIMIT', '0', '1')
  local before, unseen = st.base % COUNTS, 0
  if row[1] then
    before = row[1] + 0
  elseif ws <= st.C then
    local Ln, Wn, Lm = st.Ln, st.Wn, st.Lm
    if not Ln then
      Ln, Wn = densest(req)
      Lm = Ln
    end
    unseen = math.min(st.base, Ln * floor((st.C - ws + Wn) / Wn) + 2 * Lm)
  end
  return (st.K - before) % COUNTS + unseen - refunded_from(st, before), before, unseen
end

-- The time (from the clock) a denied strategy frees need permits: the first
-- bucket of its window whose permits from the window's start reach need
-- leaves it. Each bucket holds a permit but those refunds emptied (each at
-- least one refunded position), so that one is among the first need + |R| + g. It
-- reads at most SCAN buckets; when the bucket is not among them, the time
-- the tail leaves: longer than the truth, never shorter.
-- Also the time its first bucket leaves (its count's first change). What
-- the window holds of buckets trimmed away (unseen) leaves before any bucket.
local function retry_after(req, st, s, ws, before, unseen, need)
  local now = req.clock
  local tail = leaves(st.T, s.S, s.p) - now
  local most = need + refunded(st, 0, COUNTS) + st.g
  local got = redis.call('ZRANGEBYSCORE', req.key, format('%d', ws), format('(%d', ENTRY0),
    'WITHSCORES', 'LIMIT', '0', math.min(most, SCAN))
  if not got[2] then return tail, tail end
  local first = leaves(got[2] + 0, s.S, s.p) - now
  for j = 1, #got, 2 do
    local e = got[j + 1] + 0
    local freed = unseen + (got[j] - before) % COUNTS - refunded_from(st, before)
      + refunded_from(st, got[j] + 0)
    if freed >= need then return leaves(e, s.S, s.p) - now, first end
  end
  return tail, first
end

-- check: each strategy's count, and what the decision and the reply need:
-- the fewest permits left (and the caller's strategy with the fewest), the
-- latest time the tail leaves a window, whether some strategy denies n, the
-- longest RetryAfter and its strategy, and stable, the time until the first
-- count could drop. Durations are from the caller's clock, which may be
-- behind the key's time. On a clock gone wrong, the key reads as if all it
-- holds (the caller's longest window at the key's recorded time) had been
-- granted in the clock's bucket: every strategy counts it, until it leaves.
local function check(req, st, list, now, wrong, n)
  local c = {fewest = math.huge, own_fewest = math.huge, own_index = 1, reset = 0, retry = -1,
    stable = math.huge}
  local held, tail_at = nil, st.T
  if wrong then
    held = count_from(req, st, window_start(st.t, req.sizes[req.own], req.P))
    tail_at = -1
    if held > 0 then tail_at = bucket_end(now, req.P) end
  end
  for _, s in ipairs(list) do
    local ws = window_start(now, s.S, s.p)
    local count, before, unseen = held, nil, nil
    if not wrong then count, before, unseen = count_from(req, st, ws) end
    local left = s.L - count
    if left < c.fewest then c.fewest = left end
    if left < 0 then left = 0 end
    if s.index > 0 and left < c.own_fewest then c.own_fewest, c.own_index = left, s.index end
    local tail = 0
    if tail_at >= 0 then tail = leaves(tail_at, s.S, s.p) - req.clock end
    if tail > c.reset then c.reset = tail end
    if n > 0 and n <= req.smallest and count + n > s.L then
      -- A denying strategy. Only these are in a denial's reply (every other
      -- has n permits left, more than any of these), so stable is the time
      -- the first of their counts drops: the next step of a window where
      -- the script does not know when.
      c.denied = true
      local retry, change = tail, now - now % s.p + s.p - req.clock
      if n > s.L then
        retry = s.till - req.clock -- another configuration's limit below n
      elseif not wrong then
        retry, change = retry_after(req, st, s, ws, before, unseen, count + n - s.L)
      end
      if retry > c.retry then c.reported, c.retry = s.index, retry end
      if change < c.stable then c.stable = change end
    end
  end
  return c, held
end

-- decide: n above the caller's smallest limit is denied (RetryAfter never,
-- its first strategy reported); n == 0 is allowed; otherwise allowed unless
-- a strategy denied. A denial reports the caller's strategy with the
-- longest RetryAfter, or, when another configuration's waits longest, the
-- caller's with the fewest permits left, with that RetryAfter.
local function decide(req, c, wrong)
  if req.n > req.smallest then
    c.allowed, c.reported, c.retry, c.stable = false, 1, -1, 0
  elseif c.denied then
    c.allowed = false
    if c.reported == 0 then c.reported = c.own_index end
  else
    c.allowed = true
  end
  if wrong then c.stable = 0 end
  return c.allowed and req.n > 0
end

-- The aux's text: base, C, the refunds' horizon H, dropped x g, the ranges.
local function aux_text(req, st)
  local text = {format('%s+%d %d %d %d %d', req.kind, st.base, st.C, st.H, st.x, st.g)}
  for _, r in ipairs(st.ranges) do
    text[#text + 1] = format(' %d %d', r.lo, r.hi)
  end
  return table.concat(text)
end

-- apply: a grant is n more permits at the position of the key's time's
-- bucket (or the tail's, when that is later). When the tail moves, the old
-- tail becomes a bucket, and a tail that passes a multiple of SCAN buckets
-- of P trims up to SCAN buckets that left every live window (R): it keeps
-- up, as at most SCAN buckets opened since, and base and C remember the
-- count and position of the last bucket trimmed. When to trim depends on
-- positions only, never on counts, so that a refund leaves the key as a
-- grant of fewer permits would. Under WithPrefix, the meta keeps the
-- densest writer.
-- Returns what write needs: the new note, aux and meta texts.
local function apply(req, st, now, R)
  local e = math.max(bucket_end(now, req.P), st.T)
  local w = {e = e, moved = e ~= st.T, K = (st.K + req.n) % COUNTS, aux = st.aux}
  if st.K + req.n >= COUNTS then
    -- The wrap: trimmed grants then count as what the writers could grant.
    -- Positions start again from 0: no earlier grant refunds (stricter).
    st.base, st.H, st.x, st.g, st.ranges = st.base % COUNTS + COUNTS, 0, 0, 0, {}
    w.aux = nil
  end
  local period = SCAN * req.P
  if w.moved and st.T >= 0 and floor(e / period) > floor(st.T / period) then
    local trimmed = redis.call('ZRANGEBYSCORE', req.key, FIRST, format('%d', now - R),
      'WITHSCORES', 'LIMIT', '0', SCAN)
    if #trimmed > 0 then
      redis.call('ZREMRANGEBYSCORE', req.key, FIRST, trimmed[#trimmed])
      st.base = trimmed[#trimmed - 1] + st.base - st.base % COUNTS
      st.C, w.aux = trimmed[#trimmed] + 0, nil
    end
    if #trimmed < 2 * SCAN and st.T <= now - R then
      -- The old tail left every window too: it never becomes a bucket.
      st.base = st.K + st.base - st.base % COUNTS
      st.C, w.aux, w.tail_gone = st.T, nil, true
    end
  end
  w.note = format('%s:%d %d', req.kind, w.K, now)
  if req.shared then
    w.note = format('%s %d', w.note, e - now)
    local Ld, Wd = densest(req)
    local Ln, Wn, Lm = st.Ln or Ld, st.Wn or Wd, math.max(st.Lm or Ld, Ld)
    if Ld * Wn > Ln * Wd then Ln, Wn = Ld, Wd end
    w.meta = format('%s %d %d %d', req.kind, Ln, Wn, Lm)
  end
  if not w.aux and (st.base > 0 or st.C > 0 or st.H > 0) then w.aux = aux_text(req, st) end
  return w
end

-- The TTL (ms) a key needs after a grant: until its tail leaves the longest
-- window of the caller and of every configuration still live.
local function expire(req, list, e)
  local last = leaves(e, req.sizes[req.own], req.P)
  for _, s in ipairs(list) do
    last = math.max(last, leaves(e, s.S, s.p))
  end
  redis.call('PEXPIRE', req.key, floor((last - req.clock + 999) / 1000))
end

-- write: a grant's state. The new members go in before the old ones go, as
-- a set left empty even for a moment is a deleted key. The old tail joins
-- the buckets when the tail moved. Under WithPrefix, the caller's entry
-- moves to the new position, and entries that lapsed go. The TTL is set when
-- the tail or the caller's entry moved (else an earlier grant set it).
local function write(req, st, w, list, now, R, own_at)
  local add, gone = {'ZADD', req.key, '0', w.note}, {'ZREM', req.key}
  if w.moved and st.T >= 0 and not w.tail_gone then
    add[5], add[6] = format('%d', st.T), format('%d', st.K)
  end
  if w.aux and w.aux ~= st.aux then add[#add + 1], add[#add + 2] = '1', w.aux end
  if w.meta and w.meta ~= st.meta then add[#add + 1], add[#add + 2] = '+inf', w.meta end
  redis.call(unpack(add))
  if st.note then gone[#gone + 1] = st.note end
  if st.aux and w.aux and st.aux ~= w.aux then gone[#gone + 1] = st.aux end
  if st.meta and w.meta and st.meta ~= w.meta then gone[#gone + 1] = st.meta end
  if #gone > 2 then redis.call(unpack(gone)) end
  local entry_moved = req.shared and w.e ~= own_at
  if entry_moved then
    redis.call('ZADD', req.key, format('%d', ENTRY0 + w.e), req.sig)
    if w.moved then
      redis.call('ZREMRANGEBYSCORE', req.key, format('%d', ENTRY0), format('(%d', ENTRY0 + now - R))
    end
  end
  if w.moved or entry_moved then expire(req, list, w.e) end
end

-- restart: a grant on a clock gone wrong moves the key to the caller's
-- timeline, carrying what it held: a fresh state whose tail, at the
-- clock's bucket, holds all of it (counted for at most a window from now),
-- whose horizon refuses refunds of every earlier grant, and whose entries
-- still live move back to the tail. UNLINK frees a large set off the script.
local function restart(req, st, list, held, now)
  local e, K = bucket_end(now, req.P), (st.K + req.n) % COUNTS
  redis.call('UNLINK', req.key)
  st.base, st.C, st.H, st.x, st.g, st.ranges = (st.K - held) % COUNTS, 0, st.K, 0, 0, {}
  local add = {'ZADD', req.key, '0', format('%s:%d %d', req.kind, K, now), '1', aux_text(req, st)}
  if req.shared then
    add[4] = format('%s %d', add[4], e - now)
    if st.meta then add[#add + 1], add[#add + 2] = '+inf', st.meta end
    local entries = st.entries
    for j = 1, #entries, 2 do
      local at, p, S = entries[j + 1] - ENTRY0, match(entries[j], '^(%d+) .* (%d+)$')
      if entries[j] ~= req.sig and leaves(at, S + 0, p + 0) > now then
        add[#add + 1], add[#add + 2] = format('%d', ENTRY0 + math.min(at, e)), entries[j]
      end
    end
    add[#add + 1], add[#add + 2] = format('%d', ENTRY0 + e), req.sig
  end
  redis.call(unpack(add))
  expire(req, list, e)
  return e, K
end

-- refund: gives back permits of the grant in the bucket at e whose permits
-- are the positions [a, s) of the key's count, a = s - n, until k in all
-- were given back. The aux keeps the refunded positions R as ranges [lo, hi),
-- sorted, touching ones merged; what the grant gave back is R's prefix of its
-- positions, so that a retried refund gives nothing more. It gives while the
-- bucket is kept (after C: a configuration whose window reaches it counts
-- it), at or past the horizon H, and not on a clock gone wrong; the grant's
-- permits must lie in the bucket at e (a token of another key, or another
-- life of this one, gives nothing). Ranges of trimmed positions go; when a
-- range more than RANGES would be kept, the lowest goes and H rises to its
-- hi: a grant starting below gives nothing more. Its permits join x g (g
-- given back in windows that hold x, the lowest position dropped, and so
-- every dropped one): stricter once x leaves a window, never looser.
-- Returns the permits given.
local function refund(req, st, wrong)
  local f = req.refund
  local a = f.s - f.n
  if wrong or f.n < 1 or f.e <= st.C or f.e > st.T or f.s > st.K or a < st.H then return 0 end
  local rows = redis.call('ZREVRANGEBYSCORE', req.key, format('%d', f.e), FIRST,
    'WITHSCORES', 'LIMIT', '0', '2')
  local upto, prev = st.K, st.base % COUNTS
  if f.e ~= st.T then
    if rows[2] ~= format('%d', f.e) then return 0 end
    upto, rows[1], rows[2] = rows[1] + 0, rows[3], rows[4]
  end
  if rows[1] then prev = rows[1] + 0 end
  if (a - prev) % COUNTS + f.n + (upto - f.s) % COUNTS ~= (upto - prev) % COUNTS then return 0 end
  local r = refunded(st, a, f.s)
  local give = math.min(f.k, f.n) - r
  if give <= 0 then return 0 end
  local lo, hi, trimmed = a + r, a + r + give, st.base % COUNTS
  local kept = {}
  for _, x in ipairs(st.ranges) do
    if x.hi < lo or x.lo > hi then
      if x.hi > trimmed or trimmed > st.K then kept[#kept + 1] = x end
    else
      lo, hi = math.min(lo, x.lo), math.max(hi, x.hi)
    end
  end
  kept[#kept + 1] = {lo = lo, hi = hi}
  table.sort(kept, function(p, q) return p.lo < q.lo end)
  if #kept > RANGES then
    local low = table.remove(kept, 1)
    if st.g > 0 and st.H <= trimmed and trimmed <= st.K then st.g = 0 end
    if st.g == 0 then st.x = low.lo end
    st.H, st.g = math.max(st.H, low.hi), st.g + low.hi - low.lo
  end
  st.ranges = kept
  return give
end

-- write_refund: the new aux, in before the old goes. A refund changes
-- counts only: never the key's time, a window or the TTL.
local function write_refund(req, st)
  local aux = aux_text(req, st)
  redis.call('ZADD', req.key, '1', aux)
  if st.aux and st.aux ~= aux then redis.call('ZREM', req.key, st.aux) end
end

-- reply: Remaining, the fewest permits left; ResetAfter, when the tail
-- leaves the last window, and never before the denial's RetryAfter (on a
-- clock gone wrong the two are bounds of what the state holds, read
-- apart).
local function reply(c, used, token)
  local remaining = c.fewest - used
  if remaining < 0 then remaining = 0 end
  if not c.allowed and c.retry > c.reset then c.reset = c.retry end
  if c.allowed and token then
    return format('1 %d 0 %d %d 0 %s', remaining, c.reset, c.own_index - 1, token)
  elseif c.allowed then
    return format('1 %d 0 %d %d 0', remaining, c.reset, c.own_index - 1)
  end
  return format('0 %d %d %d %d %d', remaining, c.retry, c.reset, c.reported - 1, c.stable)
end

local req = read_args()
local st, foreign = read_state(req)
if not st then
  local why = 'NOTOURS holds ' .. foreign .. ', not redlimit state; it was left unchanged'
  return redis.error_reply(why)
end
local now, wrong = key_time(req, st)
local list, R, stable, own_at = strategies(req, st, now)
if req.refund then
  local given = 0
  if st.note then given = refund(req, st, wrong) end
  if given > 0 then write_refund(req, st) end
  local c = check(req, st, list, now, wrong, 0)
  local remaining = math.max(c.fewest, 0)
  return format('1 %d 0 %d %d -1 %d', remaining, c.reset, c.own_index - 1, given)
end
local c, held = check(req, st, list, now, wrong, req.n)
if stable < c.stable then c.stable = stable end
if not decide(req, c, wrong) then return reply(c, 0, nil) end
local e, K
if wrong then
  e, K = restart(req, st, list, held, now)
else
  local w = apply(req, st, now, R)
  write(req, st, w, list, now, R, own_at)
  e, K = w.e, w.K
end
-- After the grant, every window holds the new tail: it leaves them last.
c.reset = 0
for _, s in ipairs(list) do
  c.reset = math.max(c.reset, leaves(e, s.S, s.p) - req.clock)
end
return reply(c, req.n, format('%d.%d.%d', e, K, req.n))
