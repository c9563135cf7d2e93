package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
)

// Refunds of the buckets' grants (issue 35): the key is left as it would
// be had the grant taken k fewer permits, as far as they are still in the
// bucket (its oldest permits drain first), at most once, never looser.

// lookBucket is l's Result for n == 0 on key.
func lookBucket(t *testing.T, l Limiter, key string) Result {
	t.Helper()
	r, err := l.AllowN(context.Background(), key, 0)
	require.NoError(t, err)
	return r
}

// Step by step, on a bucket of 10 at 1 a second: what a refund gives back,
// twice, past what was given, after some permits drained, after all did;
// then a key's first refund.
func TestBucketRefundSteps(t *testing.T) {
	t.Parallel()
	for _, alg := range bucketAlgorithms {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				b.keepKeys()
				ctx := context.Background()
				clock := newClock()
				l, err := newBucket(alg, b.rdb, 10, PerSecond(1), WithClock(clock.Now))
				require.NoError(t, err)

				r, err := l.AllowN(ctx, "k", 5)
				require.NoError(t, err)
				g := r.Grant
				require.Equal(t, 5, g.N())
				require.NoError(t, g.Refund(ctx, 2))
				require.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 7, ResetAfter: 3 * time.Second}, lookBucket(t, l, "k"),
					"two of five given back at once: as if the grant took 3")
				require.NoError(t, g.Refund(ctx, 2), "the same refund again is no error")
				require.Equal(t, 7, lookBucket(t, l, "k").Remaining, "the same refund again gives nothing")
				require.NoError(t, g.Refund(ctx, 1))
				require.Equal(t, 7, lookBucket(t, l, "k").Remaining, "a refund of less than was given back gives nothing")
				require.ErrorIs(t, g.Refund(ctx, 6), ErrInvalidArgument, "more than the grant took")

				clock.Advance(time.Second) // the grant's first permit drained
				r, err = l.AllowN(ctx, "k", 4)
				require.NoError(t, err)
				g2 := r.Grant
				require.Equal(t, 4, lookBucket(t, l, "k").Remaining, "2 of the first grant and 4")
				require.NoError(t, g.Refund(ctx, 4), "two more of the first grant")
				require.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 6, ResetAfter: 4 * time.Second}, lookBucket(t, l, "k"),
					"as if the first grant took 1, drained now")
				require.NoError(t, g.Refund(ctx, 5))
				require.Equal(t, 6, lookBucket(t, l, "k").Remaining, "the first grant's last permit drained: nothing more")

				clock.Advance(2500 * time.Millisecond) // 1.5 of the second grant's 4 left
				require.NoError(t, g2.Refund(ctx, 4))
				require.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 10}, lookBucket(t, l, "k"),
					"the part of a grant still in the bucket, and no more")
				clock.Advance(time.Hour)
				require.NoError(t, g2.Refund(ctx, 4))
				r, err = l.AllowN(ctx, "k", 10)
				require.NoError(t, err)
				require.True(t, r.Allowed, "a refund after every permit drained gives nothing, and breaks nothing")
				require.Zero(t, lookBucket(t, l, "k").Remaining)

				// The first refund of a key never refunded (the short
				// form): of the earlier of two grants, it leaves the
				// later one's refund whole; a token whose positions end
				// past what the key now holds (of a longer earlier life
				// of the key) gives nothing.
				grant := func(n int) Grant {
					t.Helper()
					r, err := l.AllowN(ctx, "first", n)
					require.NoError(t, err)
					require.True(t, r.Allowed)
					return r.Grant
				}
				earlier, later := grant(2), grant(1)
				require.NoError(t, earlier.Refund(ctx, 2))
				require.Equal(t, 9, lookBucket(t, l, "first").Remaining, "the earlier grant given back")
				require.NoError(t, later.Refund(ctx, 1))
				require.Equal(t, 10, lookBucket(t, l, "first").Remaining, "the later grant given back too")
				gone := grant(5)
				require.NoError(t, b.rdb.Del(ctx, keyPrefix(l)+"first").Err()) // as if it expired
				now := grant(1)
				require.NoError(t, gone.Refund(ctx, 5))
				require.Equal(t, 9, lookBucket(t, l, "first").Remaining, "positions past the level give nothing")
				require.NoError(t, now.Refund(ctx, 1))
				require.Equal(t, 10, lookBucket(t, l, "first").Remaining)
			})
		})
	}
}

