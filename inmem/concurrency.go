package inmem

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/engine"
)

// Concurrency caps what is in flight, in process: at most limit leases on
// a key are live at any moment. A lease is live from its grant until it is
// released or its lease period passes without an extend. It decides as
// redlimit.Concurrency does (the same Results for the same calls at the
// same times), and is its fallback: give it this instance's share of the
// limit (Share).
//
// A permit taken through AllowN is a lease; Result.Grant releases the
// leases it took (Grant.Refund) and ExtendGrant extends them.
type Concurrency struct {
	limit, leaseUS int64
	store          *store[concurrencyState]
	clock          // what it decides on (store.go): WithClock's, or OnClock's
}

// concurrencyState is one key's leases. Lapsed ones stay until a grant or
// extend drops them; they count for nothing.
type concurrencyState struct {
	recordedUS int64 // the time of the latest grant or extend
	lastID     int64 // ids are never given twice while the key is held
	leases     []leaseState
}

type leaseState struct{ id, expiryUS int64 }

var _ redlimit.Limiter = (*Concurrency)(nil)

// NewConcurrency returns an in-process limiter allowing at most limit live
// leases per key, each lapsing lease after its grant or last extend. limit
// must be between 1 and redlimit.MaxConcurrencyLimit; lease at least 1ms,
// at most about 203 days, in whole microseconds. Bad values are
// redlimit.ErrInvalidConfig.
func NewConcurrency(limit int, lease time.Duration, opts ...Option) (*Concurrency, error) {
	const algorithm = "concurrency"
	if err := permits(algorithm, "limit", limit); err != nil {
		return nil, err
	}
	if limit > redlimit.MaxConcurrencyLimit {
		return nil, fmt.Errorf("redlimit: inmem %s: limit %d: must be between 1 and %d: %w", algorithm, limit, redlimit.MaxConcurrencyLimit, redlimit.ErrInvalidConfig)
	}
	leaseUS, err := micros(algorithm, "lease", lease)
	if err != nil {
		return nil, err
	}
	o, err := newOptions(algorithm, opts)
	if err != nil {
		return nil, err
	}
	l := &Concurrency{limit: int64(limit), leaseUS: leaseUS}
	l.clock = newClock(o)
	l.store = newStore(o, l.used)
	return l, nil
}

// leaseView is a key as a call at now sees it.
type leaseView struct {
	now, t int64 // the caller's clock and the key's time: max(now, recorded)
	// windowUS is the longest lease the key holds (its latest expiry less
	// the recorded time), or this limiter's lease if longer.
	windowUS int64
	// wrong: the recorded time is ahead of now by more than windowUS, a
	// clock gone wrong; live leases then lapse windowUS from now at most.
	wrong bool
	live  []int // indices into the state's leases, by effective expiry
}

func (l *Concurrency) see(s *concurrencyState, now int64) leaseView {
	v := leaseView{now: now, t: max(now, s.recordedUS), windowUS: l.leaseUS}
	for i, ls := range s.leases {
		if ls.expiryUS > v.t {
			v.live = append(v.live, i)
		}
		v.windowUS = max(v.windowUS, ls.expiryUS-s.recordedUS)
	}
	v.wrong = s.recordedUS > now+v.windowUS
	slices.SortFunc(v.live, func(a, b int) int {
		return int(l.effective(v, s.leases[a].expiryUS) - l.effective(v, s.leases[b].expiryUS))
	})
	return v
}

// effective is the expiry v reads for a live lease's own.
func (l *Concurrency) effective(v leaseView, expiry int64) int64 {
	if v.wrong {
		return min(expiry, v.now+v.windowUS)
	}
	return expiry
}

// writeTime drops lapsed leases (and, when the clock went wrong, rebases
// the live ones on now's timeline) and returns the time a grant or extend
// writes from.
func (l *Concurrency) writeTime(s *concurrencyState, v leaseView) int64 {
	kept := s.leases[:0]
	for _, ls := range s.leases {
		if ls.expiryUS > v.t {
			ls.expiryUS = l.effective(v, ls.expiryUS)
			kept = append(kept, ls)
		}
	}
	s.leases = kept
	if v.wrong {
		return v.now
	}
	return v.t
}

// take adds n leases lapsing a lease after w and returns their token.
func (l *Concurrency) take(s *concurrencyState, w, n int64) string {
	first := max(s.lastID+1, w)
	for id := first; id < first+n; id++ {
		s.leases = append(s.leases, leaseState{id: id, expiryUS: w + l.leaseUS})
	}
	s.lastID, s.recordedUS = first+n-1, w
	return fmt.Sprintf("%d.%d", first, n)
}

