-- gcra.lua: the decision of the leaky and the token bucket, joined after
-- leakybucket.lua or tokenbucket.lua, which set TAG (the state's tag) and
-- WHAT (the bucket's name in errors), and refunds.lua (MAX_RANGES and
-- merge_range). A token bucket's missing tokens are a leaky bucket's
-- level, so one rule decides both: the level drains at `count` permits
-- per `per` µs, and n permits are allowed if level + n <= capacity, which
-- then adds n. The level is counted in ticks: a permit is
-- `per` ticks and `count` ticks drain a µs, so every value is an integer.
--
-- KEYS[1]  the key
-- ARGV[1]  now       Unix time (µs), or "" for the server's TIME
-- ARGV[2]  n         permits asked for (>= 0), or "-<k>:<token>": a refund
--                    of the grant a reply named <token>, until k of its
--                    permits in all have been given back
-- ARGV[3]  capacity  permits the bucket holds
-- ARGV[4]  per       rate period (µs), reduced with count
-- ARGV[5]  count     permits drained (refilled) per period
-- ARGV[6]  shared    "1" under WithPrefix: the rate is stored
--
-- All times are integer µs. The state (format 5, docs/internals.md) is a
-- string with a TTL: the key's time r (the latest clock a grant read) and
-- the level at r in parts, each draining at the rate that granted it, the
-- slowest first; a part that refunds gave back from adds its positions:
--   "<r><level><tag>"                                         this rate only
--   "<r> <level>/<count>/<per>[ <e>@<d>[+<f>^<h>][ <lo>:<hi>...]] ... <tag>"
-- A part's permits hold positions on its own line of ticks, in the order
-- they drain, never reused: its drain has reached position (r + d) µs and
-- f ticks at r (no field: the drain is at r), the grants of its labelling e
-- hold the positions after that, and those refunds gave back are the
-- ranges [lo, hi) of ticks past the drain, which it skips: what a grant
-- gave back is the range that ends its positions, and a grant whose
-- positions start before h gives nothing more. A call decides at the key's
-- time max(now, r). Only grants and refunds write; a grant adds to its own
-- rate's part and never re-rates another.
--
-- Reply: "allowed remaining retry reset 0 stable[ token]" (µs; retry -1 =
-- never, stable -1 = until reset; the token names a grant, for refunds:
-- "<n>:<end>[+<ticks>][.<e>]", where its positions end).
-- A refund replies "1 remaining 0 reset 0 -1 given".

-- Literal patterns, so that a call does not build them; the tag is
-- captured and compared with TAG, which the file before this one sets. The
-- short form is tried first.
local SHORT = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)([1-9]%d*)(%d)$'
local LONG = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d) (.-) (%d)$'
local PART = '^(%d+)/([1-9]%d*)/([1-9]%d*)$'
local LABELS = '^(%d+)@(%-?%d+)%+?(%d*)%^?(%d*)$'
local RANGE = '^(%d+):([1-9]%d*)$'
-- A refund's ARGV[2]: k, then the token (a grant's permits, where they end).
local REFUND = '^%-([1-9]%d*):([1-9]%d*):([1-9]%d*)%+?(%d*)%.?(%d*)$'
-- Formats 2 and 3, released: a time the bucket is empty, and no key time.
local OLD_WHOLE = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)(%d)$'
local OLD_FRACTION = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)(%d)%+([1-9]%d*)/([1-9]%d*)$'
local OLD_LONG = '^([1-9]%d+) (%d+) ([1-9]%d*) ([1-9]%d*) ([1-9]%d*) (%d)$'
local NOT_OURS = 'NOTOURS holds %s, not redlimit state; it was left unchanged'
local MAX_PARTS = 2
-- Another rate's level is converted in doubles, rounded up by a margin far
-- above their error.
local MARGIN = 1 + 2 ^ -40

