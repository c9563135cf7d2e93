package model

import "fmt"

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
	grants     map[int64]*grant // by grant id, for refunds
	lastID     int64
}

// grant is one grant a refund may give back: its bucket, its permits and
// what refunds gave back of them so far.
type grant struct {
	bucket, n, given int64
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
	m := &SlidingLog{precisionUS: precisionUS, buckets: buckets{}, grants: map[int64]*grant{}}
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
	m.grants = map[int64]*grant{}
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
			// The key moves to this clock's timeline, carrying what it held.
			m.buckets, m.grants = view, map[int64]*grant{}
		}
		m.buckets[b] += n
		m.recordedUS, m.granted = t, true
		m.lastID++
		m.grants[m.lastID] = &grant{bucket: b, n: n}
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
	return res
}

// Refund gives back permits of the grant named grantID at nowUS until k of
// them in all were given back, as far as the key still counts them: while
// the grant's bucket is in the longest window at the key's recorded time
// (a call decides there at the earliest), and not on a clock gone wrong
// (nor after a grant on one moved the key). It returns the permits this
// call gave back. ResetAfter keeps counting the grant's bucket until it
// leaves the window.
func (m *SlidingLog) Refund(nowUS, grantID, k int64) int64 {
	_, wrong := m.keyTime(nowUS)
	g := m.grants[grantID]
	if wrong || g == nil || g.bucket <= floorDiv(m.recordedUS, m.precisionUS)-m.nbMax {
		return 0
	}
	give := min(k, g.n) - g.given
	if give <= 0 {
		return 0
	}
	g.given += give
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
	c.grants = make(map[int64]*grant, len(m.grants))
	for id, g := range m.grants {
		copied := *g
		c.grants[id] = &copied
	}
	return &c
}