// report returns the Result at now with retry, and the µs until the key's
// last live lease lapses.
func (l *Concurrency) report(s *concurrencyState, now, retry int64) (redlimit.Result, int64) {
	v := l.see(s, now)
	resetUS := int64(0)
	if len(v.live) > 0 {
		resetUS = l.effective(v, s.leases[v.live[len(v.live)-1]].expiryUS) - now
	}
	return redlimit.Result{
		Limit:      int(l.limit),
		Remaining:  int(max(0, l.limit-int64(len(v.live)))),
		RetryAfter: microsDuration(retry),
		ResetAfter: microsDuration(resetUS),
	}, resetUS
}

// retryFor is the wait, at v, until the excess-th earliest live lease
// lapses (excess 0: never).
func (l *Concurrency) retryFor(s *concurrencyState, v leaseView, excess int64) int64 {
	if excess == 0 {
		return -1
	}
	return l.effective(v, s.leases[v.live[excess-1]].expiryUS) - v.now
}

// AllowN takes n leases for key if n more can be live, else none. err is
// non-nil only for a key that is empty or longer than redlimit.MaxKeyBytes,
// n < 0, a nil ctx or a clock outside 2001 to 2112
// (redlimit.ErrInvalidArgument). n == 0 reports the state; n above the
// limit is denied with RetryAfter redlimit.Never.
func (l *Concurrency) AllowN(ctx context.Context, key string, n int) (redlimit.Result, error) {
	if err := checkCall(ctx, "concurrency", key, n); err != nil {
		return redlimit.Result{}, err
	}
	now, err := l.store.nowUS(l.clock, "concurrency")
	if err != nil {
		return redlimit.Result{}, err
	}
	return l.locked(key, now, func(s *concurrencyState) (redlimit.Result, bool) {
		v := l.see(s, now)
		count, want := int64(len(v.live)), int64(n)
		switch {
		case want > l.limit:
			r, _ := l.report(s, now, -1)
			return r, false
		case want == 0:
			r, _ := l.report(s, now, 0)
			r.Allowed = true
			return r, false
		case count+want > l.limit:
			r, _ := l.report(s, now, l.retryFor(s, v, count+want-l.limit))
			return r, false
		}
		token := l.take(s, l.writeTime(s, v), want)
		r, _ := l.report(s, now, 0)
		r.Allowed, r.Grant = true, engine.NewGrant(l, key, n, token)
		return r, true
	})
}

// locked runs decide on key's state under its shard's lock, and stores
// the state when decide says it changed.
func (l *Concurrency) locked(key string, now int64, decide func(s *concurrencyState) (redlimit.Result, bool)) (redlimit.Result, error) {
	sh := l.store.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	var s concurrencyState
	if e != nil {
		s = e.state
		s.leases = slices.Clone(s.leases) // a denial must leave e as it was
	}
	r, write := decide(&s)
	if write {
		_, resetUS := l.report(&s, now, 0)
		sh.put(l.store, key, e, s, now, resetUS)
	}
	return r, nil
}