-- Redis builds every function and table of a script anew on each call,
-- and a function costs more with every local it uses. So the common path
-- (a key of this rate alone, in the short form or none, and no refund)
-- keeps its values in locals and builds no table; the parts' tables (two
-- rates, refunds, released formats) are built only when the state has
-- them, and the functions use their arguments alone.

-- ceil_div returns ceil(a / b) for integers a >= 0, b > 0.
local function ceil_div(a, b)
  local q = (a - a % b) / b
  if q * b < a then q = q + 1 end
  return q
end

-- conv returns x * a / b rounded up, for integers x >= 0, a, b > 0: exact
-- while x * a stays below 2^53, else in doubles with a margin far above
-- their error.
local function conv(x, a, b)
  local p = x * a
  if p < 2 ^ 53 then return ceil_div(p, b) end
  return math.ceil(p / b * MARGIN)
end

-- ticks returns x ticks of a part of period part_per in the ticks of
-- this configuration (period per), rounded up: exact at this rate.
local function ticks(x, part_per, per)
  if part_per == per then return x end
  return conv(x, per, part_per)
end

-- drain_us returns the µs (rounded up) until x of this configuration's
-- ticks have drained, part by part: of the parts at (their counts and
-- pers; this rate's is at own), or, when at is nil, of one part of this
-- rate holding used ticks.
local function drain_us(x, used, count, per, at, counts, pers, own)
  if not at then
    if x > used then x = used end
    return ceil_div(x, count)
  end
  local us = 0
  for i = 1, #at do
    if at[i] > 0 then
      local have = ticks(at[i], pers[i], per)
      if x <= have then
        if i == own then return us + ceil_div(x, count) end
        return us + conv(x, pers[i], per * counts[i])
      end
      x, us = x - have, us + ceil_div(at[i], counts[i])
    end
  end
  return us
end

-- The clock: the caller's, or the server's.
local now = ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = now + 0
end
local capacity, per, count = ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0
local full, shared = capacity * per, ARGV[6] == '1'
-- A refund's k, and its token read (took nil: a token the script cannot
-- read, which gives nothing).
local n, refund, took, e_us, e_ticks, e = 0, nil, nil, nil, nil, nil
if string.byte(ARGV[2]) == 45 then -- '-': a refund
  refund, took, e_us, e_ticks, e = string.match(ARGV[2], REFUND)
  refund = tonumber(refund) or 0
else
  n = ARGV[2] + 0
end

-- Read the state into r and the level at r: in the short form (or none:
-- a level of 0 at now), one part of this rate never refunded, of level_r
-- ticks; else the parts (level at r in the part's ticks, its count and
-- per, its positions). A refund reads the short form as its one part.
local value = redis.pcall('GET', KEYS[1])
if value and type(value) ~= 'string' then
  return redis.error_reply(string.format(NOT_OURS, 'another type than ' .. WHAT))
end
local r, level_r, tag = now, 0, TAG
if value then r, level_r, tag = string.match(value, SHORT) end
local short = r and tag == TAG

-- The parts' functions (these locals, each over its arguments alone) are
-- built only when the state has parts.
local floor_div, fresh_labels, drained_to, rebase, given_back, give_range, never_refunded,
  write_part
