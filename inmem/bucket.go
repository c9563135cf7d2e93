package inmem

import (
	"context"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/engine"
)

// LeakyBucket smooths traffic to a steady rate, in process: its level
// starts at 0 and drains continuously at the leak rate; a request of n is
// allowed if level + n <= capacity, which then adds n. It decides as
// redlimit.LeakyBucket does (and, at equal capacity and rate, as a
// TokenBucket does).
type LeakyBucket struct{ bucket }

// TokenBucket allows bursts up to its capacity and a steady refill rate
// beyond, in process: it starts full and refills continuously up to
// capacity; a request of n is allowed if n tokens are there, and takes
// them. It decides as redlimit.TokenBucket does.
type TokenBucket struct{ bucket }

var (
	_ redlimit.Limiter = (*LeakyBucket)(nil)
	_ redlimit.Limiter = (*TokenBucket)(nil)
)

// NewLeakyBucket returns an in-process leaky bucket of capacity permits
// that drains at leak. The bounds are redlimit.NewLeakyBucket's; bad values
// are redlimit.ErrInvalidConfig.
func NewLeakyBucket(capacity int, leak redlimit.Rate, opts ...Option) (*LeakyBucket, error) {
	b, err := newBucket("leaky_bucket", "leak", capacity, leak, opts)
	if err != nil {
		return nil, err
	}
	return &LeakyBucket{b}, nil
}

// NewTokenBucket returns an in-process token bucket of capacity tokens
// refilled at refill. The bounds are redlimit.NewTokenBucket's; bad values
// are redlimit.ErrInvalidConfig.
func NewTokenBucket(capacity int, refill redlimit.Rate, opts ...Option) (*TokenBucket, error) {
	b, err := newBucket("token_bucket", "refill", capacity, refill, opts)
	if err != nil {
		return nil, err
	}
	return &TokenBucket{b}, nil
}

// bucket is both buckets, in the level view of the leaky one (the token
// bucket's missing tokens). The rate count/per µs is reduced and exact in
// ticks of 1/count µs: one permit is per ticks, a full bucket capacity ×
// per ticks, and one µs drains count ticks.
type bucket struct {
	algorithm string
	per       int64 // ticks per permit
	count     int64 // ticks drained per µs
	full      int64 // capacity × per
	window    time.Duration
	store     *store[bucketState]
}

type bucketState struct {
	atUS  int64 // when level was taken
	level int64 // ticks; > 0 in any stored state
}

func newBucket(algorithm, field string, capacity int, rate redlimit.Rate, opts []Option) (bucket, error) {
	count, perUS, err := engine.CheckBucket(redlimit.ErrInvalidConfig, "inmem "+algorithm, field, capacity, rate.Count, rate.Per)
	if err != nil {
		return bucket{}, err
	}
	o, err := newOptions(algorithm, opts)
	if err != nil {
		return bucket{}, err
	}
	b := bucket{algorithm: algorithm, per: perUS, count: count, full: int64(capacity) * perUS,
		window: time.Duration(ceilDiv(int64(capacity)*perUS, count)) * time.Microsecond}
	b.store = newStore(o, b.used)
	return b, nil
}

// AllowN takes n permits for key if all n are available, else none. err is
// non-nil only for a key that is empty or longer than redlimit.MaxKeyBytes,
// n < 0, a nil ctx or a clock outside 2001 to 2112
// (redlimit.ErrInvalidArgument).
// n == 0 reports the state; n above the capacity is denied with RetryAfter
// redlimit.Never.
func (b *bucket) AllowN(ctx context.Context, key string, n int) (redlimit.Result, error) {
	if err := checkCall(ctx, b.algorithm, key, n); err != nil {
		return redlimit.Result{}, err
	}
	now, err := b.store.nowUS(ctx, b.algorithm)
	if err != nil {
		return redlimit.Result{}, err
	}
	sh := b.store.shard(key)
	sh.mu.Lock()
	e := sh.m[key]
	var s bucketState
	if e != nil {
		s = e.state
	}
	r, resetUS, write := b.decide(&s, now, int64(n))
	if write {
		sh.put(b.store, key, e, s, now, resetUS)
	}
	sh.mu.Unlock()
	return r, nil
}

// levelAt is the level at t: drained since s.atUS, or, when the clock went
// back, risen by as much, within [0, full]. clamped reports a level that
// would pass full: the clock went back by more than the level had drained.
func (b *bucket) levelAt(s bucketState, t int64) (level int64, clamped bool) {
	if s.level == 0 {
		return 0, false
	}
	if t >= s.atUS {
		if d := t - s.atUS; d < ceilDiv(s.level, b.count) {
			return s.level - d*b.count, false
		}
		return 0, false
	}
	if d := s.atUS - t; d <= (b.full-s.level)/b.count {
		return s.level + d*b.count, false
	}
	return b.full, true
}

// decide decides at t on s and reports whether s must be stored: after a
// grant, or when the clock went back so far that the level was cut to
// full (so that the key is never locked out for longer than a full bucket
// drains). A denial or n == 0 changes nothing else, as in the scripts: a
// bucket that drained keeps when it did, should the clock go back before.
func (b *bucket) decide(s *bucketState, t, n int64) (redlimit.Result, int64, bool) {
	level, write := b.levelAt(*s, t)
	need := n * b.per
	r := redlimit.Result{Limit: int(b.full / b.per)}
	switch {
	case n > b.full/b.per:
		r.RetryAfter = redlimit.Never
	case level+need <= b.full:
		r.Allowed = true
		level += need
		write = write || n > 0
	default:
		r.RetryAfter = microsDuration(ceilDiv(level+need-b.full, b.count))
	}
	*s = bucketState{atUS: t, level: level}
	r.Remaining = int((b.full - level) / b.per)
	resetUS := ceilDiv(level, b.count)
	r.ResetAfter = microsDuration(resetUS)
	return r, resetUS, write
}

// used is the share of the bucket s has in use at t.
func (b *bucket) used(s *bucketState, t int64) float64 {
	level, _ := b.levelAt(*s, t)
	return float64(level) / float64(b.full)
}

// Allow is AllowN(ctx, key, 1).
func (b *bucket) Allow(ctx context.Context, key string) (redlimit.Result, error) {
	return b.AllowN(ctx, key, 1)
}

// TryAcquire takes one permit for key: nil when allowed, a
// *redlimit.ViolationStrategyError (matching redlimit.ErrAcquireFailed)
// whose Window is the time the bucket takes to drain or refill completely.
func (b *bucket) TryAcquire(ctx context.Context, key string) error {
	return tryAcquire(ctx, b, key, func(redlimit.Result) time.Duration { return b.window })
}

// Reset forgets all state of key.
func (b *bucket) Reset(ctx context.Context, key string) error {
	if err := checkCall(ctx, b.algorithm, key, 0); err != nil {
		return err
	}
	return b.store.reset(b.algorithm, key)
}
