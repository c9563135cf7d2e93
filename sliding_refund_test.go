package redlimit

// Refunds of sliding grants (DESIGN "Grants and refunds"): exact while the
// grant's bucket is in a window, at most once, never looser than the
// model, on shared keys too.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
)

// A refund gives back what the grant took, at most once in all: the
// largest n any refund of it asked for, never a sum; a retried refund, or
// one of no more than was given back, gives nothing and is no error. A
// grant whose bucket left the window gives nothing back.
func TestSlidingRefundAtMostOnce(t *testing.T) {
	t.Parallel()
	makers := map[string]slidingMaker{
		"window": slidingWindowMaker(5, 10*time.Second, time.Second),
		"log":    slidingLogMaker(time.Second, Strategy{5, 10 * time.Second}, Strategy{20, time.Minute}),
	}
	for name, make := range makers {
		t.Run(name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, be backend) {
				ctx := context.Background()
				clock := newClock()
				l, err := make(be.rdb, WithClock(clock.Now))
				require.NoError(t, err)
				remaining := func() int {
					r, err := l.AllowN(ctx, "k", 0)
					require.NoError(t, err)
					return r.Remaining
				}
				first, err := l.AllowN(ctx, "k", 3)
				require.NoError(t, err)
				require.Equal(t, 3, first.Grant.N())
				clock.Advance(2 * time.Second)
				second, err := l.AllowN(ctx, "k", 2)
				require.NoError(t, err)
				require.Equal(t, 0, remaining())

				require.NoError(t, first.Grant.Refund(ctx, 2))
				require.Equal(t, 2, remaining(), "2 of the first grant's 3 given back")
				require.NoError(t, first.Grant.Refund(ctx, 2), "a retried refund is no error")
				require.NoError(t, first.Grant.Refund(ctx, 1), "nor one of less than was given back")
				require.Equal(t, 2, remaining(), "and gives nothing")
				require.NoError(t, first.Grant.Refund(ctx, 3))
				require.Equal(t, 3, remaining(), "3 in all, never 2 + 3")
				require.ErrorIs(t, first.Grant.Refund(ctx, 4), ErrInvalidArgument, "more than the grant took")
				require.ErrorIs(t, first.Grant.Refund(ctx, 0), ErrInvalidArgument)

				require.NoError(t, second.Grant.Refund(ctx, 1))
				require.Equal(t, 4, remaining(), "the second grant's bucket is still in the window")

				clock.Advance(9 * time.Second) // the first grant's bucket left the 10s window
				require.Equal(t, 4, remaining())
				require.NoError(t, second.Grant.Refund(ctx, 2))
				require.Equal(t, 5, remaining(), "the second grant's bucket is still counted")
				clock.Advance(2 * time.Second)
				require.NoError(t, second.Grant.Refund(ctx, 2))
				require.Equal(t, 5, remaining())
			})
		})
	}
}

