-- sliding.lua: the sliding window and the sliding log. A configuration has a
-- precision P and one or more strategies (L_i, S_i): at most L_i permits in
-- the S_i buckets of P ending with the bucket of the key's time. A request
-- is allowed only if every strategy allows it.
--
-- KEYS[1]  the key
-- ARGV[1]  now: Unix µs, or "" to read the Redis server's TIME
-- ARGV[2]  n: permits asked for (>= 0); or a refund, "-<k>:<token>": give
--          back permits of the grant the token names until k in all were
--          given back; "=<k>:<token>" the same, replying no state (Go
--          sends it when no observer reads that state)
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
-- State, format 11 (docs/internals.md), a sorted set:
--   score 0       the note "<kind>:K t", then " d" under WithPrefix: K the
--                 key's count (every permit it granted), t the key's time
--                 (the latest clock a grant decided at), t + d the tail;
--                 on a default key the last grant left full, "|i:o,...":
--                 strategy i is full until t + o (see full_denial).
--   score 1       the aux, only once the key trimmed buckets or took a
--                 refund: "<kind>+base C H x g", then " lo hi" for each range
--                 of refunded positions (see the refund step).
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
-- replies "1 remaining 0 reset strategy -1 given", or "1 0 0 0 0 -1
-- given" when asked with '='.
--
-- The decision runs top to bottom in commented steps: read the request,
-- read the state, the key's time, the strategies, (a refund), check,
-- decide, apply, write, reply. Steps, not named functions, because Redis
-- builds every function of a script anew on each call, with every local it
-- captures, and each call moves its arguments: written as functions in
-- this order (commit bd4d971) the script cost about 2 µs more per call,
-- 14 to 18% of its Redis time (BENCHMARKS.md). So the common path (a
-- default key, no refunds recorded) keeps its values in locals, builds no
-- table, formats only the note and the reply, and the only functions are
-- those below, which use nothing but their arguments, and those of
-- refunds, built only once some refund is recorded.
--
-- Some arithmetic used throughout, for integers 0 <= a < 2^53, b >= 1
-- (every floor(a / b) here is exact: a / b never rounds up to an integer):
--   t - t % p + p - 1            the last µs of the bucket of p µs holding t
--   e - e % p + S * p            the time a bucket at position e leaves the
--                                window of S buckets of p µs
--   t - t % p - (S - 1) * p      the first µs of that window at time t

local unpack = table.unpack or unpack
local call, match, format, floor, sub = redis.call, string.match, string.format, math.floor,
  string.sub
local COUNTS = 4503599627370496 -- 2^52
local ENTRY0 = 4503599627370496 -- entries' scores: 2^52 + a position below 2^52
local BEFORE_ENTRIES = '(4503599627370496' -- below every entry's score
local FIRST = '2' -- the lowest score a bucket can have (its position is at least 999)
local SCAN = 8 -- most buckets one call reads to find a RetryAfter, or trims
local SCAN_LIMITS = '12345678' -- sub(SCAN_LIMITS, m, m): m <= SCAN as Redis reads it
local RANGES = 16 -- most ranges of refunded positions a key keeps
local NOTE = '^(%a):(%d+) (%d+) ?(%d*)()'
local AUX = '^(%a)%+(%d+) (%d+) (%d+) (%d+) (%d+)()'

-- The densest strategy (most permits per µs) of ARGV's configuration: own
-- strategies of precision P.
local function densest(own, P)
  local L, W = 0, 1
  for i = 1, own do
    local l, w = ARGV[2 * i + 3] + 0, ARGV[2 * i + 4] * P
    if l * W > L * w then L, W = l, w end
  end
  return L, W
end

