package model

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// step is one call of a table test: at time t request n permits and expect
// the given decision.
type step struct {
	t     int64 // now, µs
	n     int64 // permits requested
	ok    bool  // want Allowed
	rem   int64 // want Remaining
	retry int64 // want RetryAfterUS
	reset int64 // want ResetAfterUS
}

// runSteps plays steps against m, stopping at the first mismatch.
func runSteps(t *testing.T, m Model, steps []step) {
	t.Helper()
	for i, s := range steps {
		r := m.Step(s.t, s.n)
		got := step{s.t, s.n, r.Allowed, r.Remaining, r.RetryAfterUS, r.ResetAfterUS}
		require.Equal(t, s, got, "step %d: %+v", i, r)
	}
}

// ---------------------------------------------------------------------------
// Fixed window

func TestFixedWindow(t *testing.T) {
	const L, W = 3, 1000
	tests := []struct {
		name  string
		steps []step
	}{
		{"window [start, start+W)", []step{
			{1500, 0, true, 3, 0, 0},      // n == 0 opens nothing
			{1500, 4, false, 3, Never, 0}, // n > L
			{1500, 1, true, 2, 0, 1000},   // opens [1500, 2500)
			{1600, 2, true, 0, 0, 900},
			{1700, 1, false, 0, 800, 800},
			{2499, 1, false, 0, 1, 1}, // last µs of the window
			{2499, 0, true, 0, 0, 1},
			{2499, 4, false, 0, Never, 1},
			{2500, 3, true, 0, 0, 1000}, // end is exclusive: new window [2500, 3500)
			{3499, 1, false, 0, 1, 1},
			{3500, 0, true, 3, 0, 0}, // closed
		}},
		{"denied consumes nothing", []step{
			{0, 2, true, 1, 0, 1000},
			{10, 2, false, 1, 990, 990},
			{20, 2, false, 1, 980, 980},
			{30, 1, true, 0, 0, 970},
		}},
		{"denied opens no window", []step{
			{0, 4, false, 3, Never, 0},
			{500, 1, true, 2, 0, 1000},
		}},
		{"a clock behind the key's time decides in its window", []step{
			{10000, 3, true, 0, 0, 1000},    // [10000, 11000)
			{9500, 1, false, 0, 1000, 1000}, // at the key's time, 10000
			{9000, 0, true, 0, 0, 1000},     // writes nothing
			{10999, 1, false, 0, 1, 1},
			{11000, 1, true, 2, 0, 1000},
		}},
		{"clock backwards within the window", []step{
			{10000, 3, true, 0, 0, 1000},
			{10800, 1, false, 0, 200, 200},
			{10200, 1, false, 0, 800, 800},
			{10999, 1, false, 0, 1, 1},
			{11000, 1, true, 2, 0, 1000},
		}},
		{"a grant from behind joins the key's window", []step{
			{10000, 1, true, 2, 0, 1000},
			{9500, 1, true, 1, 0, 1000}, // counted in [10000, 11000)
			{10999, 2, false, 1, 1, 1},
			{11000, 3, true, 0, 0, 1000},
		}},
		{"a clock gone wrong counts the key's window as used", []step{
			{10000, 2, true, 1, 0, 1000},
			{5000, 2, false, 1, 1000, 1000}, // read as opened at 5000
			{5000, 0, true, 1, 0, 1000},
			{5000, 1, true, 0, 0, 1000}, // moved to [5000, 6000), count 3
			{5999, 1, false, 0, 1, 1},
			{6000, 3, true, 0, 0, 1000},
		}},
		{"a look from a clock gone wrong writes nothing", []step{
			{10000, 2, true, 1, 0, 1000},
			{0, 0, true, 1, 0, 1000},
			{9500, 1, true, 0, 0, 1000}, // the window of 10000
			{10999, 1, false, 0, 1, 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runSteps(t, NewFixedWindow(L, W), tt.steps)
		})
	}
}

func TestFixedWindowZeroLimit(t *testing.T) {
	runSteps(t, NewFixedWindow(0, 1000), []step{
		{0, 0, true, 0, 0, 0},
		{0, 1, false, 0, Never, 0},
	})
}

// ---------------------------------------------------------------------------
// Sliding window

func TestSlidingWindow(t *testing.T) {
	const L, W, P = 3, 10000, 1000 // N = 10 buckets
	tests := []struct {
		name  string
		steps []step
	}{
		{"epoch-aligned buckets", []step{
			{0, 0, true, 3, 0, 0},
			{1500, 4, false, 3, Never, 0},
			{1500, 1, true, 2, 0, 9500},  // bucket 1 leaves at 11000
			{1999, 1, true, 1, 0, 9001},  // still bucket 1
			{2000, 1, true, 0, 0, 10000}, // bucket 2
			{2000, 1, false, 0, 9000, 10000},
			{2000, 0, true, 0, 0, 10000},
			{10999, 1, false, 0, 1, 1001},
			{11000, 1, true, 1, 0, 10000}, // bucket 1 left the window
			{11000, 2, false, 1, 1000, 10000},
			{12000, 2, true, 0, 0, 10000},
			{22000, 0, true, 3, 0, 0},
		}},
		{"retry walks several buckets", []step{
			{0, 1, true, 2, 0, 10000},
			{1000, 1, true, 1, 0, 10000},
			{2000, 1, true, 0, 0, 10000},
			{3000, 2, false, 0, 8000, 9000}, // needs buckets 0 and 1 gone
			{10999, 2, false, 1, 1, 1001},   // bucket 0 gone, bucket 1 not yet
			{11000, 2, true, 0, 0, 10000},
		}},
		{"denied consumes nothing", []step{
			{0, 2, true, 1, 0, 10000},
			{500, 2, false, 1, 9500, 9500},
			{600, 2, false, 1, 9400, 9400},
			{700, 1, true, 0, 0, 9300},
		}},
		{"clock backwards: the key's time never goes back", []step{
			{20500, 3, true, 0, 0, 9500},
			// 15500µs behind, more than the window: a clock gone wrong
			// reads the 3 as granted in its own bucket.
			{5000, 1, false, 0, 10000, 10000},
			{5000, 0, true, 0, 0, 10000},
			// 5501µs behind: the call decides at the key's time, 20500,
			// and waits for the clock to reach the bucket's leaving.
			{14999, 1, false, 0, 15001, 15001},
			{30000, 1, true, 2, 0, 10000},
			// A grant on a clock gone wrong moves the key to that clock,
			// carrying the 1 it held into its bucket.
			{10000, 1, true, 1, 0, 10000},
			{10500, 1, true, 0, 0, 9500},
			{10500, 1, false, 0, 9500, 9500},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runSteps(t, NewSlidingWindow(L, W, P), tt.steps)
		})
	}
}

// ---------------------------------------------------------------------------
// Sliding log

func TestSlidingLogSteps(t *testing.T) {
	// Strategies: 0 = (2 per 2000µs), 1 = (5 per 10000µs); P = 1000.
	newLog := func() *SlidingLog { return NewSlidingLog(1000, []int64{2, 5}, []int64{2000, 10000}) }
	runSteps(t, newLog(), []step{
		{0, 0, true, 2, 0, 0},
		{0, 3, false, 2, Never, 0}, // n > smallest limit
		{0, 2, true, 0, 0, 10000},
		{0, 1, false, 0, 2000, 10000}, // only strategy 0 violated
		{2000, 2, true, 0, 0, 10000},
		{4000, 2, false, 1, 6000, 8000}, // strategy 1 violated; remaining = min(2, 1)
		{9999, 1, true, 0, 0, 9001},
		{10000, 2, false, 1, 1000, 9000}, // bucket 0 dropped; strategy 0 violated
	})
}

func TestSlidingLogReportsLongestRetry(t *testing.T) {
	newLog := func() *SlidingLog { return NewSlidingLog(1000, []int64{2, 5}, []int64{2000, 10000}) }
	tests := []struct {
		name  string
		trace [][2]int64 // (t, n) setting up the state
		t, n  int64
		want  Result
	}{
		{"only the long strategy violated", [][2]int64{{0, 2}, {2000, 2}}, 4000, 2,
			Result{Allowed: false, Limit: 5, Remaining: 1, RetryAfterUS: 6000, ResetAfterUS: 8000, Strategy: 1}},
		{"both violated, long strategy waits longer", [][2]int64{{0, 2}, {2000, 2}, {4000, 1}}, 4000, 2,
			Result{Allowed: false, Limit: 5, Remaining: 0, RetryAfterUS: 6000, ResetAfterUS: 10000, Strategy: 1}},
		{"both violated, short strategy waits longer", [][2]int64{{0, 2}, {9000, 2}}, 9000, 2,
			Result{Allowed: false, Limit: 2, Remaining: 0, RetryAfterUS: 2000, ResetAfterUS: 10000, Strategy: 0}},
		{"both violated, tie goes to lowest index", [][2]int64{{0, 2}, {8000, 2}}, 9000, 2,
			Result{Allowed: false, Limit: 2, Remaining: 0, RetryAfterUS: 1000, ResetAfterUS: 9000, Strategy: 0}},
		{"allowed reports the strategy with least remaining", [][2]int64{{0, 2}, {2000, 2}}, 4000, 1,
			Result{Allowed: true, Limit: 5, Remaining: 0, ResetAfterUS: 10000, Strategy: 1}},
		{"allowed, remaining tie goes to lowest index", [][2]int64{{0, 2}, {2000, 1}}, 4000, 1,
			Result{Allowed: true, Limit: 2, Remaining: 1, ResetAfterUS: 10000, Strategy: 0}}, // remaining (1, 1)
		{"n == 0 reports like an allowed request", [][2]int64{{0, 2}, {2000, 2}}, 4000, 0,
			Result{Allowed: true, Limit: 5, Remaining: 1, ResetAfterUS: 8000, Strategy: 1}},
		{"n > smallest limit", [][2]int64{{0, 2}, {2000, 2}}, 4000, 3,
			Result{Allowed: false, Limit: 2, Remaining: 1, RetryAfterUS: Never, ResetAfterUS: 8000, Strategy: 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newLog()
			for _, c := range tt.trace {
				require.True(t, m.Step(c[0], c[1]).Allowed)
			}
			got := m.Step(tt.t, tt.n)
			got.GrantID = 0
			require.Equal(t, tt.want, got)
		})
	}

	// The reported RetryAfter is the one that matters.
	runSteps(t, newLog(), []step{
		{0, 2, true, 0, 0, 10000},
		{9000, 2, true, 0, 0, 10000},
		{9000, 2, false, 0, 2000, 10000},
		{10999, 2, false, 0, 1, 8001},
		{11000, 2, true, 0, 0, 10000},
	})
}

func TestSlidingLogClockBackwards(t *testing.T) {
	m := NewSlidingLog(1000, []int64{2, 5}, []int64{2000, 10000})
	runSteps(t, m, []step{
		{20000, 2, true, 0, 0, 10000},
		{28000, 2, true, 0, 0, 10000},
		// The clock went back 3000µs: the call decides at the key's time,
		// 28000, where both grants count, and waits 3000µs more for it.
		{25000, 2, false, 0, 5000, 13000},
		{29999, 2, false, 0, 1, 8001},
		{30000, 2, true, 0, 0, 10000},
		// 15000µs back, more than the longest window: a clock gone wrong.
		// All the key holds (4) counts as granted in the clock's bucket.
		{15000, 1, false, 0, 2000, 10000},
		{15000, 0, true, 0, 0, 10000},
	})
}

// Clocks 1ms apart never move a key's time past the faster clock (issue 34,
// finding 1): 20 per 1s in buckets of 100ms, a call from each clock in turn
// with no real time passing grants 20, not one more per bucket crossed.
func TestSlidingSkewNoRatchet(t *testing.T) {
	m := NewSlidingWindow(20, 1_000_000, 100_000)
	granted := 0
	for i := range 400 {
		at := int64(1_000_000_099_500) + int64(i%2)*1000
		if m.Step(at, 1).Allowed {
			granted++
		}
	}
	require.Equal(t, 20, granted)
}

// A refund gives back permits of its grant while the grant's bucket is in
// a window, never more than the grant took in all, and nothing on a clock
// gone wrong.
func TestSlidingRefund(t *testing.T) {
	m := NewSlidingLog(1000, []int64{2, 5}, []int64{2000, 10000})
	r := m.Step(20000, 2)
	require.True(t, r.Allowed)
	require.Equal(t, int64(1), m.Refund(20500, r.GrantID, 1))
	require.Equal(t, int64(0), m.Refund(20500, r.GrantID, 1), "at most once")
	require.Equal(t, int64(1), m.Refund(20500, r.GrantID, 2), "up to 2 in all")
	require.Equal(t, int64(0), m.Refund(20500, r.GrantID, 2))
	require.Equal(t, int64(2), m.Step(20600, 0).Remaining)
	r = m.Step(21000, 2)
	require.True(t, r.Allowed)
	require.Equal(t, int64(0), m.Refund(5000, r.GrantID, 2), "a clock gone wrong gives nothing")
	require.True(t, m.Step(35000, 1).Allowed)
	require.Equal(t, int64(0), m.Refund(35000, r.GrantID, 2), "the bucket left every window")
	require.Equal(t, int64(0), m.Refund(21000, 99, 1), "no such grant")
}

// ---------------------------------------------------------------------------
// Leaky and token buckets

// bucketTables are table tests valid for both bucket models (C = 3, one
// permit per 1000µs), which must behave identically.
var bucketTables = []struct {
	name  string
	steps []step
}{
	{"basics", []step{
		{0, 0, true, 3, 0, 0},
		{0, 4, false, 3, Never, 0},
		{0, 2, true, 1, 0, 2000},
		{500, 2, false, 1, 500, 1500}, // level 1.5
		{999, 2, false, 1, 1, 1001},   // level 1.001: denied consumed nothing
		{1000, 2, true, 0, 0, 3000},
		{1000, 4, false, 0, Never, 3000},
		{1000, 0, true, 0, 0, 3000},
		{2500, 1, true, 0, 0, 2500}, // level 1.5 + 1
		{5000, 0, true, 3, 0, 0},
	}},
	{"clock backwards: decided at the key's time, or full when gone wrong", []step{
		{10000, 3, true, 0, 0, 3000},
		{0, 3, false, 0, 3000, 3000},    // 10000 behind, more than C/R: full at 0
		{9000, 1, false, 0, 1000, 3000}, // as at the key's time 10000
		{12500, 1, true, 1, 0, 1500},    // level 0.5 + 1
		{12000, 1, true, 0, 0, 2500},    // as at 12500: level 1.5 + 1
	}},
	{"a look before the clock goes back changes nothing", []step{
		{10000, 0, true, 3, 0, 0},   // n == 0 stores nothing
		{9000, 1, true, 2, 0, 1000}, // level 1 at 9000, as if the look never was
		{8000, 2, true, 0, 0, 3000}, // as at the key's time 9000: level 1 + 2
	}},
}

func TestLeakyBucket(t *testing.T) {
	for _, tt := range bucketTables {
		t.Run(tt.name, func(t *testing.T) {
			runSteps(t, NewLeakyBucket(3, 1, 1000), tt.steps)
		})
	}
}

func TestTokenBucket(t *testing.T) {
	for _, tt := range bucketTables {
		t.Run(tt.name, func(t *testing.T) {
			runSteps(t, NewTokenBucket(3, 1, 1000), tt.steps)
		})
	}
}

func TestBucketsFractionalRate(t *testing.T) {
	// 3 permits per second: one permit every 333333⅓ µs.
	for _, m := range []Model{NewLeakyBucket(1, 3, 1_000_000), NewTokenBucket(1, 3, 1_000_000)} {
		t.Run(fmt.Sprintf("%T", m), func(t *testing.T) {
			runSteps(t, m, []step{
				{0, 1, true, 0, 0, 333334},
				{1, 1, false, 0, 333333, 333333},
				{333333, 1, false, 0, 1, 1},     // level 1/1000000
				{333334, 1, true, 0, 0, 333334}, // level clamped at 0, then 1
				{666667, 1, false, 0, 1, 1},     // level 1/1000000
				{666668, 1, true, 0, 0, 333334},
				{1000000, 1, false, 0, 2, 2}, // level 4/1000000
			})
		})
	}
}

// ---------------------------------------------------------------------------
// Exact rates over a long run

// saturate makes requests for one permit as greedily as possible until
// endUS (exclusive): every denial jumps to t + RetryAfter, checking on the way
// that t + RetryAfter - 1 is still denied. It returns the grant times.
func saturate(t *testing.T, m Model, endUS int64) []int64 {
	t.Helper()
	var grants []int64
	for now := int64(0); now < endUS; {
		r := m.Step(now, 1)
		if r.Allowed {
			grants = append(grants, now)
			continue
		}
		require.Greater(t, r.RetryAfterUS, int64(0))
		if r.RetryAfterUS > 1 {
			require.False(t, m.Step(now+r.RetryAfterUS-1, 1).Allowed, "t=%d retry=%d", now, r.RetryAfterUS)
		}
		now += r.RetryAfterUS
	}
	return grants
}

// TestExactRates checks that at saturation 3 permits per second are admitted
// exactly, every second, over 1000 seconds. The buckets have capacity 3 so
// that they never run empty and the schedule is exactly ceil(j * 10^6 / 3).
func TestExactRates(t *testing.T) {
	t.Parallel()
	const second = 1_000_000
	seconds := 1000
	if testing.Short() {
		seconds = 200 // the sliding log's 60s window slides three times over; go test ./... runs 1000
	}
	models := map[string]Model{
		"FixedWindow":   NewFixedWindow(3, second),
		"SlidingWindow": NewSlidingWindow(3, second, 1000),
		"SlidingLog":    NewSlidingLog(1000, []int64{3, 200}, []int64{second, 60 * second}),
		"LeakyBucket":   NewLeakyBucket(3, 3, second),
		"TokenBucket":   NewTokenBucket(3, 3, second),
	}
	for name, m := range models {
		t.Run(name, func(t *testing.T) {
			grants := saturate(t, m, int64(seconds+1)*second)
			perSecond := make([]int, seconds+1)
			for _, g := range grants {
				perSecond[g/second]++
			}
			total := 0
			for s := 1; s <= seconds; s++ { // second 0 holds the initial burst
				require.Equal(t, 3, perSecond[s], "second %d", s)
				total += perSecond[s]
			}
			require.Equal(t, 3*seconds, total)
			if name == "LeakyBucket" || name == "TokenBucket" {
				require.Equal(t, 5, perSecond[0]) // burst of 3, then 1/3 s and 2/3 s
				for j := int64(1); j <= 3*int64(seconds); j++ {
					require.Equal(t, (j*second+2)/3, grants[j+2], "grant %d", j) // ceil(j*10^6/3)
				}
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Randomized properties

// call is one request of a random trace.
type call struct{ t, n int64 }

// randomTrace returns calls whose times mostly move forward by up to maxGap
// µs, sometimes stay put, and sometimes jump backwards; n is in
// [0, maxN].
func randomTrace(rng *rand.Rand, length int, maxGap, maxN int64) []call {
	trace := make([]call, length)
	now := rng.Int64N(10 * maxGap)
	for i := range trace {
		switch r := rng.IntN(20); {
		case r == 0: // clock goes backwards
			now = max(0, now-rng.Int64N(5*maxGap+1))
		case r < 6: // same instant
		default:
			now += rng.Int64N(maxGap + 1)
		}
		trace[i] = call{now, rng.Int64N(maxN + 1)}
	}
	return trace
}

// modelCase describes one randomly configured model.
type modelCase struct {
	name     string
	new      func() Model
	capacity int64 // largest n that can ever be allowed
	maxRetry int64 // upper bound on any finite RetryAfter and on ResetAfter
	maxGap   int64 // typical time step for traces
}

func randomModelCases(rng *rand.Rand) []modelCase {
	var cases []modelCase
	{
		L, W := rng.Int64N(6), 1+rng.Int64N(5000)
		cases = append(cases, modelCase{fmt.Sprintf("FixedWindow(%d,%d)", L, W),
			func() Model { return NewFixedWindow(L, W) }, L, W, W / 3})
	}
	{
		P := 1 + rng.Int64N(500)
		W := P * (1 + rng.Int64N(8))
		L := rng.Int64N(8)
		cases = append(cases, modelCase{fmt.Sprintf("SlidingWindow(%d,%d,%d)", L, W, P),
			// A clock behind the key's time by up to a window waits that
			// long too (DESIGN "A key's time").
			func() Model { return NewSlidingWindow(L, W, P) }, L, 2 * W, max(1, W/4)})
	}
	{
		P := 1 + rng.Int64N(300)
		k := 1 + rng.IntN(3)
		limits, windows := make([]int64, k), make([]int64, k)
		l, w := rng.Int64N(4), P*(1+rng.Int64N(3))
		for i := range k {
			limits[i], windows[i] = l, w
			l += 1 + rng.Int64N(4)
			w += P * rng.Int64N(4)
		}
		cases = append(cases, modelCase{fmt.Sprintf("SlidingLog(%d,%v,%v)", P, limits, windows),
			func() Model { return NewSlidingLog(P, limits, windows) }, limits[0], 2 * windows[k-1], max(1, windows[0]/3)})
	}
	{
		C, count, per := rng.Int64N(6), 1+rng.Int64N(7), 1+rng.Int64N(3000)
		bound := (C*per + count - 1) / count // ceil(C/R)
		cases = append(cases,
			modelCase{fmt.Sprintf("LeakyBucket(%d,%d,%d)", C, count, per),
				func() Model { return NewLeakyBucket(C, count, per) }, C, bound, max(1, per/count)},
			modelCase{fmt.Sprintf("TokenBucket(%d,%d,%d)", C, count, per),
				func() Model { return NewTokenBucket(C, count, per) }, C, bound, max(1, per/count)})
	}
	return cases
}

// clone returns an independent deep copy of m, so that what-if requests can
// be tried without disturbing m.
func clone(m Model) Model {
	return m.Clone()
}

// clockGoneWrong reports a call at nowUS on a sliding key whose time is
// ahead of the clock by more than its longest window.
func clockGoneWrong(m Model, nowUS int64) bool {
	var log *SlidingLog
	switch m := m.(type) {
	case *SlidingWindow:
		log = m.log
	case *SlidingLog:
		log = m
	default:
		return false
	}
	_, wrong := log.keyTime(nowUS)
	return wrong
}

// bucketOf is a bucket model's timeline, or nil.
func bucketOf(m Model) *bucketTimeline {
	switch m := m.(type) {
	case *LeakyBucket:
		return &m.b
	case *TokenBucket:
		return &m.b
	}
	return nil
}

// TestRandomProperties checks, on random traces for every model, that:
// n == 0 is always allowed, Never is reported exactly when n > capacity,
// lockouts are bounded, a denied request is denied one µs before
// RetryAfter and allowed at RetryAfter, ResetAfter is exact, and denied
// requests consume nothing.
func TestRandomProperties(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	finiteDenials := map[string]int{}
	traces := 60
	if testing.Short() {
		traces = 10 // still draws every model case; go test ./... runs all 60
	}
	for range traces {
		for _, mc := range randomModelCases(rng) {
			trace := randomTrace(rng, 200, mc.maxGap, mc.capacity+1)
			t.Run(mc.name, func(t *testing.T) {
				m := mc.new()
				for i, c := range trace {
					pre := clone(m)
					// A fixed window's clock gone wrong (more than a window
					// behind the key's time) reads the window as opened at
					// each call: its lockout ends with the key's TTL, which
					// a model has not, so its durations are not exact.
					fw, isFW := m.(*FixedWindow)
					// A sliding key's reads as if all it held had been
					// granted now: exact only once a grant wrote that.
					wrong := clockGoneWrong(pre, c.t) || (isFW && fw.opened && fw.startUS-c.t > fw.windowUS)
					// Durations count from the key's time: a fixed window's
					// start, when the clock reads earlier.
					keyT := c.t
					if isFW && fw.opened && !wrong {
						keyT = max(c.t, fw.startUS)
					}
					// A bucket's: its latest grant's time; a clock more
					// than C/R behind it reads the bucket full at each call.
					if b := bucketOf(m); b != nil && len(b.grants) > 0 && b.keyUS > c.t {
						keyT, wrong = b.keyUS, b.keyUS-c.t > b.fullUS
					}
					r := m.Step(c.t, c.n)
					snapshot := clone(m).Step(c.t, 0)
					msg := fmt.Sprintf("step %d %+v: %+v", i, c, r)

					require.GreaterOrEqual(t, r.Remaining, int64(0), msg)
					require.GreaterOrEqual(t, r.ResetAfterUS, int64(0), msg)
					require.LessOrEqual(t, r.ResetAfterUS, mc.maxRetry, msg)
					if c.n == 0 {
						require.True(t, r.Allowed, msg)
						require.Equal(t, snapshot, r, msg)
					}
					if r.Allowed {
						require.Zero(t, r.RetryAfterUS, msg)
					} else {
						// Denied consumes nothing.
						require.Equal(t, pre.Step(c.t, 0), snapshot, msg)
						require.Equal(t, r.Remaining, snapshot.Remaining, msg)
						require.Equal(t, r.ResetAfterUS, snapshot.ResetAfterUS, msg)
					}
					if !r.Allowed && c.n > mc.capacity {
						require.Equal(t, int64(Never), r.RetryAfterUS, msg)
					}
					if wrong {
						continue
					}
					if !r.Allowed && c.n <= mc.capacity {
						finiteDenials[strings.Split(mc.name, "(")[0]]++
						require.Greater(t, r.RetryAfterUS, int64(0), msg)
						require.LessOrEqual(t, r.RetryAfterUS, mc.maxRetry, msg)
						before := clone(m).Step(keyT+r.RetryAfterUS-1, c.n)
						require.False(t, before.Allowed, "%s; one µs early: %+v", msg, before)
						at := clone(m).Step(keyT+r.RetryAfterUS, c.n)
						require.True(t, at.Allowed, "%s; at RetryAfter: %+v", msg, at)
					}

					// ResetAfter is exact: one µs early the key is still
					// not back to its initial state, at ResetAfter it is.
					if r.ResetAfterUS > 0 {
						before := clone(m).Step(keyT+r.ResetAfterUS-1, 0)
						require.Greater(t, before.ResetAfterUS, int64(0), "%s; one µs early: %+v", msg, before)
					}
					at := clone(m).Step(keyT+r.ResetAfterUS, 0)
					fresh := mc.new().Step(keyT+r.ResetAfterUS, 0)
					require.Equal(t, fresh, at, "%s; at ResetAfter", msg)

					// The what-if requests above did not disturb m.
					require.Equal(t, snapshot, clone(m).Step(c.t, 0), msg)
				}
			})
		}
	}
	for _, kind := range []string{"FixedWindow", "SlidingWindow", "SlidingLog", "LeakyBucket", "TokenBucket"} {
		require.Greater(t, finiteDenials[kind], 500*traces/60, "too few denials exercised for %s", kind)
	}
	t.Logf("denials with a finite RetryAfter checked: %v", finiteDenials)
}

// TestLeakyEqualsToken checks that the level view and the tokens view give
// identical Results for the same traces, including backwards clocks.
func TestLeakyEqualsToken(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for range shortOr(60, 300) {
		C, count, per := rng.Int64N(8), 1+rng.Int64N(9), 1+rng.Int64N(5000)
		leaky, token := NewLeakyBucket(C, count, per), NewTokenBucket(C, count, per)
		for i, c := range randomTrace(rng, 300, 2*per/count+1, C+2) {
			if rng.IntN(100) == 0 {
				leaky.Reset()
				token.Reset()
			}
			require.Equal(t, leaky.Step(c.t, c.n), token.Step(c.t, c.n),
				"C=%d count=%d per=%d step %d %+v", C, count, per, i, c)
		}
	}
}

// TestSlidingLogSingleStrategy checks that a one-strategy sliding log is the
// sliding window.
func TestSlidingLogSingleStrategy(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	for range shortOr(60, 300) {
		P := 1 + rng.Int64N(500)
		W := P * (1 + rng.Int64N(10))
		L := rng.Int64N(8)
		sw, sl := NewSlidingWindow(L, W, P), NewSlidingLog(P, []int64{L}, []int64{W})
		for i, c := range randomTrace(rng, 300, W/4+1, L+1) {
			require.Equal(t, sw.Step(c.t, c.n), sl.Step(c.t, c.n),
				"L=%d W=%d P=%d step %d %+v", L, W, P, i, c)
		}
	}
}

// TestClockBackwardsGivesNoExtraPermits checks that jumping backwards right
// after saturating never allows a request: every permit granted is still
// counted (a fixed window's key time, a sliding key's time held at its
// last grant, bucket level clamp).
func TestClockBackwardsGivesNoExtraPermits(t *testing.T) {
	models := map[string]Model{
		"FixedWindow":   NewFixedWindow(5, 10000),
		"SlidingWindow": NewSlidingWindow(5, 10000, 1000),
		"SlidingLog":    NewSlidingLog(1000, []int64{5, 8}, []int64{10000, 20000}),
		"LeakyBucket":   NewLeakyBucket(5, 1, 2000),
		"TokenBucket":   NewTokenBucket(5, 1, 2000),
	}
	for name, m := range models {
		t.Run(name, func(t *testing.T) {
			require.True(t, m.Step(50000, 5).Allowed)
			for _, back := range []int64{1, 999, 1000, 5000, 9999, 10000, 50000} {
				r := m.Step(50000-back, 1)
				require.False(t, r.Allowed, "back %d: %+v", back, r)
				require.Zero(t, r.Remaining, "back %d", back)
				// A clock behind the key's time waits for it too, up to
				// a window; one further behind decides on its own clock.
				require.LessOrEqual(t, r.RetryAfterUS, 10000+min(back, 10000), "back %d", back)
			}
		})
	}
}

// A call that grants nothing on a key back in its initial state leaves it
// as it was under StepStored, as the scripts do: when the clock then goes
// back into the time the key was in use, its grants count again. The
// fixed window's Step keeps them too (its key's time is its window's
// start); the bucket models keep a level, and Step moves the bucket's time
// to that call's.
func TestStepStoredKeepsStateAfterLook(t *testing.T) {
	models := map[string]func() Model{
		"FixedWindow":   func() Model { return NewFixedWindow(3, 1000) },
		"SlidingWindow": func() Model { return NewSlidingWindow(3, 1000, 100) },
		"SlidingLog":    func() Model { return NewSlidingLog(100, []int64{3, 6}, []int64{1000, 2000}) },
		"LeakyBucket":   func() Model { return NewLeakyBucket(3, 3, 3000) },
		"TokenBucket":   func() Model { return NewTokenBucket(3, 3, 3000) },
	}
	for name, make := range models {
		t.Run(name, func(t *testing.T) {
			m := make()
			require.True(t, StepStored(m, 10000, 3).Allowed)
			for _, n := range []int64{0, 4} { // a look, and a request above every limit
				r := StepStored(m, 13000, n)
				require.Equal(t, int64(3), r.Remaining, "n=%d: 3000µs on, the key is back to its initial state: %+v", n, r)
				require.Zero(t, r.ResetAfterUS, "n=%d: %+v", n, r)
			}
			r := StepStored(m, 10500, 1)
			require.False(t, r.Allowed, "back at 500µs after the grants, they count: %+v", r)
		})
	}
	fw := NewFixedWindow(3, 1000)
	fw.Step(10000, 3)
	fw.Step(13000, 0)
	require.False(t, fw.Step(10500, 1).Allowed, "Step keeps the ended window, as the script does")
}

func TestReset(t *testing.T) {
	models := []Model{
		NewFixedWindow(2, 1000),
		NewSlidingWindow(2, 1000, 100),
		NewSlidingLog(100, []int64{2, 3}, []int64{1000, 2000}),
		NewLeakyBucket(2, 1, 1000),
		NewTokenBucket(2, 1, 1000),
	}
	for _, m := range models {
		t.Run(fmt.Sprintf("%T", m), func(t *testing.T) {
			require.True(t, m.Step(5000, 2).Allowed)
			require.False(t, m.Step(4000, 1).Allowed)
			m.Reset()
			r := m.Step(4000, 0)
			require.Equal(t, int64(2), r.Remaining)
			require.Zero(t, r.ResetAfterUS)
		})
	}
}

func TestConstructorsRejectInvalidConfig(t *testing.T) {
	require.Panics(t, func() { NewFixedWindow(1, 0) })
	require.Panics(t, func() { NewFixedWindow(-1, 10) })
	require.Panics(t, func() { NewSlidingWindow(1, 10, 0) })
	require.Panics(t, func() { NewSlidingWindow(1, 10, 20) })
	require.Panics(t, func() { NewSlidingLog(10, nil, nil) })
	require.Panics(t, func() { NewSlidingLog(10, []int64{1, 2}, []int64{10}) })
	require.Panics(t, func() { NewSlidingLog(10, []int64{2, 2}, []int64{10, 20}) })
	require.Panics(t, func() { NewSlidingLog(10, []int64{1, 2}, []int64{20, 10}) })
	require.Panics(t, func() { NewLeakyBucket(1, 0, 10) })
	require.Panics(t, func() { NewTokenBucket(1, 1, 0) })
}

// shortOr is quick under -short and full otherwise: a randomized test then
// checks its property on fewer traces while you work, and on all of them in
// the full suite.
func shortOr(quick, full int) int {
	if testing.Short() {
		return quick
	}
	return full
}