// A refund keeps the key's TTL (it never shortens it), does not move the
// key's time, and gives nothing from a clock gone wrong; from a clock
// behind the key's time it gives as at that time.
func TestBucketRefundClocksAndTTL(t *testing.T) {
	t.Parallel()
	for _, alg := range bucketAlgorithms {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newClock()
				l, err := newBucket(alg, b.rdb, 10, PerSecond(1), WithClock(clock.Now))
				require.NoError(t, err)
				key := keyPrefix(l) + "k"

				r, err := l.AllowN(ctx, "k", 4)
				require.NoError(t, err)
				before := b.rdb.PTTL(ctx, key).Val()
				clock.Advance(-500 * time.Millisecond) // behind the key's time
				require.NoError(t, r.Grant.Refund(ctx, 1))
				require.GreaterOrEqual(t, b.rdb.PTTL(ctx, key).Val(), before-100*time.Millisecond, "a refund keeps the TTL")
				require.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 7, ResetAfter: 3 * time.Second}, lookBucket(t, l, "k"),
					"given back as at the key's time, which did not move")

				clock.Advance(-time.Minute) // gone wrong: more than a full drain behind
				require.NoError(t, r.Grant.Refund(ctx, 4))
				clock.Advance(time.Minute)
				require.Equal(t, 7, lookBucket(t, l, "k").Remaining, "a clock gone wrong gives nothing back")
				require.NoError(t, r.Grant.Refund(ctx, 4))
				require.Equal(t, 10, lookBucket(t, l, "k").Remaining, "back on the key's time it does")
			})
		})
	}
}

// Random traces of grants, denials, n == 0 and partial refunds (of any
// grant, in any order, twice, summing past what was given, after the
// permits drained): every Result is the reference model's, exactly. Half
// the traces refund only the latest grant, at once; the others any grant,
// later. A bucket of at most 10 permits never holds more than the 16
// ranges of given-back positions a key keeps.
func TestBucketRefundTracesAgainstModel(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	traces := 8
	if testing.Short() {
		traces = 4
	}
	for _, alg := range bucketAlgorithms {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				b.keepKeys()
				ctx := context.Background()
				for trace := range traces {
					seed := uint64(trace) + offset
					rng := rand.New(rand.NewPCG(seed, 35))
					capacity := 2 + rng.IntN(9)
					rate := Rate{Count: 1 + rng.IntN(4), Per: time.Duration(1+rng.IntN(8)) * 100 * ms}
					full := time.Duration(int64(capacity) * int64(rate.Per) / int64(rate.Count))
					latest := trace%2 == 0
					clock := newClock()
					l, err := newBucket(alg, b.rdb, capacity, rate, WithClock(clock.Now))
					require.NoError(t, err)
					m := newBucketModel(alg, capacity, rate)
					refunder := m.(model.Refunder)
					type grant struct {
						g  Grant
						id int64
					}
					var grants []grant
					key := fmt.Sprintf("refund-trace-%d", trace)
					msg := func(i int, what string) string {
						return fmt.Sprintf("trace %d (seed %d, %d at %v) step %d: %s", trace, seed, capacity, rate, i, what)
					}
					for i := range 120 {
						clock.Advance(time.Duration(rng.Int64N(int64(full)/int64(capacity)+1)) / 2)
						now := clock.now.UnixMicro()
						if len(grants) > 0 && rng.IntN(3) == 0 {
							pick := len(grants) - 1
							if !latest {
								pick = rng.IntN(len(grants))
							}
							g := grants[pick]
							k := 1 + rng.IntN(g.g.N())
							require.NoError(t, g.g.Refund(ctx, k), msg(i, "refund"))
							refunder.Refund(now, g.id, int64(k))
							got, want := lookBucket(t, l, key), modelToResult(m.Step(now, 0))
							require.Equal(t, want, got, msg(i, fmt.Sprintf("after refunding %d of %d", k, g.g.N())))
							continue
						}
						n := rng.IntN(capacity + 1)
						want := m.Step(now, int64(n))
						got, err := l.AllowN(ctx, key, n)
						require.NoError(t, err)
						require.Equal(t, modelToResult(want), withoutGrant(got), msg(i, fmt.Sprintf("n=%d", n)))
						if got.Allowed && n > 0 {
							grants = append(grants, grant{got.Grant, want.GrantID})
							if latest {
								grants = grants[len(grants)-1:]
							}
						}
						if latest && rng.IntN(2) == 0 {
							grants = nil // only refunds right after their grant
						}
					}
				}
			})
		})
	}
}

