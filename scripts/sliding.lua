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
-- Some arithmetic used throughout, for integers 0 <= a < 2^53, b >= 1
-- (every floor(a / b) here is exact: a / b never rounds up to an integer):
--   t - t % p + p - 1            the last µs of the bucket of p µs holding t
--   e - e % p + S * p            the time a bucket at position e leaves the
--                                window of S buckets of p µs
--   t - t % p - (S - 1) * p      the first µs of that window at time t
--
-- The functions below come in the order a decision runs them; the decision
-- The key's time: a call decides at the later of its clock and the time
-- the key recorded at its last grant, so that no clock behind another's
-- reopens what the key already counted, and nothing accumulates (the key's
-- time is always a time some clock read). A recorded time ahead of the
-- clock by more than the caller's longest window is a clock gone wrong:
-- the call decides on its own clock, counting all the key holds as used
-- (check), so that the key is stricter for at most that window, and a
-- grant restarts the key on the caller's timeline (apply, write).
--
-- The functions below come in the order a decision runs them, and the
-- decision, at the end, calls them. Each uses its arguments, Redis's
-- globals and the constants of this prelude. Redis builds every function
-- of a script anew on each call (about 50 ns each, and more for each local
-- it captures), so each step is one function, and the functions that only
-- refunds use are built by refunds, when a call meets a refund.

local COUNTS = 4503599627370496 -- 2^52
local ENTRY0 = 4503599627370496 -- entries' scores: 2^52 + a position below 2^52
local BEFORE_ENTRIES = '(4503599627370496' -- below every entry's score
local FIRST = '2' -- the lowest score a bucket can have (its position is at least 999)
local SCAN = 8 -- most buckets one call reads to find a RetryAfter, or trims
local SCAN_LIMITS = '12345678' -- sub(SCAN_LIMITS, m, m): m <= SCAN as Redis reads it
local RANGES = 16 -- most ranges of refunded positions a key keeps
local NOT_OURS = 'NOTOURS holds %s, not redlimit state; it was left unchanged'
local unpack = table.unpack or unpack -- Lua 5.4 (Dragonfly) has no global unpack

