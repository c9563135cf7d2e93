package redlimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/testseed"
)

// tripCounter is a go-redis hook counting round trips: a command alone is
// one, a pipeline is one.
type tripCounter struct{ trips atomic.Int64 }

func (c *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.trips.Add(1)
		return next(ctx, cmd)
	}
}
func (c *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.trips.Add(1)
		return next(ctx, cmds)
	}
}

// take returns the round trips counted since the last take.
func (c *tripCounter) take() int64 { return c.trips.Swap(0) }

// remaining returns l's Remaining for key (an n == 0 look).
func remaining(t *testing.T, l Limiter, key string) int {
	t.Helper()
	r, err := l.AllowN(context.Background(), key, 0)
	require.NoError(t, err)
	return r.Remaining
}

func TestAllowAllRoundTripsAndResults(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newClock()
		opts := []Option{WithClock(clock.Now)}
		perUser, err := NewSlidingWindow(b.rdb, 5, time.Minute, time.Second, opts...)
		require.NoError(t, err)
		perTenant, err := NewFixedWindow(b.rdb, 3, time.Hour, append(opts, WithDenyCache(16))...)
		require.NoError(t, err)
		burst, err := NewTokenBucket(b.rdb, 10, PerSecond(1), opts...)
		require.NoError(t, err)
		parts := []Part{{perUser, "alice"}, {perTenant, "acme"}, {burst, "alice"}}
		for _, p := range parts {
			remaining(t, p.Limiter, p.Key) // the server loads each script
		}
		_, err = AllowAll(ctx, 0, parts...) // and the pool has a connection
		require.NoError(t, err)
		trips := &tripCounter{}
		b.rdb.AddHook(trips)

		for i := range 3 {
			r, err := AllowAll(ctx, 1, parts...)
			require.NoError(t, err)
			require.True(t, r.Allowed, "call %d", i)
			require.Equal(t, 1, r.Part, "the tenant's limit has the fewest permits left")
			require.Equal(t, 2-i, r.Remaining)
			require.Equal(t, 1, r.Grant.N())
			require.Equal(t, int64(1), trips.take(), "call %d: every part granted in one round trip", i)
		}

		r, err := AllowAll(ctx, 1, parts...)
		require.NoError(t, err)
		require.False(t, r.Allowed)
		require.Equal(t, 1, r.Part, "the tenant's limit denied")
		require.Equal(t, time.Hour, r.RetryAfter)
		require.LessOrEqual(t, trips.take(), int64(2), "a denial costs at most one more round trip, for the refunds")

		r, err = AllowAll(ctx, 1, parts...)
		require.NoError(t, err)
		require.False(t, r.Allowed)
		require.Equal(t, 1, r.Part)
		require.Equal(t, int64(0), trips.take(), "a denial in a part's deny cache answers without a round trip")

		require.Equal(t, 2, remaining(t, perUser, "alice"), "the denied calls took nothing from the user's limit")
		require.Equal(t, 7, remaining(t, burst, "alice"), "nor from the bucket")
		trips.take()

		r, err = AllowAll(ctx, 0, parts...)
		require.NoError(t, err)
		require.True(t, r.Allowed, "n == 0 reports")
		require.Equal(t, Grant{}, r.Grant)
	})
}

func TestAllowAllBadInputBeforeAnyRoundTrip(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		l, err := NewFixedWindow(b.rdb, 5, time.Minute)
		require.NoError(t, err)
		trips := &tripCounter{}
		b.rdb.AddHook(trips)
		var nilWindow *FixedWindow
		for _, tc := range []struct {
			name  string
			n     int
			parts []Part
		}{
			{"no parts", 1, nil},
			{"n below 0", -1, []Part{{l, "k"}}},
			{"a nil Limiter", 1, []Part{{l, "k"}, {nil, "k"}}},
			{"a typed nil Limiter", 1, []Part{{l, "k"}, {nilWindow, "k"}}},
			{"an empty key", 1, []Part{{l, "k"}, {l, ""}}},
			{"a zero-value limiter", 1, []Part{{l, "k"}, {&FixedWindow{}, "k"}}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := AllowAll(context.Background(), tc.n, tc.parts...)
				require.Error(t, err)
				require.True(t, errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrInvalidConfig), "got %v", err)
				require.Equal(t, int64(0), trips.take(), "no round trip")
			})
		}
	})
}

// Many goroutines in several "processes" (clients) on overlapping parts:
// no part is ever over its limit, and at rest each part's count is the
// number of granted AllowAll calls it was in.
func TestAllowAllConcurrentExact(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		const processes, goroutines, calls = 3, 8, 40
		type parts struct{ user, tenant Limiter }
		var ps []parts
		for range processes {
			user, err := NewFixedWindow(b.rdb, 30, time.Hour)
			require.NoError(t, err)
			tenant, err := NewSlidingWindow(b.rdb, 50, time.Hour, time.Minute)
			require.NoError(t, err)
			ps = append(ps, parts{user, tenant})
		}
		var granted [3]atomic.Int64 // by user key u0..u2
		var wg sync.WaitGroup
		for p := range processes {
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(p*100+g)+testseed.Offset(t), 38))
					for range calls {
						u := rng.IntN(3)
						r, err := AllowAll(ctx, 1, Part{ps[p].user, fmt.Sprintf("u%d", u)}, Part{ps[p].tenant, "acme"})
						if err != nil {
							t.Errorf("AllowAll: %v", err)
							return
						}
						if r.Allowed {
							granted[u].Add(1)
						}
					}
				}()
			}
		}
		wg.Wait()
		var total int64
		for u := range 3 {
			n := granted[u].Load()
			total += n
			require.LessOrEqual(t, n, int64(30), "user u%d over its limit", u)
			require.Equal(t, int(30-n), remaining(t, ps[0].user, fmt.Sprintf("u%d", u)), "user u%d's count is its granted calls", u)
		}
		require.Equal(t, int64(50), total, "the tenant's 50 are all granted, and no more")
		require.Equal(t, 0, remaining(t, ps[0].tenant, "acme"))
	})
}

// Grant.Release ends what is in flight and keeps what was counted: the
// lease of an AllowAll grant goes back, its minute's permit stays.
func TestAllowAllReleaseKeepsTheCount(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newClock()
		perMinute, err := NewFixedWindow(b.rdb, 10, time.Minute, WithClock(clock.Now))
		require.NoError(t, err)
		inFlight, err := NewConcurrency(b.rdb, 1, time.Minute, WithClock(clock.Now))
		require.NoError(t, err)
		parts := []Part{{perMinute, "u"}, {inFlight, "u"}}
		r, err := AllowAll(ctx, 1, parts...)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		denied, err := AllowAll(ctx, 1, parts...)
		require.NoError(t, err)
		require.False(t, denied.Allowed, "one in flight")
		require.NoError(t, r.Grant.Release(ctx))
		require.Equal(t, 1, remaining(t, inFlight, "u"), "the lease went back")
		require.Equal(t, 9, remaining(t, perMinute, "u"), "the minute's permit stays counted")

		plain, err := perMinute.Allow(ctx, "v")
		require.NoError(t, err)
		require.NoError(t, plain.Grant.Release(ctx))
		require.Equal(t, 9, remaining(t, perMinute, "v"), "a grant of a limiter without leases holds nothing in flight")
		require.NoError(t, Grant{}.Release(ctx))
	})
}
