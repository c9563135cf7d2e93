-- buckets.lua: the bucket log shared by the sliding window and the sliding log.
-- Joined last, after prelude.lua (now, n), sliding.lua (own, precision,
-- limits, sizes, raw, read_bucket, log_cache, stored_tail, stored_count)
-- and common.lua (idiv, ceil_div, ttl_ms, reply, not_ours); it runs only
-- for the states sliding.lua leaves to it.
--
-- Time is cut into buckets of `precision` µs aligned to the Unix epoch:
-- bucket index = floor(µs / precision). A strategy (limit, size) counts the
-- permits in the `size` buckets ending with now's bucket. A limiter's
-- strategies come sorted by size, ascending, with limits ascending.
--
-- The key is a hash, with a TTL:
--   "m"        meta, space-separated: the algorithm's tag ("W4" for the
--              sliding window, "L4" for the sliding log), then integers:
--              P E (prec size limit upto)*E tail tail_count
--              (cursor total)*E [head all]; indices relative to the tail
--              (meta_string); or, while one configuration alone uses the
--              key, a denial stamp, "!from till retry reset reported
--              [owner]", what a request for one permit gets until till
--              (sliding.lua), and then
--   "d"        holds the meta. Every write of the meta here writes it to
--              m, and a d it leaves is never read. State format 5 (the Go
--              side's spec.format) is format 4 with the stamp.
--   "<index>"  a nonempty bucket but the newest (the tail, whose count is
--              the meta's tail_count): "<count> <index of the next
--              nonempty bucket>".
-- P is the key's grid: the bucket length of its log. The nonempty buckets
-- form a queue, oldest (head) to newest (tail), holding `all` permits, and
-- are kept for `keep` buckets. head and all are written only when they are
-- not the last entry's cursor and total, as they are while one
-- configuration uses the key.
--
-- The E entries are the strategies that bind at the key: the calling
-- limiter's, and those of other configurations sharing the key (WithPrefix:
-- a rolling deploy), until they lapse (DESIGN property 8). An entry's prec
-- is its limiter's bucket length (0: the grid's), size its window in those
-- buckets, upto the bucket (in those too) from which it no longer binds: its
-- limiter's last grant plus its window, so that every window of it that
-- holds one of its grants is checked on every later grant, whoever asks.
-- On the grid, an entry counts its window in its own buckets when prec ==
-- P, else in ceil(window / P) + 1 buckets of P, which cover it. cursor is
-- the oldest bucket inside the entry's window (-1: none) and total the
-- permits in that window, so a call reads only the buckets that leave a
-- window, however many the window holds. keep is the longest window over
-- the entries. At most MAX_OTHERS entries of other configurations are kept,
-- those used last. The grid moves to the caller's precision when no other
-- entry needs the old one. Two earlier formats are read too: "W" and "L"
-- (format 3: P E (prec size limit upto)*E tail tail_count head all
-- (cursor total)*E, and the tail's count also in its field), and "w" and
-- "l" (format 2, before entries had limits: their strategies are dropped,
-- their buckets kept). A call that writes writes format 4; a format-3
-- tail's field is left until the tail moves on, and never read.
--
-- Bounded work (DESIGN property 9): a call reads at most BUDGET (8)
-- buckets (sliding.lua).
-- When more would leave a window in one call, the cursor stops where the
-- budget ran out and the strategy is `stale`: its total still counts the
-- buckets not yet walked, so it can only deny more, never grant more, and
-- the next calls walk on. A stale strategy, or a RetryAfter the budget
-- cannot reach, reports the time its whole window empties: longer than the
-- exact RetryAfter by less than the window. A window that empties entirely
-- costs no walk at all.
--
-- A denial and n == 0 never need a write (property 10): what they learn
-- (cursors that moved, dead buckets) is written with redis.pcall, best
-- effort, so that a server refusing writes still decides.

local MAX_OTHERS = 4

-- The error for a hash that is not this algorithm's log.
local function corrupt(tag)
  return not_ours('a hash that is not a ' .. (tag == 'w' and 'sliding window' or 'sliding log'))
end

-- An entry's window in buckets of the grid P: its own size on its own grid,
-- else enough buckets of P to cover any window of it.
local function eff_size(e, P)
  if e.prec == P then return e.size end
  return ceil_div(e.size * e.prec, P) + 1
end

-- The meta as a table, or nil when it is not this algorithm's. An entry
-- of the older format has no limit (e.limit == nil).
local function parse_meta(raw, tag)
  local version, skip
  local first = string.sub(raw, 1, 1)
  if first == string.upper(tag) and string.sub(raw, 2, 2) == '4' then
    version, skip = 4, 2
  elseif first == string.upper(tag) then
    version, skip = 3, 1
  elseif first == tag then
    version, skip = 2, 1
  else
    return nil
  end
  local body = string.sub(raw, skip + 1)
  local E = string.match(body, '^ %d+ (%d+) ')
  if not E then return nil end
  E = E + 0
  -- Format 4 has 4 + 6E fields, or 6 + 6E with head and all.
  local n = version == 2 and 7 + 3 * E or 6 + 6 * E
  local m
  if n <= 32 then
    -- One match for the whole field (Lua allows 32 captures): far cheaper
    -- than a match per field.
    m = {string.match(body, '^' .. string.rep(' (%-?%d+)', n) .. '$')}
    if not m[1] and version == 4 then
      n = n - 2
      m = {string.match(body, '^' .. string.rep(' (%-?%d+)', n) .. '$')}
    end
  else
    m = {}
    for field in string.gmatch(body, '[^ ]+') do
      if not string.match(field, '^%-?%d+$') then return nil end
      m[#m + 1] = field
    end
    if version == 4 and #m == n - 2 then n = n - 2 end
  end
  if #m ~= n or string.find(raw, '  ', 1, true) or string.sub(raw, -1) == ' ' then return nil end
  -- Digits, checked: arithmetic converts them, cheaper than tonumber.
  for i = 1, n do m[i] = m[i] + 0 end
  local P, E = m[1], m[2]
  if not E or E < 1 or P < 1 then return nil end
  local state = {precision = P, entries = {}}
  if version >= 3 then
    -- P E (prec size limit upto)*E tail tail_count, then format 3's head
    -- all (cursor total)*E or format 4's (cursor total)*E [head all];
    -- indices relative to the tail (see meta_string).
    local tail = m[3 + 4 * E]
    if tail < 0 then return nil end
    state.tail, state.tail_count = tail, m[4 + 4 * E]
    -- cursor i is at m[c + 2i], its total after it.
    local c = 3 + 4 * E
    if version == 3 then
      c = 5 + 4 * E
      state.head, state.all = tail - m[5 + 4 * E], m[6 + 4 * E]
    elseif n == 6 + 6 * E then
      state.head, state.all = tail - m[5 + 6 * E], m[6 + 6 * E]
    end
    state.keep = 1
    for i = 1, E do
      local k = 4 * i - 2
      local e = {prec = m[k + 1], size = m[k + 2], limit = m[k + 3], upto = m[k + 4]}
      if e.prec == 0 then
        e.prec, e.upto = P, tail + e.size + e.upto
      end
      e.cursor, e.total = m[c + 2 * i], m[c + 1 + 2 * i]
      if e.cursor ~= -1 then e.cursor = tail - e.cursor end
      if e.prec < 1 or e.size < 1 or e.limit < 1 or e.total < 0 then return nil end
      state.keep = math.max(state.keep, eff_size(e, P))
      state.entries[i] = e
    end
    if not state.head then
      -- The last entry's cursor and total, which a log always has.
      local last = state.entries[E]
      if last.cursor == -1 then return nil end
      state.head, state.all = last.cursor, last.total
    end
  else
    -- The previous format: P S size*S tail tail_count head keep all
    -- (cursor total)*S, absolute indices; its strategies have no limit.
    if #m ~= 7 + 3 * E then return nil end
    local o = 2 + E
    state.tail, state.tail_count, state.head = m[o + 1], m[o + 2], m[o + 3]
    state.keep, state.all = m[o + 4], m[o + 5]
    if state.tail < 0 or state.keep < 1 then return nil end
    for i = 1, E do
      if m[2 + i] < 1 then return nil end
      state.entries[i] = {prec = P, size = m[2 + i]}
    end
  end
  if state.all < 0 then return nil end
  return state
end

-- An empty log on grid P holding entries, their windows empty.
local function empty_log(P, entries)
  local state = {precision = P, entries = entries, tail = -1, tail_count = 0, head = -1, keep = 1, all = 0}
  for _, e in ipairs(entries) do
    e.eff, e.cursor, e.total = eff_size(e, P), -1, 0
    state.keep = math.max(state.keep, e.eff)
  end
  return state
end

-- Maps the log onto grid P at bucket b: used when the grid changes, or the
-- clock went back. Buckets map to the new bucket holding their start;
-- buckets after b (from the clock's future) fold into b, so no permit is
-- forgotten and none is counted for longer than the longest window from
-- now. Past the budget, the permits not walked (the old queue's total less
-- those walked) fold into the newest bucket: counted for longer, never
-- forgotten. Returns the new state and its buckets, oldest first, as
-- {index, count}; nothing is written here.
local function rebuild(old, b, P, entries)
  local state = empty_log(P, entries)
  local keep = state.keep
  local list = {}
  local function add(moved, count)
    if moved <= b - keep then return end
    local last = list[#list]
    if last and last[1] == moved then
      last[2] = last[2] + count
    else
      list[#list + 1] = {moved, count}
    end
  end
  local index, walked = old.head, 0
  while index ~= -1 do
    local count, next_index = read_bucket(index)
    if not count then
      if not next_index then return nil end
      -- Out of budget: the rest, newer than every bucket walked.
      local rest = old.all - walked
      if rest > 0 then add(math.min(idiv(old.tail * old.precision, P), b), rest) end
      break
    end
    walked = walked + count
    add(math.min(idiv(index * old.precision, P), b), count)
    index = next_index
  end
  -- Later reads in this call see the new log, not the old hash.
  log_cache = {}
  for k, item in ipairs(list) do
    local index, count = item[1], item[2]
    local next_index = -1
    if list[k + 1] then next_index = list[k + 1][1] end
    log_cache[-index] = {count, next_index}
    for _, e in ipairs(entries) do
      if index > b - e.eff then
        if e.cursor == -1 then e.cursor = index end
        e.total = e.total + count
      end
    end
    if state.head == -1 then state.head = index end
    state.all = state.all + count
    state.tail, state.tail_count = index, count
  end
  stored_tail, stored_count = state.tail, state.tail_count
  return state, list
end

-- The meta field. Bucket indices run to trillions (1ms buckets since
-- 1970), so all but the tail are written relative to it: head and cursors
-- as tail minus the index (-1 stays: no cursor), upto, for the entries on
-- the grid, as upto - tail - size (0 when the entry's last grant is the
-- tail). keep is not written: it is the longest window over the entries;
-- nor are head and all when they are the last entry's cursor and total.
-- The field stays under 64 bytes for usual configurations, which keeps the
-- hash in Redis's compact listpack.
local function meta_string(state, tag)
  local P, tail = state.precision, state.tail
  local m = {P, #state.entries}
  for _, e in ipairs(state.entries) do
    m[#m + 1] = e.prec == P and 0 or e.prec
    m[#m + 1] = e.size
    m[#m + 1] = e.limit
    m[#m + 1] = e.prec == P and e.upto - tail - e.size or e.upto
  end
  m[#m + 1] = tail
  m[#m + 1] = state.tail_count
  for _, e in ipairs(state.entries) do
    m[#m + 1] = e.cursor == -1 and -1 or tail - e.cursor
    m[#m + 1] = e.total
  end
  local last = state.entries[#state.entries]
  if last.cursor ~= state.head or last.total ~= state.all or state.head == -1 then
    m[#m + 1] = tail - state.head
    m[#m + 1] = state.all
  end
  -- One format call for the whole field: far cheaper than one a number.
  return string.format(string.upper(tag) .. '4' .. string.rep(' %d', #m), unpack(m))
end

-- When the whole of entry e's window has emptied: the longest any
-- RetryAfter of it can be.
local function window_clear(state, e, now)
  return (state.tail + e.eff) * state.precision - now
end

-- How long until entry e admits n more: walk its window from the oldest
-- bucket until enough permits have left, within the budget; past it, the
-- time the window empties. Nil for a malformed bucket.
local function retry_after(state, e, n, now, stale)
  if stale then return window_clear(state, e, now) end
  local excess = e.total + n - e.limit
  local index, left = e.cursor, 0
  while index ~= -1 do
    local count, next_index = read_bucket(index)
    if not count then
      if next_index then return window_clear(state, e, now) end
      return nil
    end
    left = left + count
    if left >= excess then
      return (index + e.eff) * state.precision - now
    end
    index = next_index
  end
  return nil
end

-- The entry of the caller's strategy i, as if it granted at now.
local function new_entry(now, precision, limits, sizes, i)
  return {prec = precision, size = sizes[i], limit = limits[i], upto = idiv(now, precision) + sizes[i]}
end

-- Decides a request of n permits at now against every strategy and returns
-- the script's reply. limits and sizes are the caller's strategies, in
-- ascending order, on buckets of precision; tag names the algorithm in the
-- meta field.
-- raw is the meta field as HGET gave it.
local function decide_log(now, n, precision, limits, sizes, tag, raw)
  local S = #sizes

  local state
  if type(raw) == 'table' and raw.err then return not_ours('another type than a hash') end
  if raw then
    state = parse_meta(raw, tag)
    if not state then return corrupt(tag) end
    stored_tail, stored_count = state.tail, state.tail_count
  elseif redis.call('EXISTS', KEYS[1]) == 1 then
    return corrupt(tag)
  end

  -- own[i]: the entry of the caller's strategy i; others: the entries of
  -- other configurations that still bind. reshaped: the entries changed.
  local own, others, reshaped = {}, {}, false
  if state then
    for _, e in ipairs(state.entries) do
      local found = false
      if e.limit and e.prec == precision then
        for i = 1, S do
          if not own[i] and e.size == sizes[i] and e.limit == limits[i] then
            own[i], found = e, true
            break
          end
        end
      end
      if not found then
        if e.limit and idiv(now, e.prec) < e.upto then
          others[#others + 1] = e
        else
          reshaped = true
        end
      end
    end
    if #others > MAX_OTHERS then
      table.sort(others, function(x, y) return x.upto * x.prec > y.upto * y.prec end)
      for k = #others, MAX_OTHERS + 1, -1 do others[k] = nil end
      reshaped = true
    end
    for i = 1, S do
      if not own[i] then
        -- Counts every kept permit until its cursor walks on: more, never
        -- fewer, than its window holds.
        own[i], reshaped = new_entry(now, precision, limits, sizes, i), true
        own[i].cursor, own[i].total = state.head, state.all
      end
    end
  else
    for i = 1, S do own[i] = new_entry(now, precision, limits, sizes, i) end
  end
  -- All dead: every bucket left the window the log keeps, counted in the
  -- stored grid; what bound there has lapsed.
  local all_dead = state and state.tail <= idiv(now, state.precision) - state.keep
  if all_dead then others = {} end
  local entries = {}
  for i = 1, S do entries[i] = own[i] end
  for _, e in ipairs(others) do entries[#entries + 1] = e end

  -- The grid stays while another entry counts on it; else it is the caller's.
  local P = precision
  for _, e in ipairs(others) do
    if e.prec ~= precision then P = state.precision end
  end

  -- changed: the hash must be written; tail_moved: its TTL too. While the
  -- newest bucket stays the same, so does the time the log empties, and the
  -- TTL set when that bucket began still covers it. list: a rebuilt log
  -- that replaces the hash.
  local changed, tail_moved, list = reshaped, false, nil
  local dead, stale = {}, {}
  local b = idiv(now, P)
  if state and (all_dead or reshaped or P ~= state.precision or state.tail > b) then
    -- Off the hot path. Our keys always carry a TTL: a hash without one
    -- is someone else's, and is neither rebuilt nor deleted.
    if redis.call('PTTL', KEYS[1]) < 0 then return corrupt(tag) end
  end
  if not state then
    state = empty_log(P, entries)
  elseif all_dead then
    -- An empty log, whatever it held.
    for i = 1, S do
      own[i] = new_entry(now, precision, limits, sizes, i)
      entries[i] = own[i]
    end
    state, changed, list = empty_log(P, entries), true, {}
  elseif P ~= state.precision or state.tail > b then
    state, list = rebuild(state, b, P, entries)
    if not state then return corrupt(tag) end
    changed, tail_moved = true, true
  else
    local keep = 1
    for _, e in ipairs(entries) do
      e.eff = eff_size(e, P)
      keep = math.max(keep, e.eff)
    end
    state.entries = entries
    if keep ~= state.keep then state.keep, changed, tail_moved = keep, true, true end
    for k, e in ipairs(entries) do
      local last_out = b - e.eff
      if state.tail ~= -1 and state.tail <= last_out then
        -- The whole window left: no walk.
        if e.cursor ~= -1 or e.total ~= 0 then changed = true end
        e.cursor, e.total = -1, 0
      end
      while e.cursor ~= -1 and e.cursor <= last_out do
        local count, next_index = read_bucket(e.cursor)
        if not count then
          if not next_index then return corrupt(tag) end
          stale[k] = true
          break
        end
        e.total = e.total - count
        e.cursor = next_index
        changed = true
      end
    end
    -- Buckets older than the log keeps are deleted, within the budget.
    while state.head ~= -1 and state.head <= b - state.keep do
      local count, next_index, name = read_bucket(state.head)
      if not count then
        if not next_index then return corrupt(tag) end
        break
      end
      dead[#dead + 1] = name or string.format('%d', state.head)
      state.all = state.all - count
      state.head = next_index
      changed = true
    end
  end

  -- The caller's strategy that is reported, and when denied the longest
  -- wait over every entry that denies. Another configuration's entry binds
  -- until it lapses (upto), which bounds its wait.
  local allowed, retry, reported, own_wait = true, 0, 1, -1
  if n > limits[1] then
    allowed, retry = false, -1
  elseif n > 0 then
    -- n == 0 only reports: allowed even when a lowered limit left the
    -- count above it.
    for k, e in ipairs(entries) do
      if e.total + n > e.limit then
        local wait
        if k > S then
          wait = e.upto * e.prec - now
          if n <= e.limit then
            local w = retry_after(state, e, n, now, stale[k])
            if not w then return corrupt(tag) end
            wait = math.min(wait, w)
          end
        else
          wait = retry_after(state, e, n, now, stale[k])
          if not wait then return corrupt(tag) end
          if wait > own_wait then reported, own_wait = k, wait end
        end
        allowed = false
        retry = math.max(retry, wait)
      end
    end
  end

  local writes = {}
  if allowed and n > 0 then
    if state.tail == b then
      state.tail_count = state.tail_count + n
    else
      if state.tail ~= -1 then
        writes[#writes + 1] = string.format('%d', state.tail)
        writes[#writes + 1] = string.format('%d %d', state.tail_count, b)
      end
      state.tail, state.tail_count, tail_moved = b, n, true
      if state.head == -1 then state.head = b end
      for _, e in ipairs(entries) do
        if e.cursor == -1 then e.cursor = b end
      end
    end
    state.all = state.all + n
    for _, e in ipairs(entries) do e.total = e.total + n end
    for i = 1, S do own[i].upto = idiv(now, precision) + sizes[i] end
    changed = true
  end

  -- Remaining: the fewest permits left over every entry. Reported when
  -- allowed, or denied by other configurations' entries alone: the
  -- caller's strategy with the fewest left, the first of equals.
  local best, fewest = 1, limits[1] - own[1].total
  for i = 2, S do
    local left = limits[i] - own[i].total
    if left < fewest then best, fewest = i, left end
  end
  local remaining = fewest
  for k = S + 1, #entries do
    remaining = math.min(remaining, entries[k].limit - entries[k].total)
  end
  if allowed or (retry ~= -1 and own_wait == -1) then reported = best end

  local reset, expire, stable = 0, 0, -1
  if state.tail ~= -1 then
    -- The tail may have left the caller's windows and still be kept for
    -- a longer one's.
    for k, e in ipairs(entries) do
      local clear = (state.tail + e.eff) * P
      if k > S then clear = math.min(clear, e.upto * e.prec) end
      reset = math.max(reset, clear - now)
    end
    expire = (state.tail + state.keep) * P - now
  end
  -- Another configuration's entry can deny past the time its window
  -- empties (n above its limit, a log folded by a clock that went back):
  -- the key is not fully available before a denial's retry.
  if retry > reset then reset = retry end
  -- Remaining changes when the oldest bucket of a window leaves it (at
  -- once for a stale window: its cursor is behind), or another
  -- configuration's entry lapses.
  for k, e in ipairs(entries) do
    local leaves = -1
    if e.cursor ~= -1 then
      leaves = (e.cursor + e.eff) * P - now
      if stale[k] then leaves = 0 end
    end
    if k > S and (leaves == -1 or e.upto * e.prec - now < leaves) then leaves = e.upto * e.prec - now end
    if leaves ~= -1 and (stable == -1 or leaves < stable) then stable = math.max(0, leaves) end
  end

  if changed then
    -- A grant must be written; anything else is best effort.
    local call = redis.pcall
    if allowed and n > 0 then call = redis.call end
    if list then
      -- UNLINK frees a large hash off the main thread; the permits it held
      -- that still count are in list.
      local ok = call('UNLINK', KEYS[1])
      if type(ok) == 'table' and ok.err then return reply(allowed, remaining, retry, reset, reported - 1, 0) end
      -- Every bucket but the tail, whose count is the meta's.
      for k, item in ipairs(list) do
        if k < #list or item[1] ~= state.tail then
          local next_index = b
          if list[k + 1] then next_index = list[k + 1][1] end
          writes[#writes + 1] = string.format('%d', item[1])
          writes[#writes + 1] = string.format('%d %d', item[2], next_index)
        end
      end
      tail_moved = true
    end
    if state.tail == -1 then
      if not list then call('UNLINK', KEYS[1]) end
    else
      if #dead > 0 then call('HDEL', KEYS[1], unpack(dead)) end
      call('HSET', KEYS[1], 'm', meta_string(state, tag), unpack(writes))
      if tail_moved then call('PEXPIRE', KEYS[1], ttl_ms(expire)) end
    end
  end
  return reply(allowed, remaining, retry, reset, reported - 1, stable)
end

return decide_log(now, n, precision, limits, sizes, string.lower(string.sub(own, 1, 1)), raw)
