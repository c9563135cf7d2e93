package model

import "fmt"

// FixedWindow is the reference model of a fixed-window limiter: the first
// granted request opens a window [start, start+W) in which at most L permits
// are granted; the window is not aligned to anything but that request.
type FixedWindow struct {
	limit    int64 // L
	windowUS int64 // W

	open  bool  // whether a window is open
	endUS int64 // exclusive end of the open window
	count int64 // permits granted in the open window
}

// NewFixedWindow returns a fixed-window model granting at most limit permits
// per window of windowUS microseconds. It panics if limit < 0 or
// windowUS <= 0.
func NewFixedWindow(limit, windowUS int64) *FixedWindow {
	if limit < 0 || windowUS <= 0 {
		panic(fmt.Sprintf("model: invalid fixed window limit=%d windowUS=%d", limit, windowUS))
	}
	return &FixedWindow{limit: limit, windowUS: windowUS}
}

// Reset forgets the open window, if any.
func (m *FixedWindow) Reset() {
	m.open, m.endUS, m.count = false, 0, 0
}

// Step decides a request for n permits at time nowUS.
func (m *FixedWindow) Step(nowUS int64, n int64) Result {
	t, L, W := nowUS, m.limit, m.windowUS

	// The clock went backwards: the window may not end later than t + W.
	if m.open && m.endUS > t+W {
		m.endUS = t + W
	}
	// A window whose end has come is closed.
	if m.open && m.endUS <= t {
		m.Reset()
	}

	var allowed bool
	var retry int64
	switch {
	case n > L:
		retry = Never
	case n == 0:
		allowed = true
	case !m.open:
		allowed = true
		m.open, m.endUS, m.count = true, t+W, n
	case m.count+n <= L:
		allowed = true
		m.count += n
	default:
		retry = m.endUS - t
	}

	res := Result{Allowed: allowed, Limit: L, RetryAfterUS: retry, Remaining: L}
	if m.open {
		res.Remaining = max(0, L-m.count)
		res.ResetAfterUS = m.endUS - t
	}
	return res
}

// Clone returns an independent copy of m.
func (m *FixedWindow) Clone() Model {
	c := *m
	return &c
}
