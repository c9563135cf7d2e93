-- buckets.lua: the bucket log shared by the sliding window and the sliding log.
--
-- Time is cut into buckets of `precision` µs aligned to the Unix epoch:
-- bucket index = floor(µs / precision). A strategy (limit, size) counts the
-- permits in the `size` buckets ending with now's bucket. Strategies come
-- sorted by size, ascending, with limits ascending.
--
-- The key is a hash, with a TTL:
--   "m"        meta, space-separated: the algorithm's tag ("w" for the
--              sliding window, "l" for the sliding log), then integers:
--              precision S size_1..size_S tail tail_count head keep all
--              cursor_1 total_1 .. cursor_S total_S
--   "<index>"  a nonempty bucket: "<count>" for the newest (the tail),
--              "<count> <index of the next nonempty bucket>" for the others.
-- The nonempty buckets form a queue, oldest (head) to newest (tail), holding
-- `all` permits. cursor_i is the oldest bucket inside strategy i's window
-- (-1: none) and total_i the permits in that window, so a call reads only
-- the buckets that leave a window, however many the window holds. Buckets
-- are kept for `keep` buckets, at least the longest window: longer when a
-- configuration with a longer window shares the key (DESIGN property 8), so
-- that its history is never dropped by another configuration's call.
--
-- Bounded work (DESIGN property 9): a call reads at most BUDGET buckets.
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