// The script's refund reply, read directly: "1 remaining 0 reset strategy
// -1 given", given being what this refund gave back; a token the script
// did not make, or one of a grant another key holds, gives nothing and
// leaves the key as it was. A refund sent as "=<k>:<token>" (Go's, when no
// observer reads the state) gives the same and replies only given.
func TestSlidingRefundReply(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		be.keepKeys() // a fake clock: its TTLs, seconds at most, would pass in real time
		ctx := context.Background()
		clock := newClock()
		l, err := NewSlidingWindow(be.rdb, 5, 10*time.Second, time.Second, WithClock(clock.Now))
		require.NoError(t, err)
		r, err := l.AllowN(ctx, "k", 3)
		require.NoError(t, err)
		token := grantToken(r.Grant)
		now := fmt.Sprint(clock.now.UnixMicro())
		args := []any{"w", time.Second.Microseconds(), 5, 10}
		refund := func(key, k string) string {
			v, err := slidingScript.Run(ctx, be.rdb, []string{l.redisKey(key)}, append([]any{now, k}, args...)...).Result()
			require.NoError(t, err)
			return v.(string)
		}
		require.Equal(t, "1 4 0 10000000 0 -1 2", refund("k", "-2:"+token))
		require.Equal(t, "1 4 0 10000000 0 -1 0", refund("k", "-2:"+token), "given back already")
		require.Equal(t, "1 5 0 10000000 0 -1 1", refund("k", "-3:"+token))
		for _, bad := range []string{"-1:x", "-1:" + token + "0", "-1:1.2.3", "-1:", "-x:" + token} {
			require.Equal(t, "1 5 0 10000000 0 -1 0", refund("k", bad), "token %q", bad)
		}
		_, err = l.AllowN(ctx, "other", 1)
		require.NoError(t, err)
		require.Equal(t, "1 4 0 10000000 0 -1 0", refund("other", "-3:"+token), "another key's grant")
		require.Equal(t, "1 5 0 0 0 -1 0", refund("none", "-3:"+token), "a missing key")
		require.Zero(t, be.rdb.Exists(ctx, l.redisKey("none")).Val(), "a refund creates no key")

		// "=<k>:<token>" gives back as "-" does, and replies only what it gave.
		r, err = l.AllowN(ctx, "bare", 3)
		require.NoError(t, err)
		token = grantToken(r.Grant)
		require.Equal(t, "1 0 0 0 0 -1 2", refund("bare", "=2:"+token))
		require.Equal(t, "1 0 0 0 0 -1 0", refund("bare", "=2:"+token), "given back already")
		require.Equal(t, "1 4 0 10000000 0 -1 0", refund("bare", "-2:"+token), "what the bare refund left")
		require.Equal(t, "1 0 0 0 0 -1 1", refund("bare", "=3:"+token))
		require.Equal(t, "1 0 0 0 0 -1 0", refund("bare", "=1:x"), "a token the script did not make")
	})
}

// grantToken is the token g carries, read from its printed fields: tests
// only, to call the script directly.
func grantToken(g Grant) string {
	s := fmt.Sprintf("%#v", g)
	i := strings.Index(s, `token:"`) + len(`token:"`)
	return s[i : i+strings.Index(s[i:], `"`)]
}

// Random traces of grants, denials, n == 0 and partial refunds (of grants
// still counted or long gone, retried, past the grant), with the clock
// now and then going back or gone wrong, against the model extended with
// refunds: the same Result at every step. Each trace refunds at most 16
// grants, the records a key keeps.
func TestSlidingRefundAgainstModel(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	traces, steps := 20, 300
	if testing.Short() {
		traces, steps = 5, 200
	}
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		be.keepKeys()
		for tr := range traces {
			rng := rand.New(rand.NewPCG(uint64(tr)+offset, 35))
			precision := time.Duration(1+rng.IntN(4)) * ms
			s := randomStrategies(rng, precision, 20*precision)
			var limits, windows []int64
			for _, x := range s {
				limits, windows = append(limits, int64(x.Limit)), append(windows, x.Window.Microseconds())
			}
			m := model.NewSlidingLog(precision.Microseconds(), limits, windows)
			clock := newClock()
			l, err := NewSlidingLog(be.rdb, precision, s, keysOf(tr, fmt.Sprintf("refund:%d:", tr)), WithClock(clock.Now))
			require.NoError(t, err)
			require.NoError(t, l.Reset(ctx, "k"))
			type granted struct {
				grant Grant
				id    int64
			}
			var grants []granted
			refunds := 0
			for i := range steps {
				step := time.Duration(rng.IntN(int(precision/us)*2)) * us
				switch rng.IntN(40) {
				case 0:
					step = -step * time.Duration(1+rng.IntN(4))
				case 1:
					step = -s[len(s)-1].Window * 2
				}
				clock.Advance(step)
				now := clock.now.UnixMicro()
				if len(grants) > 0 && refunds < 16 && rng.IntN(4) == 0 {
					g := grants[rng.IntN(len(grants))]
					k := 1 + rng.IntN(g.grant.N())
					require.NoError(t, g.grant.Refund(ctx, k), "trace %d step %d", tr, i)
					m.Refund(now, g.id, int64(k))
					refunds++
					continue
				}
				n := rng.IntN(s[0].Limit + 2)
				got, err := l.AllowN(ctx, "k", n)
				require.NoError(t, err, "trace %d step %d", tr, i)
				want := m.Step(now, int64(n))
				w := Result{Allowed: want.Allowed, Limit: int(want.Limit), Remaining: int(want.Remaining),
					RetryAfter: time.Duration(want.RetryAfterUS) * us, ResetAfter: time.Duration(want.ResetAfterUS) * us}
				if want.RetryAfterUS == model.Never {
					w.RetryAfter = Never
				}
				require.Equal(t, w, withoutGrant(got), "trace %d (by %v %v) step %d (%v), n=%d", tr, precision, s, i, clock.now.Sub(epoch), n)
				if got.Allowed && n > 0 {
					grants = append(grants, granted{got.Grant, want.GrantID})
				}
			}
		}
	})
}