// ExtendGrant gives the leases g took another lease period from now. When
// they are all live they keep their places, and the Result's Grant is g.
// When some lapsed, the grant is taken afresh: its leases still live
// count as room, and if the others leave room for all of them they are
// live again and the Result's Grant names them from now on; else the
// Result is a denial and nothing changed. It extends the grants of l and
// of its views (OnClock), which share its keys, on l's clock. The zero
// Grant, or one of another limiter, is redlimit.ErrInvalidArgument.
func (l *Concurrency) ExtendGrant(ctx context.Context, g redlimit.Grant) (redlimit.Result, error) {
	src, key, token := engine.GrantParts(g)
	if of, ok := src.(*Concurrency); !ok || of.store != l.store {
		return redlimit.Result{}, fmt.Errorf("redlimit: inmem concurrency: extend of %v: not a grant of this limiter: %w", g, redlimit.ErrInvalidArgument)
	}
	if err := checkCall(ctx, "concurrency", key, 0); err != nil {
		return redlimit.Result{}, err
	}
	now, err := l.store.nowUS(l.clock, "concurrency")
	if err != nil {
		return redlimit.Result{}, err
	}
	var first, n int64
	if _, err := fmt.Sscanf(token, "%d.%d", &first, &n); err != nil || n != int64(g.N()) {
		return redlimit.Result{}, fmt.Errorf("redlimit: inmem concurrency: extend: unreadable token: %w", redlimit.ErrInvalidArgument)
	}
	return l.locked(key, now, func(s *concurrencyState) (redlimit.Result, bool) {
		v := l.see(s, now)
		mine := int64(0)
		for _, i := range v.live {
			if id := s.leases[i].id; id >= first && id < first+n {
				mine++
			}
		}
		others := int64(len(v.live)) - mine
		switch {
		case mine == n:
			w := l.writeTime(s, v)
			for i := range s.leases {
				if id := s.leases[i].id; id >= first && id < first+n {
					s.leases[i].expiryUS = max(s.leases[i].expiryUS, w+l.leaseUS)
				}
			}
			s.recordedUS = w
			r, _ := l.report(s, now, 0)
			r.Allowed, r.Grant = true, g
			return r, true
		case n > l.limit:
			r, _ := l.report(s, now, -1)
			return r, false
		case others+n > l.limit:
			// The others must lapse: the grant's own, interleaved, lapse too.
			r, _ := l.report(s, now, l.retryFor(s, v, others+n-l.limit+mine))
			return r, false
		}
		w := l.writeTime(s, v)
		s.leases = slices.DeleteFunc(s.leases, func(ls leaseState) bool { return ls.id >= first && ls.id < first+n })
		token := l.take(s, w, n)
		r, _ := l.report(s, now, 0)
		r.Allowed, r.Grant = true, engine.NewGrant(l, key, int(n), token)
		return r, true
	})
}

// RefundGrant releases the first k leases of the grant named by token:
// those live free their places; lapsed or released ones free nothing.
// Grant.Refund calls it.
func (l *Concurrency) RefundGrant(ctx context.Context, key, token string, took, k int) error {
	if err := checkCall(ctx, "concurrency", key, 0); err != nil {
		return err
	}
	now, err := l.store.nowUS(l.clock, "concurrency")
	if err != nil {
		return err
	}
	var first, n int64
	if _, err := fmt.Sscanf(token, "%d.%d", &first, &n); err != nil || n != int64(took) {
		return fmt.Errorf("redlimit: inmem concurrency: refund: unreadable token: %w", redlimit.ErrInvalidArgument)
	}
	_, err = l.locked(key, now, func(s *concurrencyState) (redlimit.Result, bool) {
		before := len(s.leases)
		s.leases = slices.DeleteFunc(s.leases, func(ls leaseState) bool { return ls.id >= first && ls.id < first+int64(k) })
		return redlimit.Result{}, len(s.leases) != before
	})
	return err
}

// used is the share of the limit s has live at t.
func (l *Concurrency) used(s *concurrencyState, t int64) float64 {
	return float64(len(l.see(s, t).live)) / float64(l.limit)
}

// Allow is AllowN(ctx, key, 1).
func (l *Concurrency) Allow(ctx context.Context, key string) (redlimit.Result, error) {
	return l.AllowN(ctx, key, 1)
}

// TryAcquire takes one lease for key and lets it lapse after the lease
// period: nil when allowed, a *redlimit.ViolationStrategyError (matching
// redlimit.ErrAcquireFailed) when denied.
func (l *Concurrency) TryAcquire(ctx context.Context, key string) error {
	return tryAcquire(ctx, l, key, func(redlimit.Result) time.Duration { return 0 }) // no window
}

// OnClock returns a view of l that decides on now: the same
// configuration and the same keys (what either grants, the other sees),
// on another clock. The view's Grants refund and extend (ExtendGrant) through the view, on
// now. When l was built with WithClock (its own clock wins), or now is
// nil, OnClock returns l. redlimit.WithFallback calls it with the Redis
// limiter's clock (redlimit.WithClock).
func (l *Concurrency) OnClock(now func() time.Time) redlimit.Limiter { return onClock(l, now) }

// Reset forgets every lease of key.
func (l *Concurrency) Reset(ctx context.Context, key string) error {
	if err := checkCall(ctx, "concurrency", key, 0); err != nil {
		return err
	}
	return l.store.reset("concurrency", key)
}

// ReleaseGrant releases the leases of a grant this limiter made (see
// redlimit.Grant.Release): all it took.
func (l *Concurrency) ReleaseGrant(ctx context.Context, key, token string, took int) error {
	return l.RefundGrant(ctx, key, token, took, took)
}
