package inmem

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/testseed"
)

// The in-process buckets refund as the scripts do: the same random traces
// of grants, denials, n == 0 and refunds (of any grant, twice, past what
// was given back, from a clock that went back) on an in-process bucket and
// on the Redis bucket of the same configuration give the same Result at
// every step.
func TestBucketRefundsAgreeWithScripts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := miniClient(t)
	offset := testseed.Offset(t)
	for c := range 6 {
		seed := uint64(c) + offset
		rng := rand.New(rand.NewPCG(seed, 35))
		capacity := 1 + rng.IntN(8)
		rate := redlimit.Rate{Count: 1 + rng.IntN(4), Per: time.Duration(1+rng.IntN(1000)) * ms}
		full := time.Duration(int64(capacity) * int64(rate.Per) / int64(rate.Count))
		for _, leaky := range []bool{true, false} {
			t.Run(fmt.Sprintf("seed%d/leaky=%v", seed, leaky), func(t *testing.T) {
				clock := &fakeClock{now: epoch}
				var l, script redlimit.Limiter
				var err error
				prefix := redlimit.WithPrefix(fmt.Sprintf("refund:%d:%v:", seed, leaky))
				if leaky {
					l, err = NewLeakyBucket(capacity, rate, WithClock(clock.Now))
					require.NoError(t, err)
					script, err = redlimit.NewLeakyBucket(rdb, capacity, rate, redlimit.WithClock(clock.Now), prefix)
				} else {
					l, err = NewTokenBucket(capacity, rate, WithClock(clock.Now))
					require.NoError(t, err)
					script, err = redlimit.NewTokenBucket(rdb, capacity, rate, redlimit.WithClock(clock.Now), prefix)
				}
				require.NoError(t, err)
				var mine, theirs []redlimit.Grant
				for i := range 150 {
					step := time.Duration(rng.Int64N(int64(full)/int64(capacity) + 1))
					if rng.IntN(10) == 0 {
						step = -step
					}
					clock.Advance(step)
					if len(mine) > 0 && rng.IntN(3) == 0 {
						j := rng.IntN(len(mine))
						k := 1 + rng.IntN(mine[j].N())
						require.NoError(t, mine[j].Refund(ctx, k))
						require.NoError(t, theirs[j].Refund(ctx, k))
						got, err := l.AllowN(ctx, "k", 0)
						require.NoError(t, err)
						want, err := script.AllowN(ctx, "k", 0)
						require.NoError(t, err)
						require.Equal(t, want, got, "step %d: after refunding %d of grant %d", i, k, j)
						continue
					}
					n := rng.IntN(capacity + 2)
					want, err := script.AllowN(ctx, "k", n)
					require.NoError(t, err)
					got, err := l.AllowN(ctx, "k", n)
					require.NoError(t, err)
					require.Equal(t, withoutGrant(want), withoutGrant(got), "step %d (%v), n=%d", i, step, n)
					if got.Allowed && n > 0 {
						mine, theirs = append(mine, got.Grant), append(theirs, want.Grant)
					}
				}
			})
		}
	}
}
