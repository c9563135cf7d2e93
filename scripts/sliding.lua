-- sliding.lua: the sliding window and the sliding log, one strategy or
-- several over one shared set of buckets, allowed only if every strategy
-- allows. The reply names the strategy reported: when denied, the one with
-- the longest retry; when allowed, the one with the fewest permits left.
-- Joined after common.lua and before buckets.lua, which describes the state
-- and decides every case this file leaves.
--
-- ARGV[1] now (µs, or "" for server TIME)
-- ARGV[2] n          permits asked for (>= 0)
-- ARGV[3] own        the meta's text for this configuration's entries
--                    alone: "W P 1 0 size limit 0" for a sliding window,
--                    "L P E (0 size limit 0)*E" for a sliding log; its
--                    letter names the algorithm
-- ARGV[4] precision  bucket length (µs)
-- ARGV[5], ARGV[6]   limit and size (window / precision) of the shortest
-- ...                strategy, then the next ones, by window ascending,
--                    limits ascending
--
-- This file decides the common case on a few numbers: the meta holds only
-- the caller's own entries on its grid, each last granted in the tail (the
-- meta then starts with own), the tail is not in the clock's future and the
-- windows have not all emptied. It is buckets.lua's path for that state,
-- step for step: the same reads, writes and reply. Every other state falls
-- through, before a bucket is read, to buckets.lua, whose helpers are only
-- created when it runs: every function a script defines costs Redis a
-- closure on every call that reaches its definition.

