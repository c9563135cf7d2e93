-- gcra.lua: the decision of the leaky and the token bucket, joined after
-- leakybucket.lua or tokenbucket.lua, which set TAG (the state's tag) and
-- WHAT (the bucket's name in errors). A token bucket's missing tokens are
-- a leaky bucket's level, so one rule decides both: the level drains at
-- `count` permits per `per` µs, and n permits are allowed if level + n <=
-- capacity, which then adds n. The level is counted in ticks: a permit is
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
-- All times are integer µs. The state (format 4, docs/internals.md) is a
-- string with a TTL: the key's time r (the latest clock a grant read) and
-- the level at r in parts, each draining at the rate that granted it, the
-- slowest first; then, once refunded, what refunds need:
--   "<r><level><tag>"                                   this rate only
--   "<r> <level>/<count>/<per>[ ...] [<shift>+<horizon>[ <id>:<k>...]] <tag>"
-- A call decides at the key's time max(now, r). Only grants and refunds
-- write; a grant adds to its own rate's part and never re-rates another.
--
-- Reply: "allowed remaining retry reset 0 stable[ token]" (µs; retry -1 =
-- never, stable -1 = until reset; the token names a grant, for refunds).
-- A refund replies "1 remaining 0 reset 0 -1 given".

-- Literal patterns, so that a call does not build them; the tag is
-- captured and compared with TAG, which the file before this one sets. The
-- short form is tried first.
local SHORT = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)([1-9]%d*)(%d)$'
local LONG = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d) (.-) (%d)$'
local PART = '^(%d+)/([1-9]%d*)/([1-9]%d*)$'
local REFUNDS = '^(%d+)%+(%d+)$'
local RECORD = '^([1-9]%d*):([1-9]%d*)$'
-- Formats 2 and 3, released: a time the bucket is empty, and no key time.
local OLD_WHOLE = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)(%d)$'
local OLD_FRACTION = '^([1-9]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)(%d)%+([1-9]%d*)/([1-9]%d*)$'
local OLD_LONG = '^([1-9]%d+) (%d+) ([1-9]%d*) ([1-9]%d*) ([1-9]%d*) (%d)$'
local NOT_OURS = 'NOTOURS holds %s, not redlimit state; it was left unchanged'
local MAX_PARTS, MAX_RECORDS = 2, 16
-- Another rate's level is converted in doubles, rounded up by a margin far
-- above their error.
local MARGIN = 1 + 2 ^ -40

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

local function not_ours(what)
  return redis.error_reply(string.format(NOT_OURS, what))
end

-- The clock: the caller's, or the server's.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local capacity, per, count = ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0
local full, shared = capacity * per, ARGV[6] == '1'
local full_us = ceil_div(full, count)
local n, refund, token = tonumber(ARGV[2]), nil, ''
if not n then
  n, refund, token = 0, string.match(ARGV[2], '^%-([1-9]%d*):(.*)$')
  refund, token = tonumber(refund) or 0, token or ''
end

-- Read the state into r, the parts (level at r in the part's ticks, its
-- count and per), and the refunds' shift, horizon and records. A key
-- without state is a level of 0 at now.
local r = now
local level, counts, pers = {}, {}, {}
local shift, horizon, ids, given_k = 0, 0, nil, nil -- ids: once refunded
local value = redis.pcall('GET', KEYS[1])
local old = false -- format 2 or 3: no key time; the level is taken at now
if value then
  if type(value) ~= 'string' then
    return not_ours('another type than ' .. WHAT)
  end
  local l, tag, us, num, den, c, p, cap
  r, l, tag = string.match(value, SHORT)
  if r and tag == TAG then
    level[1], counts[1], pers[1] = l + 0, count, per
  else
    -- A released format: the level at now, at the writer's rate, read as
    -- it always was; a level above the writer's full bucket is full.
    r = nil
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
      return not_ours('a value that is not ' .. WHAT)
    end
    if us then
      old, r = true, now
      local l0 = (us - now) * c + num
      if (l0 <= 0 or l0 > cap * p) and redis.call('PTTL', KEYS[1]) < 0 then
        return not_ours('a value without a TTL')
      end
      if l0 > 0 then
        level[1], counts[1], pers[1] = math.min(l0, cap * p), c + 0, p + 0
      end
    else
      local rest
      r, rest, tag = string.match(value, LONG)
      if tag ~= TAG then rest = nil end
      for field in string.gmatch(rest or '', '%S+') do
        local a, b, d = string.match(field, PART)
        local i = #level + 1
        if a and shift == 0 and i <= MAX_PARTS then
          level[i], counts[i], pers[i] = a + 0, b + 0, d + 0
        else
          a, b = string.match(field, REFUNDS)
          if a and #level > 0 and shift == 0 and a + 0 > 0 then
            shift, horizon, ids, given_k = a + 0, b + 0, {}, {}
          else
            a, b = string.match(field, RECORD)
            if not a or shift == 0 or #ids == MAX_RECORDS then
              return not_ours('a value that is not ' .. WHAT)
            end
            i = #ids + 1
            ids[i], given_k[i] = a + 0, b + 0
          end
        end
      end
      if #level == 0 then
        return not_ours('a value that is not ' .. WHAT)
      end
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
  if r - now > full_us then wrong = true else t = r end
