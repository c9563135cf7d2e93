package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
)

// diffCase pairs a limiter with the reference model of the same
// configuration.
type diffCase struct {
	name  string
	make  func(rdb redis.Scripter, opts ...Option) (Limiter, error)
	model model.Model
	scale time.Duration // typical window or refill time, to size time steps
}

// randomDiffCases draws configurations of every algorithm from rng: small
// limits so that denials are frequent, and rates that are not whole
// microseconds per permit, so that exact fractions are exercised.
func randomDiffCases(rng *rand.Rand) []diffCase {
	precision := time.Duration(1+rng.IntN(200)) * ms
	limit := 1 + rng.IntN(8)
	window := precision * time.Duration(1+rng.IntN(30))
	fwWindow := time.Duration(1+rng.IntN(2000)) * ms
	capacity := 1 + rng.IntN(8)
	rate := Rate{Count: 1 + rng.IntN(7), Per: time.Duration(1+rng.IntN(3000))*ms + time.Duration(rng.IntN(1000))*us}
	strategies := []Strategy{
		{Limit: limit, Window: window},
		{Limit: limit + 1 + rng.IntN(10), Window: window * time.Duration(2+rng.IntN(5))},
		{Limit: limit + 12 + rng.IntN(10), Window: window * time.Duration(12+rng.IntN(20))},
	}
	return []diffCase{
		{
			name: fmt.Sprintf("fixed_window(%d per %v)", limit, fwWindow),
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewFixedWindow(rdb, limit, fwWindow, opts...)
			},
			model: model.NewFixedWindow(int64(limit), fwWindow.Microseconds()),
			scale: fwWindow,
		},
		{
			name: fmt.Sprintf("sliding_window(%d per %v by %v)", limit, window, precision),
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewSlidingWindow(rdb, limit, window, precision, opts...)
			},
			model: model.NewSlidingWindow(int64(limit), window.Microseconds(), precision.Microseconds()),
			scale: window,
		},
		{
			name: fmt.Sprintf("sliding_log(%v by %v)", strategies, precision),
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewSlidingLog(rdb, precision, strategies, opts...)
			},
			model: model.NewSlidingLog(precision.Microseconds(),
				[]int64{int64(strategies[0].Limit), int64(strategies[1].Limit), int64(strategies[2].Limit)},
				[]int64{strategies[0].Window.Microseconds(), strategies[1].Window.Microseconds(), strategies[2].Window.Microseconds()}),
			scale: strategies[1].Window,
		},
		{
			name: fmt.Sprintf("leaky_bucket(%d at %d per %v)", capacity, rate.Count, rate.Per),
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewLeakyBucket(rdb, capacity, rate, opts...)
			},
			model: model.NewLeakyBucket(int64(capacity), int64(rate.Count), rate.Per.Microseconds()),
			scale: rate.Per * time.Duration(capacity) / time.Duration(rate.Count),
		},
		{
			name: fmt.Sprintf("token_bucket(%d at %d per %v)", capacity, rate.Count, rate.Per),
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewTokenBucket(rdb, capacity, rate, opts...)
			},
			model: model.NewTokenBucket(int64(capacity), int64(rate.Count), rate.Per.Microseconds()),
			scale: rate.Per * time.Duration(capacity) / time.Duration(rate.Count),
		},
	}
}

// timeStep draws the next forward step of a trace: often zero, often a
// sliver of the scale, sometimes most of it, now and then several times it.
func timeStep(rng *rand.Rand, scale time.Duration) time.Duration {
	scaleUS := max(scale.Microseconds(), 10)
	var stepUS int64
	switch p := rng.IntN(100); {
	case p < 25:
		stepUS = 0
	case p < 35:
		stepUS = 1 + rng.Int64N(3) // microsecond edges
	case p < 75:
		stepUS = rng.Int64N(scaleUS/10 + 1)
	case p < 95:
		stepUS = rng.Int64N(scaleUS + 1)
	default:
		stepUS = scaleUS + rng.Int64N(5*scaleUS)
	}
	return time.Duration(stepUS) * us
}

