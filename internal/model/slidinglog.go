package model

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
)

// SlidingLog is the reference model of a multi-strategy sliding limiter: one
// shared set of epoch-aligned buckets of P microseconds, and several
// strategies (L_i, W_i), each granting at most L_i permits over its window of
// N_i = W_i/P buckets. A request is granted iff every strategy allows it.
//
// The key keeps its time as DESIGN's "A key's time" says: it records the
// time of its last grant, and a call decides at the later of its clock and
// that time, so that a clock behind never reopens what the key counted.
// A recorded time ahead of the clock by more than the longest window is a
// clock gone wrong: the call decides on its own clock, as if all the key
// holds (its longest window at the recorded time) had been granted in the
// clock's bucket, and a grant puts it there. Durations are from the clock.
type SlidingLog struct {
	precisionUS int64   // P
	limits      []int64 // L_i, strictly increasing
	nbs         []int64 // N_i = W_i / P, non-decreasing
	nbMax       int64   // the longest window, in buckets

	buckets    buckets
	recordedUS int64 // the key's time as of its last grant, once granted is set
	granted    bool
	grants     map[int64]grant // by grant id, for refunds
	lastID     int64
	count      int64 // every permit granted: a grant's positions are [count, count+n)
	refunded   slidingRanges
}

// grant is one grant a refund may give back: its bucket and its positions
// [at, at+n).
type grant struct {
	bucket, at, n int64
}

// maxSlidingRanges is the most ranges of refunded positions a sliding key
// keeps, as the script does.
const maxSlidingRanges = 16

// slidingRanges is what refunds gave back, as the script keeps it
// (RANGES.md): the refunded positions as disjoint ranges [lo, hi), sorted,
// touching ones merged, at most maxSlidingRanges of them, and the horizon
// below which a grant gives nothing more (stricter, never looser).
type slidingRanges struct {
	ranges  [][2]int64
	horizon int64
}

// in is how many of the positions [lo, hi) are refunded.
func (r *slidingRanges) in(lo, hi int64) int64 {
	sum := int64(0)
	for _, x := range r.ranges {
		if from, to := max(x[0], lo), min(x[1], hi); to > from {
			sum += to - from
		}
	}
	return sum
}

