package model

import "fmt"

// SlidingWindow is the reference model of a bucketed sliding-window limiter:
// time is cut into buckets of P microseconds aligned to the Unix epoch, and a
// request at time t (bucket b = floor(t/P)) is granted iff the permits in the
// N = W/P buckets (b - N, b] plus the request do not exceed L.
type SlidingWindow struct {
	limit       int64 // L
	precisionUS int64 // P
	nb          int64 // N = W / P

	buckets buckets
	clock   keyClock
}

// NewSlidingWindow returns a sliding-window model granting at most limit
// permits per window of windowUS microseconds, counted in buckets of
// precisionUS microseconds; the window is windowUS/precisionUS buckets
// (integer division). It panics if limit < 0, precisionUS <= 0 or
// windowUS < precisionUS.
func NewSlidingWindow(limit, windowUS, precisionUS int64) *SlidingWindow {
	if limit < 0 || precisionUS <= 0 || windowUS < precisionUS {
		panic(fmt.Sprintf("model: invalid sliding window limit=%d windowUS=%d precisionUS=%d",
			limit, windowUS, precisionUS))
	}
	return &SlidingWindow{
		limit:       limit,
		precisionUS: precisionUS,
		nb:          windowUS / precisionUS,
		buckets:     buckets{},
	}
}

// Reset forgets all buckets.
func (m *SlidingWindow) Reset() {
	m.buckets = buckets{}
	m.clock = keyClock{}
}

// Step decides a request for n permits at time nowUS.
func (m *SlidingWindow) Step(nowUS int64, n int64) Result {
	L, P, N := m.limit, m.precisionUS, m.nb
	t := m.buckets.advance(&m.clock, nowUS, P, N)
	b := floorDiv(t, P)
	count := m.buckets.sum(b, N)

	res := Result{Limit: L}
	switch {
	case n > L:
		res.RetryAfterUS = Never
	case n == 0:
		res.Allowed = true
	case count+n <= L:
		res.Allowed = true
		m.buckets[b] += n
		m.clock.grant(b)
		count += n
	default:
		res.RetryAfterUS = m.buckets.retryAfter(b, N, P, t, count+n-L)
	}
	res.Remaining = max(0, L-count)
	res.ResetAfterUS = m.buckets.resetAfter(N, P, t)
	return res
}

// Clone returns an independent copy of m.
func (m *SlidingWindow) Clone() Model {
	c := *m
	c.buckets = m.buckets.clone()
	return &c
}