end

-- Advance: the parts at t, the slowest draining first (a part starts
-- draining the µs after the one before it is empty); a clock gone wrong
-- sees one full part at this rate.
local at, own = {}, nil
local elapsed, drained_at = t - r, r
for i = 1, #level do
  local drain = ceil_div(level[i], counts[i])
  drained_at = drained_at + drain
  if elapsed >= drain then
    at[i], elapsed = 0, elapsed - drain
  else
    at[i], elapsed = level[i] - elapsed * counts[i], 0
  end
  if counts[i] == count and pers[i] == per then own = i end
end
if value and not old then
  local empty = true
  for i = 1, #at do empty = empty and at[i] == 0 end
  if (wrong or empty) and redis.call('PTTL', KEYS[1]) < 0 then
    return not_ours('a value without a TTL')
  end
end

-- ticks returns x ticks of part i in this configuration's ticks, rounded
-- up: exact at this rate's own part.
local function ticks(i, x)
  if i == own or pers[i] == per then return x end
  return conv(x, per, pers[i])
end

-- The level at t in this configuration's ticks.
local used = 0
if wrong then
  at, counts, pers, own, used = {full}, {count}, {per}, 1, full
else
  for i = 1, #at do used = used + ticks(i, at[i]) end
end

-- drain_us returns the µs (rounded up) until x of this configuration's
-- ticks have drained, part by part.
local function drain_us(x)
  local us = 0
  for i = 1, #at do
    if at[i] > 0 then
      local have = ticks(i, at[i])
      if x <= have then
        if i == own then return us + ceil_div(x, count) end
        return us + conv(x, pers[i], per * counts[i])
      end
      x, us = x - have, us + ceil_div(at[i], counts[i])
    end
  end
  return us
end

-- Decide, in this configuration's ticks: n permits fit if the level is at
-- most capacity - n permits.
local allowed, retry = 0, 0
if n > capacity then
  retry = -1
elseif n == 0 or used <= (capacity - n) * per then
  allowed = 1
else
  retry = drain_us(used - (capacity - n) * per)
end
local granted = allowed == 1 and n > 0

-- Apply a grant: the parts at t become the state at r = t; n permits join
-- this rate's part, placed by its rate (slowest first); drained parts go.
-- Three rates merge the two other than this one into the slower of them,
-- so that their permits drain later, never sooner. A bucket empty for
-- longer than the refunds' shift starts afresh: no earlier grant's slot
-- can reach past now any more. (A key of this rate alone takes none of
-- these ways.)
if granted then
  if used == 0 and t >= drained_at + shift then
    shift, horizon, ids, given_k = 0, 0, nil, nil
  end
  if #at > 1 or not own then
    local keep_at, keep_counts, keep_pers = {}, {}, {}
    for i = 1, #at do
      if at[i] > 0 or i == own then
        local j = #keep_at + 1
        keep_at[j], keep_counts[j], keep_pers[j] = at[i], counts[i], pers[i]
        if i == own then own = j end
      end
    end
    at, counts, pers = keep_at, keep_counts, keep_pers
    if not own then
      own = #at + 1
      for i = #at, 1, -1 do
        if counts[i] * per > count * pers[i] then own = i end
      end
      table.insert(at, own, 0)
      table.insert(counts, own, count)
      table.insert(pers, own, per)
    end
  end
  at[own] = at[own] + n * per
  used = used + n * per
  if #at > MAX_PARTS then
    local a, b = 1, 2
    if own == 1 then a, b = 2, 3 elseif own == 2 then a, b = 1, 3 end
    at[a] = at[a] + conv(at[b], pers[a], pers[b])
    table.remove(at, b)
    table.remove(counts, b)
    table.remove(pers, b)
    if own > b then own = own - 1 end
    used = 0
    for i = 1, #at do used = used + ticks(i, at[i]) end
  end
  r, level = t, at
end

