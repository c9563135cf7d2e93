package model

import "fmt"

// SlidingLog is the reference model of a multi-strategy sliding limiter: one
// shared set of epoch-aligned buckets of P microseconds, and several
// strategies (L_i, W_i), each granting at most L_i permits over its window of
// N_i = W_i/P buckets. A request is granted iff every strategy allows it.
type SlidingLog struct {
	precisionUS int64   // P
	limits      []int64 // L_i, strictly increasing
	nbs         []int64 // N_i = W_i / P, non-decreasing
	nbMax       int64   // the longest window, in buckets

	buckets buckets
	clock   keyClock
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
	m := &SlidingLog{precisionUS: precisionUS, buckets: buckets{}}
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
	m.buckets = buckets{}
	m.clock = keyClock{}
}

// Step decides a request for n permits at time nowUS.
func (m *SlidingLog) Step(nowUS int64, n int64) Result {
	P := m.precisionUS
	t := m.buckets.advance(&m.clock, nowUS, P, m.nbMax)
	b := floorDiv(t, P)
	counts := make([]int64, len(m.limits))
	for i := range m.limits {
		counts[i] = m.buckets.sum(b, m.nbs[i])
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
			retry := m.buckets.retryAfter(b, m.nbs[i], P, t, counts[i]+n-L)
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
		m.buckets[b] += n
		m.clock.grant(b)
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
	res.ResetAfterUS = m.buckets.resetAfter(m.nbMax, P, t)
	return res
}

// Clone returns an independent copy of m.
func (m *SlidingLog) Clone() Model {
	c := *m
	c.buckets = m.buckets.clone()
	return &c
}
