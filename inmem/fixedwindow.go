package inmem

import (
	"context"
	"time"

	"github.com/redlimit/redlimit"
)

// FixedWindow grants at most limit permits per window, in process: a window
// opens at the first request that finds none open and lasts for the
// window's length; a denied request, or one for zero permits, opens none.
// It decides as redlimit.FixedWindow does.
type FixedWindow struct {
	limit, windowUS int64
	window          time.Duration
	store           *store[fixedWindowState]
}

type fixedWindowState struct {
	count int64 // permits granted in the open window; 0: none open
	endUS int64 // the open window's exclusive end
}

var _ redlimit.Limiter = (*FixedWindow)(nil)

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
	now, err := l.store.nowUS(ctx, "fixed_window")
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
	r, resetUS, write := l.decide(&s, now, int64(n))
	if write {
		sh.put(l.store, key, e, s, now, resetUS)
	}
	sh.mu.Unlock()
	return r, nil
}

// decide decides at t on s and reports whether s must be stored: after a
// grant, or when the clock went back and the window was cut to its length
// from t. A denial or n == 0 changes nothing else, as in the script: a
// window that ended is still there should the clock go back into it.
func (l *FixedWindow) decide(s *fixedWindowState, t, n int64) (redlimit.Result, int64, bool) {
	L, W := l.limit, l.windowUS
	write := false
	if s.count > 0 && s.endUS > t+W {
		s.endUS, write = t+W, true // the clock went back
	}
	if s.count > 0 && s.endUS <= t {
		*s = fixedWindowState{}
	}
	r := redlimit.Result{Limit: int(L)}
	retry := int64(0)
	switch {
	case n > L:
		retry = -1
	case n == 0:
		r.Allowed = true
	case s.count == 0:
		r.Allowed, write = true, true
		*s = fixedWindowState{count: n, endUS: t + W}
	case s.count+n <= L:
		r.Allowed, write = true, true
		s.count += n
	default:
		retry = s.endUS - t
	}
	r.RetryAfter = microsDuration(retry)
	r.Remaining = int(L)
	resetUS := int64(0)
	if s.count > 0 {
		r.Remaining = int(max(0, L-s.count))
		resetUS = s.endUS - t
	}
	r.ResetAfter = microsDuration(resetUS)
	return r, resetUS, write
}

// used is the share of the limit s has in use at t.
func (l *FixedWindow) used(s *fixedWindowState, t int64) float64 {
	if s.count == 0 || s.endUS <= t {
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

// Reset forgets all state of key.
func (l *FixedWindow) Reset(ctx context.Context, key string) error {
	if err := checkCall(ctx, "fixed_window", key, 0); err != nil {
		return err
	}
	return l.store.reset("fixed_window", key)
}