// Two configurations share a key, and refunds by either leave it as it
// would be had the grant taken that many fewer permits: key a gets grants
// of n and refunds of k < n, its twin b the grants of n - k at the same
// times, and every answer on the two is the same, for both
// configurations. Then a refund of a whole grant: a is never the looser.
func TestSlidingRefundSharedTwins(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	traces, steps := 16, 120
	if testing.Short() {
		traces, steps = 6, 80
	}
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		be.keepKeys()
		for tr := range traces {
			rng := rand.New(rand.NewPCG(uint64(tr)+offset, 36))
			clock := newClock()
			windows := rng.IntN(2) == 0
			var limiters []Limiter
			var names []string
			var smallest []int
			for range 2 {
				name, make, limit := randomSlidingConfig(rng, windows)
				l, err := make(be.rdb, WithPrefix(fmt.Sprintf("rtwin:%d:", tr)), WithClock(clock.Now))
				require.NoError(t, err)
				limiters, names, smallest = append(limiters, l), append(names, name), append(smallest, limit)
			}
			refunds := 0
			for i := range steps {
				clock.Advance(time.Duration(rng.IntN(1500)) * us)
				c := rng.IntN(2)
				n := rng.IntN(smallest[c] + 1)
				a, err := limiters[c].AllowN(ctx, "a", n)
				require.NoError(t, err)
				k := 0
				if a.Allowed && n > 1 && refunds < 16 && rng.IntN(2) == 0 {
					k = 1 + rng.IntN(n-1)
				}
				b, err := limiters[c].AllowN(ctx, "b", n-k)
				require.NoError(t, err)
				if k == 0 {
					require.Equal(t, withoutGrant(a), withoutGrant(b), "trace %d step %d: %s n=%d (configurations %v)", tr, i, names[c], n, names)
				} else {
					require.True(t, b.Allowed, "trace %d step %d: %s n=%d allowed, %d not", tr, i, names[c], n, n-k)
					clock.Advance(time.Duration(rng.IntN(500)) * us)
					require.NoError(t, a.Grant.Refund(ctx, k))
					refunds++
				}
				for j, l := range limiters {
					ra, err := l.AllowN(ctx, "a", 0)
					require.NoError(t, err)
					rb, err := l.AllowN(ctx, "b", 0)
					require.NoError(t, err)
					require.Equal(t, withoutGrant(rb), withoutGrant(ra), "trace %d step %d: %s looks (configurations %v)", tr, i, names[j], names)
				}
			}
		}
	})
}

