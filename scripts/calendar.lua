-- calendar.lua: at most `limit` permits per calendar period (a day, a
-- week or a month in a time zone). Go knows the zones, the script knows
-- the clock: Go sends the starts of five periods in a row around the
-- host's time, and the script decides in the one that holds the key's time.
-- Nearly every call's times fall in the host's period, whose start and end
-- are sent apart; the other three starts are read only when one does not.
--
-- KEYS[1]  the key
-- ARGV[1]  now      Unix time (µs), or "" for the server's TIME
-- ARGV[2]  n        permits asked for (>= 0), or "-<k>:<token>": a refund
--                   of the grant named token, until k of its permits in
--                   all have been given back; "=<k>:<token>" the same,
--                   replying only what it gave (a bare refund, which no
--                   observer reads)
-- ARGV[3]  b1       start of the host's period (µs)
-- ARGV[4]  b2       its end: the start of the period after it (µs)
-- ARGV[5]  others   "<b0> <b3> <b4>": the start of the period before the
--                   host's, and of the two after b2's (µs)
-- ARGV[6]  limit    permits per period
-- ARGV[7]  shared   "1" under WithPrefix: the counted period's end is stored
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
-- "1 remaining 0 reset 0 -1 given", a bare one's "1 0 0 0 0 -1 given".

-- Literal patterns (F and E have 16 digits). The short form's count is
-- matched shortest first (%d-), as the fixed window's.
local SHORT = '^([1-9]%d-)([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)5$'
local LONG = '^(%d+) ([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d) ([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d) 5$'
local TOKEN = '^([1-4]%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)%.(%d+)%.([1-9]%d*)$'
local NOT_OURS = 'NOTOURS holds %s, not redlimit state; it was left unchanged'
local UNKNOWN_PERIOD_US = 1000000

-- The steps below run top to bottom. Redis builds every function of a
-- script anew on each call, so the only one is period_of, for the rare
-- times outside the host's period, and each step is written once: a
-- refund, a denial and a grant share the write and the reply.

-- A bare refund on the server's clock reads no clock: it takes the host's
-- period's start for the clock's time, and so decides at the key's time
-- when the key counts the host's period or a later one. The key's TTL
-- ends with the period it counts, on the server's clock, so a key that is
-- there counts a period the server's clock has not closed; one the host's
-- clock has left gives nothing (stricter).
--
-- period_of returns i, the start and the end of the period i that holds t,
-- of the four sent: 1 before the host's, 2 the host's (b1 to b2), 3 and 4
-- after it; nil when none does. Only times outside the host's period need
-- it, and only they pay for reading the other starts.
local function period_of(t)
  local b0, b3, b4 = string.match(ARGV[5], '^(%d+) (%d+) (%d+)$')
  local b1, b2 = ARGV[3] + 0, ARGV[4] + 0
  b0, b3, b4 = b0 + 0, b3 + 0, b4 + 0
  if t < b0 or t >= b4 then return nil end
  if t < b1 then return 1, b0, b1 end
  if t < b2 then return 2, b1, b2 end
  if t < b3 then return 3, b2, b3 end
  return 4, b3, b4
end

-- The clock: the caller's, or the server's; for a bare refund on the
-- server's, the host's period's start (above).
local mark = string.byte(ARGV[2])
local bare = mark == 61 -- '='
local now = ARGV[1]
if now ~= '' then
  now = now + 0
elseif bare then
  now = ARGV[3] + 0
else
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local refund_k, token
local n = 0
if mark == 45 or bare then -- '-' or '=': a refund
  refund_k, token = string.match(ARGV[2], '^[=%-]([1-9]%d*):(.+)$')
end
if not refund_k then n = ARGV[2] + 0 end
local limit = ARGV[6] + 0

-- The clock's period, nearly always the host's. It must leave a period
-- after it among those sent, for the key's time: else Go and the script
-- do not share a calendar.
local clock_start, clock_end = ARGV[3] + 0, ARGV[4] + 0
if now < clock_start or now >= clock_end then
  local clock_period
  clock_period, clock_start, clock_end = period_of(now)
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
    if first >= clock_end then
      local _
      _, _, state_end = period_of(first) -- nil past the starts sent: a clock gone wrong
    elseif first >= clock_start then
      state_end = clock_end -- most often F's period is the clock's
    else
      state_end = clock_start -- F's period ended by the clock's: never counted
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
local start, stop = clock_start, clock_end
if first and first > now then
  t = first
  if first >= clock_end then
    local _, _, after_next_end = period_of(clock_end)
    if first < after_next_end then
      _, start, stop = period_of(first)
    else
      t, wrong = now, true
    end
  end
