package inmem

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/skew"
	"github.com/redlimit/redlimit/internal/testseed"
)

// TestSkewedClocksStayWithinBound is the root package's test of the same
// name for the in-process limiters: one limiter whose clock reads, call by
// call, the time of one of two or three callers up to a bucket (10ms)
// apart. Its keys keep their time as the scripts' do (DESIGN "A key's
// time"), so the fallback is held to the same bound.
func TestSkewedClocksStayWithinBound(t *testing.T) {
	const limit, period = 5, 100 * time.Millisecond
	periodUS := period.Microseconds()
	cases := []struct {
		name  string
		new   func(opts ...Option) (redlimit.Limiter, error)
		allow skew.Allowance
	}{
		{"fixed_window", func(opts ...Option) (redlimit.Limiter, error) {
			return NewFixedWindow(limit, period, opts...)
		}, skew.FixedWindow(limit, periodUS)},
		{"sliding_window", func(opts ...Option) (redlimit.Limiter, error) {
			return NewSlidingWindow(limit, period, period/10, opts...)
		}, skew.Sliding(periodUS/10, []int64{limit}, []int64{10})},
		{"sliding_log", func(opts ...Option) (redlimit.Limiter, error) {
			return NewSlidingLog(period/10, []redlimit.Strategy{{Limit: limit, Window: period}, {Limit: 2 * limit, Window: 10 * period}}, opts...)
		}, skew.Sliding(periodUS/10, []int64{limit, 2 * limit}, []int64{10, 100})},
		{"leaky_bucket", func(opts ...Option) (redlimit.Limiter, error) {
			return NewLeakyBucket(limit, redlimit.Rate{Count: limit, Per: period}, opts...)
		}, skew.Bucket(limit, limit, periodUS)},
		{"token_bucket", func(opts ...Option) (redlimit.Limiter, error) {
			return NewTokenBucket(limit, redlimit.Rate{Count: limit, Per: period}, opts...)
		}, skew.Bucket(limit, limit, periodUS)},
	}
	offset := testseed.Offset(t)
	start := time.Unix(1_800_000_000, 0).UnixMicro()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var clockUS int64
			l, err := tc.new(WithClock(func() time.Time { return time.UnixMicro(clockUS) }))
			require.NoError(t, err)
			for trace := range 20 {
				seed := uint64(trace) + offset
				rng := rand.New(rand.NewPCG(seed, 34))
				spread := 1 + rng.Int64N(10_000)
				if trace == 0 {
					spread = 1000
				}
				skews := skew.Skews(rng, 2+rng.IntN(2), spread)
				key := fmt.Sprintf("skew-%d", trace)
				var grants []skew.Grant
				for i, c := range skew.Trace(rng, 300, start, skews, 3000, 300_000, 2) {
					clockUS = c.ClockUS
					r, err := l.AllowN(context.Background(), key, c.N)
					require.NoError(t, err, "call %d", i)
					if r.Allowed {
						grants = append(grants, skew.Grant{RealUS: c.RealUS, N: int64(c.N)})
					}
				}
				require.NoError(t, skew.Check(grants, spread, tc.allow),
					"trace %d (seed %d): clocks skewed by %vµs", trace, seed, skews)
			}
		})
	}
}