local now = now_us()
-- n is 1 on most calls: comparing strings spares a conversion.
local n = 1
if ARGV[2] ~= '1' then n = ARGV[2] + 0 end
local own, precision = ARGV[3], ARGV[4] + 0
-- Tables built by a constructor get their size at once; growing an empty
-- table costs a rehash.
local limits, sizes = {ARGV[5] + 0}, {ARGV[6] + 0}
local S = (#ARGV - 4) / 2
for i = 2, S do
  limits[i], sizes[i] = ARGV[3 + 2 * i] + 0, ARGV[4 + 2 * i] + 0
end

local BUDGET = 12

-- bucket -> {count, next}, read at most once per call. Keyed by -index:
-- gopher-lua (miniredis) keeps positive integer keys in an array part filled
-- up to the key, and bucket indices run to billions.
local log_cache = {}
local reads = 0

-- A bucket's count and next index; or nil and true when the budget is
-- spent, nil and false when the field is missing or malformed.
local function read_bucket(index)
  local cached = log_cache[-index]
  if cached then return cached[1], cached[2] end
  if reads >= BUDGET then return nil, true end
  reads = reads + 1
  local raw = redis.call('HGET', KEYS[1], string.format('%d', index))
  if not raw then return nil, false end
  local count, next_index = string.match(raw, '^([1-9]%d*) (%d+)$')
  if count then
    count, next_index = tonumber(count), tonumber(next_index)
    if next_index <= index then return nil, false end
  else
    count, next_index = tonumber(string.match(raw, '^[1-9]%d*$')), -1
    if not count then return nil, false end
  end
  log_cache[-index] = {count, next_index}
  return count, next_index
end

local raw = redis.pcall('HGET', KEYS[1], 'm')

-- The meta after own: tail tail_count head all (cursor total)*S, as
-- meta_string writes them (a string indexed by err is nil: strings index
-- the string library).
local m
if raw and not raw.err and string.find(raw, own, 1, true) == 1 then
  local rest = '^ ([1-9]%d*) (%d+) (%d+) (%d+) (%-?%d+) (%d+)$'
  if S > 1 then rest = '^ ([1-9]%d*) (%d+) (%d+) (%d+)' .. string.rep(' (%-?%d+) (%d+)', S) .. '$' end
  m = {string.match(raw, rest, #own + 1)}
end
-- bad: a bucket the log names is missing or malformed.
local bad = false
repeat
  if not m or not m[1] then break end
  local P, keep = precision, sizes[S]
  local tail, b = m[1] + 0, idiv(now, precision)
  if tail > b or tail <= b - keep then break end

  local tail_count, head, all = m[2] + 0, tail - m[3], m[4] + 0
  local cursors, totals, stale = {m[5] + 0}, {m[6] + 0}, nil
  -- changed: the hash must be written; tail_moved: its TTL too; moved:
  -- the tail, head or a cursor, whose text is otherwise copied.
  local changed, tail_moved, moved = false, false, false
  -- Each window's cursor walks past the buckets that left it.
  for i = 1, S do
    local cursor, total = cursors[i] or m[3 + 2 * i] + 0, totals[i] or m[4 + 2 * i] + 0
    if cursor ~= -1 then cursor = tail - cursor end
    local last_out = b - sizes[i]
    if tail <= last_out then
      -- The whole window left: no walk.
      if cursor ~= -1 or total ~= 0 then changed, moved = true, true end
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
      total, cursor, changed, moved = total - count, next_index, true, true
    end
    cursors[i], totals[i] = cursor, total
  end
  if bad then break end
  -- Buckets older than the log keeps are deleted, within the budget.
  local dead
  while head ~= -1 and head <= b - keep do
    local count, next_index = read_bucket(head)
    if not count then
      bad = not next_index
      break
    end
    dead = dead or {}
    dead[#dead + 1] = string.format('%d', head)
    all, head, changed, moved = all - count, next_index, true, true
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

  -- A grant: now's bucket is the tail, b_text its field.
  local tail_text, moved_text, b_text = m[1], nil, m[1]
  if allowed and n > 0 then
    if tail == b then
      tail_count = tail_count + n
    else
      moved_text = string.format('%d %d', tail_count, b)
      b_text = string.format('%d', b)
      tail, tail_count, tail_moved, moved = b, n, true, true
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

  -- Reset: when the last window empties; stable: when the oldest bucket
  -- of a window leaves it (at once for a stale one).
  local reset, stable = 0, -1
  for i = 1, S do
    local clear = (tail + sizes[i]) * P - now
    if clear > reset then reset = clear end
    if cursors[i] ~= -1 then
      local leaves = (cursors[i] + sizes[i]) * P - now
      if stale and stale[i] then leaves = 0 end
      if stable == -1 or leaves < stable then stable = math.max(0, leaves) end
    end
  end
  if retry > reset then reset = retry end

  if changed then
    -- A grant must be written; anything else is best effort.
    local call = redis.pcall
    if allowed and n > 0 then call = redis.call end
    if dead then call('HDEL', KEYS[1], unpack(dead)) end
    -- The fields that did not move are copied as the text read: each %d
    -- is a sprintf.
    local meta
    if S == 1 and not moved then
      meta = string.format('%s %s %d %s %d %s %d', own, m[1], tail_count, m[3], all, m[5], totals[1])
    elseif not moved then
      local fields = {own, m[1], tail_count, m[3], all}
      for i = 1, S do fields[4 + 2 * i], fields[5 + 2 * i] = m[3 + 2 * i], totals[i] end
      meta = string.format('%s %s %d %s %d' .. string.rep(' %s %d', S), unpack(fields))
    else
      local fields = {own, tail, tail_count, tail - head, all}
      for i = 1, S do
        local c = cursors[i]
        if c ~= -1 then c = tail - c end
        fields[4 + 2 * i], fields[5 + 2 * i] = c, totals[i]
      end
      meta = string.format('%s' .. string.rep(' %d', 4 + 2 * S), unpack(fields))
    end
    if moved_text then
      call('HSET', KEYS[1], 'm', meta, tail_text, moved_text, b_text, string.format('%d', tail_count))
    elseif allowed and n > 0 then
      call('HSET', KEYS[1], 'm', meta, b_text, string.format('%d', tail_count))
    else
      call('HSET', KEYS[1], 'm', meta)
    end
    if tail_moved then call('PEXPIRE', KEYS[1], ttl_ms((tail + keep) * P - now)) end
  end
  do return reply(allowed, fewest, retry, reset, reported - 1, stable) end
until true
if bad then
  return not_ours('a hash that is not a ' .. (string.sub(own, 1, 1) == 'W' and 'sliding window' or 'sliding log'))
end
