-- sliding.lua: the sliding window and the sliding log, one strategy or
-- several over one shared set of buckets, allowed only if every strategy
-- allows. The reply names the strategy reported: when denied, the one with
-- the longest retry; when allowed, the one with the fewest permits left.
-- Joined after prelude.lua (now, n, NOT_OURS) and before common.lua and
-- buckets.lua, which describes the state and decides every case this file
-- leaves.
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n          permits asked for (>= 0)
-- ARGV[3] own        the meta's text for this configuration's entries
--                    alone: "W4 P 1 0 size limit 0" for a sliding window,
--                    "L4 P E (0 size limit 0)*E" for a sliding log; its
--                    letter names the algorithm
-- ARGV[4] precision  bucket length (µs)
-- ARGV[5], ARGV[6]   limit and size (window / precision) of the shortest
-- ...                strategy, then the next ones, by window ascending,
--                    limits ascending
-- last, under WithPrefix only: the configuration's name in the denial
--                    stamps it writes (stampOwner in validate.go)
--
-- This file decides the common case on a few numbers: the meta holds only
-- the caller's own entries on its grid, each last granted in the tail (the
-- meta then starts with own), the tail is not in the clock's future and
-- the windows have not all emptied. It is buckets.lua's path for that
-- state, step for step: the same reads, Results and writes but for the
-- denial stamp (below), which buckets.lua never writes. Two calls take a
-- shortcut, each replying in a form of its own that the Go side completes
-- (internal/engine/reply.go): a denial of one permit that a stamp answers
-- costs one HGET and two numbers, the first denial of a state paying for
-- the stamp's write; a grant in the tail's bucket costs one HGET, one
-- HSET, and the numbers that change (see
-- BENCHMARKS.md). Every other state falls
-- through, before a bucket is read, to common.lua and buckets.lua, whose
-- helpers are only created when they run: every function a script defines
-- costs Redis a closure on every call that reaches its definition. So this
-- file defines none but the bucket reader, and only for the calls that may
-- read a bucket; what common.lua's helpers do is written out here.

