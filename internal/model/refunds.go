package model

// refundRanges is what refunds gave back of a state's grants, as the
// scripts keep it: every grant holds positions [first, first+n) of its
// state, never reused, and the positions given back are ranges [lo, hi),
// sorted and apart (touching ranges merge), at most maxRefundRanges of
// them; when more would be kept, the lowest goes and the horizon rises to
// its end, before which a grant gives nothing back any more. Written
// plainly: the set of positions, then its runs.
type refundRanges struct {
	ranges  [][2]int64
	horizon int64
}

// maxRefundRanges is the most ranges a state keeps; the scripts keep the
// same bound.
const maxRefundRanges = 16

// given returns what the grant holding [first, first+n) gave back, and
// whether it may give back more.
func (r *refundRanges) given(first, n int64) (int64, bool) {
	if first < r.horizon {
		return 0, false
	}
	back := int64(0)
	for p := first; p < first+n; p++ {
		if !r.covers(p) {
			break
		}
		back++
	}
	return back, true
}

// covers reports whether position p was given back.
func (r *refundRanges) covers(p int64) bool {
	for _, g := range r.ranges {
		if g[0] <= p && p < g[1] {
			return true
		}
	}
	return false
}

// add gives back [lo, hi) and rebuilds the ranges: the runs of positions
// given back, lowest first.
func (r *refundRanges) add(lo, hi int64) {
	var points [][2]int64 // every range, and the new one, as [lo, hi)
	points = append(points, r.ranges...)
	points = append(points, [2]int64{lo, hi})
	// Sort by lo (few ranges: insertion sort), then join touching ones.
	for i := 1; i < len(points); i++ {
		for j := i; j > 0 && points[j][0] < points[j-1][0]; j-- {
			points[j], points[j-1] = points[j-1], points[j]
		}
	}
	var runs [][2]int64
	for _, g := range points {
		if k := len(runs); k > 0 && runs[k-1][1] == g[0] {
			runs[k-1][1] = g[1]
			continue
		}
		runs = append(runs, g)
	}
	if len(runs) > maxRefundRanges {
		r.horizon = max(r.horizon, runs[0][1])
		runs = runs[1:]
	}
	r.ranges = runs
}

// clone returns an independent copy of r.
func (r refundRanges) clone() refundRanges {
	r.ranges = append([][2]int64(nil), r.ranges...)
	return r
}