-- Refund: the grant's permits occupy a slot of the key's timeline that
-- ended at <end> µs and <frac> ticks when granted, with <after> µs of
-- other rates' parts after it and the refunds' shift at <shift>. Refunds
-- since moved it at most shift - <shift> earlier, so it ends no sooner
-- than that much before <end>: what of it lies after t is still counted,
-- and up to k of its permits (less those asked for before) leave this
-- rate's part from its end.
local given = 0
if refund and not wrong and own and not old and at[own] > 0 then
  local e, frac, s, after = string.match(token, '^([1-9]%d*)%+?(%d*)%.?(%d*)%.?(%d*)$')
  frac, s, after = tonumber(frac) or 0, tonumber(s) or 0, tonumber(after) or 0
  local id = e and e + s + after
  ids, given_k = ids or {}, given_k or {}
  local k, j = refund, #ids + 1
  for i = 1, #ids do
    if ids[i] == id then k, j = refund - given_k[i], i end
  end
  if e and s <= shift and id > horizon and k > 0 then
    local left = (e - (shift - s) - t) * count + frac
    if left > 0 then
      given = math.min(k * per, left, at[own])
    end
  end
  if given > 0 then
    level[own] = level[own] - given
    at[own] = at[own] - given
    used = used - given
    shift = shift + ceil_div(given, count)
    ids[j], given_k[j] = id, refund
    if #ids > MAX_RECORDS then
      -- Drop a record of a drained grant if there is one, else the
      -- oldest, whose grant and every older one then give nothing.
      local drop
      for i = 1, #ids do
        if ids[i] - shift <= t then drop = i end
      end
      if not drop then
        drop = 1
        for i = 2, #ids do
          if ids[i] < ids[drop] then drop = i end
        end
        horizon = math.max(horizon, ids[drop])
      end
      table.remove(ids, drop)
      table.remove(given_k, drop)
    end
  end
end

-- Write: grants (the key lives until every part has drained, on this
-- caller's clock) and refunds (their TTL kept: a refund never shortens it).
local reset = drain_us(used)
if granted or given > 0 then
  if not shared and #level == 1 and own == 1 and shift == 0 then
    value = string.format('%d%d%s', r, level[1], TAG)
  else
    local fields = {string.format('%d', r)}
    for i = 1, #level do
      if level[i] > 0 or (i == #level and #fields == 1) then
        fields[#fields + 1] = string.format('%d/%d/%d', level[i], counts[i], pers[i])
      end
    end
    if shift > 0 then
      fields[#fields + 1] = string.format('%d+%d', shift, horizon)
      for i = 1, #ids do
        fields[#fields + 1] = string.format('%d:%d', ids[i], given_k[i])
      end
    end
    fields[#fields + 1] = TAG
    value = table.concat(fields, ' ')
  end
  if granted then
    redis.call('SET', KEYS[1], value, 'PX', ceil_div(reset, 1000))
  else
    redis.call('SET', KEYS[1], value, 'KEEPTTL')
  end
end

-- Reply, for this configuration's capacity. A clock gone wrong reads the
-- bucket full again on the next call, its durations not counting down:
-- stable 0, so that no deny cache keeps the answer.
local remaining = capacity - ceil_div(used, per)
if remaining < 0 then remaining = 0 end
if refund then
  return string.format('1 %d 0 %d 0 -1 %d', remaining, reset, (given - given % per) / per)
end
local stable = -1
if wrong then
  stable = 0
elseif remaining < capacity then
  stable = drain_us(used - (capacity - remaining - 1) * per)
end
if not granted then
  return string.format('%d %d %d %d 0 %d', allowed, remaining, retry, reset, stable)
end

-- The grant's token: where its slot ends (µs, and ticks past them), the
-- shift, and what of other rates follows it: "<end>[+<frac>][.<shift>[.<after>]]".
local e, frac, after = t, at[own] % count, 0
for i = 1, #at do
  if i < own then
    e = e + ceil_div(at[i], counts[i])
  elseif i == own then
    e = e + (at[i] - frac) / count
  else
    after = after + (at[i] - at[i] % counts[i]) / counts[i]
  end
end
if frac == 0 and shift == 0 and after == 0 then
  return string.format('1 %d 0 %d 0 %d %d', remaining, reset, stable, e)
end
local token = string.format('%d', e)
if frac > 0 then token = token .. string.format('+%d', frac) end
if after > 0 then
  token = token .. string.format('.%d.%d', shift, after)
elseif shift > 0 then
  token = token .. string.format('.%d', shift)
end
return string.format('1 %d 0 %d 0 %d %s', remaining, reset, stable, token)