local own = ARGV[3]
-- S strategies; an odd count of ARGV ends with the stamps' owner.
local S, owner = (#ARGV - 4) / 2, ''
if S % 1 ~= 0 then S, owner = S - 0.5, ARGV[#ARGV] end

-- The meta field: own, then the rest (below), when only the caller's
-- configuration uses the key. A string indexed by err is nil: strings
-- index the string library.
local raw = redis.pcall('HGET', KEYS[1], 'm')
-- at: where the rest starts in raw, when own is there. in_d: the meta is
-- in field d, and m holds a denial stamp.
local at, in_d
if raw and not raw.err then
  if string.find(raw, own, 1, true) == 1 then
    at = #own + 1
  elseif string.byte(raw) == 33 then
    -- The denial stamp: "!from till retry reset reported[ owner]" in m,
    -- the meta moved to field d. A denial of one permit at from (µs)
    -- that changed nothing writes it; till, retry and reset count from
    -- from, till being when the first of the windows' oldest buckets
    -- leaves. Every other write of the meta puts it back in m, so
    -- while the stamp is there the state is the one it describes: from
    -- then until till no bucket leaves a window and the tail is not in
    -- the clock's future, and a request for one permit is denied with the
    -- same absolute times. The stamp's owner, under WithPrefix, is the
    -- configuration that wrote it; a default key only ever holds one.
    -- Such a request is decided here, on two numbers: the reply is "~",
    -- now and the stamp, and the Go side subtracts
    -- (internal/engine/reply.go); now is ARGV's text, or TIME's two, so
    -- that no number is formatted. A clock before from, or n ~= 1, or
    -- another configuration, reads the meta from d. (A field of its own:
    -- stamp and meta together would pass the 64 bytes of
    -- hash-max-listpack-value, and Redis would keep the key as a hash
    -- table, twice the memory, for good.)
    local _, _, from, till, name = string.find(raw, '^!(%d+) (%d+) %d+ %d+ %d+ ?(%w*)$')
    if n == 1 and name == owner then
      local elapsed = now - from
      if elapsed >= 0 and elapsed < till + 0 then
        if not t then return '~' .. ARGV[1] .. ' ' .. raw end
        local us = t[2]
        if #us < 6 then us = string.sub('00000' .. us, -6) end
        return '~' .. t[1] .. us .. ' ' .. raw
      end
    end
    if from then
      raw, in_d = redis.call('HGET', KEYS[1], 'd'), true
      if raw and string.find(raw, own, 1, true) == 1 then at = #own + 1 end
    end
  end
end

local precision = ARGV[4] + 0
-- caught: the match of a state the grant leaves to the path below, which
-- then need not match it again.
local caught

-- A grant in the tail's bucket, the common call of a busy key: the meta
-- holds only the caller's entries (at), each window's cursor inside it
-- (cursor i is tail - c_i, inside while c_i < size_i; -1, no cursor, does
-- not match %d+) and no head apart from the last cursor. In the tail's
-- bucket nothing leaves a window or the log, so the grant adds n to the
-- tail's count and to every total, and changes nothing else: the meta is
-- rewritten from its own text with those numbers alone formatted, and the
-- reply is "=", now and that rest of the meta; the Go side computes
-- Remaining, the strategy reported and ResetAfter from its configuration
-- (internal/engine/reply.go), so no reply is formatted here. It is the
-- step the path below takes for such a state, and writes the same meta; a
-- state outside it (a tail or cursor out of place, a count above a total,
-- a denial) goes on below. c_i < size_i compares the decimal strings: a
-- shorter one is smaller (size_i has no leading zero, and neither may c_i,
-- which is written back as it is), and among equal lengths the order is
-- the strings' own. One or two strategies, the common cases, are matched
-- into locals; more into a table.
if at and n > 0 then
  local P, rest = precision, nil
  if S <= 2 then
    local tail, count, c1, t1, c2, t2
    if S == 1 then
      tail, count, c1, t1 = string.match(raw, '^ ([1-9]%d*) (%d+) (%d+) (%d+)$', at)
    else
      tail, count, c1, t1, c2, t2 = string.match(raw, '^ ([1-9]%d*) (%d+) (%d+) (%d+) (%d+) (%d+)$', at)
    end
    local size1 = ARGV[6]
    if tail and tail * P <= now and now < tail * P + P and (#c1 < #size1 or (#c1 == #size1 and c1 < size1)) and (#c1 == 1 or string.byte(c1) ~= 48) then
      local granted, total1 = count + n, t1 + n
      if granted <= total1 and total1 <= ARGV[5] + 0 then
        if S == 1 then
          rest = string.format(' %s %d %s %d', tail, granted, c1, total1)
        else
          local size2, total2 = ARGV[8], t2 + n
          if (#c2 < #size2 or (#c2 == #size2 and c2 < size2)) and (#c2 == 1 or string.byte(c2) ~= 48) and granted <= total2 and total2 <= ARGV[7] + 0 then
            rest = string.format(' %s %d %s %d %s %d', tail, granted, c1, total1, c2, total2)
          end
        end
      end
    end
    if tail and not rest then caught = {tail, count, c1, t1, c2, t2} end
  else
    -- f: tail count (c_i t_i)*S.
    local f = {string.match(raw, '^ ([1-9]%d*) (%d+)' .. string.rep(' (%d+) (%d+)', S) .. '$', at)}
    local tail = f[1]
    if tail and tail * P <= now and now < tail * P + P then
      local count = f[2] + n
      f[2] = count
      for i = 1, S do
        local c, size, total = f[1 + 2 * i], ARGV[4 + 2 * i], f[2 + 2 * i] + n
        if not ((#c < #size or (#c == #size and c < size)) and (#c == 1 or string.byte(c) ~= 48) and count <= total and total <= ARGV[3 + 2 * i] + 0) then
          tail = nil
          break
        end
        f[2 + 2 * i] = total
      end
      if tail then rest = string.format(' %s %d' .. string.rep(' %s %d', S), unpack(f)) end
    end
  end
  if rest then
    redis.call('HSET', KEYS[1], 'm', own .. rest)
    if not t then return '=' .. ARGV[1] .. rest end
    local us = t[2]
    if #us < 6 then us = string.sub('00000' .. us, -6) end
    return '=' .. t[1] .. us .. rest
  end
end

-- Tables built by a constructor get their size at once; each growth of
-- one costs a rehash.
local limits, sizes
if S == 1 then
  limits, sizes = {ARGV[5] + 0}, {ARGV[6] + 0}
else
  limits, sizes = {ARGV[5] + 0, ARGV[7] + 0}, {ARGV[6] + 0, ARGV[8] + 0}
  for i = 3, S do
    limits[i], sizes[i] = ARGV[3 + 2 * i] + 0, ARGV[4 + 2 * i] + 0
  end
end

-- The rest: tail tail_count (cursor total)*S [head all], as meta_string
-- writes them.
local m = caught
if at and not m then
  -- Constant patterns for one and two strategies: building one costs.
  if S == 1 then
    m = {string.match(raw, '^ ([1-9]%d*) (%d+) (%-?%d+) (%d+)$', at)}
    if not m[1] then m = {string.match(raw, '^ ([1-9]%d*) (%d+) (%-?%d+) (%d+) (%d+) (%d+)$', at)} end
  elseif S == 2 then
    m = {string.match(raw, '^ ([1-9]%d*) (%d+) (%-?%d+) (%d+) (%-?%d+) (%d+)$', at)}
    if not m[1] then m = {string.match(raw, '^ ([1-9]%d*) (%d+) (%-?%d+) (%d+) (%-?%d+) (%d+) (%d+) (%d+)$', at)} end
  else
    local rest = '^ ([1-9]%d*) (%d+)' .. string.rep(' (%-?%d+) (%d+)', S)
    m = {string.match(raw, rest .. '$', at)}
    if not m[1] then m = {string.match(raw, rest .. ' (%d+) (%d+)$', at)} end
  end
end

-- fast: this file decides. The tail is not in the clock's future, the
-- windows have not all emptied, and the log has a head.
local fast = false
local P, keep, b = precision, sizes[S], 0
local tail, tail_count, head, all, cursors, totals
if m and m[1] then
  -- idiv(now, precision): now >= 0.
  tail, b = m[1] + 0, (now - now % precision) / precision
  if tail <= b and tail > b - keep then
    if S == 1 then
      cursors, totals = {m[3] + 0}, {m[4] + 0}
    else
      cursors, totals = {m[3] + 0, m[5] + 0}, {m[4] + 0, m[6] + 0}
      for i = 3, S do cursors[i], totals[i] = m[1 + 2 * i] + 0, m[2 + 2 * i] + 0 end
    end
    for i = 1, S do
      if cursors[i] ~= -1 then cursors[i] = tail - cursors[i] end
    end
    tail_count, head, all = m[2] + 0, cursors[S], totals[S]
    if m[3 + 2 * S] then
      head, all, fast = tail - m[3 + 2 * S], m[4 + 2 * S] + 0, true
    else
      fast = head ~= -1
    end
  end
end

-- Whether the call may read a bucket: a bucket left a window or the log, a
-- request may be denied (its wait walks a window), or buckets.lua decides.
-- Most calls read none, and spare the reader's closure.
local reader = not fast or head <= b - keep
for i = 1, fast and not reader and S or 0 do
  if (cursors[i] ~= -1 and cursors[i] <= b - sizes[i]) or (n > 0 and totals[i] + n > limits[i]) then reader = true end
end

-- bucket -> {count, next}, read at most once per call. Keyed by -index:
-- gopher-lua (miniredis) keeps positive integer keys in an array part filled
-- up to the key, and bucket indices run to billions.
local log_cache, reads = nil, 0
-- The tail as the meta read says: its count is not in its field.
local stored_tail, stored_count = tail or -1, tail_count or 0
-- read_bucket(index): a bucket's count, next index and field name (nil for
-- the tail, whose count the meta holds); or nil and true when the budget
-- (BUDGET reads a call) is spent, nil and false when the field is missing
-- or malformed.
-- 8: a read costs Redis about 2µs (HGET, and HDEL when the bucket is
-- dead), so 8 keep the dearest call under 3 normal ones (bench -adversarial),
-- and still walk every window of the tests' traces exactly.
local BUDGET = 8
local read_bucket
if reader then
  log_cache = {}
  read_bucket = function(index)
    local cached = log_cache[-index]
    if cached then return cached[1], cached[2], cached[3] end
    if index == stored_tail then return stored_count, -1 end
    if reads >= BUDGET then return nil, true end
    reads = reads + 1
    local name = string.format('%d', index)
    local field = redis.call('HGET', KEYS[1], name)
    if not field then return nil, false end
    local count, next_index = string.match(field, '^([1-9]%d*) (%d+)$')
    if count then
      count, next_index = count + 0, next_index + 0
      if next_index <= index then return nil, false end
    else
      count, next_index = tonumber(string.match(field, '^[1-9]%d*$')), -1
      if not count then return nil, false end
    end
    log_cache[-index] = {count, next_index, name}
    return count, next_index, name
  end
end

-- bad: a bucket the log names is missing or malformed.
local bad = false
repeat
  if not fast then break end
  local stale
  -- changed: the hash must be written; tail_moved: its TTL too.
  local changed, tail_moved = false, false
  -- Each window's cursor walks past the buckets that left it.
  for i = 1, S do
    local cursor, total = cursors[i], totals[i]
    local last_out = b - sizes[i]
    if tail <= last_out then
      -- The whole window left: no walk.
      if cursor ~= -1 or total ~= 0 then changed = true end
      cursor, total = -1, 0
    end
    while cursor ~= -1 and cursor <= last_out do
      local count, next_index = read_bucket(cursor)
      if not count then
        if next_index then
          stale = stale or {}
          stale[i] = true
        else
          bad = true
        end
        break
      end
      total, cursor, changed = total - count, next_index, true
    end
    cursors[i], totals[i] = cursor, total
  end
  if bad then break end
  -- Buckets older than the log keeps are deleted, within the budget.
  local dead
  while head ~= -1 and head <= b - keep do
    local count, next_index, name = read_bucket(head)
    if not count then
      bad = not next_index
      break
    end
    dead = dead or {}
    dead[#dead + 1] = name or string.format('%d', head)
    all, head, changed = all - count, next_index, true
  end
  if bad then break end

  -- The longest wait over the windows that deny, and the one reported.
  local allowed, retry, reported, own_wait = true, 0, 1, -1
  if n > limits[1] then
    allowed, retry = false, -1
  elseif n > 0 then
    for i = 1, S do
      local excess = totals[i] + n - limits[i]
      if excess > 0 then
        -- Walk the window from its oldest bucket until enough permits
        -- have left; past the budget, or stale, the time it empties.
        local wait = (tail + sizes[i]) * P - now
        if not (stale and stale[i]) then
          local index, left = cursors[i], 0
          while true do
            if index == -1 then
              bad = true
              break
            end
            local count, next_index = read_bucket(index)
            if not count then
              bad = not next_index
              break
            end
            left = left + count
            if left >= excess then
              wait = (index + sizes[i]) * P - now
              break
            end
            index = next_index
          end
          if bad then break end
        end
        if wait > own_wait then reported, own_wait = i, wait end
        if wait > retry then retry = wait end
        allowed = false
      end
    end
  end
  if bad then break end

  -- A grant: now's bucket becomes the tail, whose count the meta holds;
  -- the tail it replaces gets its field, moved.
  local tail_text, moved = m[1], nil
  if allowed and n > 0 then
    if tail == b then
      tail_count = tail_count + n
    else
      moved = string.format('%d %d', tail_count, b)
      tail, tail_count, tail_moved = b, n, true
      if head == -1 then head = b end
      for i = 1, S do
        if cursors[i] == -1 then cursors[i] = b end
      end
    end
    all = all + n
    for i = 1, S do totals[i] = totals[i] + n end
    changed = true
  end

  -- Remaining: the fewest permits left, reported when allowed.
  local fewest = limits[1] - totals[1]
  for i = 2, S do
    local left = limits[i] - totals[i]
    if left < fewest then
      fewest = left
      if allowed then reported = i end
    end
  end

  -- Reset: when the last window empties; stable, for a denial (only its
  -- is read: the deny cache keeps denials): when the oldest bucket of a
  -- window leaves it (at once for a stale one). An allowed reply says -1.
  local reset, stable = 0, -1
  for i = 1, S do
    local clear = (tail + sizes[i]) * P - now
    if clear > reset then reset = clear end
    if not allowed and cursors[i] ~= -1 then
      local leaves = (cursors[i] + sizes[i]) * P - now
      if stale and stale[i] then leaves = 0 end
      if leaves < 0 then leaves = 0 end
      if stable == -1 or leaves < stable then stable = leaves end
    end
  end
  if retry > reset then reset = retry end

  -- A denial of one permit that changed nothing stamps the meta (see the
  -- top): it walked no cursor and deleted no bucket, so until till a call
  -- on this state reads the same buckets, within the same budget, and
  -- replies the same. Best effort, like every write of a denial.
  if not allowed and n == 1 and not changed and stable > 0 then
    local stamp = string.format('!%d %d %d %d %d', now, stable, retry, reset, reported - 1)
    if owner ~= '' then stamp = stamp .. ' ' .. owner end
    if in_d then
      redis.pcall('HSET', KEYS[1], 'm', stamp)
    else
      redis.pcall('HSET', KEYS[1], 'm', stamp, 'd', raw)
    end
  end

  if changed then
    -- A grant must be written; anything else is best effort.
    local call = redis.pcall
    if allowed and n > 0 then call = redis.call end
    if dead then call('HDEL', KEYS[1], unpack(dead)) end
    -- The common metas, one or two windows and no head: constant formats.
    local meta
    local implicit = head == cursors[S] and all == totals[S] and head ~= -1
    if implicit and S <= 2 then
      local c1 = cursors[1]
      if c1 ~= -1 then c1 = tail - c1 end
      if S == 1 then
        meta = own .. string.format(' %d %d %d %d', tail, tail_count, c1, totals[1])
      else
        local c2 = cursors[2]
        if c2 ~= -1 then c2 = tail - c2 end
        meta = own .. string.format(' %d %d %d %d %d %d', tail, tail_count, c1, totals[1], c2, totals[2])
      end
    else
      local fields = {tail, tail_count}
      for i = 1, S do
        local c = cursors[i]
        if c ~= -1 then c = tail - c end
        fields[1 + 2 * i], fields[2 + 2 * i] = c, totals[i]
      end
      if not implicit then fields[3 + 2 * S], fields[4 + 2 * S] = tail - head, all end
      meta = own .. string.format(string.rep(' %d', #fields), unpack(fields))
    end
    if moved then
      call('HSET', KEYS[1], 'm', meta, tail_text, moved)
    else
      call('HSET', KEYS[1], 'm', meta)
    end
    if tail_moved then
      -- ttl_ms: the log empties in expire > 0 µs; rounded up to the ms.
      local expire = (tail + keep) * P - now
      local ms = (expire - expire % 1000) / 1000
      if expire % 1000 > 0 then ms = ms + 1 end
      call('PEXPIRE', KEYS[1], ms)
    end
  end
  -- reply() in common.lua: six integers, the constant ones written in,
  -- and a denial with nothing left formats each distinct duration once.
  if fewest < 0 then fewest = 0 end
  if reported > 1 then
    do return string.format('%d %d %d %d %d %d', allowed and 1 or 0, fewest, retry, reset, reported - 1, stable) end
  elseif allowed then
    do return string.format('1 %d 0 %d 0 -1', fewest, reset) end
  elseif fewest > 0 or retry == -1 then
    do return string.format('0 %d %d %d 0 %d', fewest, retry, reset, stable) end
  end
  local retry_text = string.format('%d', retry)
  local reset_text, stable_text = retry_text, retry_text
  if reset ~= retry then reset_text = string.format('%d', reset) end
  if stable == reset then
    stable_text = reset_text
  elseif stable ~= retry then
    stable_text = string.format('%d', stable)
  end
  do return '0 0 ' .. retry_text .. ' ' .. reset_text .. ' 0 ' .. stable_text end
until true
if bad then
  return redis.error_reply('NOTOURS holds a hash that is not a ' .. (string.sub(own, 1, 1) == 'W' and 'sliding window' or 'sliding log') .. NOT_OURS)
end
