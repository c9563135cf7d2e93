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

-- merge_range returns ranges, a list of {lo, hi}, with [lo, hi), given
-- back by none before, added and merged with those it touches, as a new
-- list.
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

-- give_back gives back what is left of k of the permits of the grant
-- holding positions [first, first + n), at most cap, and records them in
-- text: its ranges, each "<lo>:<hi>" after one separator character sep
-- (count of them, or nil to count them here). It returns what it gave,
-- the text and the horizon. A refund should cost no more than a grant
-- (issue 35), so the ranges are read and rewritten in the text, never as
-- tables: the range that starts at or before first and the one after it
-- are found (the last range first: refunds of the latest grants stop
-- there; else from the start), the new range is spliced in, merged with
-- those it touches, and the other ranges keep their text.
local function give_back(text, count, first, n, k, cap, horizon, sep)
  -- Before: the range starting at or before first, at [before_at,
  -- before_end] in text; after: the next one. What the grant gave back is
  -- the start of its positions that the range before covers.
  local before_at, before_lo, before_hi, before_end
  local after_at, after_lo, after_hi, after_end
  if text ~= '' then
    local at, lo, hi = string.match(text, '.*%D()(%d+):(%d+)$')
    if at and lo + 0 <= first then
      before_at, before_lo, before_hi, before_end = at, lo + 0, hi + 0, #text
    else
      local from, stop = 1, nil
      while true do
        at, stop, lo, hi = string.find(text, '(%d+):(%d+)', from)
        if not at then break end
        if lo + 0 > first then
          after_at, after_lo, after_hi, after_end = at, lo + 0, hi + 0, stop
          break
        end
        before_at, before_lo, before_hi, before_end = at, lo + 0, hi + 0, stop
        from = stop + 1
      end
    end
  end
  local kept = 0
  if before_hi and before_hi > first then kept = math.min(before_hi, first + n) - first end
  local back = math.min(k, n) - kept
  if back > cap then back = cap end
  if back <= 0 then return 0, text, horizon end

  -- Splice [lo, hi) in: it replaces the ranges it touches, or goes
  -- between the two found, after its separator.
  if not count then
    local _
    _, count = string.gsub(text, ':', '')
  end
  local lo, hi = first + kept, first + kept + back
  local cut_from, cut_to, piece = nil, nil, nil
  if before_hi == lo then
    cut_from, cut_to, lo, count = before_at, before_end, before_lo, count - 1
  end
  if after_lo == hi then
    cut_from, cut_to, hi, count = cut_from or after_at, after_end, after_hi, count - 1
  end
  if cut_from then
    piece = string.format('%d:%d', lo, hi)
  else
    cut_from = (before_end or 0) + 1
    cut_to = cut_from - 1
    piece = string.format('%s%d:%d', sep, lo, hi)
  end

  -- Past MAX_RANGES the lowest range goes, its separator with it, in the
  -- same splice: the text kept starts after it. When the lowest is the
  -- new range, it goes whole.
  local keep_from = 1
  if count + 1 > MAX_RANGES then
    local _, lowest_end, lowest_hi = string.find(text, ':(%d+)')
    if lowest_end >= cut_from then
      return back, string.sub(text, cut_to + 1), math.max(horizon, hi)
    end
    horizon, keep_from = math.max(horizon, lowest_hi + 0), lowest_end + 1
  end
  return back, string.sub(text, keep_from, cut_from - 1) .. piece .. string.sub(text, cut_to + 1),
    horizon
end
