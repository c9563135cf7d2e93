package inmem

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
)

// TestClockBackAfterLook is the finding of a fallback that granted what
// Redis denies: a call that only looks (n == 0) at a key back in its
// initial state must not forget what the key held, since the clock may go
// back into the time it was in use.
func TestClockBackAfterLook(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		make  func(opts ...Option) (redlimit.Limiter, error)
		burst int
	}{
		{"token_bucket", func(opts ...Option) (redlimit.Limiter, error) {
			return NewTokenBucket(1, redlimit.PerSecond(1), opts...)
		}, 1},
		{"leaky_bucket", func(opts ...Option) (redlimit.Limiter, error) {
			return NewLeakyBucket(1, redlimit.PerSecond(1), opts...)
		}, 1},
		{"fixed_window", func(opts ...Option) (redlimit.Limiter, error) { return NewFixedWindow(3, time.Second, opts...) }, 3},
		{"sliding_window", func(opts ...Option) (redlimit.Limiter, error) {
			return NewSlidingWindow(3, time.Second, 100*time.Millisecond, opts...)
		}, 3},
		{"sliding_log", func(opts ...Option) (redlimit.Limiter, error) {
			return NewSlidingLog(100*time.Millisecond, []redlimit.Strategy{{Limit: 3, Window: time.Second}, {Limit: 6, Window: 2 * time.Second}}, opts...)
		}, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := &fakeClock{now: epoch}
			l, err := c.make(WithClock(clock.Now))
			require.NoError(t, err)
			r, err := l.AllowN(ctx, "k", c.burst)
			require.NoError(t, err)
			require.True(t, r.Allowed, "a fresh key grants its burst")
			clock.Advance(2 * time.Second)
			r, err = l.AllowN(ctx, "k", 0)
			require.NoError(t, err)
			require.Equal(t, c.burst, r.Remaining, "2s later the key is back to initial")
			require.Zero(t, r.ResetAfter, "2s later the key is back to initial")
			clock.Advance(-1500 * time.Millisecond)
			r, err = l.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, r.Allowed, "the clock went back to 0.5s after the burst: Redis and the model deny: %+v", r)
			require.Equal(t, 500*ms, r.RetryAfter, "the wait the script gives")
		})
	}
}

// TestDifferentialClockBackwards is TestDifferential with a clock that
// also jumps back: every in-process limiter gives the Result of its
// reference model, stepped as the scripts keep state (model.StepStored),
// to the microsecond. What the models define then: a window ends no later
// than its length from now; a sliding key's time stands still at its last
// grant's bucket until the clock catches up, so a shorter window of a
// sliding log takes back the buckets it had let go; a bucket's level rises
// as the clock goes back, up to full.
func TestDifferentialClockBackwards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seeds := 40
	if testing.Short() {
		seeds = 10
	}
	offset := testseed.Offset(t)
	for c := range seeds {
		seed := uint64(5000+c) + offset
		rng := rand.New(rand.NewPCG(seed, 0))
		for _, dc := range randomDiffCases(rng) {
			t.Run(fmt.Sprintf("seed%d/%s", seed, dc.name), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 1))
				clock := &fakeClock{now: epoch.Add(time.Duration(rng.Int64N(int64(time.Hour))))}
				l, err := dc.make(WithClock(clock.Now))
				require.NoError(t, err)
				dc.model.Reset()
				for i := range 2000 {
					step := timeStep(rng, dc.scale)
					if rng.IntN(6) == 0 {
						step = -step
					}
					clock.Advance(step)
					n := backwardsN(rng)
					got, err := l.AllowN(ctx, "k", n)
					require.NoError(t, err)
					m := model.StepStored(dc.model, clock.now.UnixMicro(), int64(n))
					require.Equal(t, modelResult(m), withoutGrant(got), "step %d (%v), n=%d", i, step, n)
				}
			})
		}
	}
}

// backwardsN is n for the clock-back traces: often 1, often 0 (a look,
// which must change nothing), sometimes more, now and then above every
// capacity.
func backwardsN(rng *rand.Rand) int {
	switch p := rng.IntN(100); {
	case p < 50:
		return 1
	case p < 75:
		return 0
	case p < 98:
		return 2 + rng.IntN(2)
	default:
		return 30
	}
}