-- ranges_of returns the ranges in an aux's text of them, " lo hi" each, as
-- a list of {lo = , hi = }; nil when there is none.
local function ranges_of(text)
  local ranges = nil
  for lo, hi in string.gmatch(text, ' (%d+) (%d+)') do
    ranges = ranges or {}
    ranges[#ranges + 1] = {lo = lo + 0, hi = hi + 0}
  end
  return ranges
end

-- The aux's text: base, C, the refunds' horizon H, dropped x g, the ranges
-- (their text body when given, else from the list ranges).
local function aux_text(kind, base, C, H, x, g, ranges, body)
  local text = format('%s+%d %d %d %d %d', kind, base, C, H, x, g)
  if body then return text .. body end
  for _, r in ipairs(ranges or {}) do
    text = text .. format(' %d %d', r.lo, r.hi)
  end
  return text
end

-- full_denial replies a request of one permit on a default key whose last
-- grant left some of its strategies full, from the note alone; nil when
-- none is still full. The note lists them, "|i:o,...": strategy i holds its
-- whole limit until t + o, when the first bucket of its window leaves it.
-- Until then it denies one permit with that wait, as the check step would
-- find by reading the buckets; one past it has freed a permit (a bucket
-- holds one at least while no refund is recorded), and one not listed had
-- one left, and only a grant (which rewrites the note) takes more. It
-- saves a hot key's denial its two reads of buckets, a quarter to a third
-- of its Redis time (BENCHMARKS.md, "A full key's denial from its note").
local function full_denial(full, t, now, clock, T, P, own, longest)
  local retry, reported, stable, listed = -1, nil, math.huge, 0
  for i, o in string.gmatch(full, '(%d+):(%d+)') do
    i, o, listed = i + 0, o + 0, listed + 1
    -- (A list this script could not have written: the steps decide.)
    if listed > own or i < 1 or i > own or o > longest then return nil end
    local wait = t + o - clock
    if t + o > now then
      if wait > retry then reported, retry = i, wait end
      if wait < stable then stable = wait end
    end
  end
  if not reported then return nil end
  local reset = retry
  for i = 1, own do
    local tail = T - T % P + ARGV[2 * i + 4] * P - clock
    if tail > reset then reset = tail end
  end
  return format('0 0 %d %d %d %d', retry, reset, reported - 1, stable)
end

-- Read the request: n (or a refund) and the caller's configuration, whose
-- strategies stay in ARGV (see strategy).
local key, kind = KEYS[1], ARGV[3]
local P = ARGV[4] + 0
local clock = ARGV[1]
if clock == '' then
  local t = call('TIME')
  clock = t[1] * 1000000 + t[2]
else
  clock = clock + 0
end
local last = #ARGV
local shared = last % 2 == 1
if shared then last = last - 1 end
local own = (last - 4) / 2
local smallest, longest = ARGV[5] + 0, ARGV[last] * P
local n, refund_arg = 0, nil
local mark = string.byte(ARGV[2])
if mark == 45 or mark == 61 then -- '-' or '=': a refund
  refund_arg = ARGV[2]
else
  n = ARGV[2] + 0
end

-- Read the state: the note and the aux (ZRANGE 0 1), then under WithPrefix
-- the entries and the meta. An empty key reads as a state with no grant
-- (t = -1). Anything else at the key is foreign: an error, and the key is
-- left as it is. ranges is nil while no range of refunded positions is
-- kept, else a list of {lo = , hi = }; ranges_text is their text in the
-- aux, which a refund reads (the refund step) before any list.
local rows = redis.pcall('ZRANGE', key, '0', '1')
if rows.err then
  return redis.error_reply('NOTOURS holds another type than sliding state, not redlimit ' ..
    'state; it was left unchanged')
end
local note, K, t, T, full = rows[1], 0, -1, -1, ''
local aux, base, C, H, x, g, ranges, ranges_text = nil, 0, 0, 0, 0, 0, nil, ''
local meta, Ln, Wn, Lm, entries, sig
if note then
  local note_kind, k, at, d, rest = match(note, NOTE)
  if note_kind == kind then K = k + 0 end
  if rest and rest <= #note then full = sub(note, rest) end
  if note_kind ~= kind or K >= COUNTS or (full ~= '' and string.byte(full) ~= 124) then
    return redis.error_reply('NOTOURS holds a sorted set that is not sliding state, not ' ..
      'redlimit state; it was left unchanged')
  end
  t = at + 0
  T = t - t % P + P - 1
  if d ~= '' then T = t + d end
  local second = rows[2]
  if second and string.byte(second, 2) == 43 then -- '+': the aux, or a foreign member
    local aux_kind, b, c, h, xx, gg, rest = match(second, AUX)
    if aux_kind == kind then
      aux, base, C, H, x, g = second, b + 0, c + 0, h + 0, xx + 0, gg + 0
      if rest <= #second then ranges_text = sub(second, rest) end
      if not refund_arg then ranges = ranges_of(ranges_text) end
    end
  end
end
if shared then
  sig = table.concat(ARGV, ' ', 4, last)
  entries = call('ZRANGEBYSCORE', key, format('%d', ENTRY0), '+inf', 'WITHSCORES')
  local ln, wn, lm = match(entries[#entries - 1] or '', '^' .. kind .. ' (%d+) (%d+) (%d+)$')
  if ln then
    meta, Ln, Wn, Lm = entries[#entries - 1], ln + 0, wn + 0, lm + 0
    entries[#entries], entries[#entries - 1] = nil, nil
  end
end

-- The key's time: a call decides at the later of its clock and the time
-- the key recorded at its last grant, so that no clock behind another's
-- reopens what the key already counted, and nothing accumulates (the key's
-- time is always a time some clock read). A recorded time ahead of the
-- clock by more than the caller's longest window is a clock gone wrong
-- (wrong): the call decides on its own clock, counting all the key holds
-- as used (check), so that the key is stricter for at most that window.
local now, wrong = clock, false
if t > clock then
  if t - clock > longest then wrong = true else now = t end
end

-- A key full since its last grant denies one permit from its note (see
-- full_denial), while no refund is recorded.
if full ~= '' and n == 1 and not shared and not wrong and not ranges and g == 0 then
  local reply = full_denial(full, t, now, clock, T, P, own, longest)
  if reply then return reply end
end

-- The strategies: the caller's own (in ARGV), then under WithPrefix those
-- of every other configuration whose last grant is still in its longest
-- window (it binds until then), in others, four numbers each: L, S, p and
-- till, the time it lapses. A configuration that differs from the caller
-- only in its limits (the same precision and windows) is left out: the
-- caller's limits govern those windows, so a plan upgrade keeps what was
-- used. Also R, the longest window of the caller and every live
-- configuration (buckets before it count for no one), stable, the time
-- until the first configuration lapses, and own_at, the caller's entry.
local others, count_strategies = nil, own
local R, stable, own_at = longest, math.huge, nil
if entries and entries[1] then
  others = {}
  local shape = string.gsub(sig, ' %d+ (%d+)', ' %1')
  for j = 1, #entries, 2 do
    local text, at = entries[j], entries[j + 1] - ENTRY0
    local p, limits = match(text, '^(%d+)(.*)$')
    p = p + 0
    local span = match(limits, '(%d+)$') * p -- its longest window
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
  count_strategies = own + #others / 4
end

-- The refunds' sums, built only while some refund is recorded (else each
-- is 0): refunded(lo, hi), the refunded positions from lo up to hi (modulo
-- COUNTS: past the wrap, [lo, COUNTS) and [0, hi)), and refunded_from(p),
-- the permits refunds gave back at positions from p (a window's first) to
-- the key's count: those of the ranges, and the g of ranges dropped (x g,
-- see the refund step) when the window holds all of them (p <= x; past the
-- wrap, p > K, it does).
local refunded, refunded_from
if ranges or g > 0 or refund_arg then
  refunded = function(lo, hi)
    if not ranges then return 0 end
    if lo > hi then return refunded(lo, COUNTS) + refunded(0, hi) end
    local sum = 0
    for _, r in ipairs(ranges) do
      local from, to = r.lo, r.hi
      if from < lo then from = lo end
      if to > hi then to = hi end
      if to > from then sum = sum + to - from end
    end
    return sum
  end
  refunded_from = function(p)
    local sum = refunded(p, K)
    if g > 0 and (p <= x or p > K) then sum = sum + g end
    return sum
  end
end

-- A refund gives back permits of the grant in the bucket at e whose
-- permits are the positions [a, s) of the key's count, a = s - n, until k
-- in all were given back. The aux keeps the refunded positions as ranges
-- [lo, hi), sorted, touching ones merged; what the grant gave back is the
-- ranges' prefix of its positions, so that a retried refund gives nothing
-- more. It gives while the bucket is kept (after C: a configuration whose
-- window reaches it counts it), at or past the horizon H, and not on a
-- clock gone wrong; the grant's permits must lie in the bucket at e (a
-- token of another key, or another life of this one, gives nothing).
-- Ranges of trimmed positions go; when a range more than RANGES would be
-- kept, the lowest goes and H rises to its hi: a grant starting below gives
-- nothing more. Its permits join x g (g given back in windows that hold x,
-- the lowest position dropped, and so every dropped one): stricter once x
-- leaves a window, never looser. A refund changes counts only: never the
-- key's time, a window or the TTL. It is then checked as n == 0.
local given
if refund_arg then
  -- A token this script did not make reads as a grant that gives nothing.
  local fk, fe, fs, fn = match(refund_arg, '^.(%d+):(%d+)%.(%d+)%.(%d+)$')
  fk, fe, fs, fn = (fk or 0) + 0, (fe or -1) + 0, (fs or 0) + 0, (fn or 0) + 0
  local a = fs - fn
  given = 0
  if note and not wrong and fn >= 1 and fe > C and fe <= T and fs <= K and a >= H then
    -- The bucket at e, and the one before it (none on a key of its note
    -- alone).
    local found = {}
    if rows[2] then
      found = call('ZREVRANGEBYSCORE', key, format('%d', fe), FIRST, 'WITHSCORES',
        'LIMIT', '0', '2')
    end
    local upto, prev, ok = K, base % COUNTS, true
    if fe ~= T then
      ok = found[2] == format('%d', fe)
      if ok then upto, found[1], found[2] = found[1] + 0, found[3], found[4] end
    end
    if ok and found[1] then prev = found[1] + 0 end
    ok = ok and (a - prev) % COUNTS + fn + (upto - fs) % COUNTS == (upto - prev) % COUNTS
    -- A grant whose positions start at or past the last range's end (a
    -- recent grant's), on a key whose first range is not at trimmed
    -- positions, gave nothing back yet, and its range goes last, joined
    -- with the last range when they touch: the ranges' text is spliced at
    -- its ends, and no list is built. Any other refund reads the list.
    local r, trimmed, splice = 0, base % COUNTS, false
    local last_at, last_lo, last_hi, first_lo, first_hi, first_end
    if ok and ranges_text ~= '' then
      last_at, last_lo, last_hi = match(ranges_text, '.*() (%d+) (%d+)$')
      first_lo, first_hi, first_end = match(ranges_text, '^ (%d+) (%d+)()')
      splice = last_hi ~= nil and last_hi + 0 <= a and (first_hi + 0 > trimmed or trimmed > K)
    elseif ok then
      splice = true
    end
    if ok and not splice then
      ranges = ranges or ranges_of(ranges_text)
      r = refunded(a, fs)
    end
    if ok and math.min(fk, fn) - r > 0 then
      given = math.min(fk, fn) - r
      local lo, hi = a + r, a + r + given
      local low_lo, low_hi -- the lowest range, when one more than RANGES would be kept
      if splice then
        local body = ranges_text
        if last_hi and last_hi + 0 == lo then
          body, lo = sub(body, 1, last_at - 1), last_lo + 0
        elseif first_end and string.find(body, '^' .. string.rep(' %d+ %d+', RANGES)) then
          body, low_lo, low_hi = sub(body, first_end), first_lo + 0, first_hi + 0
        end
        ranges_text = body .. format(' %d %d', lo, hi)
      else
        -- The ranges are sorted and apart: the new one, merged with those
        -- it touches, goes before the first range past it.
        local kept, placed = {}, false
        for _, range in ipairs(ranges or {}) do
          if range.hi < lo or range.lo > hi then
            if range.lo > hi and not placed then
              kept[#kept + 1], placed = {lo = lo, hi = hi}, true
            end
            if range.hi > trimmed or trimmed > K then kept[#kept + 1] = range end
          else
            lo, hi = math.min(lo, range.lo), math.max(hi, range.hi)
          end
        end
        if not placed then kept[#kept + 1] = {lo = lo, hi = hi} end
        if #kept > RANGES then
          local low = table.remove(kept, 1)
          low_lo, low_hi = low.lo, low.hi
        end
        ranges = kept
      end
      if low_lo then
        if g > 0 and H <= trimmed and trimmed <= K then g = 0 end
        if g == 0 then x = low_lo end
        H, g = math.max(H, low_hi), g + low_hi - low_lo
      end
      -- The new aux goes in before the old goes.
      local text = aux_text(kind, base, C, H, x, g, ranges, splice and ranges_text)
      call('ZADD', key, '1', text)
      if aux and aux ~= text then call('ZREM', key, aux) end
    end
  end
end

-- A refund replies the key's state as n == 0 would (the check below), or,
-- asked with '=', only what it gave: the check's reads are then spared.
if mark == 61 then return format('1 0 0 0 0 -1 %d', given) end
if refund_arg and not ranges then ranges = ranges_of(ranges_text) end

-- Where a grant goes: the position e of the key's time's bucket, or the
-- tail's when that is later; on a clock gone wrong, the clock's bucket
-- (see the restart, below).
local e = now - now % P + P - 1
if T > e and not wrong then e = T end

-- Check each strategy's count, and what the decision and the reply need:
-- the fewest permits left (and the caller's strategy with the fewest), the
-- latest time the tail leaves a window, whether some strategy denies n, the
-- longest RetryAfter and its strategy, the time until the first count
-- could drop (denied_stable), and the ResetAfter after a grant at e (when
-- the new tail leaves the last window). Durations are from the caller's
-- clock, which may be behind the key's time.
--
-- A strategy counts the permits in its window, from ws to the tail: the
-- key's count minus the count before ws (the last bucket before it, else
-- base), minus what refunds gave back there. A window reaching buckets
-- trimmed away (at or before C: a configuration whose window is longer
-- than any that granted since) counts what they held as used, up to what
-- any writer could have granted there: Ln * ceil(U / Wn) + 2 * Lm in U µs.
-- On a clock gone wrong, the key reads as if all it holds (held: the
-- caller's longest window at the key's recorded time) had been granted in
-- the clock's bucket: every strategy counts it, until it leaves.
--
-- A denied strategy's RetryAfter is the time (from the clock) it frees
-- need permits: the first bucket of its window whose permits from the
-- window's start reach need leaves it. Each bucket holds a permit but those
-- refunds emptied (each at least one refunded position), so that one is
-- among the first need + |R| + g. It reads at most SCAN buckets; when the
-- bucket is not among them, the time the tail leaves: longer than the
-- truth, never shorter. The denial's stable is the time its first bucket
-- leaves (its count's first change); what the window holds of buckets
-- trimmed away (unseen) leaves before any bucket.
local fewest, own_fewest, own_index, reset, grant_reset = math.huge, math.huge, 1, 0, 0
local retry, reported, denied, denied_stable = -1, nil, false, math.huge
local held, held_from, fills = nil, nil, nil
if wrong then held_from = t - t % P - (ARGV[last] - 1) * P end
for i = 1, count_strategies do
  local L, S, p, index, till
  if i <= own then
    L, S, p, index = ARGV[2 * i + 3] + 0, ARGV[2 * i + 4] + 0, P, i
  else
    local j = 4 * (i - own) - 3
    L, S, p, index, till = others[j], others[j + 1], others[j + 2], 0, others[j + 3]
  end
  local ws = now - now % p - (S - 1) * p
  local from, count, before, unseen, tail_at = ws, 0, K, 0, T
  if wrong then from = held_from end
  -- Scores are integers: "(from" is from - 1, and "(" .. below is ws.
  local below = nil
  if T >= from then
    below = format('%d', from - 1)
    -- (A key that holds its note alone has no bucket to look up.)
    local found = nil
    if rows[2] then
      found = call('ZREVRANGEBYSCORE', key, below, FIRST, 'LIMIT', '0', '1')[1]
    end
    before = base % COUNTS
    if found then
      before = found + 0
    elseif from <= C then
      local ln, wn, lm = Ln, Wn, Lm
      if not ln then
        ln, wn = densest(own, P)
        lm = ln
      end
      unseen = math.min(base, ln * floor((C - from + wn) / wn) + 2 * lm)
    end
    count = (K - before) % COUNTS + unseen
    if refunded_from then count = count - refunded_from(before) end
  end
  if n > 0 and index > 0 and count + n == L and unseen == 0
      and not (shared or wrong or refunded) then
    -- A grant would leave this strategy full: the note says until when.
    fills = fills or {}
    fills[#fills + 1], fills[#fills + 2] = i, below or false
  end
  if wrong then
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
    -- has n permits left, more than any of these), so stable is the time
    -- the first of their counts drops: the next step of a window where
    -- the script does not know when.
    denied = true
    local wait, change = tail, now - now % p + p - clock
    if n > L then
      wait = till - clock -- another configuration's limit below n
    elseif not wrong then
      local need = count + n - L
      local most, gone = need + g, 0
      if refunded then most, gone = most + refunded(0, COUNTS), refunded_from(before) end
      if most > SCAN then most = SCAN end
      local got = call('ZRANGEBYSCORE', key, '(' .. below, BEFORE_ENTRIES,
        'WITHSCORES', 'LIMIT', '0', sub(SCAN_LIMITS, most, most))
      change = wait
      if got[2] then
        local at = got[2] + 0
        change = at - at % p + S * p - clock
        for j = 1, #got, 2 do
          local count_at = got[j] + 0
          local freed = unseen + (count_at - before) % COUNTS - gone
          if refunded then freed = freed + refunded_from(count_at) end
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
if refund_arg then
  if fewest < 0 then fewest = 0 end
  return format('1 %d 0 %d %d -1 %d', fewest, reset, own_index - 1, given)
end

-- Decide: n above the caller's smallest limit is denied (RetryAfter never,
-- its first strategy reported); n == 0 is allowed; otherwise allowed unless
-- a strategy denied. A denial reports the caller's strategy with the
-- longest RetryAfter, or, when another configuration's waits longest, the
-- caller's with the fewest permits left, with that RetryAfter. Remaining is
-- the fewest permits left; a denial's ResetAfter is never before its
-- RetryAfter (on a clock gone wrong the two are bounds of what the state
-- holds, read apart).
if stable < denied_stable then denied_stable = stable end
if n > smallest then
  reported, retry, denied, denied_stable = 1, -1, true, 0
elseif denied and reported == 0 then
  reported = own_index
end
if wrong then denied_stable = 0 end
if fewest < 0 then fewest = 0 end
if denied then
  if retry > reset then reset = retry end
  return format('0 %d %d %d %d %d', fewest, retry, reset, reported - 1, denied_stable)
elseif n == 0 then
  return format('1 %d 0 %d %d 0', fewest, reset, own_index - 1)
end

-- Apply a grant: n more permits at e. When the tail moves (moved), the old
-- tail becomes a bucket, and a tail that passes a multiple of SCAN buckets
-- of P trims up to SCAN buckets that left every live window (R): it keeps
-- up, as at most SCAN buckets opened since, and base and C remember the
-- count and position of the last bucket trimmed. When to trim depends on
-- positions only, never on counts, so that a refund leaves the key as a
-- grant of fewer permits would. Under WithPrefix, the meta keeps the
-- densest writer. A grant on a clock gone wrong restarts the key instead
-- (below).
local new_K, moved, new_aux, tail_gone = (K + n) % COUNTS, e ~= T, aux, false
local new_note, new_meta
if not wrong then
  if K + n >= COUNTS then
    -- The wrap: trimmed grants then count as what the writers could grant.
    -- Positions start again from 0: no earlier grant refunds (stricter).
    base, H, x, g, ranges, new_aux = base % COUNTS + COUNTS, 0, 0, 0, nil, nil
  end
  local period = SCAN * P
  if moved and T >= 0 and e - e % period > T - T % period then
    local trimmed = call('ZRANGEBYSCORE', key, FIRST, format('%d', now - R),
      'WITHSCORES', 'LIMIT', '0', sub(SCAN_LIMITS, SCAN, SCAN))
    if #trimmed > 0 then
      call('ZREMRANGEBYSCORE', key, FIRST, trimmed[#trimmed])
      base = trimmed[#trimmed - 1] + base - base % COUNTS
      C, new_aux = trimmed[#trimmed] + 0, nil
    end
    if #trimmed < 2 * SCAN and T <= now - R then
      -- The old tail left every window too: it never becomes a bucket.
      base = K + base - base % COUNTS
      C, new_aux, tail_gone = T, nil, true
    end
  end
  if shared then
    new_note = format('%s:%d %d %d', kind, new_K, now, e - now)
    local Ld, Wd = densest(own, P)
    local ln, wn, lm = Ln or Ld, Wn or Wd, math.max(Lm or Ld, Ld)
    if Ld * wn > ln * Wd then ln, wn = Ld, Wd end
    new_meta = format('%s %d %d %d', kind, ln, wn, lm)
  else
    new_note = format('%s:%d %d', kind, new_K, now)
    if fills and K + n < COUNTS then
      -- Each strategy this grant leaves full, and when the first bucket
      -- of its window leaves it (the oldest member from its start, else
      -- the tail, old or new), for full_denial.
      local sep = '|'
      for j = 1, #fills, 2 do
        local i, below, first = fills[j], fills[j + 1], e
        if below then first = T end
        if below and rows[2] then
          local got = call('ZRANGEBYSCORE', key, '(' .. below, BEFORE_ENTRIES, 'WITHSCORES',
            'LIMIT', '0', '1')
          if got[2] then first = got[2] + 0 end
        end
        local leaves = first - first % P + ARGV[2 * i + 4] * P
        new_note = format('%s%s%d:%d', new_note, sep, i, leaves - now)
        sep = ','
      end
    end
  end
  if not new_aux and (base > 0 or C > 0 or H > 0) then
    new_aux = aux_text(kind, base, C, H, x, g, ranges)
  end
end

-- The key's TTL after a grant (ms): until the new tail leaves the last
-- window of the caller and of every configuration still live.
local ttl = floor((grant_reset + 999) / 1000)
if wrong then
  -- Restart: a grant on a clock gone wrong moves the key to the caller's
  -- timeline, carrying what it held: a fresh state whose tail, at the
  -- clock's bucket, holds all of it (counted for at most a window from
  -- now), whose horizon refuses refunds of every earlier grant, and whose
  -- entries still live move back to the tail. UNLINK frees a large set off
  -- the script.
  call('UNLINK', key)
  base, C, H, x, g, ranges = (K - held) % COUNTS, 0, K, 0, 0, nil
  local add = {'ZADD', key, '0', format('%s:%d %d', kind, new_K, now), '1',
    aux_text(kind, base, C, H, x, g, ranges)}
  if shared then
    add[4] = format('%s %d', add[4], e - now)
    if meta then add[#add + 1], add[#add + 2] = '+inf', meta end
    for j = 1, #entries, 2 do
      local at, p, S = entries[j + 1] - ENTRY0, match(entries[j], '^(%d+) .* (%d+)$')
      if entries[j] ~= sig and at - at % p + S * p > now then
        add[#add + 1], add[#add + 2] = format('%d', ENTRY0 + math.min(at, e)), entries[j]
      end
    end
    add[#add + 1], add[#add + 2] = format('%d', ENTRY0 + e), sig
  end
  call(unpack(add))
  call('PEXPIRE', key, ttl)
else
  -- Write the grant. The new members go in before the old ones go, as a
  -- set left empty even for a moment is a deleted key. The old tail joins
  -- the buckets when the tail moved. Under WithPrefix, the caller's entry
  -- moves to the new position, and entries that lapsed go. The TTL is set
  -- when the tail or the caller's entry moved (else an earlier grant set
  -- it).
  local keep_tail = moved and T >= 0 and not tail_gone
  local aux_changed = new_aux and new_aux ~= aux
  local meta_changed = new_meta and new_meta ~= meta
  if keep_tail or aux_changed or meta_changed then
    local add = {'ZADD', key, '0', new_note}
    if keep_tail then add[5], add[6] = format('%d', T), format('%d', K) end
    if aux_changed then add[#add + 1], add[#add + 2] = '1', new_aux end
    if meta_changed then add[#add + 1], add[#add + 2] = '+inf', new_meta end
    call(unpack(add))
    local gone = {'ZREM', key}
    if note then gone[#gone + 1] = note end
    if aux and aux_changed then gone[#gone + 1] = aux end
    if meta and meta_changed then gone[#gone + 1] = meta end
    if #gone > 2 then call(unpack(gone)) end
  else
    call('ZADD', key, '0', new_note)
    if note then call('ZREM', key, note) end
  end
  local entry_moved = shared and e ~= own_at
  if entry_moved then
    call('ZADD', key, format('%d', ENTRY0 + e), sig)
    if moved then
      call('ZREMRANGEBYSCORE', key, format('%d', ENTRY0), format('(%d', ENTRY0 + now - R))
    end
  end
  if moved or entry_moved then call('PEXPIRE', key, ttl) end
end

-- Reply to a grant: Remaining after it, and its token.
local remaining = fewest - n
if remaining < 0 then remaining = 0 end
return format('1 %d 0 %d %d 0 %d.%d.%d', remaining, grant_reset, own_index - 1, e, new_K, n)