end
local counted = first ~= nil and (wrong or state_end > start)
if first and (wrong or not counted) and redis.call('PTTL', KEYS[1]) < 0 then
  return redis.error_reply(string.format(NOT_OURS, 'a value without a TTL'))
end
local used = 0
if counted then used = count end

-- The key is back to its initial state at the start of the first of this
-- configuration's periods that the state no longer counts in: the next
-- one, unless another configuration's period, ending later, wrote it (the
-- first start sent at or after its end, the end of the period holding the
-- µs before it; else its end).
local reset_at = stop
if counted and not wrong and state_end > stop then
  local _, _, after = period_of(state_end - 1)
  reset_at = after or state_end
end

-- Decide and apply. A refund: of a grant this state counts, in the key's
-- period, and not before the floor, up to what it took; at most once. The
-- grant holds positions [pos, pos + took); what it gave back is the start
-- of them that a range of given-back positions covers (only its refunds
-- touch them), and what it gives now joins that range. A grant: a new
-- state in the key's period (carrying what a state ahead of a clock gone
-- wrong held), or more on the one counted, whose end moves to this
-- period's if it was sooner. Denials and n == 0 change nothing.
local allowed, retry, given, pos, write, new_ttl = 1, 0, nil, nil, false, false
if refund_k then
  given = 0
  local grant_first, grant_pos, took = string.match(token, TOKEN)
  if grant_first and counted and not wrong and grant_first + 0 == first then
    grant_pos, took = grant_pos + 0, took + 0
    if grant_pos >= floor and grant_pos + took <= next_pos then
      -- The ranges are joined by commas: one before each, for give_back.
      local text = ''
      if records then text = ',' .. records end
      given, text, floor = give_back(text, nil, grant_pos, took, refund_k + 0, count, floor, ',')
      if given > 0 then
        count = count - given
        used, records, write = count, string.sub(text, 2), true
      end
    end
  end
elseif n > limit then
  allowed, retry = 0, -1
elseif n > 0 and used + n > limit then
  allowed, retry = 0, reset_at - t
elseif n > 0 then
  if not counted or wrong then
    first, state_end, next_pos, floor, records, new_ttl = t, stop, used, 0, nil, true
    count = used
  elseif state_end < stop then
    state_end, new_ttl = stop, true
  end
  pos = next_pos
  count = count + n
  next_pos, used, write = pos + n, count, true
end

-- Write: a grant, or a refund that gave back. The TTL runs to the end of
-- what the state counts (ms, rounded up); the key keeps its TTL when that
-- end has not moved.
if write then
  local text
  if records then
    text = string.format('%d %d %d %d %d %s 5', count, first, state_end, next_pos, floor, records)
  elseif ARGV[7] == '1' then
    text = string.format('%d %d %d 5', count, first, state_end)
  else
    text = string.format('%d%d5', count, first)
  end
  if new_ttl then
    redis.call('SET', KEYS[1], text, 'PX', math.ceil((state_end - now) / 1000))
  else
    redis.call('SET', KEYS[1], text, 'KEEPTTL')
  end
end

-- Reply: Remaining and ResetAfter as n == 0 would see the state after the
-- call, with used permits counted until reset_at; a bare refund's, only
-- what it gave.
if bare then return string.format('1 0 0 0 0 -1 %d', given) end
local remaining, reset = limit - used, 0
if remaining < 0 then remaining = 0 end
if used > 0 then reset = reset_at - t end
if given then
  return string.format('1 %d 0 %d 0 -1 %d', remaining, reset, given)
elseif pos then
  return string.format('1 %d 0 %d 0 -1 %d.%d.%d', remaining, reset, first, pos, n)
end
return string.format('%d %d %d %d 0 -1', allowed, remaining, retry, reset)
