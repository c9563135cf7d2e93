-- calendar.lua: at most `limit` permits per calendar period (a day, a
-- week or a month in a time zone). Go knows the zones, the script knows
-- the clock: Go sends the starts of five periods in a row around the
-- host's time, and the script decides in the one that holds the key's time.
--
-- KEYS[1]  the key
-- ARGV[1]  now      Unix time (µs), or "" for the server's TIME
-- ARGV[2]  n        permits asked for (>= 0), or "-<k>:<token>": a refund
--                   of the grant named token, until k of its permits in
--                   all have been given back
-- ARGV[3]  b0       start of the period before the host's (µs)
-- ARGV[4]  b1       start of the host's period (µs)
-- ARGV[5]  b2       start of the period after it (µs)
-- ARGV[6]  b3       start of the one after that (µs)
-- ARGV[7]  b4       start of the one after that (µs)
-- ARGV[8]  limit    permits per period
-- ARGV[9]  shared   "1" under WithPrefix: the counted period's end is stored
--
-- All times are integer µs. The state is a string with a TTL that ends
-- with the period it counts (docs/internals.md), F (16 digits) the key's
-- time, the first grant the state counts, and 5 the calendar window's tag:
--   "<count><F>5"               the period of this configuration that holds
--                               F (up to a count of 91 one integer)
--   "<count> <F> <E> 5"         permits counted until E, of any configuration
--   "<count> <F> <E> <next> <floor> <lo>:<hi>,... 5"
--                               the same, after refunds: the positions
--                               from <lo> to before <hi> (a grant at <pos>
--                               holds [pos, pos + n), pos the permits
--                               granted before it since F) were given
--                               back, in at most 16 ranges, sorted and
--                               apart; a grant starting before <floor>
--                               gives nothing more (docs/refunds.md)
-- A call at clock c decides at the key's time t = max(c, F), in the period
-- that holds t: a clock that still reads the period before the key's first
-- grant in the next one decides in the key's period. F at or past the end
-- of the period after c's is a clock gone wrong: the call decides at c and
-- counts all the state holds as used; a grant then starts the state on
-- c's period, carrying that count. A clock outside the periods sent (the
-- server's and the host's clocks disagree by more than a period) is denied
-- for a second, without a write: the script cannot know its period. A
-- configuration counts the state in its period when E is after the
-- period's start; a grant stretches E to its own period's end, never
-- shortens it. Denials and n == 0 write nothing.
--
-- Reply: "allowed remaining retry reset 0 -1 [token]" (µs; retry -1 =
-- never), the token "<F>.<pos>.<n>" when n > 0 was granted; a refund's:
-- "1 remaining 0 reset 0 -1 given".

-- Literal patterns (F and E have 16 digits). The short form's count is
-- matched shortest first (%d-), as the fixed window's.
local SHORT = '^([1-9]%d-)([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)5$'
local LONG = '^(%d+) ([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d) ([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d) 5$'
local TOKEN = '^([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)%.(%d+)%.([1-9]%d*)$'
local NOT_OURS = 'NOTOURS holds %s, not redlimit state; it was left unchanged'
local UNKNOWN_PERIOD_US = 1000000

-- The steps below run top to bottom; Redis builds every function of a
-- script anew on each call, with every local it uses, so the only
-- functions are these, which use their arguments alone, and period_of.

-- state_text is the state a grant or a refund writes.
local function state_text(count, first, state_end, next_pos, floor, records, shared)
  if records then
    return string.format('%d %d %d %d %d %s 5', count, first, state_end, next_pos, floor, records)
  elseif shared then
    return string.format('%d %d %d 5', count, first, state_end)
  end
  return string.format('%d%d5', count, first)
end

-- remaining_reset returns a reply's Remaining and ResetAfter: the state's,
-- as n == 0 would see it, with used permits counted until reset_at.
local function remaining_reset(limit, used, reset_at, t)
  local remaining, reset = limit - used, 0
  if remaining < 0 then remaining = 0 end
  if used > 0 then reset = reset_at - t end
  return remaining, reset
end

-- The clock: the caller's, or the server's.
local now = ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = now + 0
end
local refund_k, token
local n = 0
if string.byte(ARGV[2]) == 45 then -- '-': a refund
  refund_k, token = string.match(ARGV[2], '^%-([1-9]%d*):(.+)$')
end
if not refund_k then n = ARGV[2] + 0 end
local limit, shared = ARGV[8] + 0, ARGV[9] == '1'

-- period_of returns i, the start and the end of period i, [ARGV[2 + i],
-- ARGV[3 + i]), that holds t; nil when none of the four does. The host's
-- period (i = 2, from b1 to b2) holds nearly every call's time: the other
-- starts are read only when it does not.
local host_start, host_end = ARGV[4] + 0, ARGV[5] + 0
local function period_of(t)
  if t >= host_start and t < host_end then return 2, host_start, host_end end
  local b0, b3, b4 = ARGV[3] + 0, ARGV[6] + 0, ARGV[7] + 0
  if t < b0 or t >= b4 then return nil end
  if t < host_start then return 1, b0, host_start end
  if t < b3 then return 3, host_end, b3 end
  return 4, b3, b4
end

-- The clock's period. It must leave a period after it among those sent,
-- for the key's time: else Go and the script do not share a calendar.
local clock_period, clock_start, clock_end = period_of(now)
if not clock_period or clock_period == 4 then
  if refund_k then
    return string.format('1 0 0 %d 0 -1 0', UNKNOWN_PERIOD_US)
  elseif n > limit then
    return string.format('0 0 -1 %d 0 -1', UNKNOWN_PERIOD_US)
  elseif n == 0 then
    return string.format('1 0 0 %d 0 -1', UNKNOWN_PERIOD_US)
  end
  return string.format('0 0 %d %d 0 %d', UNKNOWN_PERIOD_US, UNKNOWN_PERIOD_US, UNKNOWN_PERIOD_US)