// Past the 16 ranges a key keeps (buckets of 30 to 50, many small grants
// refunded in part, in any order): never looser than the model, whose
// queue is unbounded, at every step.
func TestBucketRefundTracesPastTheBound(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	for _, alg := range bucketAlgorithms {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				b.keepKeys()
				ctx := context.Background()
				for trace := range 2 {
					seed := uint64(trace) + offset
					rng := rand.New(rand.NewPCG(seed, 36))
					capacity := 30 + rng.IntN(21)
					rate := Rate{Count: 1 + rng.IntN(4), Per: time.Duration(1+rng.IntN(8)) * 100 * ms}
					step := int64(rate.Per) / int64(rate.Count) / 40
					clock := newClock()
					l, err := newBucket(alg, b.rdb, capacity, rate, WithClock(clock.Now))
					require.NoError(t, err)
					m := newBucketModel(alg, capacity, rate)
					type grant struct {
						g  Grant
						id int64
					}
					var grants []grant
					key := fmt.Sprintf("refund-bound-%d", trace)
					for i := range 300 {
						clock.Advance(time.Duration(rng.Int64N(step + 1)))
						now := clock.now.UnixMicro()
						what := fmt.Sprintf("trace %d (seed %d, %d at %v) step %d", trace, seed, capacity, rate, i)
						if len(grants) > 0 && rng.IntN(2) == 0 {
							g := grants[rng.IntN(len(grants))]
							k := 1 + rng.IntN(g.g.N())
							if rng.IntN(4) > 0 {
								k = 1 + rng.IntN(max(1, g.g.N()-1)) // keep some: ranges apart
							}
							require.NoError(t, g.g.Refund(ctx, k))
							m.(model.Refunder).Refund(now, g.id, int64(k))
							got, want := lookBucket(t, l, key), m.Step(now, 0)
							require.LessOrEqual(t, int64(got.Remaining), want.Remaining, "%s: never looser after a refund", what)
							continue
						}
						n := 1 + rng.IntN(3)
						got, err := l.AllowN(ctx, key, n)
						require.NoError(t, err)
						want := m.Clone().Step(now, int64(n))
						require.True(t, !got.Allowed || want.Allowed, "%s: n=%d granted where the model denies", what, n)
						if got.Allowed {
							grants = append(grants, grant{got.Grant, m.Step(now, int64(n)).GrantID})
						}
						require.LessOrEqual(t, int64(lookBucket(t, l, key).Remaining), m.Step(now, 0).Remaining, "%s: never looser", what)
					}
				}
			})
		})
	}
}

// Two configurations share a key (WithPrefix): a grant by either, refunded
// in full at once, leaves every configuration what it has on a twin key
// that never saw the grant, then and later; partly, or later, never more.
func TestBucketRefundSharedKey(t *testing.T) {
	t.Parallel()
	for _, alg := range bucketAlgorithms {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				b.keepKeys()
				ctx := context.Background()
				for ci, byFast := range []bool{false, true} {
					clock := newClock()
					opts := []Option{WithPrefix(fmt.Sprintf("refund-shared:%d:", ci)), WithClock(clock.Now)}
					slow, err := newBucket(alg, b.rdb, 5, PerMinute(1), opts...)
					require.NoError(t, err)
					fast, err := newBucket(alg, b.rdb, 20, PerMinute(10), opts...)
					require.NoError(t, err)
					for _, key := range []string{"key", "twin"} {
						_, err := slow.AllowN(ctx, key, 1)
						require.NoError(t, err)
						_, err = fast.AllowN(ctx, key, 2)
						require.NoError(t, err)
					}
					l := slow
					if byFast {
						l = fast
					}
					r, err := l.AllowN(ctx, "key", 2)
					require.NoError(t, err)
					require.True(t, r.Allowed)
					require.NoError(t, r.Grant.Refund(ctx, 2))
					require.NoError(t, r.Grant.Refund(ctx, 2))
					for _, at := range []time.Duration{0, 10 * time.Second, time.Minute, 3 * time.Minute} {
						clock.now = epoch.Add(at)
						for _, c := range []Limiter{slow, fast} {
							onKey, onTwin := lookBucket(t, c, "key"), lookBucket(t, c, "twin")
							require.Equal(t, onTwin.Remaining, onKey.Remaining,
								"refunded by the faster %v, %v on: the key is its twin", byFast, at)
							require.LessOrEqual(t, onKey.ResetAfter, onTwin.ResetAfter+time.Microsecond,
								"refunded by the faster %v, %v on: the key resets no later than its twin", byFast, at)
						}
					}
				}
			})
		})
	}
}

