package inmem

import (
	"context"
	"fmt"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/engine"
)

// FixedWindow grants at most limit permits per window, in process: a window
// opens at the first request that finds none open and lasts for the
// window's length; a denied request, or one for zero permits, opens none.
// It decides, and its Grants refund, as redlimit.FixedWindow does.
type FixedWindow struct {
	limit, windowUS int64
	window          time.Duration
	store           *store[fixedWindowState]
	clock           // what it decides on (store.go): WithClock's, or OnClock's
}

// fixedWindowState is a key's window, kept as the script keeps it: its
// start is the key's time, and a window that ended stays until the key is
// evicted, so that a clock that goes back into it finds what it held.
type fixedWindowState struct {
	count   int64 // permits the window counts
	startUS int64 // the window's start; 0: no window was ever opened
	// Refunds, as the script keeps them: permits refunds gave back in the
	// window, what each refunded grant gave back (by the position of its
	// last permit), at most maxRefundRecords of them, and the position at
	// or before which grants give nothing.
	given int64
	refunds
}

var (
	_ redlimit.Limiter = (*FixedWindow)(nil)
	_ engine.Refunder  = (*FixedWindow)(nil)
)

// NewFixedWindow returns an in-process limiter granting at most limit
// permits per window. limit must be between 1 and 2^40; window at least
// 1ms, at most about 203 days, in whole microseconds. Bad values are
// redlimit.ErrInvalidConfig.
func NewFixedWindow(limit int, window time.Duration, opts ...Option) (*FixedWindow, error) {
	const algorithm = "fixed_window"
	if err := permits(algorithm, "limit", limit); err != nil {
		return nil, err
	}
	windowUS, err := micros(algorithm, "window", window)
	if err != nil {
		return nil, err
	}
	o, err := newOptions(algorithm, opts)
	if err != nil {
		return nil, err
	}
	l := &FixedWindow{limit: int64(limit), windowUS: windowUS, window: window}
	l.clock = newClock(o)
	l.store = newStore(o, l.used)
	return l, nil
}

// AllowN takes n permits for key if all n are available, else none. err is
// non-nil only for a key that is empty or longer than redlimit.MaxKeyBytes,
// n < 0, a nil ctx or a clock outside 2001 to 2112
// (redlimit.ErrInvalidArgument).
// n == 0 reports the state; n above the limit is denied with RetryAfter
// redlimit.Never.
func (l *FixedWindow) AllowN(ctx context.Context, key string, n int) (redlimit.Result, error) {
	if err := checkCall(ctx, "fixed_window", key, n); err != nil {
		return redlimit.Result{}, err
	}
	now, err := l.store.nowUS(l.clock, "fixed_window")
	if err != nil {
		return redlimit.Result{}, err
	}
	sh := l.store.shard(key)
	sh.mu.Lock()
	e := sh.m[key]
	var s fixedWindowState
	if e != nil {
		s = e.state
	}
	r, resetUS, write, token := l.decide(&s, now, int64(n))
	if write {
		sh.put(l.store, key, e, s, now, resetUS)
		r.Grant = engine.NewGrant(l, key, n, token)
	}
	sh.mu.Unlock()
	return r, nil
}

// at returns the key's time for a call at now, the window's start as that
// call reads it, whether the clock went wrong (the window read as opened
// at now), and whether the window is open: the script's rule.
func (l *FixedWindow) at(s *fixedWindowState, now int64) (t, start int64, wrong, open bool) {
	t, start = now, s.startUS
	switch {
	case s.startUS == 0:
		return t, start, false, false
	case start-now > l.windowUS:
		start, wrong = now, true
	case start > now:
		t = start
	}
	return t, start, wrong, t < start+l.windowUS
}

