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
	for c := range 8 {
		seed := uint64(c) + offset
		rng := rand.New(rand.NewPCG(seed, 35))
		capacity, most, slow := 1+rng.IntN(8), 0, int64(1)
		if c >= 6 {
			// Many small grants refunded in part, slowly drained: more
			// ranges of given-back positions than a key keeps.
			capacity, most, slow = 30+rng.IntN(20), 3, 40
		}
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
					step := time.Duration(rng.Int64N(int64(full)/int64(capacity)/slow + 1))
					if rng.IntN(10) == 0 {
						step = -step
					}
					clock.Advance(step)
					if len(mine) > 0 && rng.IntN(3) == 0 {
						j := rng.IntN(len(mine))
						k := 1 + rng.IntN(mine[j].N())
						if most > 0 && rng.IntN(4) > 0 {
							k = 1 + rng.IntN(max(1, mine[j].N()-1)) // keep some: ranges apart
						}
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
					if most > 0 {
						n = 1 + rng.IntN(most)
					}
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

// Past 16 ranges of given-back positions, the in-process buckets drop the
// lowest and raise the horizon as the scripts do: 40 grants of 2, each
// refunded 1 (40 ranges apart), then 2: only the last 16 give their
// second permit, and at most once.
func TestBucketRefundRangesBounded(t *testing.T) {
	ctx := context.Background()
	for _, leaky := range []bool{true, false} {
		t.Run(fmt.Sprintf("leaky=%v", leaky), func(t *testing.T) {
			clock := &fakeClock{now: epoch}
			var l redlimit.Limiter
			var err error
			if leaky {
				l, err = NewLeakyBucket(100, redlimit.PerHour(1), WithClock(clock.Now))
			} else {
				l, err = NewTokenBucket(100, redlimit.PerHour(1), WithClock(clock.Now))
			}
			require.NoError(t, err)
			var grants []redlimit.Grant
			for range 40 {
				r, err := l.AllowN(ctx, "k", 2)
				require.NoError(t, err)
				require.True(t, r.Allowed)
				grants = append(grants, r.Grant)
			}
			remaining := func() int {
				r, err := l.AllowN(ctx, "k", 0)
				require.NoError(t, err)
				return r.Remaining
			}
			for _, k := range []int{1, 2, 2} {
				for _, g := range grants {
					require.NoError(t, g.Refund(ctx, k))
				}
				if k == 1 {
					require.Equal(t, 60, remaining(), "40 grants of 2, each gave 1 back")
				}
			}
			require.Equal(t, 76, remaining(), "only the grants past the horizon gave their second permit, once")
		})
	}
}