// Goroutines in two processes (clients) grant and refund on one key at
// once: never over the limit, and at rest the key holds at least the
// grants not refunded. Exactly those, but for refunds of grants below the
// horizon: half of the grants keep a permit, so the refunded positions form
// a run per two grants, and a key keeps 16 runs; those give nothing,
// stricter and never looser (docs/internals.md, Refunds).
func TestSlidingRefundConcurrent(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		const limit, workers, calls = 400, 8, 40
		var limiters [2]Limiter
		for i := range limiters {
			var err error
			limiters[i], err = NewSlidingLog(be.rdb, time.Second, []Strategy{{limit, time.Hour}, {2 * limit, 2 * time.Hour}})
			require.NoError(t, err)
		}
		var wg sync.WaitGroup
		var kept atomic.Int64
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := limiters[w%2]
				for i := range calls {
					r, err := l.AllowN(ctx, "k", 2)
					if err != nil || !r.Allowed {
						t.Errorf("worker %d call %d: %+v, %v", w, i, r, err)
						return
					}
					back := 1 + i%2 // every other grant is given back whole
					if err := r.Grant.Refund(ctx, back); err != nil {
						t.Errorf("worker %d call %d: refund: %v", w, i, err)
						return
					}
					kept.Add(int64(2 - back))
				}
			}()
		}
		wg.Wait()
		r, err := limiters[0].AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.LessOrEqual(t, r.Remaining, limit-int(kept.Load()), "the key holds the grants not given back")
		t.Logf("%d permits of refunds that came too late given nothing", limit-int(kept.Load())-r.Remaining)
	})
}

// Forty grants given back whole in a shuffled order, in four runs of ten
// separated by grants that stay, and more grants that stay between the
// refunds: the key ends exactly at its grants minus its refunds, as the
// model does. The refunded positions are four ranges, never more than the
// 16 a key keeps (one record per refunded grant, 16 at most, lost the
// refunds of the grants below the oldest kept).
func TestSlidingRefundFortyShuffled(t *testing.T) {
	t.Parallel()
	makers := map[string]slidingMaker{
		"window": slidingWindowMaker(500, time.Hour, time.Second),
		"log":    slidingLogMaker(time.Second, Strategy{500, time.Hour}, Strategy{900, 2 * time.Hour}),
	}
	for name, make := range makers {
		t.Run(name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, be backend) {
				ctx := context.Background()
				rng := rand.New(rand.NewPCG(testseed.Offset(t), 39))
				clock := newClock()
				l, err := make(be.rdb, WithClock(clock.Now))
				require.NoError(t, err)
				m := model.NewSlidingLog(time.Second.Microseconds(), []int64{500}, []int64{time.Hour.Microseconds()})
				type granted struct {
					grant Grant
					id    int64
				}
				var back []granted
				kept := 0
				grant := func(n int) granted {
					clock.Advance(time.Duration(rng.IntN(1500)) * ms)
					r, err := l.AllowN(ctx, "k", n)
					require.NoError(t, err)
					require.True(t, r.Allowed)
					want := m.Step(clock.now.UnixMicro(), int64(n))
					require.True(t, want.Allowed)
					return granted{r.Grant, want.GrantID}
				}
				for range 4 {
					for range 10 {
						back = append(back, grant(1+rng.IntN(3)))
					}
					n := 1 + rng.IntN(3)
					grant(n)
					kept += n
				}
				rng.Shuffle(len(back), func(i, j int) { back[i], back[j] = back[j], back[i] })
				for i, g := range back {
					clock.Advance(time.Duration(rng.IntN(500)) * ms)
					require.NoError(t, g.grant.Refund(ctx, g.grant.N()))
					require.Equal(t, int64(g.grant.N()), m.Refund(clock.now.UnixMicro(), g.id, int64(g.grant.N())))
					if i%5 == 0 {
						n := 1 + rng.IntN(3)
						grant(n)
						kept += n
					}
				}
				require.Equal(t, 500-kept, remaining(t, l, "k"), "every refund gave back its grant")
				for _, g := range back {
					require.NoError(t, g.grant.Refund(ctx, g.grant.N()), "a retry")
				}
				require.Equal(t, 500-kept, remaining(t, l, "k"), "a retried refund gives nothing")
				require.Equal(t, int64(500-kept), m.Step(clock.now.UnixMicro(), 0).Remaining, "the model")
			})
		})
	}
}

