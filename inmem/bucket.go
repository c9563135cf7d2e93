package inmem

import (
	"context"
	"strconv"
	"strings"
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
// per ticks, and one µs drains count ticks. It keeps what the scripts keep
// (scripts/gcra.lua, one rate): the key's time, the level then, and the
// positions refunds need, so that it decides and refunds as they do.
type bucket struct {
	algorithm string
	per       int64 // ticks per permit
	count     int64 // ticks drained per µs
	full      int64 // capacity × per
	fullUS    int64 // the µs a full bucket takes to drain
	window    time.Duration
	store     *store[bucketState]
	clock     // what it decides on (store.go): WithClock's, or OnClock's
}

// bucketState is a key's level at its time and, once refunded, its
// permits' positions: every permit holds a tick position in the order
// they drain, never reused. At keyUS the drain is at (keyUS + driftUS) µs
// and driftTicks ticks (0 and 0 until a refund moved it ahead of the
// clock); the ranges given back (ticks past the drain, sorted, apart) are
// skipped by it; a grant starting before the horizon gives nothing back.
type bucketState struct {
	keyUS      int64 // the key's time: the latest clock a grant read
	level      int64 // ticks at keyUS
	driftUS    int64
	driftTicks int64 // in [0, count)
	horizon    int64 // ticks past the drain; 0: none
	ranges     []refundRange
}

var _ engine.Refunder = (*bucket)(nil)

func newBucket(algorithm, field string, capacity int, rate redlimit.Rate, opts []Option) (bucket, error) {
	count, perUS, err := engine.CheckBucket(redlimit.ErrInvalidConfig, "inmem "+algorithm, field, capacity, rate.Count, rate.Per)
	if err != nil {
		return bucket{}, err
	}
	o, err := newOptions(algorithm, opts)
	if err != nil {
		return bucket{}, err
	}
	full := int64(capacity) * perUS
	b := bucket{algorithm: algorithm, per: perUS, count: count, full: full, fullUS: ceilDiv(full, count)}
	b.window = time.Duration(b.fullUS) * time.Microsecond
	b.clock = newClock(o)
	b.store = newStore(o, b.used)
	return b, nil
}

// AllowN takes n permits for key if all n are available, else none. err is
// non-nil only for a key that is empty or longer than redlimit.MaxKeyBytes,
// n < 0, a nil ctx or a clock outside 2001 to 2112
// (redlimit.ErrInvalidArgument).
// n == 0 reports the state; n above the capacity is denied with RetryAfter
// redlimit.Never. An allowed call with n > 0 carries a Grant that refunds.
func (b *bucket) AllowN(ctx context.Context, key string, n int) (redlimit.Result, error) {
	if err := checkCall(ctx, b.algorithm, key, n); err != nil {
		return redlimit.Result{}, err
	}
	now, err := b.store.nowUS(b.clock, b.algorithm)
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
	r, resetUS, token := b.decide(&s, now, int64(n))
	if token != "" {
		sh.put(b.store, key, e, s, now, max(resetUS, b.ends(s)))
	}
	sh.mu.Unlock()
	if token != "" {
		r.Grant = engine.NewGrant(b, key, n, token)
	}
	return r, nil
}

// at returns the key's time for a call at now (the later of the two),
// whether the clock is gone wrong (behind it by more than a full drain:
// the call then decides at now on a full bucket), and the level then.
func (b *bucket) at(s bucketState, now int64) (t int64, wrong bool, level int64) {
	t = now
	if s.keyUS > now {
		if s.keyUS-now > b.fullUS {
			return now, true, b.full
		}
		t = s.keyUS
	}
	if d := t - s.keyUS; d < ceilDiv(s.level, b.count) {
		return t, false, s.level - d*b.count
	}
	return t, false, 0
}

// decide decides at now on s, and returns the grant's token ("" unless
// granted with n > 0: only a grant changes s). A call decides as at the
// key's time, durations included.
func (b *bucket) decide(s *bucketState, now, n int64) (redlimit.Result, int64, string) {
	t, _, level := b.at(*s, now)
	need := n * b.per
	r := redlimit.Result{Limit: int(b.full / b.per)}
	token := ""
	switch {
	case n > b.full/b.per:
		r.RetryAfter = redlimit.Never
	case level+need <= b.full:
		r.Allowed = true
		if n > 0 {
			token = b.grant(s, t, level, need, n)
			level = s.level
		}
	default:
		r.RetryAfter = microsDuration(ceilDiv(level+need-b.full, b.count))
	}
	r.Remaining = int((b.full - level) / b.per)
	resetUS := ceilDiv(level, b.count)
	r.ResetAfter = microsDuration(resetUS)
	return r, resetUS, token
}

// grant adds need ticks to s at the key's time t, where the level is
// level, and returns the grant's token: its permits and where its
// positions end (µs, then "+" the ticks past them), as the scripts write
// it. The positions move to t first: the drain's, past what drained and
// the ranges it skipped, and at least to t when the bucket is empty.
func (b *bucket) grant(s *bucketState, t, level, need, n int64) string {
	moved := b.drainedTo(*s, level)
	pos := (s.driftUS+s.keyUS-t)*b.count + s.driftTicks + moved
	if level == 0 && pos < 0 {
		pos = 0
	}
	var ranges []refundRange
	for _, g := range s.ranges {
		if g.lo > moved {
			ranges = append(ranges, refundRange{g.lo - moved, g.hi - moved})
		}
	}
	horizon := max(0, s.horizon-moved)
	*s = bucketState{keyUS: t, level: level + need, horizon: horizon, ranges: ranges}
	s.driftUS, s.driftTicks = floorDiv(pos, b.count), 0
	s.driftTicks = pos - s.driftUS*b.count
	end := s.driftTicks + s.level
	for _, g := range s.ranges {
		end += g.hi - g.lo
	}
	token := strconv.FormatInt(n, 10) + ":" + strconv.FormatInt(t+s.driftUS+floorDiv(end, b.count), 10)
	if frac := end - floorDiv(end, b.count)*b.count; frac > 0 {
		token += "+" + strconv.FormatInt(frac, 10)
	}
	return token
}

// drainedTo returns how far s's drain moved from its time to where the
// level is level, in ticks past its drain then: the ticks drained and
// the ranges given back that it skipped (a range it reaches, whole).
func (b *bucket) drainedTo(s bucketState, level int64) int64 {
	pos, left := int64(0), s.level-level
	for _, g := range s.ranges {
		if pos+left < g.lo {
			break
		}
		left, pos = left-(g.lo-pos), g.hi
	}
	return pos + left
}

// ends returns the µs from s's time until its drain reaches the end of
// its positions: a state kept that long reuses none.
func (b *bucket) ends(s bucketState) int64 {
	end := s.driftUS*b.count + s.driftTicks + s.level
	for _, g := range s.ranges {
		end += g.hi - g.lo
	}
	return ceilDiv(max(end, 0), b.count)
}

// RefundGrant gives back permits of the grant token names on key until k
// of them in all have been given back, as far as they are still in the
// bucket (those its positions hold that the drain has not reached), from
// the last. A clock gone wrong, a grant before the horizon or a token
// this bucket did not make gives nothing back; no error but for bad
// arguments.
func (b *bucket) RefundGrant(ctx context.Context, key, token string, took, k int) error {
	if err := checkCall(ctx, b.algorithm, key, k); err != nil {
		return err
	}
	now, err := b.store.nowUS(b.clock, b.algorithm)
	if err != nil {
		return err
	}
	sh := b.store.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[key]; e != nil {
		b.refund(&e.state, now, token, int64(k))
	}
	return nil
}

// refund is RefundGrant on s at now; it returns the ticks given back.
// What of the grant's positions the drain has not reached and no refund
// gave back leaves the level, from their end, up to the k asked beyond
// what it gave back before.
func (b *bucket) refund(s *bucketState, now int64, token string, k int64) int64 {
	_, wrong, level := b.at(*s, now)
	took, endUS, frac, ok := parseBucketToken(token)
	if wrong || level == 0 || !ok {
		return 0
	}
	end := (endUS-s.keyUS-s.driftUS)*b.count + frac - s.driftTicks
	start := end - took*b.per
	tail := s.level
	for _, g := range s.ranges {
		tail += g.hi - g.lo
	}
	moved := b.drainedTo(*s, level)
	if end <= moved || end > tail || (s.horizon > 0 && start < s.horizon) {
		return 0
	}
	gave, top := int64(0), end
	for _, g := range s.ranges {
		if g.lo < end && end <= g.hi {
			top = max(g.lo, start)
			gave = end - top
		}
	}
	more := min(k*b.per-gave, top-max(moved, start))
	if more <= 0 {
		return 0
	}
	s.level -= more
	b.giveRange(s, top-more, top)
	return more
}

// giveRange records [lo, hi) as given back, merged with the ranges it
// touches; past maxRefundRanges the lowest goes: the drain moves past it
// at once (the level stays: the grants before it look drained sooner,
// stricter) and the horizon rises to its end, as in the scripts.
func (b *bucket) giveRange(s *bucketState, lo, hi int64) {
	ranges := mergeRange(s.ranges, lo, hi)
	if len(ranges) > maxRefundRanges {
		gone, size := ranges[0], ranges[0].hi-ranges[0].lo
		ranges = ranges[1:]
		for i := range ranges {
			ranges[i] = refundRange{ranges[i].lo - size, ranges[i].hi - size}
		}
		s.horizon = max(s.horizon, gone.hi) - size
		pos := s.driftTicks + size
		s.driftUS += floorDiv(pos, b.count)
		s.driftTicks = pos - floorDiv(pos, b.count)*b.count
	}
	s.ranges = ranges
}

// parseBucketToken reads a token grant made: "<took>:<end>[+<frac>]".
func parseBucketToken(token string) (took, end, frac int64, ok bool) {
	tookText, rest, ok1 := strings.Cut(token, ":")
	endText, fracText, hasFrac := strings.Cut(rest, "+")
	var err1, err2, err3 error
	took, err1 = strconv.ParseInt(tookText, 10, 64)
	end, err2 = strconv.ParseInt(endText, 10, 64)
	if hasFrac {
		frac, err3 = strconv.ParseInt(fracText, 10, 64)
	}
	return took, end, frac, ok1 && err1 == nil && err2 == nil && err3 == nil && took > 0 && frac >= 0
}

// used is the share of the bucket s has in use at t.
func (b *bucket) used(s *bucketState, t int64) float64 {
	_, _, level := b.at(*s, t)
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

// OnClock returns a view of l that decides on now: the same
// configuration and the same keys (what either grants, the other sees),
// on another clock. The view's Grants refund through the view, on
// now. When l was built with WithClock (its own clock wins), or now is
// nil, OnClock returns l. redlimit.WithFallback calls it with the Redis
// limiter's clock (redlimit.WithClock).
func (l *LeakyBucket) OnClock(now func() time.Time) redlimit.Limiter { return onClock(l, now) }

// OnClock returns a view of l that decides on now: the same
// configuration and the same keys (what either grants, the other sees),
// on another clock. The view's Grants refund through the view, on
// now. When l was built with WithClock (its own clock wins), or now is
// nil, OnClock returns l. redlimit.WithFallback calls it with the Redis
// limiter's clock (redlimit.WithClock).
func (l *TokenBucket) OnClock(now func() time.Time) redlimit.Limiter { return onClock(l, now) }

// Reset forgets all state of key.
func (b *bucket) Reset(ctx context.Context, key string) error {
	if err := checkCall(ctx, b.algorithm, key, 0); err != nil {
		return err
	}
	return b.store.reset(b.algorithm, key)
}