// withoutGrant is r without its Grant, to compare Results of limiters that
// name grants differently (a model's, the script's and this package's).
func withoutGrant(r redlimit.Result) redlimit.Result {
	r.Grant = redlimit.Grant{}
	return r
}

func modelResult(m model.Result) redlimit.Result {
	r := redlimit.Result{Allowed: m.Allowed, Limit: int(m.Limit), Remaining: int(m.Remaining),
		RetryAfter: time.Duration(m.RetryAfterUS) * us, ResetAfter: time.Duration(m.ResetAfterUS) * us}
	if m.RetryAfterUS == model.Never {
		r.RetryAfter = redlimit.Never
	}
	return r
}

// TestClockBackwardsAgreesWithScripts drives every in-process limiter and
// the Redis limiter of the same configuration (WithClock, on miniredis)
// with the same clock-back traces: the same Result at every step. Only on
// miniredis: its keys expire on its own clock, which these traces never
// move, as a WithClock limiter on a real server sees until the TTL passes
// in real time (within the traces' milliseconds, on a real server, keys
// would expire while the fake clock still counts on them).
func TestClockBackwardsAgreesWithScripts(t *testing.T) {
	t.Parallel()
	rdb := miniClient(t)
	ctx := context.Background()
	seeds, steps := 8, 500
	if testing.Short() {
		seeds, steps = 2, 250
	}
	offset := testseed.Offset(t)
	for c := range seeds {
		seed := uint64(7000+c) + offset
		rng := rand.New(rand.NewPCG(seed, 0))
		for k, dc := range randomDiffCases(rng) {
			t.Run(fmt.Sprintf("seed%d/%s", seed, dc.name), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 1))
				clock := &fakeClock{now: epoch.Add(time.Duration(rng.Int64N(int64(time.Hour))))}
				l, err := dc.make(WithClock(clock.Now))
				require.NoError(t, err)
				script, err := redisTwin(rdb, dc.name, k, l, redlimit.WithClock(clock.Now), redlimit.WithPrefix(fmt.Sprintf("twin:%d:%d:", seed, k)))
				require.NoError(t, err)
				for i := range steps {
					step := timeStep(rng, dc.scale)
					if rng.IntN(6) == 0 {
						step = -step
					}
					clock.Advance(step)
					n := backwardsN(rng)
					want, err := script.AllowN(ctx, "k", n)
					require.NoError(t, err)
					got, err := l.AllowN(ctx, "k", n)
					require.NoError(t, err)
					require.Equal(t, withoutGrant(want), withoutGrant(got), "step %d (%v), n=%d: the script's Result", i, step, n)
				}
			})
		}
	}
}

// redisTwin builds the Redis limiter of in-process limiter l's
// configuration; k is l's place in randomDiffCases.
func redisTwin(rdb redis.Scripter, name string, k int, l redlimit.Limiter, opts ...redlimit.Option) (redlimit.Limiter, error) {
	switch l := l.(type) {
	case *FixedWindow:
		return redlimit.NewFixedWindow(rdb, int(l.limit), l.window, opts...)
	case *SlidingWindow:
		return redlimit.NewSlidingWindow(rdb, int(l.limits[0]), l.strategies[0].Window, time.Duration(l.precisionUS)*us, opts...)
	case *SlidingLog:
		return redlimit.NewSlidingLog(rdb, time.Duration(l.precisionUS)*us, l.strategies, opts...)
	case *LeakyBucket:
		return redlimit.NewLeakyBucket(rdb, int(l.full/l.per), redlimit.Rate{Count: int(l.count), Per: time.Duration(l.per) * us}, opts...)
	case *TokenBucket:
		return redlimit.NewTokenBucket(rdb, int(l.full/l.per), redlimit.Rate{Count: int(l.count), Per: time.Duration(l.per) * us}, opts...)
	}
	return nil, fmt.Errorf("%s (case %d): no Redis twin", name, k)
}