// TestDifferential drives every script and its reference model with the
// same seeded random traces through WithClock and requires the same Result
// at every step: Allowed, Limit, Remaining, RetryAfter and ResetAfter, to
// the microsecond.
func TestDifferential(t *testing.T) {
	t.Parallel()
	configs, steps := shortOr(2, 4), shortOr(300, 1500)
	offset := testseed.Offset(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		b.keepKeys()
		for c := range configs {
			seed := uint64(1000+c) + offset
			rng := rand.New(rand.NewPCG(seed, 0))
			for _, dc := range randomDiffCases(rng) {
				t.Run(fmt.Sprintf("seed%d/%s", seed, dc.name), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(seed, 1))
					clock := &fakeClock{now: epoch.Add(time.Duration(rng.Int64N(int64(time.Hour))))}
					l, err := dc.make(b.rdb, WithClock(clock.Now), keysOf(c, "diff:"))
					require.NoError(t, err)
					require.NoError(t, l.Reset(ctx, "k"))
					dc.model.Reset()
					for i := range steps {
						clock.Advance(timeStep(rng, dc.scale))
						if rng.IntN(100) == 0 {
							require.NoError(t, l.Reset(ctx, "k"))
							dc.model.Reset()
						}
						n := rng.IntN(4)
						if rng.IntN(10) < 6 {
							n = 1
						}
						got, err := l.AllowN(ctx, "k", n)
						require.NoError(t, err, "step %d", i)
						m := dc.model.Step(clock.now.UnixMicro(), int64(n))
						want := Result{
							Allowed:    m.Allowed,
							Limit:      int(m.Limit),
							Remaining:  int(m.Remaining),
							RetryAfter: time.Duration(m.RetryAfterUS) * us,
							ResetAfter: time.Duration(m.ResetAfterUS) * us,
						}
						if m.RetryAfterUS == model.Never {
							want.RetryAfter = Never
						}
						require.Equal(t, want, withoutGrant(got), "step %d at %v (+%dµs since epoch), n=%d", i, clock.now, clock.now.Sub(epoch).Microseconds(), n)
					}
				})
			}
		}
	})
}

// keysOf returns the keys a trace runs on: for an even i, those under
// WithPrefix(prefix), which any configuration may share; for an odd one,
// the default keys, which carry their configuration's fingerprint (and so
// hold one configuration, which the scripts read the shorter way).
func keysOf(i int, prefix string) Option {
	if i%2 == 1 {
		return WithName("")
	}
	return WithPrefix(prefix)
}

// TestLeakyAndTokenBucketAgree requires identical Results from the two
// bucket scripts at equal capacity and rate, over random traces.
func TestLeakyAndTokenBucketAgree(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		if b.mini == nil {
			// These rates leave TTLs of milliseconds: one key could
			// expire and not the other.
			keepTTL(b.rdb, time.Hour)
		}
		rng := rand.New(rand.NewPCG(7+testseed.Offset(t), 7))
		for c := range shortOr(2, 5) {
			capacity := 1 + rng.IntN(10)
			rate := Rate{Count: 1 + rng.IntN(9), Per: time.Duration(1+rng.IntN(5000)) * ms}
			clock := newClock()
			leaky, err := NewLeakyBucket(b.rdb, capacity, rate, WithClock(clock.Now))
			require.NoError(t, err)
			token, err := NewTokenBucket(b.rdb, capacity, rate, WithClock(clock.Now))
			require.NoError(t, err)
			key := fmt.Sprintf("agree%d", c)
			scale := rate.Per * time.Duration(capacity) / time.Duration(rate.Count)
			for i := range shortOr(100, 500) {
				clock.Advance(timeStep(rng, scale))
				n := rng.IntN(capacity + 2)
				lr, err := leaky.AllowN(ctx, key, n)
				require.NoError(t, err)
				tr, err := token.AllowN(ctx, key, n)
				require.NoError(t, err)
				require.Equal(t, withoutGrant(lr), withoutGrant(tr), "config %d (capacity %d, %+v) step %d n=%d", c, capacity, rate, i, n)
			}
		}
	})
}

// TestRetryAfterIsExact checks RetryAfter by behaviour on every script: after
// a denial, the same request is still denied 1µs before RetryAfter has
// passed and allowed once it has. A denial consumes nothing, so the probe
// does not disturb the trace.
func TestRetryAfterIsExact(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		b.keepKeys()
		rng := rand.New(rand.NewPCG(42+testseed.Offset(t), 0))
		for _, dc := range randomDiffCases(rng) {
			t.Run(dc.name, func(t *testing.T) {
				clock := newClock()
				prefix := "retry:" + dc.name + ":"
				l, err := dc.make(b.rdb, WithClock(clock.Now), keysOf(rng.IntN(2), prefix))
				require.NoError(t, err)
				require.NoError(t, l.Reset(ctx, "k"))
				probes := 0
				for i := 0; probes < 40 && i < 5000; i++ {
					clock.Advance(timeStep(rng, dc.scale) / 4)
					n := 1 + rng.IntN(2)
					r, err := l.AllowN(ctx, "k", n)
					require.NoError(t, err)
					if r.Allowed || r.RetryAfter == Never {
						continue
					}
					probes++
					start := clock.now
					clock.now = start.Add(r.RetryAfter - us)
					early, err := l.AllowN(ctx, "k", n)
					require.NoError(t, err)
					require.False(t, early.Allowed, "step %d: denied with RetryAfter %v, but allowed 1µs before it", i, r.RetryAfter)
					clock.now = start.Add(r.RetryAfter)
					onTime, err := l.AllowN(ctx, "k", n)
					require.NoError(t, err)
					require.True(t, onTime.Allowed, "step %d: denied with RetryAfter %v, still denied after it (%+v)", i, r.RetryAfter, onTime)
				}
				require.Greater(t, probes, 10, "the trace should deny often enough to probe")
			})
		}
	})
}
