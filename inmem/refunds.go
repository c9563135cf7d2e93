package inmem

// refunds is what refunds gave back of the grants a window or period
// still counts, as the scripts keep it (DESIGN "Grants and refunds": at
// most once, docs/refunds.md): every grant holds positions [first,
// first+n) of its state, never reused, and the positions given back are
// kept as ranges [lo, hi), sorted, apart (touching ranges merge), at most
// maxRefundRanges of them. When more would be kept, the lowest goes and
// the horizon rises to its end: a grant starting before the horizon gives
// nothing back any more (stricter, never looser).
type refunds struct {
	ranges  []refundRange
	horizon int64
}

// refundRange is the positions [lo, hi), given back.
type refundRange struct{ lo, hi int64 }

// maxRefundRanges is the most ranges a state keeps, as in the scripts.
const maxRefundRanges = 16

// given returns what the grant holding positions [first, first+n) gave
// back so far, and whether it may give back more (it starts at or past the
// horizon). Only its own refunds touch its positions, so what it gave back
// is their start that a range covers.
func (r *refunds) given(first, n int64) (back int64, ok bool) {
	if first < r.horizon {
		return 0, false
	}
	for _, g := range r.ranges {
		if g.lo <= first && first < g.hi {
			return min(g.hi, first+n) - first, true
		}
	}
	return 0, true
}

// add records that the positions [lo, hi), given back by none before, are
// given back. The ranges are copied first: a state is a value that shares
// them with the stored one until it is put.
func (r *refunds) add(lo, hi int64) {
	ranges := mergeRange(r.ranges, lo, hi)
	if len(ranges) > maxRefundRanges {
		r.horizon = max(r.horizon, ranges[0].hi)
		ranges = ranges[1:]
	}
	r.ranges = ranges
}

// mergeRange returns a new slice of ranges with [lo, hi), given back by
// none before, added and merged with the ranges it touches.
func mergeRange(ranges []refundRange, lo, hi int64) []refundRange {
	out := make([]refundRange, 0, len(ranges)+1)
	placed := false
	for _, g := range ranges {
		switch {
		case g.hi == lo:
			lo = g.lo
		case g.lo == hi:
			hi = g.hi
		case g.lo > hi && !placed:
			out = append(out, refundRange{lo, hi}, g)
			placed = true
		default:
			out = append(out, g)
		}
	}
	if !placed {
		out = append(out, refundRange{lo, hi})
	}
	return out
}