if not short then
  -- floor_div returns floor(a / b) for integers a (of either sign), b > 0.
  function floor_div(a, b)
    local q = math.floor(a / b)
    while q * b > a do q = q - 1 end
    while (q + 1) * b <= a do q = q + 1 end
    return q
  end

  -- A part's positions: its labelling e, where its drain is at r (d µs
  -- past r and f ticks), the horizon h and the ranges given back, in ticks
  -- past the drain; a part never refunded is labelling 0 with its drain at
  -- r, and nothing else.
  function fresh_labels(e)
    return {e = e, d = 0, f = 0, h = 0, ranges = {}}
  end

  -- drained_to returns how far a part's drain moved from r to t, its level
  -- going from level_r to level_t, in ticks past its drain at r: the ticks
  -- it drained, and the ranges given back that it skipped on the way (a
  -- range the drain reaches is skipped whole).
  function drained_to(level_r, level_t, ranges)
    local pos, left = 0, level_r - level_t
    for _, range in ipairs(ranges) do
      if pos + left < range[1] then break end
      left, pos = left - (range[1] - pos), range[2]
    end
    return pos + left
  end

  -- rebase returns a part's positions (old_labels, its count c) as of t:
  -- its drain moved by moved ticks (the ranges it skipped go), at least to
  -- t when the part is empty there, so that positions are never reused.
  function rebase(old_labels, c, empty_at_t, moved, r, t)
    local new = fresh_labels(old_labels.e)
    local pos = (old_labels.d + r - t) * c + old_labels.f + moved
    if empty_at_t and pos < 0 then pos = 0 end
    new.d = floor_div(pos, c)
    new.f = pos - new.d * c
    if old_labels.h > moved then new.h = old_labels.h - moved end
    for _, range in ipairs(old_labels.ranges) do
      if range[1] > moved then
        range[1], range[2] = range[1] - moved, range[2] - moved
        new.ranges[#new.ranges + 1] = range
      end
    end
    return new
  end

  -- given_back returns what the grant of took permits ending at position
  -- e (ticks past the drain at r) gave back, and the top of what it holds:
  -- refunds give back its last permits first, so what it gave is a range
  -- that ends at e.
  function given_back(ranges, e, start)
    for _, range in ipairs(ranges) do
      if range[1] < e and e <= range[2] then
        local top = math.max(range[1], start)
        return e - top, top
      end
    end
    return 0, e
  end

  -- give_range records [lo, hi) of a part (its positions part, its count
  -- c) as given back, merged with the ranges it touches; past MAX_RANGES
  -- the lowest goes: the drain moves past it at once (the level stays: the
  -- grants before it then look drained sooner, stricter) and the horizon
  -- rises to its end, so that no grant it held gives again.
  function give_range(part, c, lo, hi)
    local ranges = merge_range(part.ranges, lo, hi)
    if #ranges > MAX_RANGES then
      local gone = table.remove(ranges, 1)
      local size = gone[2] - gone[1]
      part.h = math.max(part.h, gone[2]) - size
      for _, range in ipairs(ranges) do
        range[1], range[2] = range[1] - size, range[2] - size
      end
      local pos = part.f + size
      part.d = part.d + floor_div(pos, c)
      part.f = pos - floor_div(pos, c) * c
    end
    part.ranges = ranges
  end

  -- never_refunded reports whether a part's positions are those of a part
  -- no refund touched: its drain at r, nothing given back.
  function never_refunded(part)
    return part.e == 0 and part.d == 0 and part.f == 0 and part.h == 0 and #part.ranges == 0
  end

  -- write_part adds a part (its level, count, per and positions) to fields
  -- as the state writes it: its level and rate, then its positions once a
  -- refund touched them.
  function write_part(fields, part_level, part_count, part_per, part)
    if never_refunded(part) then
      fields[#fields + 1] = string.format('%d/%d/%d', part_level, part_count, part_per)
      return
    end
    local format = '%d/%d/%d %d@%d+%d^%d'
    if part.f == 0 and part.h == 0 then format = '%d/%d/%d %d@%d' end
    fields[#fields + 1] = string.format(format, part_level, part_count, part_per,
      part.e, part.d, part.f, part.h)
    for _, range in ipairs(part.ranges) do
      fields[#fields + 1] = string.format('%d:%d', range[1], range[2])
    end
  end
end

local level, counts, pers, labels
local old = false -- format 2 or 3: no key time; the level is taken at now
if short then
  r, level_r = r + 0, level_r + 0
else
  local us, num, den, c, p, cap
  level, counts, pers, labels, level_r = {}, {}, {}, {}, 0
  -- A released format: the level at now, at the writer's rate, read as
  -- it always was; a level above the writer's full bucket is full.
  us, tag, num, den = string.match(value, OLD_FRACTION)
  if not us then us, tag = string.match(value, OLD_WHOLE) end
  if us then
    if den and num + 0 >= den + 0 then us = nil end
    c, p, cap = count, per, capacity
    num = den and ceil_div(num * count, den) or 0
  else
    us, num, c, p, cap, tag = string.match(value, OLD_LONG)
    if us and (#us ~= 16 or num + 0 >= c + 0) then us = nil end
  end
  if us and tag ~= TAG then
    return redis.error_reply(string.format(NOT_OURS, 'a value that is not ' .. WHAT))
  end
  if us then
    old, r = true, now
    local l0 = (us - now) * c + num
    if (l0 <= 0 or l0 > cap * p) and redis.call('PTTL', KEYS[1]) < 0 then
      return redis.error_reply(string.format(NOT_OURS, 'a value without a TTL'))
    end
    if l0 > 0 then
      level[1], counts[1], pers[1] = math.min(l0, cap * p), c + 0, p + 0
      labels[1] = fresh_labels(0)
    end
  else
    local rest
    r, rest, tag = string.match(value, LONG)
    if tag ~= TAG then rest = nil end
    for field in string.gmatch(rest or '', '%S+') do
      local a, b, d, f, h = string.match(field, PART)
      local i = #level
      if a and i < MAX_PARTS then
        level[i + 1], counts[i + 1], pers[i + 1] = a + 0, b + 0, d + 0
        labels[i + 1] = fresh_labels(0)
      else
        a, d, f, h = string.match(field, LABELS)
        local at_i = labels[i]
        if a and at_i and not at_i.read then
          at_i.e, at_i.d, at_i.f, at_i.h = a + 0, d + 0, tonumber(f) or 0, tonumber(h) or 0
          at_i.read = true
        else
          a, b = string.match(field, RANGE)
          if not a or not at_i or not at_i.read or #at_i.ranges == MAX_RANGES then
            return redis.error_reply(string.format(NOT_OURS, 'a value that is not ' .. WHAT))
          end
          at_i.ranges[#at_i.ranges + 1] = {a + 0, b + 0}
        end
      end
    end
    if #level == 0 then
      return redis.error_reply(string.format(NOT_OURS, 'a value that is not ' .. WHAT))
    end
  end
  r = r + 0
end

-- The key's time: the latest a grant recorded. A call decides as at that
-- time, durations included. A recorded time ahead by more than a full
-- drain is a clock gone wrong: this call decides at now and counts the
-- bucket as full (below), and grants and refunds nothing.
local t, wrong = now, false
if r > now then
  if r - now > ceil_div(full, count) then wrong = true else t = r end
end

-- Advance: the level at t, used, in this configuration's ticks; of the
-- parts, each at t (at), the slowest draining first (a part starts
-- draining the µs after the one before it is empty), and own, this
-- rate's. A clock gone wrong sees one full part at this rate.
local used, at, own = level_r - (t - r) * count, nil, nil
if used < 0 then used = 0 end
local empty = used == 0
if level then
  at = {}
  local elapsed = t - r
  for i = 1, #level do
    local drain = ceil_div(level[i], counts[i])
    if elapsed >= drain then
      at[i], elapsed = 0, elapsed - drain
    else
      at[i], elapsed = level[i] - elapsed * counts[i], 0
    end
    if counts[i] == count and pers[i] == per then own = i end
  end
  used, empty = 0, true
  for i = 1, #at do
    used, empty = used + ticks(at[i], pers[i], per), empty and at[i] == 0
  end
end
if value and not old and (wrong or empty) and redis.call('PTTL', KEYS[1]) < 0 then
  return redis.error_reply(string.format(NOT_OURS, 'a value without a TTL'))
end
if wrong then
  level, at, used = nil, nil, full
end

-- Decide, in this configuration's ticks: n permits fit if the level is at
-- most capacity - n permits.
local allowed, retry = 0, 0
if n > capacity then
  retry = -1
elseif n == 0 or used <= (capacity - n) * per then
  allowed = 1
else
  retry = drain_us(used - (capacity - n) * per, used, count, per, at, counts, pers, own)
end
local granted = allowed == 1 and n > 0

-- Apply a grant: the parts at t become the state at r = t; n permits join
-- this rate's part, placed by its rate (slowest first), at the end of its
-- positions; drained parts go. Three rates merge the two other than this
-- one into the slower of them, so that their permits drain later, never
-- sooner; a part whose positions start afresh (new, or merged) takes a
-- labelling none before it had, so that no earlier grant's name can
-- reach its permits. A key of this rate alone takes none of these ways:
-- its one part's drain stays at r (at t, it has drained to t or is empty).
local given, grant_end = 0, nil
if granted and not level then
  used = used + n * per
  r, level_r, grant_end = t, used, used
elseif granted then
  local next_e = t
  for i = 1, #at do
    next_e = math.max(next_e, labels[i].e + 1)
    local moved = drained_to(level[i], at[i], labels[i].ranges)
    labels[i] = rebase(labels[i], counts[i], at[i] == 0, moved, r, t)
  end
  if #at > 1 or not own then
    local keep_at, keep_counts, keep_pers, keep_labels = {}, {}, {}, {}
    for i = 1, #at do
      -- A drained part goes, unless its labelling could be the next one
      -- (not yet behind the clock): it stays, empty, so that no part of
      -- its rate starts again under the same name.
      if at[i] > 0 or i == own or labels[i].e >= t then
        local j = #keep_at + 1
        keep_at[j], keep_counts[j], keep_pers[j] = at[i], counts[i], pers[i]
        keep_labels[j] = labels[i]
        if i == own then own = j end
      end
    end
    at, counts, pers, labels = keep_at, keep_counts, keep_pers, keep_labels
    if not own then
      own = #at + 1
      for i = #at, 1, -1 do
        if counts[i] * per > count * pers[i] then own = i end
      end
      table.insert(at, own, 0)
      table.insert(counts, own, count)
      table.insert(pers, own, per)
      table.insert(labels, own, fresh_labels(value and next_e or 0))
    end
  end
  at[own] = at[own] + n * per
  used = used + n * per
  if #at > MAX_PARTS then
    local a, b = 1, 2
    if own == 1 then a, b = 2, 3 elseif own == 2 then a, b = 1, 3 end
    at[a] = at[a] + conv(at[b], pers[a], pers[b])
    labels[a] = fresh_labels(next_e)
    labels[a].h = at[a]
    table.remove(at, b)
    table.remove(counts, b)
    table.remove(pers, b)
    table.remove(labels, b)
    if own > b then own = own - 1 end
    used = 0
    for i = 1, #at do used = used + ticks(at[i], pers[i], per) end
  end
  grant_end = at[own]
  for _, range in ipairs(labels[own].ranges) do
    grant_end = grant_end + range[2] - range[1]
  end
  r, level = t, at
end

-- Refund: the token names where the grant's positions end (µs and ticks
-- past them) in its part's labelling. What of them the drain has not
-- reached and no refund gave back leaves the level, from their end, up to
-- the k asked beyond what the grant gave back before: the level is then
-- what it would be had the grant taken that many fewer, as far as they
-- were still in the bucket (internal/model's queue).
local given_lo -- a refund on a key in the short form: where its one range starts
if refund and not level and value and not wrong and used > 0 then
  -- The short form is one part of this rate, labelling 0, its drain at r,
  -- nothing given back: the same steps in locals, without the parts'
  -- tables. A grant's permits end at e_pos; the drain moved to level_r -
  -- used.
  if took and (tonumber(e) or 0) == 0 then
    local e_pos = (e_us - r) * count + (tonumber(e_ticks) or 0)
    local moved = level_r - used
    if e_pos > moved and e_pos <= level_r then
      given = math.min(refund * per, e_pos - math.max(moved, e_pos - took * per))
      given_lo, level_r, used = e_pos - given, level_r - given, used - given
    end
  end
elseif refund and level and own and not old and at[own] > 0 then
  local part = labels[own]
  if took and (tonumber(e) or 0) == part.e then
    local e_pos = (e_us - r - part.d) * count + (tonumber(e_ticks) or 0) - part.f
    local start = e_pos - took * per
    local tail = level[own]
    for _, range in ipairs(part.ranges) do tail = tail + range[2] - range[1] end
    local moved = drained_to(level[own], at[own], part.ranges)
    if e_pos > moved and e_pos <= tail and (part.h == 0 or start >= part.h) then
      local gave, top = given_back(part.ranges, e_pos, start)
      local more = math.min(refund * per - gave, top - math.max(moved, start))
      if more > 0 then
        given = more
        give_range(part, count, top - more, top)
        level[own] = level[own] - more
        at[own] = at[own] - more
        used = used - more
      end
    end
  end
end

-- Write: grants (the key lives until every part has drained, and until
-- the clock reaches the end of every part's positions, on this caller's
-- clock, so that a key that expires reuses none) and refunds (their TTL
-- kept: a refund never shortens it, nor moves an end). A key of this
-- rate alone is written in the short form (under WithPrefix, as its one
-- part), and its positions end where it has drained.
local reset = drain_us(used, used, count, per, at, counts, pers, own)
if granted or given > 0 then
  local ttl = reset
  if given_lo then
    value = string.format('%d %d/%d/%d 0@0 %d:%d %s', r, level_r, count, per, given_lo,
      given_lo + given, TAG)
  elseif not level then
    if shared then
      value = string.format('%d %d/%d/%d %s', r, level_r, count, per, TAG)
    else
      value = string.format('%d%d%s', r, level_r, TAG)
    end
  elseif not shared and #level == 1 and own == 1 and never_refunded(labels[1]) then
    value = string.format('%d%d%s', r, level[1], TAG)
  else
    local fields = {string.format('%d', r)}
    for i = 1, #level do
      if level[i] > 0 or i == own or labels[i].e >= r or (i == #level and #fields == 1) then
        write_part(fields, level[i], counts[i], pers[i], labels[i])
      end
    end
    fields[#fields + 1] = TAG
    value = table.concat(fields, ' ')
  end
  if granted and level then
    for i = 1, #level do
      local part, ends = labels[i], level[i]
      for _, range in ipairs(part.ranges) do ends = ends + range[2] - range[1] end
      ends = part.d * counts[i] + part.f + ends
      if ends > 0 then ttl = math.max(ttl, ceil_div(ends, counts[i])) end
    end
  end
  if granted then
    redis.call('SET', KEYS[1], value, 'PX', ceil_div(ttl, 1000))
  else
    redis.call('SET', KEYS[1], value, 'KEEPTTL')
  end
end

-- Reply, for this configuration's capacity. A clock gone wrong reads the
-- bucket full again on the next call, its durations not counting down:
-- stable 0, so that no deny cache keeps it.
local remaining = capacity - ceil_div(used, per)
if remaining < 0 then remaining = 0 end
if refund then
  return string.format('1 %d 0 %d 0 -1 %d', remaining, reset, (given - given % per) / per)
end
local stable = -1
if wrong then
  stable = 0
elseif remaining < capacity then
  stable = drain_us(used - (capacity - remaining - 1) * per, used, count, per, at, counts, pers,
    own)
end
if not granted then
  return string.format('%d %d %d %d 0 %d', allowed, remaining, retry, reset, stable)
end

-- The grant's token: its permits, where its positions end (µs, and ticks
-- past them), and its part's labelling when not 0 (a key of this rate
-- alone: labelling 0, its drain at r).
local e, pos = 0, grant_end
if level then
  local part = labels[own]
  e, pos, r = part.e, part.f + grant_end, r + part.d
end
local e_ticks = pos % count
local reply = string.format('1 %d 0 %d 0 %d %d:%d', remaining, reset, stable, n,
  r + (pos - e_ticks) / count)
if e_ticks > 0 then reply = reply .. string.format('+%d', e_ticks) end
if e > 0 then reply = reply .. string.format('.%d', e) end
return reply