// add refunds the positions [lo, hi), merging the ranges it touches; a
// range more than maxSlidingRanges drops the lowest and raises the horizon
// to its end.
func (r *slidingRanges) add(lo, hi int64) {
	kept := make([][2]int64, 0, len(r.ranges)+1)
	for _, x := range r.ranges {
		if x[1] < lo || x[0] > hi {
			kept = append(kept, x)
		} else {
			lo, hi = min(lo, x[0]), max(hi, x[1])
		}
	}
	kept = append(kept, [2]int64{lo, hi})
	slices.SortFunc(kept, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	if len(kept) > maxSlidingRanges {
		r.horizon = max(r.horizon, kept[0][1])
		kept = kept[1:]
	}
	r.ranges = kept
}

// NewSlidingLog returns a sliding-log model with buckets of precisionUS
// microseconds and strategies (limits[i], windowsUS[i]), given sorted by
// window ascending with limits strictly increasing; each window is
// windowsUS[i]/precisionUS buckets (integer division). It panics on an empty
// or inconsistent configuration.
func NewSlidingLog(precisionUS int64, limits, windowsUS []int64) *SlidingLog {
	if precisionUS <= 0 || len(limits) == 0 || len(limits) != len(windowsUS) {
		panic(fmt.Sprintf("model: invalid sliding log precisionUS=%d limits=%v windowsUS=%v",
			precisionUS, limits, windowsUS))
	}
	m := &SlidingLog{precisionUS: precisionUS, buckets: buckets{}, grants: map[int64]grant{}}
	for i := range limits {
		if limits[i] < 0 || windowsUS[i] < precisionUS ||
			(i > 0 && (limits[i] <= limits[i-1] || windowsUS[i] < windowsUS[i-1])) {
			panic(fmt.Sprintf("model: invalid sliding log precisionUS=%d limits=%v windowsUS=%v",
				precisionUS, limits, windowsUS))
		}
		nb := windowsUS[i] / precisionUS
		m.limits = append(m.limits, limits[i])
		m.nbs = append(m.nbs, nb)
		m.nbMax = max(m.nbMax, nb)
	}
	return m
}

// Reset forgets all buckets.
func (m *SlidingLog) Reset() {
	m.buckets, m.granted, m.recordedUS = buckets{}, false, 0
	m.grants, m.count, m.refunded = map[int64]grant{}, 0, slidingRanges{}
}

// keyTime returns the time a call at nowUS decides at, and whether the
// clock went wrong (the recorded time is further ahead than the longest
// window). It drops the buckets that had left every window as of the last
// grant: the key's time never goes back before it, so no window reaches
// them again.
func (m *SlidingLog) keyTime(nowUS int64) (int64, bool) {
	if !m.granted || m.recordedUS <= nowUS {
		return nowUS, false
	}
	tail := floorDiv(m.recordedUS, m.precisionUS)
	for k := range m.buckets {
		if k <= tail-m.nbMax {
			delete(m.buckets, k)
		}
	}
	if m.recordedUS-nowUS > m.nbMax*m.precisionUS {
		return nowUS, true
	}
	return m.recordedUS, false
}

// Step decides a request for n permits at time nowUS.
func (m *SlidingLog) Step(nowUS int64, n int64) Result {
	P := m.precisionUS
	t, wrong := m.keyTime(nowUS)
	b := floorDiv(t, P)
	view := m.buckets
	if wrong {
		view = buckets{}
		if held := m.buckets.sum(floorDiv(m.recordedUS, P), m.nbMax); held > 0 {
			view[b] = held
		}
	}
	counts := make([]int64, len(m.limits))
	for i := range m.limits {
		counts[i] = view.sum(b, m.nbs[i])
	}

	var res Result
	switch {
	case n > m.limits[0]:
		res.RetryAfterUS = Never
		res.Strategy = 0
		res.Limit = m.limits[0]
	case n == 0:
		res.Allowed = true
	default:
		// Find the violated strategy with the longest RetryAfter (ties:
		// lowest index), if any.
		worst := -1
		for i, L := range m.limits {
			if counts[i]+n <= L {
				continue
			}
			retry := view.retryAfter(b, m.nbs[i], P, nowUS, counts[i]+n-L)
			if worst < 0 || retry > res.RetryAfterUS {
				worst = i
				res.RetryAfterUS = retry
			}
		}
		if worst >= 0 {
			res.Strategy = worst
			res.Limit = m.limits[worst]
			break
		}
		res.Allowed = true
		if wrong {
			// The key moves to this clock's timeline, carrying what it held;
			// no earlier grant refunds.
			m.buckets, m.grants = view, map[int64]grant{}
			m.refunded = slidingRanges{horizon: m.count}
		}
		m.buckets[b] += n
		m.recordedUS, m.granted = t, true
		m.lastID++
		m.grants[m.lastID] = grant{bucket: b, at: m.count, n: n}
		m.count += n
		res.GrantID = m.lastID
		for i := range counts {
			counts[i] += n
		}
	}

	// Remaining is the minimum over all strategies; an allowed request
	// reports the strategy achieving it (ties: lowest index).
	minAt := 0
	for i, L := range m.limits {
		if max(0, L-counts[i]) < max(0, m.limits[minAt]-counts[minAt]) {
			minAt = i
		}
	}
	res.Remaining = max(0, m.limits[minAt]-counts[minAt])
	if res.Allowed {
		res.Strategy = minAt
		res.Limit = m.limits[minAt]
	}
	res.ResetAfterUS = view.resetAfter(m.nbMax, P, nowUS)
	if !res.Allowed && res.RetryAfterUS > res.ResetAfterUS {
		res.ResetAfterUS = res.RetryAfterUS // never before the retry, as the scripts say
	}
	return res
}

// Refund gives back permits of the grant named grantID at nowUS until k of
// them in all were given back, as far as the key still counts them: while
// the grant's bucket is in the longest window at the key's recorded time
// (a call decides there at the earliest), and not on a clock gone wrong
// (nor after a grant on one moved the key), as the script keeps refunds
// (slidingRanges): what a grant gave back is the refunded prefix of its
// positions, and a grant starting below the horizon gives nothing. It
// returns the permits this call gave back. ResetAfter keeps counting the
// grant's bucket until it leaves the window.
func (m *SlidingLog) Refund(nowUS, grantID, k int64) int64 {
	_, wrong := m.keyTime(nowUS)
	g, ok := m.grants[grantID]
	if wrong || !ok || g.bucket <= floorDiv(m.recordedUS, m.precisionUS)-m.nbMax ||
		g.at < m.refunded.horizon {
		return 0
	}
	r := m.refunded.in(g.at, g.at+g.n)
	give := min(k, g.n) - r
	if give <= 0 {
		return 0
	}
	m.refunded.add(g.at+r, g.at+r+give)
	// A bucket refunded to nothing stays until it leaves the window: a
	// refund changes counts, not when the key is back in its initial
	// state (ResetAfter), as the scripts keep it.
	m.buckets[g.bucket] -= give
	return give
}

// Clone returns an independent copy of m.
func (m *SlidingLog) Clone() Model {
	c := *m
	c.buckets = m.buckets.clone()
	c.grants = maps.Clone(m.grants)
	c.refunded.ranges = slices.Clone(m.refunded.ranges)
	return &c
}
