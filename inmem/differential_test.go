package inmem

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
)

const (
	ms = time.Millisecond
	us = time.Microsecond
)

// fakeClock is a settable clock for WithClock.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time          { return c.now }
func (c *fakeClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

var epoch = time.Unix(1_800_000_000, 0)

// diffCase pairs an in-process limiter with the reference model of the
// same configuration.
type diffCase struct {
	name  string
	make  func(opts ...Option) (redlimit.Limiter, error)
	model model.Model
	scale time.Duration
}

// randomDiffCases draws configurations as the root package's differential
// test does for the scripts: small limits, rates that are not whole µs per
// permit.
func randomDiffCases(rng *rand.Rand) []diffCase {
	precision := time.Duration(1+rng.IntN(200)) * ms
	limit := 1 + rng.IntN(8)
	window := precision * time.Duration(1+rng.IntN(30))
	fwWindow := time.Duration(1+rng.IntN(2000)) * ms
	capacity := 1 + rng.IntN(8)
	rate := redlimit.Rate{Count: 1 + rng.IntN(7), Per: time.Duration(1+rng.IntN(3000))*ms + time.Duration(rng.IntN(1000))*us}
	strategies := []redlimit.Strategy{
		{Limit: limit, Window: window},
		{Limit: limit + 1 + rng.IntN(10), Window: window * time.Duration(2+rng.IntN(5))},
		{Limit: limit + 12 + rng.IntN(10), Window: window * time.Duration(12+rng.IntN(20))},
	}
	return []diffCase{
		{
			name:  fmt.Sprintf("fixed_window(%d per %v)", limit, fwWindow),
			make:  func(opts ...Option) (redlimit.Limiter, error) { return NewFixedWindow(limit, fwWindow, opts...) },
			model: model.NewFixedWindow(int64(limit), fwWindow.Microseconds()),
			scale: fwWindow,
		},
		{
			name: fmt.Sprintf("sliding_window(%d per %v by %v)", limit, window, precision),
			make: func(opts ...Option) (redlimit.Limiter, error) {
				return NewSlidingWindow(limit, window, precision, opts...)
			},
			model: model.NewSlidingWindow(int64(limit), window.Microseconds(), precision.Microseconds()),
			scale: window,
		},
		{
			name: fmt.Sprintf("sliding_log(%v by %v)", strategies, precision),
			make: func(opts ...Option) (redlimit.Limiter, error) {
				return NewSlidingLog(precision, strategies, opts...)
			},
			model: model.NewSlidingLog(precision.Microseconds(),
				[]int64{int64(strategies[0].Limit), int64(strategies[1].Limit), int64(strategies[2].Limit)},
				[]int64{strategies[0].Window.Microseconds(), strategies[1].Window.Microseconds(), strategies[2].Window.Microseconds()}),
			scale: strategies[1].Window,
		},
		{
			name:  fmt.Sprintf("leaky_bucket(%d at %d per %v)", capacity, rate.Count, rate.Per),
			make:  func(opts ...Option) (redlimit.Limiter, error) { return NewLeakyBucket(capacity, rate, opts...) },
			model: model.NewLeakyBucket(int64(capacity), int64(rate.Count), rate.Per.Microseconds()),
			scale: rate.Per * time.Duration(capacity) / time.Duration(rate.Count),
		},
		{
			name:  fmt.Sprintf("token_bucket(%d at %d per %v)", capacity, rate.Count, rate.Per),
			make:  func(opts ...Option) (redlimit.Limiter, error) { return NewTokenBucket(capacity, rate, opts...) },
			model: model.NewTokenBucket(int64(capacity), int64(rate.Count), rate.Per.Microseconds()),
			scale: rate.Per * time.Duration(capacity) / time.Duration(rate.Count),
		},
	}
}

// timeStep is the root differential test's: often zero, often a sliver of
// the scale, sometimes most of it, now and then several times it.
func timeStep(rng *rand.Rand, scale time.Duration) time.Duration {
	scaleUS := max(scale.Microseconds(), 10)
	var stepUS int64
	switch p := rng.IntN(100); {
	case p < 25:
		stepUS = 0
	case p < 35:
		stepUS = 1 + rng.Int64N(3)
	case p < 75:
		stepUS = rng.Int64N(scaleUS/10 + 1)
	case p < 95:
		stepUS = rng.Int64N(scaleUS + 1)
	default:
		stepUS = scaleUS + rng.Int64N(5*scaleUS)
	}
	return time.Duration(stepUS) * us
}

// TestDifferential drives every in-process limiter and its reference model
// with the same seeded random traces and requires the same Result at every
// step, to the microsecond. The seeds and steps are the root package's,
// and more configurations, since a step costs nanoseconds here.
func TestDifferential(t *testing.T) {
	t.Parallel()
	configs, steps := 40, 3000
	if testing.Short() { // the root package's configurations only
		configs = 4
	}
	ctx := context.Background()
	offset := testseed.Offset(t)
	for c := range configs {
		seed := uint64(1000+c) + offset
		rng := rand.New(rand.NewPCG(seed, 0))
		for _, dc := range randomDiffCases(rng) {
			t.Run(fmt.Sprintf("seed%d/%s", seed, dc.name), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 1))
				clock := &fakeClock{now: epoch.Add(time.Duration(rng.Int64N(int64(time.Hour))))}
				l, err := dc.make(WithClock(clock.Now))
				require.NoError(t, err)
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
					if rng.IntN(50) == 0 {
						n = 30 // above every capacity here: Never
					}
					got, err := l.AllowN(ctx, "k", n)
					require.NoError(t, err, "step %d", i)
					m := dc.model.Step(clock.now.UnixMicro(), int64(n))
					want := redlimit.Result{
						Allowed:    m.Allowed,
						Limit:      int(m.Limit),
						Remaining:  int(m.Remaining),
						RetryAfter: time.Duration(m.RetryAfterUS) * us,
						ResetAfter: time.Duration(m.ResetAfterUS) * us,
					}
					if m.RetryAfterUS == model.Never {
						want.RetryAfter = redlimit.Never
					}
					require.Equal(t, want, withoutGrant(got), "step %d at +%dµs since epoch, n=%d", i, clock.now.Sub(epoch).Microseconds(), n)
				}
			})
		}
	}
}
