package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/faultproxy"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/testseed"
)

// refundAlgorithms is every algorithm whose grants refund, as the tests
// of this file build them: 10 permits that nothing regains while a test
// runs (forever is the longest period all accept).
func refundAlgorithms() []struct {
	name string
	new  func(rdb redis.Scripter, opts ...Option) (Limiter, error)
} {
	out := []struct {
		name string
		new  func(rdb redis.Scripter, opts ...Option) (Limiter, error)
	}{}
	for _, alg := range algorithms {
		out = append(out, struct {
			name string
			new  func(rdb redis.Scripter, opts ...Option) (Limiter, error)
		}{alg.name, func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return alg.new(rdb, 10, forever, opts...)
		}})
	}
	out = append(out, struct {
		name string
		new  func(rdb redis.Scripter, opts ...Option) (Limiter, error)
	}{"calendar_window", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
		return NewCalendarWindow(rdb, 10, Monthly(time.UTC, 1), opts...)
	}})
	return out
}

// At most once: the permits given back from one grant are the most any
// refund asked for, never a sum, and never more than it took.
func TestRefundAtMostOnce(t *testing.T) {
	t.Parallel()
	for _, alg := range refundAlgorithms() {
		t.Run(alg.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newClock()
				l, err := alg.new(b.rdb, WithClock(clock.Now))
				require.NoError(t, err)
				r, err := l.AllowN(ctx, "k", 6)
				require.NoError(t, err)
				require.True(t, r.Allowed)
				require.Equal(t, 4, remaining(t, l, "k"))
				for _, step := range []struct {
					refund, want int
					why          string
				}{
					{3, 7, "3 given back"},
					{3, 7, "the same refund again gives nothing"},
					{2, 7, "a smaller one gives nothing"},
					{5, 9, "a larger one gives the difference"},
					{6, 10, "up to what the grant took"},
					{6, 10, "and never more"},
				} {
					require.NoError(t, r.Grant.Refund(ctx, step.refund))
					require.Equal(t, step.want, remaining(t, l, "k"), "refund(%d): %s", step.refund, step.why)
				}
				err = r.Grant.Refund(ctx, 7)
				require.ErrorIs(t, err, ErrInvalidArgument, "more than the grant took")
			})
		})
	}
}

// A refund whose reply is lost on the way back has been made; its retry
// gives nothing more.
func TestRefundRetriedAfterLostReply(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	proxy, err := faultproxy.Start(srv.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	// The lost reply ends at the refund's ctx deadline; the calls that
	// must succeed get all the time a loaded machine needs.
	rdb := patientClient(t, proxy.Addr())
	for _, alg := range refundAlgorithms() {
		t.Run(alg.name, func(t *testing.T) {
			ctx := context.Background()
			l, err := alg.new(rdb, WithoutBreaker(), WithPrefix("lost:"+alg.name+":"))
			require.NoError(t, err)
			r, err := l.AllowN(ctx, "k", 5)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			proxy.SetDrop(true)
			short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			err = r.Grant.Refund(short, 4)
			cancel()
			require.Error(t, err, "the reply was lost")
			proxy.SetDrop(false)
			require.NoError(t, r.Grant.Refund(ctx, 4), "the retry")
			require.Equal(t, 9, remaining(t, l, "k"), "the refund was made once")
		})
	}
}

// Goroutines of several clients grant and refund on one key, each
// refunding the grants it holds in any order, in steps, some twice: never
// over the limit, and at rest the key holds exactly what was granted less
// what was given back.
func TestRefundConcurrentExact(t *testing.T) {
	t.Parallel()
	for _, alg := range refundAlgorithms() {
		t.Run(alg.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				const clients, goroutines, calls = 3, 6, 30
				var taken, refunded atomic.Int64
				var wg sync.WaitGroup
				for c := range clients {
					l, err := alg.new(b.rdb)
					require.NoError(t, err)
					for g := range goroutines {
						wg.Add(1)
						go func() {
							defer wg.Done()
							rng := rand.New(rand.NewPCG(uint64(c*100+g)+testseed.Offset(t), 35))
							// Grants this goroutine holds, and what it asked
							// back of each so far: a refund may come long
							// after its grant, in any order, in steps.
							type held struct {
								g     Grant
								asked int
							}
							var mine []held
							for range calls {
								if len(mine) > 0 && rng.IntN(2) == 0 {
									i := rng.IntN(len(mine))
									h := &mine[i]
									k := h.asked + 1 + rng.IntN(h.g.N()-h.asked)
									// Counted before it is made, and grants
									// after they are: the count held is then
									// never above the key's.
									refunded.Add(int64(k - h.asked))
									h.asked = k
									if err := h.g.Refund(ctx, k); err != nil {
										t.Errorf("Refund: %v", err)
										return
									}
									if rng.IntN(4) == 0 {
										// A retry gives nothing more.
										if err := h.g.Refund(ctx, k); err != nil {
											t.Errorf("Refund again: %v", err)
											return
										}
									}
									if h.asked == h.g.N() {
										mine = append(mine[:i], mine[i+1:]...)
									}
									continue
								}
								r, err := l.AllowN(ctx, "hot", 1+rng.IntN(3))
								if err != nil {
									t.Errorf("AllowN: %v", err)
									return
								}
								if !r.Allowed {
									continue
								}
								if n := taken.Add(int64(r.Grant.N())) - refunded.Load(); n > 10 {
									t.Errorf("%d permits held at once, limit 10", n)
								}
								mine = append(mine, held{g: r.Grant})
							}
						}()
					}
				}
				wg.Wait()
				l, err := alg.new(b.rdb)
				require.NoError(t, err)
				exact := 10 - (taken.Load() - refunded.Load())
				got := int64(remaining(t, l, "hot"))
				require.Equal(t, fmt.Sprint(exact), fmt.Sprint(got),
					"at rest: granted %d, given back %d", taken.Load(), refunded.Load())
			})
		})
	}
}

// Forty grants refunded in a shuffled order, between grants that stay:
// every refund is made, and the key ends at grants minus refunds. Ranges
// of given-back positions merge as the gaps between them fill, so no
// refund waits behind sixteen others.
func TestRefundManyOutOfOrder(t *testing.T) {
	t.Parallel()
	for _, alg := range refundAlgorithms() {
		t.Run(alg.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newClock()
				var l Limiter
				var err error
				if alg.name == "calendar_window" {
					l, err = NewCalendarWindow(b.rdb, 1000, Monthly(time.UTC, 1), WithClock(clock.Now))
				} else {
					for _, a := range algorithms {
						if a.name == alg.name {
							l, err = a.new(b.rdb, 1000, forever, WithClock(clock.Now))
						}
					}
				}
				require.NoError(t, err)
				var grants []Grant
				for i := range 50 {
					r, err := l.AllowN(ctx, "k", 1+i%3)
					require.NoError(t, err)
					require.True(t, r.Allowed)
					if i%5 != 4 { // every fifth grant stays
						grants = append(grants, r.Grant)
					}
				}
				before := remaining(t, l, "k")
				rng := rand.New(rand.NewPCG(7+testseed.Offset(t), 35))
				rng.Shuffle(len(grants), func(i, j int) { grants[i], grants[j] = grants[j], grants[i] })
				want := before
				for _, g := range grants {
					require.NoError(t, g.Refund(ctx, g.N()))
					want += g.N()
				}
				got := remaining(t, l, "k")
				require.Equal(t, want, got, "every one of %d refunds gave back", len(grants))
			})
		})
	}
}