// A key keeps 16 ranges of refunded positions; the 17th refund forgets the
// lowest range, and only the grants below it can no longer be refunded
// (docs/internals.md, "Refunds"). 17 pairs of grants of one permit, a then
// b, and the a of each pair refunded from the last to the first: the
// ranges stay apart, and the 17th, the first pair's, is the lowest. Every
// b above it still gives back; one below it would not. Then the same in
// order, and two ranges forgotten, which never loosen a window.
func TestSlidingRefundForgetsTheLowestRange(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		be.keepKeys()
		clock := newClock()
		l, err := NewSlidingWindow(be.rdb, 100, time.Hour, time.Second, WithClock(clock.Now))
		require.NoError(t, err)
		var a, b []Grant
		for range 17 {
			for _, list := range []*[]Grant{&a, &b} {
				clock.Advance(10 * ms)
				r, err := l.Allow(ctx, "k")
				require.NoError(t, err)
				require.True(t, r.Allowed)
				*list = append(*list, r.Grant)
			}
		}
		for i := 16; i >= 0; i-- {
			require.NoError(t, a[i].Refund(ctx, 1))
		}
		require.Equal(t, 100-34+17, remaining(t, l, "k"), "every a given back")
		for i, g := range []Grant{b[15], b[0]} {
			require.NoError(t, g.Refund(ctx, 1))
			require.Equal(t, 100-34+17+1+i, remaining(t, l, "k"), "b%d, above the forgotten range, gives back", []int{16, 1}[i])
		}

		// Refunds from the first grant to the last, each of a grant past
		// every range: 17 grants a of 2 permits, each followed by a grant
		// b of one, and one permit of each a given back. The 17th refund
		// forgets the lowest range, a0's: a0, below it, gives nothing
		// more; b0, past it, does.
		a, b = nil, nil
		for range 17 {
			for i, list := range []*[]Grant{&a, &b} {
				clock.Advance(10 * ms)
				r, err := l.AllowN(ctx, "up", 2-i)
				require.NoError(t, err)
				require.True(t, r.Allowed)
				*list = append(*list, r.Grant)
			}
		}
		for _, g := range a {
			require.NoError(t, g.Refund(ctx, 1))
		}
		require.Equal(t, 100-51+17, remaining(t, l, "up"), "one permit of every a given back")
		require.NoError(t, a[0].Refund(ctx, 2))
		require.Equal(t, 100-51+17, remaining(t, l, "up"), "a0, below the forgotten range, gives nothing more")
		require.NoError(t, b[0].Refund(ctx, 1))
		require.Equal(t, 100-51+18, remaining(t, l, "up"), "b0, past it, gives back")

		// Two forgotten ranges: the lowest position dropped (x) stays the
		// first one's, so a window that holds the second forgotten range
		// but not the first counts the second's permits as used
		// (stricter) and never subtracts what was given back below its
		// start (looser). 18 pairs of grants, a of 2 and b of 1, one pair
		// a second, on a window of a minute, and one permit of each a
		// given back in order: the 17th and 18th refunds forget a0's and
		// a1's ranges. Once pair 0's bucket has left the window, the
		// exact count is 34 (pairs 1 to 17, less 17 given back) and the
		// key counts 35.
		minute, err := NewSlidingWindow(be.rdb, 100, time.Minute, time.Second, WithClock(clock.Now))
		require.NoError(t, err)
		clock.Advance(time.Second - time.Duration(clock.now.UnixMicro()%1e6)*time.Microsecond)
		start := clock.now // pair i grants in the bucket start + i s
		a = nil
		for i := range 18 {
			clock.now = start.Add(time.Duration(i)*time.Second + 10*ms)
			r, err := minute.AllowN(ctx, "two", 2)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			a = append(a, r.Grant)
			clock.Advance(10 * ms)
			r, err = minute.AllowN(ctx, "two", 1)
			require.NoError(t, err)
			require.True(t, r.Allowed)
		}
		for _, g := range a {
			require.NoError(t, g.Refund(ctx, 1))
		}
		require.Equal(t, 100-54+18, remaining(t, minute, "two"), "every refund gave back while all pairs are in the window")
		clock.now = start.Add(time.Minute + 500*ms) // pair 0's bucket left the window, pair 1's is in it
		require.Equal(t, 100-35, remaining(t, minute, "two"),
			"a1's forgotten range counts as used (exact: 66 left), and a0's is not subtracted")
	})
}
