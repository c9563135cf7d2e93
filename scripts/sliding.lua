-- sliding.lua: the sliding window and the sliding log. A configuration has
-- a precision P and one or more strategies (L_i, S_i): at most L_i permits
-- in the S_i buckets of P ending with the bucket of now. A request is
-- allowed only if every strategy allows it.
--
-- KEYS[1]  the key
-- ARGV[1]  now: Unix µs, or "" to read the Redis server's TIME
-- ARGV[2]  n: permits asked for (>= 0)
-- ARGV[3]  kind: "w" for a sliding window, "l" for a sliding log (each
--          reads the other's state as foreign)
-- ARGV[4]  precision P: this configuration's bucket length (µs)
-- ARGV[5]  limit L_1 of the shortest strategy (permits)
-- ARGV[6]  size S_1 of the shortest strategy (its window in buckets of P)
-- ...      L_i, S_i of each next strategy, windows and limits ascending
-- last     under WithPrefix only: "1", the key may be shared with other
--          configurations (a default key's prefix names its configuration)
--
-- Times and durations are integer µs in Lua numbers, exact below 2^53 (Go
-- keeps every value below it), sent through format('%d'): Lua's own
-- conversion keeps 14 digits. Counts of permits granted on a key since it
-- began are kept modulo BUCKET0 = 2^52: a count in a window is a
-- difference of two, exact as long as no window holds 2^52 permits.
--
-- State (format 9, docs/internals.md): a sorted set whose scores keep its
-- members in order. The note, score 0, is what the decision reads:
--   "<kind>9:K T base C", then "+O" unless O is 0, then " T-f cb ni-f" per
--   remembered window
-- K, the key's count, is in the text and not the score, so that a call
-- reads the note without its score: Redis 7.0 prints a score with %.17g,
-- several percent of a denial's Redis time. A grant in the tail's bucket
-- then writes the note of the new count and removes the old one.
-- Every bucket before the tail T (the last bucket granted in) that holds a
-- permit: score BUCKET0 + the bucket's index on the key's grid G
-- (floor(µs / G), in the key's time: see clock), member the decimal count
-- up to and including that bucket (cumulative, so members are unique and
-- the count in any span of buckets is one subtraction). base is the count
-- of the last bucket trimmed away, plus BUCKET0 once the key's count
-- wrapped; C the first bucket index still fully known; O how far (µs) the
-- key's time is ahead of the clock. A remembered window starting at bucket
-- f holds the count of every permit granted before f (cb) and the first
-- bucket from f on that holds a permit (ni): facts about buckets before
-- the tail, which no later grant changes, so a call whose windows start
-- from f to ni reads no bucket. Under WithPrefix, also one member per
-- configuration that granted, score ENTRY0 + the start (µs) of its last
-- grant's bucket, text "P L_1 S_1 L_2 S_2 ...": its strategies bind every
-- call until that bucket leaves its longest window (until, read with the
-- key's O of the time: see clock); and the meta, score
-- +inf, "<kind>9 G R Ln Wn Lm": G the grid (µs, the first writer's
-- precision); R the longest window (µs) of any configuration that granted;
-- Ln per Wn µs the densest strategy of any that granted, and Lm the
-- largest limit of their densest strategies: in U µs, no writer granted
-- more than Ln * ceil(U / Wn) + 2 * Lm. A default key, which only one
-- configuration ever reads, keeps neither: its grid, windows and densest
-- strategy are its configuration's.
--
-- The reply is six integers: allowed (0/1), remaining, retry-after µs (-1:
-- never), reset-after µs, the index of the strategy reported, and stable µs:
-- how long the same request gets the same reply but for its durations
-- counting down (the deny cache's bound).
--
-- The steps of a decision are the sections below, in order: read_args,
-- read_state, clock, strategies, check (for each strategy), decide, apply,
-- write, reply. Redis builds every function anew on each call, and one
-- using the chunk's locals costs about a small command (callgrind): the
-- steps are sections of one chunk; the functions take their arguments.

local KEY, KIND = KEYS[1], ARGV[3]
local find, match, format = string.find, string.match, string.format
-- The scores, exact integers below 2^53: the note's is 0; a bucket's is
-- BUCKET0 + its index (below 2^44: µs below 2^53 in buckets of 1ms at
-- least); an entry's is ENTRY0 = 2^52 + 2^44, plus a time in µs (below
-- 2^52 - 2^44: the year 2112).
local BUCKET0, ENTRY0 = 4503599627370496, 4521191813414912
local SCAN = 8 -- most buckets one call reads to find a RetryAfter, or trims
-- Every floor(a / b), as (a - a % b) / b or math.floor(a / b), is exact:
-- for integers |a| < 2^53 and b >= 1, a / b never rounds up to an integer.

-- The time (µs) bucket k of a grid of g µs leaves the window of S buckets
-- of p µs: the first window start after the bucket's end, plus the window.
-- Windows start at multiples of p on the caller's clock, o µs behind.
local function leaves(k, g, S, p, o)
  local e = (k + 1) * g - o + p - 1
  return e - e % p + o + (S - 1) * p
end

-- The densest strategy (most permits per µs) of the configuration of
-- precision p with strategies ARGV[5..last] (see the meta).
local function densest(p, last)
  local L, W = 0, 1
  for i = 5, last, 2 do
    if ARGV[i] * W > L * ARGV[i + 1] * p then L, W = ARGV[i] + 0, ARGV[i + 1] * p end
  end
  return L, W
end

-- read_args: the request and the configuration: precision P, its
-- strategies in ARGV[5..last] (limit and size), the smallest limit first.
local n, P, now = ARGV[2] + 0, ARGV[4] + 0, ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = now + 0
end
local last = #ARGV
local shared = last % 2 == 1
if shared then last = last - 1 end
local smallest = ARGV[5] + 0

-- read_state: the note, the key's lowest member; under WithPrefix, then
-- the entries and the meta; or an empty key's state (no tail: T = -1).
-- Without a meta, the grid G is this configuration's precision, and R
-- (read on a grant) and Ln, Wn, Lm (where needed) are its longest window
-- and densest strategy. The text after the key's count starts at the
-- note's character rest, its remembered windows at remembered. A state in a previous released format (a sorted set whose
-- first member is a format 8 note, or whose last is a format 7 note or a
-- format 6 meta, or a hash with "W4" or "L4" in field m) reads as empty,
-- and the first grant replaces it.
local note, meta, rest, remembered = '', nil, nil, 1
local G, R, Ln, Wn, Lm = P, nil, nil, nil, nil
local T, base, C, O, cum = -1, 0, 0, 0, 0
local entries, old, foreign = nil, false, nil
local rows = redis.pcall('ZRANGE', KEY, '0', '0')
if rows.err then
  local m = redis.pcall('HGET', KEY, 'm')
  old = type(m) == 'string' and find(m, '^' .. string.upper(KIND) .. '4 ') ~= nil
  if not old then foreign = 'another type than sliding state' end
elseif rows[1] then
  local kind, k, after_k, t, b, c, o, at = match(rows[1], '^(%a)9:(%d+)() (%d+) (%d+) (%d+)%+?(%d*)()')
  if kind == KIND then
    -- base and C stay text until a call needs them: few do.
    note, cum, rest, T, base, C, remembered = rows[1], k + 0, after_k, t + 0, b, c, at
    if o ~= '' then O = o + 0 end
    if cum >= BUCKET0 then foreign = 'a sorted set that is not sliding state' end
    if shared then
      entries = redis.call('ZRANGEBYSCORE', KEY, format('%d', ENTRY0), '+inf', 'WITHSCORES')
      local k, g, r, ln, wn, lm = match(entries[#entries - 1] or '', '^(%a)9 (%d+) (%d+) (%d+) (%d+) (%d+)$')
      if k == KIND then
        meta, G, R, Ln, Wn, Lm = entries[#entries - 1], g + 0, r + 0, ln + 0, wn + 0, lm + 0
        entries[#entries], entries[#entries - 1] = nil, nil
      end
    end
  else
    local highest = redis.call('ZRANGE', KEY, '-1', '-1')[1]
    if find(rows[1], '^' .. KIND .. ':%d+ %d+ %d+[%d +]*$')
      or find(highest, '^' .. KIND .. '6 %d+ %d+ %d+ %d+ %d+ %d+$')
      or find(highest, '^' .. KIND .. '~%d+ %d+ %d+[%d +]*$') then
      old = true
    else
      foreign = 'a sorted set that is not sliding state'
    end
  end
end
if foreign then return redis.error_reply('NOTOURS holds ' .. foreign .. ', not redlimit state; it was left unchanged') end

-- clock: the key keeps its own time, O µs ahead of the caller's clock.
-- When now falls in a bucket before the tail, the clock went back: O grows
-- so that now falls in the tail's bucket, and the key's time stands still
-- there until the clock catches up. No bucket is then in the future,
-- nothing is counted again or forgotten, and no grant stays in a window for
-- longer than the window from now. The new O is written (write, below)
-- even by a denial or n == 0, the one write they make, best effort: when
-- Redis refuses it, the decision is the same, and a later call grows O
-- alike. A call that wrote O reads, and leaves, the key as a call at the
-- tail's time would, and windows still start at multiples of their
-- precision on the caller's clock (leaves): never stricter than without it
-- but for buckets a later key time trims sooner (apply), which a longer
-- window then counts conservatively.
now = now + O
local b, moved = (now - now % G) / G, false
if T > b then
  O, now, b, moved = O + (T - b) * G, now + (T - b) * G, T, true
end

-- strategies: the caller's own, which the check reads from ARGV, then
-- n_others of every other configuration whose last grant is still in its
-- longest window (until > now), listed in others, four entries each: L,
-- S, p (at most L permits in S buckets of p µs) and until. While
-- configurations alternate, every grant satisfies all of them. A
-- configuration that differs from the caller only in its limits (the same
-- precision and windows: the same shape) is left out: the caller's own
-- limits govern those windows, so the two share the counts and each
-- applies its own (a plan upgrade keeps what was used). Until the first
-- lapses, the strategies that bind stay (stable).
local own, others, n_others = (last - 4) / 2, nil, 0
local stable, sig, own_start = math.huge, nil, nil
if entries then
  sig, others = table.concat(ARGV, ' ', 4, last), {}
  local shape = string.gsub(sig, ' %d+ (%d+)', ' %1')
  for j = 1, #entries, 2 do
    local text, start = entries[j], entries[j + 1] - ENTRY0
    local p, limits = match(text, '^(%d+)(.*)$')
    p = p + 0
    local till = leaves(math.floor(start / G), G, match(limits, '(%d+)$') + 0, p, O)
    if text == sig then
      own_start = start
    elseif till > now and string.gsub(text, ' %d+ (%d+)', ' %1') ~= shape then
      if till - now < stable then stable = till - now end
      for L, S in string.gmatch(limits, ' (%d+) (%d+)') do
        local k = 4 * n_others
        others[k + 1], others[k + 2], others[k + 3], others[k + 4] = L + 0, S + 0, p, till
        n_others = n_others + 1
      end
    end
  end
end

-- check, for each strategy: its window [ws, now] counts the state buckets
-- from the one holding ws, first (whole: conservative when the grids
-- differ): count = cum minus the count before first, modulo BUCKET0.
--
-- The count before is remembered, else read: a window a grant saw starting
-- at f, whose first bucket holding a permit is ni, tells it for every
-- window starting from f to ni, as no bucket in between holds a permit. A
-- window no remembered one covers is listed in fresh, for a grant to
-- remember. Buckets trimmed away leave base; a window reaching before them
-- (a configuration whose window is longer than any that granted before)
-- counts their grants as used, up to what any writer could have granted
-- there (the meta's bound).
--
-- What the decision and the reply need is gathered as it goes: the fewest
-- permits left (and the caller's strategy with the fewest), the latest
-- time the tail (or, on a grant, now's bucket) leaves a window, and for a
-- request of 1 to smallest permits: whether some strategy denies, the
-- longest RetryAfter and its strategy, and stable, the time until the
-- first count drops. A denying strategy's RetryAfter is the time the first
-- bucket whose cumulative count reaches cum + n - L leaves its window, or
-- for another configuration's whose limit is below n, the time it lapses.
-- It reads at most SCAN buckets from its window's first (none when the
-- first is remembered and enough); when the bucket is not among them, or
-- the count is partly unknown, it is the time the tail leaves: longer than
-- the truth, never shorter.
local fewest, own_fewest, own_index, tail_leaves, b_leaves = math.huge, math.huge, 1, 0, 0
local denied, reported, retry, fresh, kept, stop = false, nil, -1, nil, 0, #note
for k = 1, own + n_others do
  -- The strategy, its place among the caller's (0 for another
  -- configuration's) and, for another's, until when it binds.
  local L, S, p, index, till = nil, nil, P, k, nil
  if k <= own then
    L, S = ARGV[2 * k + 3] + 0, ARGV[2 * k + 4] + 0
  else
    local o = 4 * (k - own)
    L, S, p, index, till = others[o - 3], others[o - 2], others[o - 1], 0, others[o]
  end
  local ws = now - (now - O) % p - (S - 1) * p
  local first = (ws - ws % G) / G
  local before, next_bucket, known, hit, unseen = cum, false, true, false, 0
  if T >= first then
    -- The remembered windows, " T-f cb ni-f" each; the one used is
    -- kept, as the sum of their j = 1, 2, 4, ... in turn.
    local at, j = remembered, 1
    while not hit and at < stop do
      local _, to, d, cb, e = find(note, '^ (%d+) (%d+) (%d+)', at)
      local f = T - d
      local ni = f + e
      if f <= first and first <= ni then
        before, next_bucket, hit = cb + 0, ni, true
        if kept % (2 * j) < j then kept = kept + j end
      end
      at, j = to + 1, 2 * j
    end
    if not hit then
      local row = redis.call('ZREVRANGEBYSCORE', KEY, format('(%d', BUCKET0 + first), format('%d', BUCKET0), 'LIMIT', '0', '1')
      before = base % BUCKET0
      if row[1] then
        before = row[1] + 0
      elseif first < C + 0 then
        if not Ln then
          Ln, Wn = densest(P, last)
          Lm = Ln
        end
        local most = Ln * math.floor((C * G - ws + Wn - 1) / Wn) + 2 * Lm
        before, unseen, known = base % BUCKET0, math.min(base, most), false
      end
    end
  end
  if known and not hit then
    fresh = fresh or {}
    fresh[#fresh + 1], fresh[#fresh + 2], fresh[#fresh + 3] = first, before, b
  end

  local count = (cum - before) % BUCKET0 + unseen
  local left = L - count
  if left < fewest then fewest = left end
  if left < 0 then left = 0 end
  if index > 0 and left < own_fewest then own_fewest, own_index = left, index end
  local tail_ends = leaves(T, G, S, p, O)
  if tail_ends > tail_leaves then tail_leaves = tail_ends end
  local ends = tail_ends
  if b ~= T then ends = leaves(b, G, S, p, O) end
  if ends > b_leaves then b_leaves = ends end

  if n > 0 and n <= smallest and (count > 0 or n > L) then
    -- A denial's times. change: until this count first drops, when its
    -- first bucket leaves the window (the next step of p when not known).
    local change = p - (now - O) % p
    if next_bucket then change = leaves(next_bucket, G, S, p, O) - now end
    if count + n > L then
      denied = true
      local after, need = tail_ends - now, count + n - L
      if n > L then
        -- Another configuration's limit below n (the caller's are at
        -- least smallest): it denies until that configuration lapses.
        after = till - now
      elseif known and next_bucket and need <= 1 then
        -- The first bucket holds a permit at least: need is reached there.
        after = change
      elseif known then
        -- Each bucket holds a permit at least, so the first whose count
        -- from the window's start reaches need is among its first need:
        -- the buckets before the tail, then the tail (after's first value).
        local got = redis.call('ZRANGEBYSCORE', KEY, format('%d', BUCKET0 + first), format('(%d', ENTRY0), 'WITHSCORES', 'LIMIT', '0', math.min(need, SCAN))
        change = after
        if got[2] then change = leaves(got[2] - BUCKET0, G, S, p, O) - now end
        for j = #got - 1, 1, -2 do
          if (got[j] - before) % BUCKET0 >= need then after = leaves(got[j + 1] - BUCKET0, G, S, p, O) - now end
        end
      end
      if after > retry then reported, retry = index, after end
    end
    if change < stable then stable = change end
  end
end

-- decide: n above the caller's smallest limit is denied (RetryAfter never,
-- and the caller's first strategy reported); n == 0 is allowed; otherwise
-- allowed unless a strategy denied. The denial reports the caller's
-- strategy with the longest RetryAfter (the first of equals), or, when
-- another configuration's waits longest, the caller's with the fewest
-- permits left, with that RetryAfter.
local allowed = true
if n > smallest then
  allowed, reported, retry, stable = false, 1, -1, 0
elseif denied then
  allowed = false
  if reported == 0 then reported = own_index end
end
local granted = allowed and n > 0
if not granted then fresh = nil end -- only a grant remembers windows

-- apply: a grant is n more in bucket b, which is now's. The note changes
-- when the tail moves (the old tail's bucket becomes a member), a window
-- no grant saw is remembered (with its first bucket holding a permit: read
-- once here, b when none held one before), or a trim moves base and C;
-- under WithPrefix the meta, when this grant changes it (new_meta). The
-- TTL runs until the tail leaves the longest window of every configuration,
-- and is set when the tail or that window moves, or the key's time did.
local note_changed, new_meta, expire = moved, nil, moved
if granted then
  if old then redis.call('DEL', KEY) end
  local window = ARGV[last] * P
  R = R or window
  expire = expire or T ~= b or window > R
  R = math.max(R, window)
  if shared then
    local Ld, Wd = densest(P, last)
    if not Ln then Ln, Wn, Lm = Ld, Wd, Ld end
    if Ld * Wn > Ln * Wd then Ln, Wn = Ld, Wd end
    Lm = math.max(Lm, Ld)
    new_meta = format('%s9 %d %d %d %d %d', KIND, G, R, Ln, Wn, Lm)
    if new_meta == meta then new_meta = nil end
  end
  note_changed = note_changed or new_meta ~= nil or T ~= b
  -- The grant that wraps the key's count adds BUCKET0 to base: trimmed
  -- grants then count as what the writers could have granted (check).
  if cum + n >= BUCKET0 then base, note_changed = base % BUCKET0 + BUCKET0, true end
  -- Buckets that left the longest window of every configuration go, SCAN
  -- at most, on a grant that opens a bucket and passes a multiple of SCAN
  -- permits: it keeps up (at most SCAN new buckets per SCAN permits) and
  -- spares most grants its read. base and C remember where they were;
  -- counts never depend on it (a difference of cumulative counts).
  if T ~= b and math.floor((cum + n) / SCAN) > math.floor(cum / SCAN) then
    local trimmed = redis.call('ZRANGEBYSCORE', KEY, format('%d', BUCKET0), format('(%d', BUCKET0 + math.floor((now - R) / G)), 'WITHSCORES', 'LIMIT', '0', SCAN)
    if #trimmed > 0 then
      redis.call('ZREMRANGEBYSCORE', KEY, format('%d', BUCKET0), trimmed[#trimmed])
      base, C, note_changed = trimmed[#trimmed - 1] + base - base % BUCKET0, trimmed[#trimmed] - BUCKET0 + 1, true
    end
  end
  if fresh then
    note_changed = true
    for j = 1, #fresh, 3 do
      local first = fresh[j]
      if T >= first then
        local got = redis.call('ZRANGEBYSCORE', KEY, format('%d', BUCKET0 + first), format('(%d', ENTRY0), 'WITHSCORES', 'LIMIT', '0', '1')
        fresh[j + 2] = T
        if got[2] then fresh[j + 2] = got[2] - BUCKET0 end
      end
    end
  end
end

-- write: a grant's note, with the new count: when only the count changed,
-- the old note's text with it; else the tail b, base, C, O and the windows
-- remembered that this call used, with the old tail's bucket when the tail
-- moved, and new_meta. A denial or n == 0 writes only when O grew (clock),
-- best effort. The old members go after the new ones are in: a set left
-- empty even for a moment is a deleted key, and the new one would carry no
-- TTL; a note gone without its successor would leave a key nobody reads as
-- ours.
if granted or moved then
  local call, total = redis.pcall, cum
  if granted then call, total = redis.call, (cum + n) % BUCKET0 end
  if not note_changed then
    call('ZADD', KEY, '0', format('%s9:%d', KIND, total) .. string.sub(note, rest))
    call('ZREM', KEY, note)
  else
    local text = {format('%s9:%d %d %d %s', KIND, total, b, base, C)}
    if O > 0 then text[2] = format('+%d', O) end
    local at, j = remembered, 1
    while at < #note do
      local _, to, d, cb, e = find(note, '^ (%d+) (%d+) (%d+)', at)
      if kept % (2 * j) >= j then text[#text + 1] = format(' %d %s %s', b - T + d, cb, e) end
      at, j = to + 1, 2 * j
    end
    if fresh then
      for j = 1, #fresh, 3 do
        text[#text + 1] = format(' %d %d %d', b - fresh[j], fresh[j + 1], fresh[j + 2] - fresh[j])
      end
    end
    local args, gone = {'ZADD', KEY, '0', table.concat(text)}, {}
    if note ~= '' and note ~= args[4] then gone[1] = note end
    if T ~= b and T >= 0 then args[5], args[6] = format('%d', BUCKET0 + T), format('%d', cum) end
    if new_meta then
      args[#args + 1], args[#args + 2] = '+inf', new_meta
      if meta then gone[#gone + 1] = meta end
    end
    local written = call(unpack(args))
    if type(written) == 'number' and #gone > 0 then call('ZREM', KEY, unpack(gone)) end
  end
end
if granted then
  -- This configuration's entry, and the others' that lapsed.
  if shared then
    if b * G ~= own_start then redis.call('ZADD', KEY, format('%d', ENTRY0 + b * G), sig or table.concat(ARGV, ' ', 4, last)) end
    if T ~= b then redis.call('ZREMRANGEBYSCORE', KEY, format('%d', ENTRY0), format('%d', ENTRY0 + now - R - G)) end
  end
  if expire then redis.call('PEXPIRE', KEY, math.floor(((b + 1) * G + R - now + 999) / 1000)) end
  tail_leaves = b_leaves
end

-- reply: Remaining, the fewest permits left; ResetAfter, when the tail leaves.
local used = 0
if granted then used = n end
local remaining, reset = fewest - used, tail_leaves - now
if remaining < 0 then remaining = 0 end
if reset < 0 then reset = 0 end
if allowed then return format('1 %d 0 %d %d 0', remaining, reset, own_index - 1) end
if moved then stable = 0 end
return format('0 %d %d %d %d %d', remaining, retry, reset, reported - 1, stable)