// A key keeps at most 16 ranges of given-back positions: past that the
// lowest goes and a refund of a grant before the horizon gives nothing
// (stricter than the model, never looser), and the state stays bounded
// whatever the number of grants and refunds.
func TestBucketRefundRecordsBounded(t *testing.T) {
	t.Parallel()
	for _, alg := range bucketAlgorithms {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				b.keepKeys()
				ctx := context.Background()
				clock := newClock()
				l, err := newBucket(alg, b.rdb, 100, PerHour(1), WithClock(clock.Now))
				require.NoError(t, err)
				m := newBucketModel(alg, 100, PerHour(1))
				now := clock.now.UnixMicro()
				var grants []Grant
				var ids []int64
				for range 40 {
					r, err := l.AllowN(ctx, "k", 2)
					require.NoError(t, err)
					require.True(t, r.Allowed)
					grants = append(grants, r.Grant)
					ids = append(ids, m.Step(now, 2).GrantID)
				}
				refundAll := func(k int) {
					for i, g := range grants {
						require.NoError(t, g.Refund(ctx, k))
						m.(model.Refunder).Refund(now, ids[i], int64(k))
					}
				}
				refundAll(1)
				require.Equal(t, 60, lookBucket(t, l, "k").Remaining, "40 grants of 2, each gave 1 back")
				require.Equal(t, int64(60), m.Step(now, 0).Remaining, "the model agrees")
				require.LessOrEqual(t, b.rdb.StrLen(ctx, keyPrefix(l)+"k").Val(), int64(600), "the state's ranges are bounded")
				refundAll(2)
				// 40 ranges apart: the 24 lowest went, and the horizon
				// with them; the last 16 grants each give their second
				// permit.
				require.Equal(t, 76, lookBucket(t, l, "k").Remaining, "only grants past the horizon give more")
				require.Equal(t, int64(100), m.Step(now, 0).Remaining, "the model, unbounded, gives all back")
				refundAll(2)
				require.Equal(t, 76, lookBucket(t, l, "k").Remaining, "at most once, ranges or not")
				for range 3 {
					clock.Advance(20 * time.Minute)
					now = clock.now.UnixMicro()
					got, want := lookBucket(t, l, "k"), m.Step(now, 0)
					require.LessOrEqual(t, int64(got.Remaining), want.Remaining, "never looser than the model as it drains")
					require.Equal(t, 24-int((now-epoch.UnixMicro())/3600_000_000), 100-got.Remaining,
						"the level the horizon kept drains at the rate: %v", got)
				}
			})
		})
	}
}

// Under WithPrefix, a part of one rate that a refund emptied is dropped by
// another rate's grant and started again in the same µs: a retry of the
// refund that emptied it finds a labelling its grant never had, and gives
// nothing of the new grant.
func TestBucketRefundPartStartedAgain(t *testing.T) {
	t.Parallel()
	for _, alg := range bucketAlgorithms {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newClock()
				opts := []Option{WithPrefix("refund-again:" + alg + ":"), WithClock(clock.Now)}
				slow, err := newBucket(alg, b.rdb, 5, PerMinute(1), opts...)
				require.NoError(t, err)
				fast, err := newBucket(alg, b.rdb, 20, PerMinute(10), opts...)
				require.NoError(t, err)
				grant := func(l Limiter) Grant {
					r, err := l.AllowN(ctx, "k", 1)
					require.NoError(t, err)
					require.True(t, r.Allowed)
					return r.Grant
				}
				grant(slow)
				first := grant(fast)
				require.NoError(t, first.Refund(ctx, 1))
				grant(slow) // drops the emptied part of the fast rate
				grant(fast) // starts it again, in the same µs
				before := lookBucket(t, fast, "k")
				require.NoError(t, first.Refund(ctx, 1), "the retry")
				require.Equal(t, before, lookBucket(t, fast, "k"), "at most once: the retry gives nothing of the new grant")
			})
		})
	}
}