end

-- Read the state: count, F (first), E (state_end; the short form's is the
-- end of F's period), the next grant's position, the refund floor and
-- records. first == nil: no state.
local count, first, state_end, next_pos, floor, records = 0, nil, nil, 0, 0, nil
local value = redis.pcall('GET', KEYS[1])
if value then
  if type(value) ~= 'string' then
    return redis.error_reply(string.format(NOT_OURS, 'another type than a calendar window'))
  end
  count, first = string.match(value, SHORT)
  if count then
    first = first + 0
    local i, stop = clock_period, clock_end -- most often F's period is the clock's
    if first < clock_start or first >= clock_end then
      local _
      i, _, stop = period_of(first)
    end
    if i then
      state_end = stop
    elseif first < ARGV[3] + 0 then
      state_end = ARGV[3] + 0 -- over before any period sent began
    end
  else
    count, first, state_end = string.match(value, LONG)
    if not count then -- a refunded state: the pattern is built only here
      count, first, state_end, next_pos, floor, records = string.match(value,
        '^(%d+) ([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d) ' ..
        '([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d) (%d+) (%d+) ([%d:,]+) 5$')
    end
    if not count or (records and #records > MAX_RANGES * 34) then
      return redis.error_reply(string.format(NOT_OURS, 'a string that is not a calendar window'))
    end
    first, state_end = first + 0, state_end + 0
  end
  count = count + 0
  if records then
    next_pos, floor = next_pos + 0, floor + 0
  else
    next_pos = count
  end
end

-- The key's time and its period. A state is counted in the key's period
-- when it counts permits past the period's start; a state no longer
-- counted is ours only if its key has a TTL, as all ours do.
local t, wrong = now, false
if first and first > now then
  local _, _, after_next_end = period_of(clock_end)
  if first < after_next_end then t = first else wrong = true end
end
local period, start, stop = clock_period, clock_start, clock_end
if t ~= now then period, start, stop = period_of(t) end
local counted = first ~= nil and (wrong or state_end > start)
if first and (wrong or not counted) and redis.call('PTTL', KEYS[1]) < 0 then
  return redis.error_reply(string.format(NOT_OURS, 'a value without a TTL'))
end
local used = 0
if counted then used = count end

-- The key is back to its initial state at the start of the first of this
-- configuration's periods that the state no longer counts in: the next
-- one, unless another configuration's period, ending later, wrote it (the
-- first start sent at or after its end, else its end).
local reset_at = stop
if counted and not wrong and state_end > stop then
  reset_at = state_end
  for i = period + 1, 5 do
    if ARGV[2 + i] + 0 >= state_end then
      reset_at = ARGV[2 + i] + 0
      break
    end
  end
end

-- A refund: of a grant this state counts, in the key's period, and not
-- before the floor, up to what it took; at most once. The grant holds
-- positions [pos, pos + took); what it gave back is the start of them that
-- a range of given-back positions covers (only its refunds touch them),
-- and what it gives now joins that range. The state keeps its TTL.
if refund_k then
  local given = 0
  local grant_first, pos, took = string.match(token, TOKEN)
  if grant_first and counted and not wrong and grant_first + 0 == first then
    pos, took = pos + 0, took + 0
    if pos >= floor and pos + took <= next_pos then
      -- The ranges are joined by commas: one before each, for give_back.
      local text = ''
      if records then text = ',' .. records end
      given, text, floor = give_back(text, nil, pos, took, refund_k + 0, count, floor, ',')
      if given > 0 then
        count = count - given
        used = count
        records = string.sub(text, 2)
        redis.call('SET', KEYS[1],
          state_text(count, first, state_end, next_pos, floor, records, shared), 'KEEPTTL')
      end
    end
  end
  local remaining, reset = remaining_reset(limit, used, reset_at, t)
  return string.format('1 %d 0 %d 0 -1 %d', remaining, reset, given)
end

-- Decide.
if n > limit or n == 0 or used + n > limit then
  local allowed, retry = 0, reset_at - t
  if n > limit then
    retry = -1
  elseif n == 0 then
    allowed, retry = 1, 0
  end
  local remaining, reset = remaining_reset(limit, used, reset_at, t)
  return string.format('%d %d %d %d 0 -1', allowed, remaining, retry, reset)
end

-- Apply and write a grant: a new state in the key's period (carrying
-- what a state ahead of a clock gone wrong held), or more on the one
-- counted, whose end moves to this period's if it was sooner. The TTL
-- runs to the end of what the state counts (ms, rounded up); the key keeps
-- its TTL when that end has not moved.
local new_ttl = false
if not counted or wrong then
  first, state_end, next_pos, floor, records, new_ttl = t, stop, used, 0, nil, true
  count = used
elseif state_end < stop then
  state_end, new_ttl = stop, true
end
local pos = next_pos
count = count + n
next_pos, used = pos + n, count
local text = state_text(count, first, state_end, next_pos, floor, records, shared)
if new_ttl then
  redis.call('SET', KEYS[1], text, 'PX', math.ceil((state_end - now) / 1000))
else
  redis.call('SET', KEYS[1], text, 'KEEPTTL')
end
local remaining, reset = remaining_reset(limit, used, reset_at, t)
return string.format('1 %d 0 %d 0 -1 %d.%d.%d', remaining, reset, first, pos, n)
