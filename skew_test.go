package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/skew"
	"github.com/redlimit/redlimit/internal/testseed"
)

// skewConfig is the configuration every algorithm is built with in the
// skewed-clock traces: 5 per 100ms (buckets of 10ms; a token every 20ms).
const (
	skewLimit  = 5
	skewPeriod = 100 * time.Millisecond
)

// skewAllowance is the most alg, built with algorithm.new(rdb, skewLimit,
// skewPeriod), grants one caller in any interval of d µs.
func skewAllowance(alg algorithm) skew.Allowance {
	limit, periodUS := int64(skewLimit), skewPeriod.Microseconds()
	switch alg.name {
	case "fixed_window":
		return skew.FixedWindow(limit, periodUS)
	case "sliding_window":
		return skew.Sliding(periodUS/10, []int64{limit}, []int64{10})
	case "sliding_log":
		return skew.Sliding(periodUS/10, []int64{limit, 2 * limit}, []int64{10, 100})
	default: // the buckets: capacity limit, limit per period
		return skew.Bucket(limit, limit, periodUS)
	}
}

// TestSkewedClocksStayWithinBound runs random traces of two or three
// callers sharing a key, whose clocks are up to a bucket (10ms) apart,
// calling in a random order, and checks DESIGN's bound ("A key's time"):
// in any interval of real time, the grants never exceed what the
// configuration grants in that interval lengthened by the clocks' spread.
// A key's time that ratchets forward (an offset growing with each call
// from a clock behind) or a clamp written back from a clock behind breaks
// it within a few dozen calls.
func TestSkewedClocksStayWithinBound(t *testing.T) {
	traces, calls := 8, 200
	if testing.Short() {
		traces, calls = 3, 120
	}
	offset := testseed.Offset(t)
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, b backend) {
				b.keepKeys()
				ctx := context.Background()
				var clockUS int64
				l, err := alg.new(b.rdb, skewLimit, skewPeriod, WithClock(func() time.Time { return time.UnixMicro(clockUS) }))
				require.NoError(t, err)
				for trace := range traces {
					seed := uint64(trace) + offset
					rng := rand.New(rand.NewPCG(seed, 34))
					// A spread from 1µs to a bucket, and the 1ms of the
					// issue's finding.
					spread := 1 + rng.Int64N(10_000)
					if trace == 0 {
						spread = 1000
					}
					skews := skew.Skews(rng, 2+rng.IntN(2), spread)
					key := fmt.Sprintf("skew-%d", trace)
					var grants []skew.Grant
					for i, c := range skew.Trace(rng, calls, epoch.UnixMicro(), skews, 3000, 300_000, 2) {
						clockUS = c.ClockUS
						r, err := l.AllowN(ctx, key, c.N)
						require.NoError(t, err, "call %d", i)
						if r.Allowed {
							grants = append(grants, skew.Grant{RealUS: c.RealUS, N: int64(c.N)})
						}
					}
					require.NoError(t, skew.Check(grants, spread, skewAllowance(alg)),
						"trace %d (seed %d): clocks skewed by %vµs", trace, seed, skews)
				}
			})
		})
	}
}
