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
-- Every time and duration is an integer number of µs held in a Lua number
-- (exact below 2^53; the Go side keeps every value below it).
--
-- State (docs/internals.md): a sorted set. One member per nonempty bucket of
-- the key's grid G: score the bucket's index (floor(µs / G), in µs of the
-- key's time: clock, below), member the decimal count of every permit
-- granted on the key up to and including that bucket (cumulative, so
-- members are unique and the count in any span of buckets is one
-- subtraction). And the note, score +inf:
--   "<kind>~T base C" then "+O" unless O is 0, then " T-f cb ni-f" per
--   remembered window
-- T the tail (the last bucket granted in); base the cumulative count of the
-- last bucket trimmed away; C the first bucket index still fully known; O
-- how far (µs) the key's time is ahead of the clock (clock, below). A
-- remembered window starting at bucket f holds the count of every permit
-- granted before f (cb) and the first bucket from f on that holds a permit
-- (ni): facts about buckets before the tail, which no later grant changes,
-- so a call whose windows start from f to ni reads no bucket. Under
-- WithPrefix, also the meta, score +inf, which sorts before the note:
--   "<kind>7 G R Ln Wn"
-- G the grid (µs, the first writer's precision); R the longest window (µs)
-- of any configuration that granted; Ln per Wn µs the densest strategy of
-- any configuration that granted. A default key, which only one
-- configuration ever reads, keeps no meta: its grid, windows and densest
-- strategy are its configuration's. Short, and relative to T, every member
-- stays within the 64 bytes of Redis's compact listpack. And under
-- WithPrefix one member per configuration that granted, score -until,
-- text "P L_1 S_1 L_2 S_2 ...": its strategies bind every call until its
-- last grant leaves its longest window (until, in µs of the key's time).
-- Configurations sharing a key all read it by the same rule.
--
-- The reply is six integers: allowed (0/1), remaining, retry-after µs (-1:
-- never), reset-after µs, the index of the strategy reported, and stable µs:
-- how long the same request gets the same reply but for its durations
-- counting down (the deny cache's bound).
--
-- How it reads: the steps of a decision are the sections below, in order,
-- each headed by its name: read_args, read_state, clock, other_rules,
-- locate, decide, apply, write, reply. They share the chunk's locals.
-- Redis makes every function and table of a script anew on every call,
-- each costing it a good part of what a small command does: the steps are
-- not functions, and the few functions take what they need as arguments.
--
-- A rule is {L, S, P, first, before, count, next, known, memo}: at most L
-- permits in S buckets of P µs, and what locate finds: the window's first
-- bucket on the key's grid, the count before it, the count in it, its
-- first bucket holding a permit (false when not known), whether the count
-- is known exactly, and the remembered window it used (false if none).

local KEY, KIND = KEYS[1], ARGV[3]
-- Above every bucket index (they stay below 2^52 / 1000), below the meta.
local LAST = '9007199254740992'
-- Most buckets one call reads to find a RetryAfter, or trims.
local SCAN = 8

-- floor(a / b) for b > 0, exact where a / b rounds up to an integer.
local function idiv(a, b)
  local r = a % b
  if r < 0 then r = r + b end
  return (a - r) / b
end

-- The time bucket k of a grid of g µs leaves rule r's window.
local function leaves(k, g, r)
  return (idiv((k + 1) * g + r.P - 1, r.P) + r.S - 1) * r.P
end

-- Strategies from numbers[from..last], limit and size in turn, on precision
-- p, appended to rules. A strategy over the same buckets as one of the
-- caller's own (the first own) is left out: the caller's own limit governs
-- that window, so configurations that differ only in a limit share its
-- count and each applies its own (a plan upgrade keeps what was used).
local function add_rules(rules, own, p, numbers, from, last)
  for i = from, last, 2 do
    local L, S, same = numbers[i] + 0, numbers[i + 1] + 0, false
    for k = 1, own do
      if rules[k].P == p and rules[k].S == S then same = true end
    end
    if not same then
      rules[#rules + 1] = {L = L, S = S, P = p, first = 0, before = 0, count = 0, next = false, known = true, memo = false}
    end
  end
end

-- read_args: the request and the configuration. Its strategies come first
-- in rules (own of them), other configurations' follow. Ld per Wd µs is its
-- densest strategy (most permits per µs): it bounds what it can grant in
-- any span.
local n, P, now = ARGV[2] + 0, ARGV[4] + 0, nil
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = ARGV[1] + 0
end
local last, sig = #ARGV, nil
local shared = last % 2 == 1
if shared then
  last = last - 1
  sig = table.concat(ARGV, ' ', 4, last)
end
local rules = {}
add_rules(rules, 0, P, ARGV, 5, last)
local own = #rules
local Ld, Wd = 0, 1
for i = 1, own do
  local r = rules[i]
  if r.L * Wd > Ld * r.S * P then Ld, Wd = r.L, r.S * P end
end

-- read_state: the note (tail, trim and remembered windows: memo, a list
-- of {f, cb, ni, used}: a table indexed by bucket numbers would make
-- miniredis's Lua fill it up to the index), the meta (else this
-- configuration's grid, window and densest strategy) and the tail's
-- member, or an empty key's state (no tail: T = -1). A state in the
-- previous released format (format 6, or a hash with "W4" or "L4" in
-- field m) reads as empty, and the first grant replaces it.
local meta, note, G, R, Ln, Wn, base, C, T, O = nil, nil, P, rules[own].S * P, Ld, Wd, 0, 0, -1, 0
local tail_member, cum, memo, entries, old = nil, 0, {}, {}, false
local rows = redis.pcall('ZRANGE', KEY, '-3', '-1')
local foreign
if rows.err then
  local m = redis.pcall('HGET', KEY, 'm')
  old = type(m) == 'string' and string.find(m, '^' .. string.upper(KIND) .. '4 ') ~= nil
  if not old then foreign = 'another type than sliding state' end
elseif #rows > 0 then
  local kind, t, b, c, o, remembered = string.match(rows[#rows], '^(%a)~(%d+) (%d+) (%d+)%+?(%d*)(.*)$')
  if kind == KIND then
    note, T, base, C = rows[#rows], t + 0, b + 0, c + 0
    O = tonumber(o) or 0
    for d, cb, e in string.gmatch(remembered, ' (%d+) (%d+) (%d+)') do
      local f = T - d
      memo[#memo + 1] = {f, cb + 0, f + e, false}
    end
    local i = #rows - 1
    local k, g, r, ln, wn = string.match(rows[i] or '', '^(%a)7 (%d+) (%d+) (%d+) (%d+)$')
    if k == KIND then meta, G, R, Ln, Wn, i = rows[i], g + 0, r + 0, ln + 0, wn + 0, i - 1 end
    -- The tail's member; under WithPrefix a configuration's, when no
    -- bucket is left, which is no number.
    local tail = tonumber(rows[i])
    cum = base
    if tail then tail_member, cum = rows[i], tail end
    if shared then entries = redis.call('ZRANGEBYSCORE', KEY, '-inf', '(0', 'WITHSCORES') end
  elseif string.find(rows[#rows], '^' .. KIND .. '6 %d+ %d+ %d+ %d+ %d+ %d+$') then
    old = true
  else
    foreign = 'a sorted set that is not sliding state'
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
-- tail's time would: never stricter than without it.
now = now + O
local b, moved, member, note_changed, static, old_member = idiv(now, G), false, nil, false, false, nil
if T > b then
  O, now, b, moved, note_changed = O + (T - b) * G, now + (T - b) * G, T, true, true
  -- Written again as it is, with the note.
  member = tail_member
end

-- other_rules: the strategies of the other configurations whose last grant
-- is still in their longest window bind this call too. So while
-- configurations alternate, every grant satisfies all of them. stable:
-- until the first of them lapses, the rules stay as they are.
local stable, own_until = math.huge, nil
for j = 1, #entries, 2 do
  local text, till = entries[j], -entries[j + 1]
  if text == sig then
    own_until = till
  elseif till > now then
    local numbers = {}
    for x in string.gmatch(text, '%d+') do numbers[#numbers + 1] = x end
    add_rules(rules, own, numbers[1] + 0, numbers, 2, #numbers)
    stable = math.min(stable, till - now)
  end
end

-- locate: each rule's window [ws, now] counts the state buckets from the
-- one holding ws, first (whole: conservative when the grids differ): count
-- = the tail's cumulative count minus before, the count before first.
-- before and next are remembered, else before is read: a window a grant
-- saw starting at f, whose first bucket holding a permit is ni, tells them
-- for every window starting from f to ni, as no bucket in between holds a
-- permit (so denials while buckets with no permits leave the window read
-- none). Buckets trimmed away leave base; a window reaching before them (a
-- configuration whose window is longer than any that granted before)
-- counts their grants as used, up to what the densest writer could have
-- granted there.
for i = 1, #rules do
  local r = rules[i]
  local ws = (idiv(now, r.P) - r.S + 1) * r.P
  local first, before = idiv(ws, G), cum
  for j = 1, #memo do
    if memo[j][1] <= first and first <= memo[j][3] then r.memo = memo[j] end
  end
  if r.memo then r.memo[4] = true end
  if T < first then
    before = cum
  elseif r.memo then
    before, r.next = r.memo[2], r.memo[3]
  else
    local row = redis.call('ZREVRANGEBYSCORE', KEY, string.format('(%d', first), '0', 'LIMIT', '0', '1')
    before = base
    if row[1] then
      before = row[1] + 0
    elseif first < C then
      before, r.known = before - math.min(base, Ln * (idiv(C * G - ws + Wn - 1, Wn) + 1)), false
    end
  end
  r.first, r.before, r.count = first, before, cum - before
end

-- The first buckets of rule r's window (at most need): the rows'
-- cumulative counts and indexes in turn. The first is r.next.
local function window_rows(r, need)
  local rows = redis.call('ZRANGEBYSCORE', KEY, r.first, LAST, 'WITHSCORES', 'LIMIT', '0', need)
  if not r.next and rows[2] then r.next = rows[2] + 0 end
  return rows
end

-- decide: allowed, and when denied the rule reported (the longest
-- RetryAfter, the first of equals; none when another configuration's
-- denies longest), its RetryAfter (-1: never) and how long the denial
-- stays as it is: until the first count drops. The times are read for
-- denials only: a grant needs none of them. A rule's count first drops
-- when the first bucket in its window leaves it (change), and drops to
-- L - n (after: the RetryAfter of n) when the first bucket whose
-- cumulative count reaches cum + n - L does. When that bucket is not among
-- the window's first SCAN, or the count is partly unknown (then it drops
-- at each of this configuration's buckets), the RetryAfter is the time the
-- tail leaves: longer than the truth, never shorter.
local allowed, reported, retry = n <= rules[1].L, nil, 0
if not allowed then
  reported, retry, stable = 1, -1, 0
elseif n > 0 then
  for i = 1, #rules do
    local r = rules[i]
    if r.count > 0 and r.count + n > r.L then allowed = false end
  end
  if not allowed then
    for i = 1, #rules do
      local r = rules[i]
      if r.count > 0 then
        local after, change = leaves(T, G, r) - now, r.P - now % r.P
        local target = cum + n - r.L
        if r.known and r.next and target <= r.before + 1 then
          -- The first bucket holds a permit at least: it reaches before + 1.
          after = leaves(r.next, G, r) - now
          change = after
        elseif r.known then
          -- Each bucket holds a permit at least, so the one reaching
          -- target is among the window's first count + n - L.
          local rows = window_rows(r, math.max(1, math.min(SCAN, r.count + n - r.L)))
          if r.next then change = leaves(r.next, G, r) - now end
          for j = #rows - 1, 1, -2 do
            if rows[j] + 0 >= target then after = leaves(rows[j + 1] + 0, G, r) - now end
          end
        end
        if change < stable then stable = change end
        if r.count + n > r.L and (not reported or after > retry) then reported, retry = i, after end
      end
    end
    -- Denied by another configuration's rule: this one's fewest is told.
    if reported and reported > own then reported = 0 end
    allowed = not reported
  end
end

-- apply: a grant is n more in bucket b, which is now's. The note changes
-- when the tail moves or a window no grant saw is remembered (its first
-- bucket holding a permit is read once here, b when it held none before,
-- so that the calls after it read no bucket), or a trim moves base and C;
-- under WithPrefix the meta (static) when there is none yet, or R or the
-- densest writer changed. The TTL runs until the tail leaves the longest
-- window of every configuration, and is set when the tail or that window
-- moves, or the key's time did.
local granted, expire = allowed and n > 0, false
if granted then
  if old then redis.call('DEL', KEY) end
  local window = rules[own].S * P
  static = shared and (old or not meta or window > R or Ld * Wn > Ln * Wd)
  -- A previous format has no note; a new meta goes with the note.
  note_changed = note_changed or static or not note or T ~= b
  expire = old or moved or T ~= b or window > R
  if window > R then R = window end
  if Ld * Wn > Ln * Wd then Ln, Wn = Ld, Wd end
  -- Buckets that left the longest window of every configuration go, SCAN
  -- at most, on a grant that opens a bucket and passes a multiple of SCAN
  -- permits: it keeps up (at most SCAN new buckets per SCAN permits) and
  -- spares most grants its read. base and C remember where they were;
  -- counts never depend on it (a difference of cumulative counts).
  if T ~= b and idiv(cum + n, SCAN) > idiv(cum, SCAN) then
    local cutoff = idiv(now - R, G)
    local trimmed = redis.call('ZRANGEBYSCORE', KEY, '0', string.format('(%d', cutoff), 'WITHSCORES', 'LIMIT', '0', SCAN)
    if #trimmed > 0 then
      redis.call('ZREMRANGEBYSCORE', KEY, '0', trimmed[#trimmed])
      base, C, note_changed = trimmed[#trimmed - 1] + 0, trimmed[#trimmed] + 1, true
    end
  end
  for i = 1, #rules do
    local r = rules[i]
    if r.known and not r.memo then
      if not r.next and T >= r.first then window_rows(r, 1) end
      r.memo = {r.first, r.before, r.next or b, true}
      memo[#memo + 1], note_changed = r.memo, true
    end
  end
  -- A grant in the tail's bucket replaces its member.
  if T == b then old_member = tail_member end
  member = string.format('%d', cum + n)
end

-- write: bucket b's member, the note when it changed (the tail b, base, C,
-- O and the windows remembered that this call used) and the meta when
-- static. A denial or n == 0 writes only when O grew (clock), best effort.
-- The old members go after the new ones are in: a set left empty even for
-- a moment is a deleted key, and the new one would carry no TTL; a note
-- gone without its successor would leave a key nobody reads as ours.
if member then
  local gone, new_note, new_meta = {old_member}, nil, meta
  if note_changed then
    local text = {string.format('%s~%d %d %d', KIND, b, base, C)}
    if O > 0 then text[2] = string.format('+%d', O) end
    for i = 1, #memo do
      local m = memo[i]
      if m[4] then text[#text + 1] = string.format(' %d %d %d', b - m[1], m[2], m[3] - m[1]) end
    end
    new_note = table.concat(text)
    if static then new_meta = string.format('%s7 %d %d %d %d', KIND, G, R, Ln, Wn) end
    -- A missing note or meta (nil) appends nothing.
    if note ~= new_note then gone[#gone + 1] = note end
    if meta ~= new_meta then gone[#gone + 1] = meta end
  end
  local call, written = redis.call, nil
  if not granted then call = redis.pcall end
  if static then
    written = call('ZADD', KEY, b, member, '+inf', new_note, '+inf', new_meta)
  elseif new_note then
    written = call('ZADD', KEY, b, member, '+inf', new_note)
  else
    written = call('ZADD', KEY, b, member)
  end
  if type(written) == 'number' and #gone > 0 then call('ZREM', KEY, unpack(gone)) end
end
if granted then
  -- This configuration's entry, and the others' that lapsed.
  if shared then
    local till = leaves(b, G, rules[own])
    if till ~= own_until then redis.call('ZADD', KEY, -till, sig) end
    if T ~= b then redis.call('ZREMRANGEBYSCORE', KEY, -now, '(0') end
  end
  if expire then redis.call('PEXPIRE', KEY, idiv((b + 1) * G + R - now + 999, 1000)) end
  T, cum = b, cum + n
end

-- reply: Remaining is the fewest permits left (reported: this
-- configuration's first strategy with the fewest, unless a denial names
-- another); ResetAfter the time the tail leaves the longest window.
local used = allowed and n or 0
local remaining, fewest, own_left, reset = nil, 1, nil, 0
for i = 1, #rules do
  local r = rules[i]
  local left = r.L - r.count - used
  if left < 0 then left = 0 end
  if not remaining or left < remaining then remaining = left end
  if i <= own and (not own_left or left < own_left) then own_left, fewest = left, i end
  local ends = leaves(T, G, r) - now
  if ends > reset then reset = ends end
end
if allowed or moved then stable = 0 end
if allowed then retry = 0 end
if not reported or reported == 0 then reported = fewest end
return string.format('%d %d %d %d %d %d', allowed and 1 or 0, remaining, retry, reset, reported - 1, stable)