// decide decides at now on s and reports whether s must be stored (after
// a grant), and the grant's token. A denial or n == 0 changes nothing, as
// in the script.
func (l *FixedWindow) decide(s *fixedWindowState, now, n int64) (redlimit.Result, int64, bool, string) {
	L, W := l.limit, l.windowUS
	t, start, wrong, open := l.at(s, now)
	count := int64(0)
	if open {
		count = s.count
	}
	r := redlimit.Result{Limit: int(L)}
	retry := int64(0)
	switch {
	case n > L:
		retry = -1
	case n == 0:
		r.Allowed = true
	case !open:
		r.Allowed, count, start = true, n, t
		*s = fixedWindowState{count: n, startUS: t}
	case count+n <= L:
		r.Allowed, count = true, count+n
		s.count = count
		if wrong {
			*s = fixedWindowState{count: count, startUS: start}
		}
	default:
		retry = start + W - t
	}
	granted := r.Allowed && n > 0
	r.RetryAfter = microsDuration(retry)
	r.Remaining = int(max(0, L-count))
	resetUS := int64(0)
	if open || granted {
		resetUS = start + W - t
	}
	r.ResetAfter = microsDuration(resetUS)
	token := ""
	if granted {
		token = fmt.Sprintf("%d.%d.%d", start, count+s.given, n)
	}
	return r, resetUS, granted, token
}

// refund gives back, into the window the token names while it is open at
// the key's time, what the grant took and has not given back yet, until k
// of its permits in all: the script's rule. It returns the permits given
// back.
func (l *FixedWindow) refund(s *fixedWindowState, now int64, token string, k int64) int64 {
	var start, at, took int64
	if _, err := fmt.Sscanf(token, "%d.%d.%d", &start, &at, &took); err != nil || took < 1 || at < took {
		return 0
	}
	_, _, wrong, open := l.at(s, now)
	if !open || wrong || start != s.startUS || at > s.count+s.given {
		return 0
	}
	first := at - took // the grant holds positions [first, at)
	kept, ok := s.refunds.given(first, took)
	if !ok {
		return 0
	}
	back := min(k, took, kept+s.count) - kept
	if back <= 0 {
		return 0
	}
	s.count -= back
	s.given += back
	s.refunds.add(first+kept, first+kept+back)
	return back
}

// RefundGrant gives back permits of a grant this limiter made (see
// redlimit.Grant): until n of them in all have been given back.
func (l *FixedWindow) RefundGrant(ctx context.Context, key, token string, took, n int) error {
	if err := checkCall(ctx, "fixed_window", key, 0); err != nil {
		return err
	}
	now, err := l.store.nowUS(l.clock, "fixed_window")
	if err != nil {
		return err
	}
	sh := l.store.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[key]; e != nil {
		l.refund(&e.state, now, token, int64(n))
	}
	return nil
}

// used is the share of the limit s has in use at now.
func (l *FixedWindow) used(s *fixedWindowState, now int64) float64 {
	if _, _, _, open := l.at(s, now); !open {
		return 0
	}
	return float64(s.count) / float64(l.limit)
}

// Allow is AllowN(ctx, key, 1).
func (l *FixedWindow) Allow(ctx context.Context, key string) (redlimit.Result, error) {
	return l.AllowN(ctx, key, 1)
}

// TryAcquire takes one permit for key: nil when allowed, a
// *redlimit.ViolationStrategyError (matching redlimit.ErrAcquireFailed)
// when denied.
func (l *FixedWindow) TryAcquire(ctx context.Context, key string) error {
	return tryAcquire(ctx, l, key, func(redlimit.Result) time.Duration { return l.window })
}

// OnClock returns a view of l that decides on now: the same
// configuration and the same keys (what either grants, the other sees),
// on another clock. The view's Grants refund through the view, on
// now. When l was built with WithClock (its own clock wins), or now is
// nil, OnClock returns l. redlimit.WithFallback calls it with the Redis
// limiter's clock (redlimit.WithClock).
func (l *FixedWindow) OnClock(now func() time.Time) redlimit.Limiter { return onClock(l, now) }

// Reset forgets all state of key.
func (l *FixedWindow) Reset(ctx context.Context, key string) error {
	if err := checkCall(ctx, "fixed_window", key, 0); err != nil {
		return err
	}
	return l.store.reset("fixed_window", key)
}
