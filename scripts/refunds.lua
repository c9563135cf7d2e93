-- refunds.lua: what refunds gave back, for the scripts that join it
-- before their own (the fixed and the calendar window, and the buckets'
-- merge_range; docs/refunds.md).
-- Every grant holds positions [first, first + n) of its state, never
-- reused. The positions given back are kept as ranges [lo, hi), sorted and
-- apart, in the state's text as "<lo>:<hi>" pairs; touching ranges merge,
-- and at most MAX_RANGES are kept: past that the lowest goes and the
-- horizon rises to its end, so that a grant starting before it gives
-- nothing more (stricter, never looser).
local MAX_RANGES = 16

-- read_ranges parses the ranges in text and returns them with what the
-- grant holding [first, first + n) gave back: the start of its positions
-- that a range covers (only its own refunds touch them).
local function read_ranges(text, first, n)
  local ranges, given = {}, 0
  for lo, hi in string.gmatch(text, '(%d+):(%d+)') do
    lo, hi = lo + 0, hi + 0
    if lo <= first and first < hi then given = math.min(hi, first + n) - first end
    ranges[#ranges + 1] = {lo, hi}
  end
  return ranges, given
end

-- merge_range returns ranges with [lo, hi), given back by none before,
-- added and merged with those it touches, as a new list.
local function merge_range(ranges, lo, hi)
  local parts, placed = {}, false
  for _, range in ipairs(ranges) do
    if range[2] == lo then
      lo = range[1]
    elseif range[1] == hi then
      hi = range[2]
    elseif range[1] > hi and not placed then
      parts[#parts + 1], placed = {lo, hi}, true
      parts[#parts + 1] = range
    else
      parts[#parts + 1] = range
    end
  end
  if not placed then parts[#parts + 1] = {lo, hi} end
  return parts
end

-- add_range returns ranges with [lo, hi) added (merge_range), each
-- formatted by fmt, and the horizon, raised when the lowest range had to
-- go.
local function add_range(ranges, lo, hi, horizon, fmt)
  local parts = merge_range(ranges, lo, hi)
  if #parts > MAX_RANGES then
    horizon = math.max(horizon, parts[1][2])
    table.remove(parts, 1)
  end
  for i, range in ipairs(parts) do parts[i] = string.format(fmt, range[1], range[2]) end
  return parts, horizon
end