local function parse_meta(raw, tag)
  local m = {}
  local first = true
  for field in string.gmatch(raw, '[^ ]+') do
    if first then
      if field ~= tag then return nil end
      first = false
    else
      if not string.match(field, '^%-?%d+$') then return nil end
      m[#m + 1] = tonumber(field)
    end
  end
  local S = m[2]
  if not S or S < 1 or #m ~= 7 + 3 * S or m[1] < 1 then return nil end
  local state = {precision = m[1], sizes = {}, cursor = {}, total = {}}
  for i = 1, S do state.sizes[i] = m[2 + i] end
  state.tail, state.tail_count = m[3 + S], m[4 + S]
  state.head, state.keep, state.all = m[5 + S], m[6 + S], m[7 + S]
  if state.keep < state.sizes[S] or state.all < 0 then return nil end
  for i = 1, S do
    state.cursor[i], state.total[i] = m[6 + S + 2 * i], m[7 + S + 2 * i]
    if state.total[i] < 0 then return nil end
  end
  return state
end

local function same_config(state, precision, sizes)
  if state.precision ~= precision or #state.sizes ~= #sizes then return false end
  for i = 1, #sizes do
    if state.sizes[i] ~= sizes[i] then return false end
  end
  return true
end

local function empty_state(precision, sizes)
  local state = {precision = precision, sizes = sizes, cursor = {}, total = {}, tail = -1, tail_count = 0,
    head = -1, keep = sizes[#sizes], all = 0}
  for i = 1, #sizes do state.cursor[i], state.total[i] = -1, 0 end
  return state
end

-- Maps the log onto `precision` and `sizes` at bucket b: used when the
-- configuration changed on a live key, or the clock went back. Buckets map
-- to the new bucket holding their start; buckets after b (from the clock's
-- future) fold into b, so no permit is forgotten and none is counted for
-- longer than the longest window from now. Buckets are kept as long as the
-- old log kept them, if that is longer than the new longest window: a
-- configuration that shares the key never loses its history to this one.
-- Past the budget, the permits not walked (the old queue's total less those
-- walked) fold into the newest bucket: counted for longer, never forgotten.
-- Returns the new state and its buckets, oldest first, as {index, count};
-- nothing is written here.
local function rebuild(old, b, precision, sizes)
  local S = #sizes
  local keep = math.max(sizes[S], ceil_div(old.keep * old.precision, precision))
  local entries = {}
  local function add(moved, count)
    if moved <= b - keep then return end
    local last = entries[#entries]
    if last and last[1] == moved then
      last[2] = last[2] + count
    else
      entries[#entries + 1] = {moved, count}
    end
  end
  local index, walked = old.head, 0
  while index ~= -1 do
    local count, next_index = read_bucket(index)
    if not count then
      if not next_index then return nil end
      -- Out of budget: the rest, newer than every bucket walked.
      local rest = old.all - walked
      if rest > 0 then add(math.min(idiv(old.tail * old.precision, precision), b), rest) end
      break
    end
    walked = walked + count
    add(math.min(idiv(index * old.precision, precision), b), count)
    index = next_index
  end
  local state = empty_state(precision, sizes)
  state.keep = keep
  -- Later reads in this call see the new log, not the old hash.
  log_cache = {}
  for k, entry in ipairs(entries) do
    local index, count = entry[1], entry[2]
    local next_index = -1
    if entries[k + 1] then next_index = entries[k + 1][1] end
    log_cache[-index] = {count, next_index}
    for i = 1, S do
      if index > b - sizes[i] then
        if state.cursor[i] == -1 then state.cursor[i] = index end
        state.total[i] = state.total[i] + count
      end
    end
    if state.head == -1 then state.head = index end
    state.all = state.all + count
    state.tail, state.tail_count = index, count
  end
  return state, entries
end

local function meta_string(state, tag)
  local m = {state.precision, #state.sizes}
  for i = 1, #state.sizes do m[#m + 1] = state.sizes[i] end
  m[#m + 1] = state.tail
  m[#m + 1] = state.tail_count
  m[#m + 1] = state.head
  m[#m + 1] = state.keep
  m[#m + 1] = state.all
  for i = 1, #state.sizes do
    m[#m + 1] = state.cursor[i]
    m[#m + 1] = state.total[i]
  end
  for i = 1, #m do m[i] = string.format('%d', m[i]) end
  return tag .. ' ' .. table.concat(m, ' ')
end

-- When the whole of strategy i's window has emptied: the longest any
-- RetryAfter of it can be.
local function window_clear(state, i, now)
  return (state.tail + state.sizes[i]) * state.precision - now
end

-- How long until strategy i admits n more: walk its window from the oldest
-- bucket until enough permits have left, within the budget; past it, the
-- time the window empties. Nil for a malformed bucket.
local function retry_after(state, i, n, limit, now, stale)
  if stale then return window_clear(state, i, now) end
  local excess = state.total[i] + n - limit
  local index, left = state.cursor[i], 0
  while index ~= -1 do
    local count, next_index = read_bucket(index)
    if not count then
      if next_index then return window_clear(state, i, now) end
      return nil
    end
    left = left + count
    if left >= excess then
      return (index + state.sizes[i]) * state.precision - now
    end
    index = next_index
  end
  return nil
end

-- Decides a request of n permits at now against every strategy and returns
-- the script's reply. limits and sizes are in ascending order; tag names
-- the algorithm in the meta field.
local function decide_log(now, n, precision, limits, sizes, tag)
  local S = #sizes
  local b = idiv(now, precision)
  local corrupt = 'a hash that is not a ' .. (tag == 'w' and 'sliding window' or 'sliding log')

  local state
  local raw = redis.pcall('HGET', KEYS[1], 'm')
  if type(raw) == 'table' and raw.err then return not_ours('another type than a hash') end
  if raw then
    state = parse_meta(raw, tag)
    if not state then return not_ours(corrupt) end
  elseif redis.call('EXISTS', KEYS[1]) == 1 then
    return not_ours(corrupt)
  else
    state = empty_state(precision, sizes)
  end

  -- changed: the hash must be written; tail_moved: its TTL too. While the
  -- newest bucket stays the same, so does the time the log empties, and the
  -- TTL set when that bucket began still covers it. entries: a rebuilt log
  -- that replaces the hash.
  local changed, tail_moved, entries = false, false, nil
  local dead, stale = {}, {}
  -- All dead: every bucket left the window the log keeps, counted in the
  -- stored precision.
  local all_dead = raw and state.tail <= idiv(now, state.precision) - state.keep
  if raw and (all_dead or not same_config(state, precision, sizes) or state.tail > b) then
    -- Off the hot path. Our keys always carry a TTL: a hash without one
    -- is someone else's, and is neither rebuilt nor deleted.
    if redis.call('PTTL', KEYS[1]) < 0 then return not_ours(corrupt) end
  end
  if all_dead then
    -- An empty log, whatever it held.
    state, changed, entries = empty_state(precision, sizes), true, {}
  elseif not same_config(state, precision, sizes) or state.tail > b then
    state, entries = rebuild(state, b, precision, sizes)
    if not state then return not_ours(corrupt) end
    changed, tail_moved = true, true
  else
    for i = 1, S do
      local last_out = b - sizes[i]
      if state.tail ~= -1 and state.tail <= last_out then
        -- The whole window left: no walk.
        state.cursor[i], state.total[i], changed = -1, 0, true
      end
      while state.cursor[i] ~= -1 and state.cursor[i] <= last_out do
        local count, next_index = read_bucket(state.cursor[i])
        if not count then
          if not next_index then return not_ours(corrupt) end
          stale[i] = true
          break
        end
        state.total[i] = state.total[i] - count
        state.cursor[i] = next_index
        changed = true
      end
    end
    -- Buckets older than the log keeps are deleted, within the budget.
    while state.head ~= -1 and state.head <= b - state.keep do
      local count, next_index = read_bucket(state.head)
      if not count then
        if not next_index then return not_ours(corrupt) end
        break
      end
      dead[#dead + 1] = string.format('%d', state.head)
      state.all = state.all - count
      state.head = next_index
      changed = true
    end
  end

  local allowed, retry, reported = true, 0, 1
  if n > limits[1] then
    allowed, retry = false, -1
  elseif n > 0 then
    -- n == 0 only reports: allowed even when a lowered limit left the
    -- count above it.
    for i = 1, S do
      if state.total[i] + n > limits[i] then
        local wait = retry_after(state, i, n, limits[i], now, stale[i])
        if not wait then return not_ours(corrupt) end
        if allowed or wait > retry then reported, retry = i, wait end
        allowed = false
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
      for i = 1, S do
        if state.cursor[i] == -1 then state.cursor[i] = b end
      end
    end
    state.all = state.all + n
    writes[#writes + 1] = string.format('%d', b)
    writes[#writes + 1] = string.format('%d', state.tail_count)
    for i = 1, S do state.total[i] = state.total[i] + n end
    changed = true
  end

  local remaining = limits[1] - state.total[1]
  if allowed then reported = 1 end
  for i = 2, S do
    local left = limits[i] - state.total[i]
    if left < remaining then
      remaining = left
      if allowed then reported = i end
    end
  end

  local reset, expire = 0, 0
  if state.tail ~= -1 then
    -- The tail may have left this configuration's windows and still be
    -- kept for a longer one's.
    reset = math.max(0, (state.tail + sizes[S]) * precision - now)
    expire = (state.tail + state.keep) * precision - now
  end
  -- Remaining changes when the oldest bucket of a window leaves it; at
  -- once for a stale window (its cursor is behind).
  local stable = -1
  for i = 1, S do
    if state.cursor[i] ~= -1 then
      local leaves = (state.cursor[i] + sizes[i]) * precision - now
      if stale[i] then leaves = 0 end
      if stable == -1 or leaves < stable then stable = math.max(0, leaves) end
    end
  end

  if changed then
    -- A grant must be written; anything else is best effort.
    local call = redis.pcall
    if allowed and n > 0 then call = redis.call end
    if entries then
      -- UNLINK frees a large hash off the main thread; the permits it held
      -- that still count are in entries.
      local ok = call('UNLINK', KEYS[1])
      if type(ok) == 'table' and ok.err then return reply(allowed, remaining, retry, reset, reported - 1, 0) end
      for k, entry in ipairs(entries) do
        if k < #entries or entry[1] ~= state.tail then
          local next_index = b
          if entries[k + 1] then next_index = entries[k + 1][1] end
          writes[#writes + 1] = string.format('%d', entry[1])
          writes[#writes + 1] = string.format('%d %d', entry[2], next_index)
        elseif not (allowed and n > 0) then
          writes[#writes + 1] = string.format('%d', entry[1])
          writes[#writes + 1] = string.format('%d', entry[2])
        end
      end
      tail_moved = true
    end
    if state.tail == -1 then
      if not entries then call('UNLINK', KEYS[1]) end
    else
      if #dead > 0 then call('HDEL', KEYS[1], unpack(dead)) end
      call('HSET', KEYS[1], 'm', meta_string(state, tag), unpack(writes))
      if tail_moved then call('PEXPIRE', KEYS[1], ttl_ms(expire)) end
    end
  end
  return reply(allowed, remaining, retry, reset, reported - 1, stable)
end
