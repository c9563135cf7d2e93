package redlimit

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/engine"
)

var concurrencyScript = loadScript("concurrency.lua")

// MaxConcurrencyLimit is the largest limit NewConcurrency takes: each live
// lease is a member of a sorted set, and a grant, release or extend of n
// leases touches n members, so n is bounded to keep every call's work
// bounded.
const MaxConcurrencyLimit = 10_000

// Concurrency caps what is in flight: at most limit leases on a key are
// live at any moment. A lease is live from its grant until it is released
// or its lease period passes without an Extend, so a holder that crashes
// loses its place after at most one lease period. Releasing or extending a
// lease that lapsed never frees or takes another holder's place.
//
// Acquire takes one lease and returns it; Release gives it back, Extend
// keeps it for another lease period. Concurrency is also a Limiter: a
// permit taken through Allow, AllowN or TryAcquire is a lease that lapses
// after the lease period, and Result.Grant is those leases: refunding it
// releases them, and ExtendGrant extends them.
//
// A denial's RetryAfter is the time until enough live leases lapse (a
// release may come sooner), and its ViolationStrategyError has no Window; Result.ResetAfter is the time until the last
// live lease lapses. Durations are counted on the caller's clock (the
// Redis server's TIME, or WithClock's). docs/concurrency.md tells what a
// crash, a Redis failover and a clock step do to live leases.
type Concurrency struct {
	limiter
	// extender is the fallback's ExtendGrant, for leases it granted (on
	// this limiter's clock, as the fallback is).
	extender grantExtender
}

// grantExtender is a limiter whose grants are leases: this package's
// Concurrency, or inmem's as a fallback.
type grantExtender interface {
	ExtendGrant(ctx context.Context, g Grant) (Result, error)
}

// NewConcurrency returns a limiter allowing at most limit live leases per
// key, each lapsing lease after its grant or last Extend. limit must be
// between 1 and MaxConcurrencyLimit; lease at least 1ms, at most about
// 203 days, in whole microseconds. Bad values are ErrInvalidConfig. A
// WithFallback fallback must extend leases too (inmem.NewConcurrency).
// Keys are redlimit:cc:<config>:<key> unless WithPrefix says otherwise.
func NewConcurrency(rdb redis.Scripter, limit int, lease time.Duration, opts ...Option) (*Concurrency, error) {
	const algorithm = "concurrency"
	if err := permits(algorithm, "limit", limit); err != nil {
		return nil, err
	}
	if limit > MaxConcurrencyLimit {
		return nil, engine.Errorf(ErrInvalidConfig, "redlimit: %s: limit %d: must be between 1 and %d", algorithm, limit, MaxConcurrencyLimit)
	}
	leaseUS, err := micros(algorithm, "lease", lease)
	if err != nil {
		return nil, err
	}
	l, err := newLimiter(rdb, spec{
		algorithm: algorithm,
		code:      "cc",
		format:    1,
		script:    concurrencyScript,
		args:      []any{limit, leaseUS},
		limits:    []int{limit},
		leases:    true,
		// A release no observer reads replies only what it gave: it
		// spares the counts its Result would need.
		bareRefunds: true,
		// A concurrency limit has no window: its denials say "limit N".
		windows: []time.Duration{0},
	}, opts)
	if err != nil {
		return nil, err
	}
	c := &Concurrency{limiter: l}
	if l.fallback != nil {
		ext, ok := l.fallback.(grantExtender)
		if !ok {
			return nil, engine.Errorf(ErrInvalidConfig, "redlimit: %s: WithFallback(%T): the fallback must extend leases (inmem.NewConcurrency)", algorithm, l.fallback)
		}
		c.extender = ext
	}
	return c, nil
}

// Acquire takes one lease on key. It returns the lease when allowed, a
// *ViolationStrategyError when the key already has limit live leases (it
// matches ErrAcquireFailed; its RetryAfter is the time until the earliest
// live lease lapses), and any other error when no decision was made (Redis
// unreachable, ctx done, a key that is empty or longer than MaxKeyBytes).
// Release the lease when done, whatever happened (defer it); a lease never
// released lapses after the lease period.
func (c *Concurrency) Acquire(ctx context.Context, key string) (*Lease, error) {
	if c == nil {
		return nil, engine.Errorf(ErrInvalidConfig, "redlimit: nil *Concurrency: make it with NewConcurrency and check the error it returns")
	}
	l := &c.limiter
	if err := l.built(); err != nil {
		return nil, err
	}
	lease := &Lease{c: c}
	r, err := l.engine.DecideIn(ctx, key, 1, lease.argv[:0])
	if err != nil {
		return nil, err
	}
	if !r.Allowed {
		if r.FromFallback {
			return nil, l.fallbackDenial(l.result(r, key, 1))
		}
		return nil, &ViolationStrategyError{Limit: l.limits[0], RetryAfter: r.RetryAfter}
	}
	res := l.result(r, key, 1)
	if res.Grant.N() == 0 {
		return nil, engine.Errorf(ErrInvalidConfig, "redlimit: concurrency: the fallback granted a lease without a Grant to release it by")
	}
	lease.grant = res.Grant
	return lease, nil
}

