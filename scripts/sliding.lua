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
-- the key's grid G: score the bucket's index (floor(µs / G)), member the
-- decimal count of every permit granted on the key up to and including that
-- bucket (cumulative, so members are unique and the count in any span of
-- buckets is one subtraction). And one meta member, score +inf:
--   "<kind>6 G R Ln Wn base C"   (kind w or l, format 6)
-- G the grid (µs, the first writer's precision); R the longest window (µs)
-- of any configuration that granted; Ln per Wn µs the densest strategy of
-- any configuration that granted; base the cumulative count of the last
-- bucket trimmed away; C the first bucket index still fully known. And one
-- member per configuration that granted, score -until, text "P L_1 S_1
-- L_2 S_2 ...": its strategies bind every call until its last grant leaves
-- its longest window (until, Unix µs). Configurations sharing a key
-- (WithPrefix) all read it by the same rule; a default key, which only
-- one configuration ever reads, keeps no such member.
--
-- The reply is six integers: allowed (0/1), remaining, retry-after µs (-1:
-- never), reset-after µs, the index of the strategy reported, and stable µs:
-- how long the same request gets the same reply but for its durations
-- counting down (the deny cache's bound).

local KEY = KEYS[1]
local KIND = ARGV[3]
local SHARED = #ARGV % 2 == 1
local META = '^' .. KIND .. '6 (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$'
-- Above every bucket index (they stay below 2^52 / 1000) and below the meta.
local LAST_INDEX = '9007199254740992'
local NOT_OURS = ', not redlimit state; it was left unchanged'
-- Most buckets one call reads to find a RetryAfter, or trims.
local SCAN = 8

-- floor(a / b) for b > 0, exact where a / b rounds up to an integer.
local function idiv(a, b)
  local r = a % b
  if r < 0 then r = r + b end
  return (a - r) / b
end

local function ceil_div(a, b)
  return idiv(a + b - 1, b)
end

-- Strategies from numbers[from..last], limit and size in turn: at most L
-- permits in S buckets of P µs. A strategy over the same buckets as one
-- already there (own) is left out: the caller's own limit governs that
-- window, so configurations that differ only in a limit share its count
-- and each applies its own (a plan upgrade keeps what was used).
local function add_rules(rules, P, numbers, from, last, own)
  for i = from, last, 2 do
    local L, S, same = numbers[i] + 0, numbers[i + 1] + 0, false
    for k = 1, own or 0 do
      if rules[k].P == P and rules[k].S == S then same = true end
    end
    if not same then rules[#rules + 1] = {L = L, S = S, P = P} end
  end
end

-- The request and the configuration, from ARGV: its strategies come first
-- in cfg.rules (cfg.own of them), other configurations' follow.
local function read_args()
  local cfg = {n = ARGV[2] + 0, P = ARGV[4] + 0, rules = {}, Ld = 0, Wd = 1}
  if ARGV[1] == '' then
    local t = redis.call('TIME')
    cfg.now = t[1] * 1000000 + t[2]
  else
    cfg.now = ARGV[1] + 0
  end
  local last = #ARGV
  if SHARED then last = last - 1 end
  add_rules(cfg.rules, cfg.P, ARGV, 5, last)
  cfg.own = #cfg.rules
  if SHARED then cfg.sig = table.concat(ARGV, ' ', 4, last) end
  for i = 1, cfg.own do
    local r = cfg.rules[i]
    -- The densest strategy (most permits per µs) bounds what this
    -- configuration can grant in any span.
    if r.L * cfg.Wd > cfg.Ld * r.S * r.P then cfg.Ld, cfg.Wd = r.L, r.S * r.P end
  end
  cfg.window = cfg.rules[cfg.own].S * cfg.P
  return cfg
end

-- The key's state: its meta and its tail (last bucket), or an empty state
-- on the configuration's grid. A hash in the previous released format ("W4"
-- or "L4" in field m) reads as empty, and the first grant replaces it.
local function read_state(cfg)
  local st = {G = cfg.P, R = 0, Ln = 0, Wn = 1, base = 0, C = 0, cum = 0, tail = -1, entries = {}}
  local rows = redis.pcall('ZRANGE', KEY, '-2', '-1', 'WITHSCORES')
  if rows.err then
    local m = redis.pcall('HGET', KEY, 'm')
    if type(m) == 'string' and string.find(m, '^' .. string.upper(KIND) .. '4 ') then
      st.old = true
      return st
    end
    return nil, 'another type than sliding state'
  end
  if #rows == 0 then return st end
  local G, R, Ln, Wn, base, C = string.match(rows[#rows - 1], META)
  if not G then return nil, 'a sorted set that is not sliding state' end
  st.meta = rows[#rows - 1]
  if SHARED then st.entries = redis.call('ZRANGEBYSCORE', KEY, '-inf', '(0', 'WITHSCORES') end
  st.G, st.R, st.Ln, st.Wn, st.base, st.C = G + 0, R + 0, Ln + 0, Wn + 0, base + 0, C + 0
  st.cum = st.base
  if #rows == 4 then
    if not string.find(rows[1], '^%d+$') then return nil, 'a sorted set that is not sliding state' end
    st.tail_member, st.cum, st.tail = rows[1], rows[1] + 0, rows[2] + 0
  end
  return st
end

-- The strategies of the other configurations whose last grant is still in
-- their longest window bind this call too. So while configurations
-- alternate, every grant satisfies all of them. cfg.stable: until the
-- first of them lapses, the rules stay as they are.
local function other_rules(cfg, st)
  cfg.stable = math.huge
  for j = 1, #st.entries, 2 do
    local sig, till = st.entries[j], -st.entries[j + 1]
    if sig == cfg.sig then
      cfg.own_until = till
    elseif till > cfg.now then
      local numbers = {}
      for x in string.gmatch(sig, '%d+') do numbers[#numbers + 1] = x end
      add_rules(cfg.rules, numbers[1] + 0, numbers, 2, #numbers, cfg.own)
      cfg.stable = math.min(cfg.stable, till - cfg.now)
    end
  end
end

-- Bucket b's member, and the meta member when it changed: one ZADD.
local function write(st, b, member)
  local meta = string.format('%s6 %d %d %d %d %d %d', KIND, st.G, st.R, st.Ln, st.Wn, st.base, st.C)
  if meta == st.meta then
    redis.call('ZADD', KEY, b, member)
    return
  end
  -- Add before removing the old meta: a set left empty even for a moment
  -- is a deleted key, and the new one would carry no TTL.
  redis.call('ZADD', KEY, b, member, '+inf', meta)
  if st.meta then redis.call('ZREM', KEY, st.meta) end
  st.meta = meta
end

-- The clock went back behind the tail: the buckets from now's on are moved
-- into now's, as if granted now, and those before the longest window ending
-- at the tail are trimmed, so that no key stays locked for longer than its
-- windows from now. The only write a denial or n == 0 ever makes; when
-- Redis refuses it, the decision is the same. Its work grows with the
-- buckets moved: a clock, not a caller, decides when it runs.
local function fold(cfg, st)
  local b = idiv(cfg.now, st.G)
  if st.tail <= b then return b end
  local from = idiv((st.tail + 1) * st.G - st.R, st.G)
  local row = redis.call('ZREVRANGEBYSCORE', KEY, string.format('(%d', from), '0', 'LIMIT', '0', '1')
  if row[1] then st.base = row[1] + 0 end
  -- Buckets from C on are known: none of this configuration's windows
  -- reaches before C, and what was removed is forgotten, as when the
  -- clock is not moved (the reference model's rule).
  local longest = (idiv(cfg.now, cfg.P) - cfg.rules[cfg.own].S + 1) * cfg.P
  st.C = math.min(math.max(st.C, from), idiv(longest, st.G))
  st.tail, cfg.folded = b, true
  -- It removes the old tail at least: a write, after which Redis takes
  -- the rest even at maxmemory.
  if type(redis.pcall('ZREMRANGEBYSCORE', KEY, b, LAST_INDEX)) ~= 'number' then return b end
  redis.call('ZREMRANGEBYSCORE', KEY, '0', string.format('(%d', from))
  st.tail_member = string.format('%d', st.cum)
  write(st, b, st.tail_member)
  return b
end

-- The time bucket k of the key's grid leaves strategy i's window.
local function leaves(cfg, st, k, i)
  local r = cfg.rules[i]
  return (ceil_div((k + 1) * st.G, r.P) + r.S - 1) * r.P
end

-- Each strategy's window [ws, now] counts the state buckets from the one
-- holding ws (whole: conservative when the grids differ): count = tail's
-- cumulative count minus the last one before the window. Buckets trimmed
-- away leave base; a window reaching before them (a configuration whose
-- window is longer than any that granted before) counts their grants as
-- used, up to what the densest writer could have granted there.
local function locate(cfg, st)
  for i = 1, #cfg.rules do
    local r = cfg.rules[i]
    local ws = (idiv(cfg.now, r.P) - r.S + 1) * r.P
    local first, before, known = idiv(ws, st.G), st.cum, true
    if st.tail >= first then
      local row = redis.call('ZREVRANGEBYSCORE', KEY, string.format('(%d', first), '0', 'LIMIT', '0', '1')
      before = st.base
      if row[1] then
        before = row[1] + 0
      elseif first < st.C then
        before, known = before - math.min(st.base, st.Ln * (ceil_div(st.C * st.G - ws, st.Wn) + 1)), false
      end
    end
    r.first, r.known, r.count = first, known, st.cum - before
  end
end

-- When strategy i's count first drops, and when it has dropped to L_i - n
-- (the RetryAfter of n): when the first bucket in its window leaves it, and
-- the first whose cumulative count reaches cum + n - L_i. When that bucket
-- is not among the window's first SCAN, or the count is partly unknown
-- (then it drops at each of this configuration's buckets), the RetryAfter
-- is the time the tail leaves: longer than the truth, never shorter.
local function window_times(cfg, st, i)
  local r = cfg.rules[i]
  local retry, change = leaves(cfg, st, st.tail, i) - cfg.now, r.P - cfg.now % r.P
  if not r.known then return retry, change end
  local target = st.cum + cfg.n - r.L
  -- Each bucket holds a permit at least, so the one reaching target is
  -- among the window's first count + n - L: most denials read one.
  local need = math.max(1, math.min(SCAN, r.count + cfg.n - r.L))
  local rows = redis.call('ZRANGEBYSCORE', KEY, r.first, LAST_INDEX, 'WITHSCORES', 'LIMIT', '0', need)
  change = leaves(cfg, st, rows[2] + 0, i) - cfg.now
  for j = 1, #rows, 2 do
    if rows[j] + 0 >= target then return leaves(cfg, st, rows[j + 1] + 0, i) - cfg.now, change end
  end
  return retry, change
end

-- allowed, and when denied the strategy reported (the longest RetryAfter,
-- the first of equals; none when another configuration's denies longest),
-- its RetryAfter (-1: never) and how long the denial stays as it is: until
-- the first count drops. The times are read for denials only: a grant
-- needs none of them.
local function decide(cfg, st)
  if cfg.n > cfg.rules[1].L then return false, 1, -1, 0 end
  if cfg.n == 0 then return true end
  local over = false
  for i = 1, #cfg.rules do
    local r = cfg.rules[i]
    if r.count > 0 and r.count + cfg.n > r.L then over = true end
  end
  if not over then return true end
  local worst, retry, stable = nil, 0, cfg.stable
  for i = 1, #cfg.rules do
    local r = cfg.rules[i]
    if r.count > 0 then
      local after, change = window_times(cfg, st, i)
      stable = math.min(stable, change)
      if r.count + cfg.n > r.L and (not worst or after > retry) then worst, retry = i, after end
    end
  end
  if not worst then return true end
  if worst > cfg.own then worst = nil end
  return false, worst, retry, stable
end

-- Buckets that left the longest window of every configuration go, SCAN at
-- most per call; base and C remember where they were. Counts never depend
-- on it: a window's count is a difference of cumulative counts either way.
-- It runs on a grant that opens a bucket and passes a multiple of SCAN
-- permits: it keeps up (at most SCAN new buckets per SCAN permits), and
-- spares most grants its read and the meta's rewrite (bench/: a grant in a
-- new bucket costs a third less).
local function trim(cfg, st)
  local cutoff = idiv(cfg.now - st.R, st.G)
  local rows = redis.call('ZRANGEBYSCORE', KEY, '0', string.format('(%d', cutoff), 'WITHSCORES', 'LIMIT', '0', SCAN)
  if #rows == 0 then return end
  redis.call('ZREMRANGEBYSCORE', KEY, '0', rows[#rows])
  st.base, st.C = rows[#rows - 1] + 0, rows[#rows] + 1
end

-- A grant: n more in bucket b, which is now's (the tail's when the clock
-- went back: fold), the meta when it changed, and a TTL until the tail
-- leaves the longest window of every configuration.
local function apply(cfg, st, b)
  if st.old then redis.call('DEL', KEY) end
  if st.tail == b then redis.call('ZREM', KEY, st.tail_member) end
  if cfg.window > st.R then st.R = cfg.window end
  if cfg.Ld * st.Wn > st.Ln * cfg.Wd then st.Ln, st.Wn = cfg.Ld, cfg.Wd end
  -- Trimming reads and removes buckets below now's only.
  if st.tail ~= b and idiv(st.cum + cfg.n, SCAN) > idiv(st.cum, SCAN) then trim(cfg, st) end
  write(st, b, string.format('%d', st.cum + cfg.n))
  -- This configuration's entry, and the others' that lapsed.
  local till = leaves(cfg, st, b, cfg.own)
  if SHARED and till ~= cfg.own_until then redis.call('ZADD', KEY, -till, cfg.sig) end
  if SHARED and st.tail ~= b then redis.call('ZREMRANGEBYSCORE', KEY, -cfg.now, '(0') end
  redis.call('PEXPIRE', KEY, ceil_div((b + 1) * st.G + st.R - cfg.now, 1000))
  st.tail, st.cum = b, st.cum + cfg.n
end

-- Remaining is the fewest permits left (reported: this configuration's
-- first strategy with the fewest, unless a denial names another);
-- ResetAfter the time the tail leaves the longest window.
local function reply(cfg, st, allowed, reported, retry, stable)
  local used = allowed and cfg.n or 0
  local remaining, fewest, own_left, reset = nil, 1, nil, 0
  for i = 1, #cfg.rules do
    local r = cfg.rules[i]
    local left = math.max(0, r.L - r.count - used)
    if not remaining or left < remaining then remaining = left end
    if i <= cfg.own and (not own_left or left < own_left) then own_left, fewest = left, i end
    reset = math.max(reset, leaves(cfg, st, st.tail, i) - cfg.now)
  end
  if allowed or cfg.folded then stable = 0 end
  return string.format('%d %d %d %d %d %d', allowed and 1 or 0, remaining, allowed and 0 or retry,
    reset, (reported or fewest) - 1, stable)
end

local cfg = read_args()
local st, foreign = read_state(cfg)
if not st then return redis.error_reply('NOTOURS holds ' .. foreign .. NOT_OURS) end
local b = fold(cfg, st)
other_rules(cfg, st)
locate(cfg, st)
local allowed, reported, retry, stable = decide(cfg, st)
if allowed and cfg.n > 0 then apply(cfg, st, b) end
return reply(cfg, st, allowed, reported, retry, stable)
