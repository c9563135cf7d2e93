package model

import "fmt"

// SlidingWindow is the reference model of a bucketed sliding-window limiter:
// time is cut into buckets of P microseconds aligned to the Unix epoch, and a
// request at time t (bucket b = floor(t/P)) is granted iff the permits in the
// N = W/P buckets (b - N, b] plus the request do not exceed L. It is a
// sliding log of one strategy, and keeps the key's time as SlidingLog does.
type SlidingWindow struct {
	log *SlidingLog
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
	return &SlidingWindow{log: NewSlidingLog(precisionUS, []int64{limit}, []int64{windowUS})}
}

// Reset forgets all buckets.
func (m *SlidingWindow) Reset() { m.log.Reset() }

// Step decides a request for n permits at time nowUS.
func (m *SlidingWindow) Step(nowUS int64, n int64) Result { return m.log.Step(nowUS, n) }

// Refund gives back permits of the grant named grantID: see SlidingLog.Refund.
func (m *SlidingWindow) Refund(nowUS, grantID, k int64) int64 { return m.log.Refund(nowUS, grantID, k) }

// Clone returns an independent copy of m.
func (m *SlidingWindow) Clone() Model {
	return &SlidingWindow{log: m.log.Clone().(*SlidingLog)}
}