-- read_request returns the clock (the caller's, or the server's TIME), n
-- (0 for a refund), the refund's text (nil for a request), whether the key
-- may be shared, last (the index in ARGV of the longest strategy's size),
-- the number of the caller's strategies, its smallest limit, its longest
-- window (µs), and its densest strategy (most permits per µs): Ld permits
-- per Wd µs.
local function read_request(P)
  local clock = ARGV[1]
  if clock == '' then
    local time = redis.call('TIME')
    clock = time[1] * 1000000 + time[2]
  else
    clock = clock + 0
  end
  local last = #ARGV
  local shared = last % 2 == 1
  if shared then last = last - 1 end
  local own = (last - 4) / 2
  local Ld, Wd = 0, 1
  for i = 1, own do
    local l, w = ARGV[2 * i + 3] + 0, ARGV[2 * i + 4] * P
    if l * Wd > Ld * w then Ld, Wd = l, w end
  end
  local n, refund_text = 0, ARGV[2]
  if string.byte(refund_text) ~= 45 then n, refund_text = refund_text + 0, nil end -- '-'
  return clock, n, refund_text, shared, last, own, ARGV[5] + 0, ARGV[last] * P, Ld, Wd
end

-- read_state reads the note and the aux (ZRANGE 0 1). It returns an error's
-- text for anything at the key that is not this kind's state (the key is
-- left as it is), else nil and the note, K, t, the tail T, the aux, base,
-- C, H, x, g and ranges (nil while none is kept, else a list of
-- {lo = , hi = }); an empty key reads as a state with no grant (t = -1).
-- Last come the key's time (now), whether it is a clock gone wrong, and
-- e, where a grant goes: the bucket of the key's time, or the tail when
-- that is later; on a clock gone wrong, the clock's bucket.
local function read_state(key, kind, P, clock, longest)
  local rows = redis.pcall('ZRANGE', key, '0', '1')
  if rows.err then
    return string.format(NOT_OURS, 'another type than sliding state')
  end
  local note = rows[1]
  local K, t, T, aux, base, C, H, x, g, ranges = 0, -1, -1, nil, 0, 0, 0, 0, 0, nil
  if note then
    local note_kind, k, at, d = string.match(note, '^(%a):(%d+) (%d+) ?(%d*)$')
    if note_kind == kind then K = k + 0 end
    if note_kind ~= kind or K >= COUNTS then
      return string.format(NOT_OURS, 'a sorted set that is not sliding state')
    end
    t = at + 0
    T = t - t % P + P - 1
    if d ~= '' then T = t + d end
    local second = rows[2]
    if second and string.byte(second, 2) == 43 then -- '+': the aux, or a foreign member
      local aux_kind, b, c, h, xx, gg, rest =
        string.match(second, '^(%a)%+(%d+) (%d+) (%d+) (%d+) (%d+)()')
      if aux_kind == kind then
        aux, base, C, H, x, g = second, b + 0, c + 0, h + 0, xx + 0, gg + 0
        for lo, hi in string.gmatch(string.sub(second, rest), ' (%d+) (%d+)') do
          ranges = ranges or {}
          ranges[#ranges + 1] = {lo = lo + 0, hi = hi + 0}
        end
      end
    end
  end
  local now, wrong = clock, false
  if t > clock then
    if t - clock > longest then wrong = true else now = t end
  end
  local e = now - now % P + P - 1
  if T > e and not wrong then e = T end
  return nil, note, K, t, T, aux, base, C, H, x, g, ranges, now, wrong, e
end

-- read_writers reads, under WithPrefix, the configurations that wrote the
-- key and the meta. It returns the caller's signature, the entries (text,
-- score, ...), the meta (nil while none is kept) with its densest writer,
-- Ln per Wn µs, and their largest Lm (else the caller's Ld, Wd and Ld),
-- and the meta a grant writes: the densest writer of both. Then come the
-- strategies of every other configuration whose last grant is still in its
-- longest window (it binds until then): four numbers each, L, S, p and
-- till, the time it lapses (nil when there are none). A configuration that
-- differs from the caller only in its limits (the same precision and
-- windows) is left out: the caller's limits govern those windows, so a
-- plan upgrade keeps what was used. Last come R, the longest window of the
-- caller and every live configuration (buckets before it count for no
-- one), stable, the time until the first configuration lapses, and own_at,
-- the position of the caller's entry.
local function read_writers(key, kind, last, now, clock, longest, Ld, Wd)
  local sig = table.concat(ARGV, ' ', 4, last)
  local entries = redis.call('ZRANGEBYSCORE', key, string.format('%d', ENTRY0), '+inf',
    'WITHSCORES')
  local meta, Ln, Wn, Lm = entries[#entries - 1], Ld, Wd, Ld
  local ln, wn, lm = string.match(meta or '', '^' .. kind .. ' (%d+) (%d+) (%d+)$')
  if ln then
    Ln, Wn, Lm = ln + 0, wn + 0, lm + 0
    entries[#entries], entries[#entries - 1] = nil, nil
  else
    meta = nil
  end
  local dense_L, dense_W = Ln, Wn
  if Ld * dense_W > dense_L * Wd then dense_L, dense_W = Ld, Wd end
  local new_meta = string.format('%s %d %d %d', kind, dense_L, dense_W, math.max(Lm, Ld))
  local others, R, stable, own_at = nil, longest, math.huge, nil
  if entries[1] then others = {} end
  local shape = string.gsub(sig, ' %d+ (%d+)', ' %1')
  for j = 1, #entries, 2 do
    local text, at = entries[j], entries[j + 1] - ENTRY0
    local p, limits = string.match(text, '^(%d+)(.*)$')
    p = p + 0
    local span = string.match(limits, '(%d+)$') * p -- its longest window
    local till = at - at % p + span
    if text == sig then
      own_at = at
    elseif till > now then
      if span > R then R = span end
      if string.gsub(text, ' %d+ (%d+)', ' %1') ~= shape then
        if till - clock < stable then stable = till - clock end
        for L, S in string.gmatch(limits, ' (%d+) (%d+)') do
          local m = #others
          others[m + 1], others[m + 2], others[m + 3], others[m + 4] = L + 0, S + 0, p, till
        end
      end
    end
  end
  return sig, entries, meta, Ln, Wn, Lm, new_meta, others, R, stable, own_at
end

-- aux_text returns the aux's text: base, C, the refunds' horizon H,
-- dropped x g, and the ranges.
local function aux_text(kind, base, C, H, x, g, ranges)
  local text = string.format('%s+%d %d %d %d %d', kind, base, C, H, x, g)
  for _, r in ipairs(ranges or {}) do
    text = text .. string.format(' %d %d', r.lo, r.hi)
  end
  return text
end

-- refunds builds the functions of refunds, and returns them: refunded,
-- refunded_from and refund. Only a call that meets a refund (one, or a key
-- that records one) builds them; the others count no refund.
local function refunds()
  -- refunded returns how many positions from lo up to hi the ranges hold
  -- (modulo COUNTS: past the wrap, lo > hi, those of [lo, COUNTS) and
  -- [0, hi)).
  local function refunded(ranges, lo, hi)
    if not ranges then return 0 end
    local lo2, hi2 = 0, 0
    if lo > hi then lo, hi, lo2, hi2 = lo, COUNTS, 0, hi end
    local sum = 0
    for _, r in ipairs(ranges) do
      sum = sum + math.max(0, math.min(r.hi, hi) - math.max(r.lo, lo))
        + math.max(0, math.min(r.hi, hi2) - math.max(r.lo, lo2))
    end
    return sum
  end

  -- refunded_from returns the permits refunds gave back at positions from p
  -- (a window's first) to the key's count K: those of the ranges, and the g
  -- of ranges dropped (see refund) when the window holds all of them (p <=
  -- x; past the wrap, p > K, it does).
  local function refunded_from(ranges, g, x, K, p)
    local sum = refunded(ranges, p, K)
    if g > 0 and (p <= x or p > K) then sum = sum + g end
    return sum
  end

  -- refund gives back permits of the grant in the bucket at e whose permits
  -- are the positions [a, s) of the key's count, a = s - n, until k in all
  -- were given back, and returns what it gave and the aux's new H, x, g and
  -- ranges. The aux keeps the refunded positions as ranges [lo, hi), sorted,
  -- touching ones merged; what the grant gave back is the ranges' prefix of
  -- its positions, so that a retried refund gives nothing more. It gives
  -- while the bucket is kept (after C: a configuration whose window reaches
  -- it counts it) and at or past the horizon H; the grant's permits must lie
  -- in the bucket at e (a token of another key, or another life of this one,
  -- gives nothing). Ranges of trimmed positions go; when a range more than
  -- RANGES would be kept, the lowest goes and H rises to its hi: a grant
  -- starting below gives nothing more. Its permits join x g (g given back in
  -- windows that hold x, the lowest position dropped, and so every dropped
  -- one): stricter once x leaves a window, never looser. A refund changes
  -- counts only: never the key's time, a window or the TTL.
  local function refund(key, kind, text, K, T, aux, base, C, H, x, g, ranges)
    -- A token this script did not make reads as a grant that gives nothing.
    local k, e, s, n = string.match(text, '^%-(%d+):(%d+)%.(%d+)%.(%d+)$')
    k, e, s, n = (k or 0) + 0, (e or -1) + 0, (s or 0) + 0, (n or 0) + 0
    local a = s - n
    if n < 1 or e <= C or e > T or s > K or a < H then return 0, H, x, g, ranges end
    -- The grant's bucket (at e, or the tail) and the count before it.
    local found = redis.call('ZREVRANGEBYSCORE', key, string.format('%d', e), FIRST,
      'WITHSCORES', 'LIMIT', '0', '2')
    local upto, prev = K, base % COUNTS
    if e ~= T then
      if found[2] ~= string.format('%d', e) then return 0, H, x, g, ranges end
      upto, found[1], found[2] = found[1] + 0, found[3], found[4]
    end
    if found[1] then prev = found[1] + 0 end
    if (a - prev) % COUNTS + n + (upto - s) % COUNTS ~= (upto - prev) % COUNTS then
      return 0, H, x, g, ranges
    end
    local r = refunded(ranges, a, s)
    local given = math.min(k, n) - r
    if given <= 0 then return 0, H, x, g, ranges end
    local lo, hi, trimmed = a + r, a + r + given, base % COUNTS
    local kept = {}
    for _, range in ipairs(ranges or {}) do
      if range.hi < lo or range.lo > hi then
        if range.hi > trimmed or trimmed > K then kept[#kept + 1] = range end
      else
        lo, hi = math.min(lo, range.lo), math.max(hi, range.hi)
      end
    end
    kept[#kept + 1] = {lo = lo, hi = hi}
    table.sort(kept, function(p, q) return p.lo < q.lo end)
    if #kept > RANGES then
      local low = table.remove(kept, 1)
      if g > 0 and H <= trimmed and trimmed <= K then g = 0 end
      if g == 0 then x = low.lo end
      H, g = math.max(H, low.hi), g + low.hi - low.lo
    end
    -- The new aux goes in before the old goes.
    local new_aux = aux_text(kind, base, C, H, x, g, kept)
    redis.call('ZADD', key, '1', new_aux)
    if aux and aux ~= new_aux then redis.call('ZREM', key, aux) end
    return given, H, x, g, kept
  end

  return refunded, refunded_from, refund
end

-- check counts each strategy's window, the caller's then the others', and
-- returns what the decision and the reply need: the fewest permits left
-- (and the caller's strategy with the fewest, own_index), the latest time
-- the tail leaves a window (reset), the ResetAfter after a grant at e
-- (when the new tail leaves the last window), the longest RetryAfter of a
-- strategy that denies n and its index (0: another configuration's),
-- whether one denies, the time until the first of their counts could drop
-- (denied_stable), and on a clock gone wrong what the key holds. Durations
-- are from the clock, which may be behind the key's time. refunded and
-- refunded_from are those of refunds, or nil when the key records none.
--
-- A strategy counts the permits in its window, from its start to the
-- tail: the key's count minus the count before the window (the last bucket
-- before it, else base), minus what refunds gave back there. A window
-- reaching buckets trimmed away (at or before C: a configuration whose
-- window is longer than any that granted since) counts what they held as
-- used (unseen), up to what any writer could have granted there: Ln *
-- ceil(U / Wn) + 2 * Lm in U µs. On a clock gone wrong (held_from: the
-- first µs of the caller's longest window at the key's recorded time; nil
-- otherwise), the key reads as if all it holds since then had been granted
-- in the clock's bucket: every strategy counts it, until it leaves.
--
-- A denied strategy's RetryAfter is the time it frees need permits: the
-- first bucket of its window whose permits from the window's start reach
-- need leaves it. Each bucket holds a permit but those refunds emptied
-- (each at least one refunded position), so that one is among the first
-- need + |R| + g. It reads at most SCAN buckets; when the bucket is not
-- among them, the time the tail leaves: longer than the truth, never
-- shorter. What the window holds of buckets trimmed away (unseen) leaves
-- before any bucket.
local function check(key, n, smallest, own, P, others, clock, now, e, held_from,
                     K, T, base, C, g, x, ranges, refunded, refunded_from, Ln, Wn, Lm)
  local fewest, own_fewest, own_index, reset, grant_reset = math.huge, math.huge, 1, 0, 0
  local retry, reported, denied, denied_stable, held = -1, nil, false, math.huge, nil
  local strategies = own
  if others then strategies = own + #others / 4 end
  for i = 1, strategies do
    local L, S, p, index, till
    if i <= own then
      L, S, p, index = ARGV[2 * i + 3] + 0, ARGV[2 * i + 4] + 0, P, i
    else
      local j = 4 * (i - own) - 3
      L, S, p, index, till = others[j], others[j + 1], others[j + 2], 0, others[j + 3]
    end
    local from = held_from or now - now % p - (S - 1) * p
    local count, before, unseen, below = 0, K, 0, nil
    if T >= from then
      -- Scores are integers: "(from" is from - 1, and "(" .. below is from.
      below = string.format('%d', from - 1)
      local row = redis.call('ZREVRANGEBYSCORE', key, below, FIRST, 'LIMIT', '0', '1')
      before = base % COUNTS
      if row[1] then
        before = row[1] + 0
      elseif from <= C then
        unseen = math.min(base, Ln * math.floor((C - from + Wn) / Wn) + 2 * Lm)
      end
      count = (K - before) % COUNTS + unseen
      if refunded then count = count - refunded_from(ranges, g, x, K, before) end
    end
    local tail_at = T
    if held_from then
      held, tail_at = count, -1
      if count > 0 then tail_at = now - now % P + P - 1 end
    end
    local left = L - count
    if left < fewest then fewest = left end
    if left < 0 then left = 0 end
    if index > 0 and left < own_fewest then own_fewest, own_index = left, index end
    local tail = 0
    if tail_at >= 0 then tail = tail_at - tail_at % p + S * p - clock end
    if tail > reset then reset = tail end
    local leaves = e - e % p + S * p - clock
    if leaves > grant_reset then grant_reset = leaves end
    if n > 0 and n <= smallest and count + n > L then
      -- A denying strategy. Only these are in a denial's reply (every other
      -- has n permits left, more than any of these).
      denied = true
      local wait, change = tail, now - now % p + p - clock
      if n > L then
        wait = till - clock -- another configuration's limit below n
      elseif not held_from then
        local need = count + n - L
        local most, gone = need + g, 0
        if refunded then
          most = most + refunded(ranges, 0, COUNTS)
          gone = refunded_from(ranges, g, x, K, before)
        end
        if most > SCAN then most = SCAN end
        local got = redis.call('ZRANGEBYSCORE', key, '(' .. below, BEFORE_ENTRIES,
          'WITHSCORES', 'LIMIT', '0', string.sub(SCAN_LIMITS, most, most))
        change = wait
        if got[2] then
          local at = got[2] + 0
          change = at - at % p + S * p - clock
          for j = 1, #got, 2 do
            local count_at = got[j] + 0
            local freed = unseen + (count_at - before) % COUNTS - gone
            if refunded then freed = freed + refunded_from(ranges, g, x, K, count_at) end
            if freed >= need then
              at = got[j + 1] + 0
              wait = at - at % p + S * p - clock
              break
            end
          end
        end
      end
      if wait > retry then reported, retry = index, wait end
      if change < denied_stable then denied_stable = change end
    end
  end
  return fewest, own_index, reset, grant_reset, retry, reported, denied, denied_stable, held
end

-- decide returns the reply to a refund (given: what it gave back), a
-- denial or n == 0, or nil for a grant. n above the caller's smallest
-- limit is denied (RetryAfter never, its first strategy reported); n == 0
-- is allowed; otherwise allowed unless a strategy denied. A denial reports
-- the caller's strategy with the longest RetryAfter, or, when another
-- configuration's waits longest, the caller's with the fewest permits
-- left, with that RetryAfter. Remaining is the fewest permits left; a
-- denial's ResetAfter is never before its RetryAfter (on a clock gone
-- wrong the two are bounds of what the state holds, read apart). A
-- denial's stable is the time until its first count or the first other
-- configuration changes (0 on a clock gone wrong).
local function decide(n, smallest, fewest, own_index, reset, retry, reported, denied,
                      denied_stable, stable, wrong, given)
  if fewest < 0 then fewest = 0 end
  if given then
    return string.format('1 %d 0 %d %d -1 %d', fewest, reset, own_index - 1, given)
  end
  if stable < denied_stable then denied_stable = stable end
  if n > smallest then
    reported, retry, denied, denied_stable = 1, -1, true, 0
  elseif denied and reported == 0 then
    reported = own_index
  end
  if wrong then denied_stable = 0 end
  if denied then
    if retry > reset then reset = retry end
    return string.format('0 %d %d %d %d %d', fewest, retry, reset, reported - 1, denied_stable)
  elseif n == 0 then
    return string.format('1 %d 0 %d %d 0', fewest, reset, own_index - 1)
  end
  return nil
end

-- apply returns what a grant of n permits at e writes: the key's new
-- count, note and aux (nil: none), and whether the old tail went. When the
-- tail moves, the old tail becomes a bucket, and a tail that passes a
-- multiple of SCAN buckets of P trims up to SCAN buckets that left every
-- live window (at or before now - R): it keeps up, as at most SCAN buckets
-- opened since, and base and C become the count and position of the last
-- bucket trimmed. When to trim depends on positions only, never on counts,
-- so that a refund leaves the key as a grant of fewer permits would. Past
-- the count's wrap, trimmed grants count as what the writers could grant,
-- and positions start again from 0: no earlier grant refunds (stricter).
-- On a clock gone wrong the grant restarts the key: a fresh state whose
-- tail, at the clock's bucket e, holds all the key held (counted for at
-- most a window from now), and whose horizon refuses refunds of every
-- earlier grant.
local function apply(key, kind, n, P, shared, wrong, held, now, e, R, K, T, aux, base, C, H, x,
                     g, ranges)
  local new_K, new_aux, tail_gone = (K + n) % COUNTS, aux, false
  local new_note = string.format('%s:%d %d', kind, new_K, now)
  if shared then new_note = string.format('%s %d', new_note, e - now) end
  if wrong then
    return new_K, new_note, aux_text(kind, (K - held) % COUNTS, 0, K, 0, 0, nil), false
  end
  if K + n >= COUNTS then
    base, H, x, g, ranges, new_aux = base % COUNTS + COUNTS, 0, 0, 0, nil, nil
  end
  local period = SCAN * P
  if e ~= T and T >= 0 and e - e % period > T - T % period then
    local trimmed = redis.call('ZRANGEBYSCORE', key, FIRST, string.format('%d', now - R),
      'WITHSCORES', 'LIMIT', '0', string.sub(SCAN_LIMITS, SCAN, SCAN))
    if #trimmed > 0 then
      redis.call('ZREMRANGEBYSCORE', key, FIRST, trimmed[#trimmed])
      base = trimmed[#trimmed - 1] + base - base % COUNTS
      C, new_aux = trimmed[#trimmed] + 0, nil
    end
    if #trimmed < 2 * SCAN and T <= now - R then
      -- The old tail left every window too: it never becomes a bucket.
      base = K + base - base % COUNTS
      C, new_aux, tail_gone = T, nil, true
    end
  end
  if not new_aux and (base > 0 or C > 0 or H > 0) then
    new_aux = aux_text(kind, base, C, H, x, g, ranges)
  end
  return new_K, new_note, new_aux, tail_gone
end

-- write writes a grant at e: its note, and its aux and meta where they
-- changed; when the tail moved (and did not go with the trim), the old
-- tail T joins the buckets, holding the count K. The new members go in
-- before the old ones go, as a set left empty even for a moment is a
-- deleted key. Under WithPrefix (sig), the caller's entry moves to e, and
-- when the tail moved the entries that lapsed (last grant before now - R)
-- go. The key's TTL (ttl ms) is set when the tail or the entry moved; else
-- an earlier grant set it. A restart (on a clock gone wrong) writes the
-- state afresh, and moves back to e the entries still live; UNLINK frees a
-- large set off the script.
local function write(key, note, aux, meta, new_note, new_aux, new_meta, K, T, e, tail_gone,
                     wrong, sig, own_at, entries, now, R, ttl)
  if wrong then
    redis.call('UNLINK', key)
    local add = {'ZADD', key, '0', new_note, '1', new_aux}
    if sig then
      if meta then add[#add + 1], add[#add + 2] = '+inf', meta end
      for j = 1, #entries, 2 do
        local at, p, S = entries[j + 1] - ENTRY0, string.match(entries[j], '^(%d+) .* (%d+)$')
        if entries[j] ~= sig and at - at % p + S * p > now then
          add[#add + 1], add[#add + 2] = string.format('%d', ENTRY0 + math.min(at, e)), entries[j]
        end
      end
      add[#add + 1], add[#add + 2] = string.format('%d', ENTRY0 + e), sig
    end
    redis.call(unpack(add))
    redis.call('PEXPIRE', key, ttl)
    return
  end
  local moved = e ~= T
  local keep_tail = moved and T >= 0 and not tail_gone
  local aux_changed = new_aux and new_aux ~= aux
  local meta_changed = new_meta and new_meta ~= meta
  if keep_tail or aux_changed or meta_changed then
    local add, gone = {'ZADD', key, '0', new_note}, {'ZREM', key}
    if keep_tail then add[5], add[6] = string.format('%d', T), string.format('%d', K) end
    if aux_changed then add[#add + 1], add[#add + 2] = '1', new_aux end
    if meta_changed then add[#add + 1], add[#add + 2] = '+inf', new_meta end
    redis.call(unpack(add))
    if note then gone[#gone + 1] = note end
    if aux and aux_changed then gone[#gone + 1] = aux end
    if meta and meta_changed then gone[#gone + 1] = meta end
    if #gone > 2 then redis.call(unpack(gone)) end
  else
    redis.call('ZADD', key, '0', new_note)
    if note then redis.call('ZREM', key, note) end
  end
  local entry_moved = sig and e ~= own_at
  if entry_moved then
    redis.call('ZADD', key, string.format('%d', ENTRY0 + e), sig)
    if moved then
      redis.call('ZREMRANGEBYSCORE', key, string.format('%d', ENTRY0),
        string.format('(%d', ENTRY0 + now - R))
    end
  end
  if moved or entry_moved then redis.call('PEXPIRE', key, ttl) end
end

-- The decision: read the request and the state (with the key's time), the
-- other configurations, a refund, check, decide; for a grant, apply,
-- write and reply.
local key, kind, P = KEYS[1], ARGV[3], ARGV[4] + 0
local clock, n, refund_text, shared, last, own, smallest, longest, Ld, Wd = read_request(P)
local foreign, note, K, t, T, aux, base, C, H, x, g, ranges, now, wrong, e =
  read_state(key, kind, P, clock, longest)
if foreign then return redis.error_reply(foreign) end
local sig, entries, meta, new_meta, others, own_at
local Ln, Wn, Lm, R, stable = Ld, Wd, Ld, longest, math.huge
if shared then
  sig, entries, meta, Ln, Wn, Lm, new_meta, others, R, stable, own_at =
    read_writers(key, kind, last, now, clock, longest, Ld, Wd)
end
local refunded, refunded_from, refund, given = nil, nil, nil, nil
if ranges or g > 0 or refund_text then refunded, refunded_from, refund = refunds() end
if refund_text then
  given = 0
  if note and not wrong then
    given, H, x, g, ranges = refund(key, kind, refund_text, K, T, aux, base, C, H, x, g, ranges)
  end
end
local held_from = nil
if wrong then held_from = t - t % P - (ARGV[last] - 1) * P end
local fewest, own_index, reset, grant_reset, retry, reported, denied, denied_stable, held =
  check(key, n, smallest, own, P, others, clock, now, e, held_from, K, T, base, C, g, x, ranges,
    refunded, refunded_from, Ln, Wn, Lm)
local reply = decide(n, smallest, fewest, own_index, reset, retry, reported, denied,
  denied_stable, stable, wrong, given)
if reply then return reply end

-- A grant. The key's TTL (ms) lasts until the new tail leaves the last
-- window of the caller and of every configuration still live.
local new_K, new_note, new_aux, tail_gone = apply(key, kind, n, P, shared, wrong, held, now, e,
  R, K, T, aux, base, C, H, x, g, ranges)
write(key, note, aux, meta, new_note, new_aux, new_meta, K, T, e, tail_gone, wrong, sig, own_at,
  entries, now, R, math.floor((grant_reset + 999) / 1000))
local remaining = math.max(0, fewest) - n
if remaining < 0 then remaining = 0 end
return string.format('1 %d 0 %d %d 0 %d.%d.%d', remaining, grant_reset, own_index - 1, e, new_K, n)
