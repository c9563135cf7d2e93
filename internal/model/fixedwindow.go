package model

import (
	"fmt"
	"maps"
	"slices"
)

// FixedWindow is the reference model of a fixed-window limiter: the first
// granted request opens a window [start, start+W) in which at most L permits
// are granted; the window is not aligned to anything but that request.
//
// The key's time is the window's start: a request whose clock reads earlier
// decides as at that start, in that window, unless it reads more than W
// earlier, a clock gone wrong, which decides at its own time with the
// window read as opened then (all it holds counts as used; a grant moves
// it there). Only grants change the state; a window that ended is kept, so
// that a clock that goes back into it finds what it held.
type FixedWindow struct {
	limit    int64 // L
	windowUS int64 // W

	opened  bool  // whether a window was ever opened (startUS is the key's time)
	startUS int64 // start of the last window opened
	count   int64 // permits it counts

	// Refunds: what refunds gave back in the window (given), what each
	// refunded grant gave back (records, by the position of its last
	// permit in the window), at most maxRefundRecords of them, and the
	// position at or before which grants give nothing (horizon).
	given   int64
	records map[int64]int64
	horizon int64
	grants  map[int64]fixedGrant // every grant, by GrantID
	lastID  int64
}

// fixedGrant is a grant as the fixed window names it: its window's start,
// the position of its last permit in the window, and its permits.
type fixedGrant struct{ startUS, at, took int64 }

// maxRefundRecords is the most refunded grants a window remembers; the
// scripts keep the same bound.
const maxRefundRecords = 16

var _ Refunder = (*FixedWindow)(nil)

// NewFixedWindow returns a fixed-window model granting at most limit permits
// per window of windowUS microseconds. It panics if limit < 0 or
// windowUS <= 0.
func NewFixedWindow(limit, windowUS int64) *FixedWindow {
	if limit < 0 || windowUS <= 0 {
		panic(fmt.Sprintf("model: invalid fixed window limit=%d windowUS=%d", limit, windowUS))
	}
	return &FixedWindow{limit: limit, windowUS: windowUS}
}

// Reset forgets the window, if any, and every grant.
func (m *FixedWindow) Reset() {
	*m = FixedWindow{limit: m.limit, windowUS: m.windowUS}
}

// at returns the key's time for a call at nowUS, the window's start as
// that call reads it, whether the clock went wrong (the window read as
// opened at nowUS), and whether the window is open.
func (m *FixedWindow) at(nowUS int64) (t, start int64, wrong, open bool) {
	t, start = nowUS, m.startUS
	switch {
	case !m.opened:
		return t, start, false, false
	case start-nowUS > m.windowUS:
		start, wrong = nowUS, true
	case start > nowUS:
		t = start
	}
	return t, start, wrong, t < start+m.windowUS
}

// Step decides a request for n permits at time nowUS.
func (m *FixedWindow) Step(nowUS int64, n int64) Result {
	L, W := m.limit, m.windowUS
	t, start, wrong, open := m.at(nowUS)
	count := int64(0)
	if open {
		count = m.count
	}

	var allowed bool
	var retry int64
	switch {
	case n > L:
		retry = Never
	case n == 0:
		allowed = true
	case !open:
		allowed, count, start = true, n, t
		m.opened, m.startUS, m.count = true, t, n
		m.given, m.records, m.horizon = 0, nil, 0
	case count+n <= L:
		allowed, count = true, count+n
		m.count = count
		if wrong {
			m.startUS = start
			m.given, m.records, m.horizon = 0, nil, 0
		}
	default:
		retry = start + W - t
	}

	granted := allowed && n > 0
	res := Result{Allowed: allowed, Limit: L, RetryAfterUS: retry, Remaining: max(0, L-count)}
	if open || granted {
		res.ResetAfterUS = start + W - t
	}
	if granted {
		if m.grants == nil {
			m.grants = map[int64]fixedGrant{}
		}
		m.lastID++
		m.grants[m.lastID] = fixedGrant{startUS: start, at: count + m.given, took: n}
		res.GrantID = m.lastID
	}
	return res
}

// Refund gives back permits of the grant named grantID until k of them in
// all have been given back, while the window that counts them is open at
// the key's time (never from a clock gone wrong). A refunded grant is
// remembered, so that a retry gives nothing more, up to maxRefundRecords
// grants a window: then the oldest one's record goes, and it and every
// grant before it give nothing more.
func (m *FixedWindow) Refund(nowUS, grantID, k int64) int64 {
	g, ok := m.grants[grantID]
	_, _, wrong, open := m.at(nowUS)
	if !ok || !open || wrong || g.startUS != m.startUS || g.at <= m.horizon || g.at > m.count+m.given {
		return 0
	}
	kept := m.records[g.at]
	back := min(k, g.took, kept+m.count) - kept
	if back <= 0 {
		return 0
	}
	m.count -= back
	m.given += back
	if m.records == nil {
		m.records = map[int64]int64{}
	}
	m.records[g.at] = kept + back
	if len(m.records) > maxRefundRecords {
		oldest := slices.Min(slices.Collect(maps.Keys(m.records)))
		delete(m.records, oldest)
		m.horizon = max(m.horizon, oldest)
	}
	return back
}

// Clone returns an independent copy of m.
func (m *FixedWindow) Clone() Model {
	c := *m
	c.records = maps.Clone(m.records)
	c.grants = maps.Clone(m.grants)
	return &c
}