// ExtendGrant gives the leases g took another lease period from now, in
// one round trip. When they are all live they keep their places, and the
// Result's Grant is g. When some lapsed, the grant is taken afresh: its
// leases still live count as room, and if the others leave room for all
// of them, they are all live again and the Result's Grant names them from
// now on (refund that one); else the Result is a denial and nothing
// changed. It goes behind the circuit breaker, never to the fallback (a
// lease the fallback granted is extended there). The zero Grant, or one of
// another limiter, is ErrInvalidArgument.
func (c *Concurrency) ExtendGrant(ctx context.Context, g Grant) (Result, error) {
	if c == nil {
		return Result{}, engine.Errorf(ErrInvalidConfig, "redlimit: nil *Concurrency: make it with NewConcurrency and check the error it returns")
	}
	l := &c.limiter
	if err := l.built(); err != nil {
		return Result{}, err
	}
	src, key, token := engine.GrantParts(g)
	switch {
	case src == nil:
		return Result{}, engine.Errorf(ErrInvalidArgument, "redlimit: concurrency: extend of the zero Grant")
	case src == engine.Refunder(l.engine):
		r, err := l.engine.Extend(ctx, key, token, g.N())
		if err != nil {
			return Result{}, err
		}
		return l.result(r, key, g.N()), nil
	case c.extender != nil:
		return c.extender.ExtendGrant(ctx, g)
	}
	return Result{}, engine.Errorf(ErrInvalidArgument, "redlimit: concurrency: extend of %v: not a grant of this limiter", g)
}

// Lease is one place on a key of a Concurrency, from Acquire. It is safe
// for concurrent use: a timer may Extend it while the request's goroutine
// Releases it.
type Lease struct {
	c        *Concurrency
	mu       sync.Mutex // held across a round trip: Release waits for an Extend
	grant    Grant
	released bool
	// argv holds Acquire's command arguments (EVALSHA, its SHA, 1, the
	// key, now, n, limit, lease): room in the lease's allocation spares
	// Acquire one of its own.
	argv [8]any
}

// Release gives the lease's place back, in one round trip, and drops the
// key's cached denials in this process. It is idempotent: once it returned
// nil, later calls return nil without a round trip, and a release that
// reached Redis twice frees one place. Releasing a lease that lapsed frees
// nothing (its place may be another holder's by then). On an error (Redis
// unreachable, ctx done) call it again or let the lease lapse.
func (l *Lease) Release(ctx context.Context) error {
	if l == nil {
		return engine.Errorf(ErrInvalidArgument, "redlimit: concurrency: Release of a nil *Lease")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return nil
	}
	if err := l.grant.Refund(ctx, l.grant.N()); err != nil {
		return err
	}
	l.released = true
	return nil
}

// Extend keeps the lease live for another lease period from now, in one
// round trip. A lease that lapsed is taken afresh if the key has room,
// else Extend returns a *ViolationStrategyError (it matches
// ErrAcquireFailed) and the lease is lost. Any other error means no
// decision was made; the lease then lapses when it would have. Extend
// after Release is ErrInvalidArgument, without a round trip: it never
// takes a place that nobody would release.
func (l *Lease) Extend(ctx context.Context) error {
	if l == nil {
		return engine.Errorf(ErrInvalidArgument, "redlimit: concurrency: Extend of a nil *Lease")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return engine.Errorf(ErrInvalidArgument, "redlimit: concurrency: Extend of a released lease")
	}
	res, err := l.c.ExtendGrant(ctx, l.grant)
	if err != nil {
		return err
	}
	if !res.Allowed {
		return &ViolationStrategyError{Limit: res.Limit, RetryAfter: res.RetryAfter}
	}
	l.grant = res.Grant
	return nil
}
