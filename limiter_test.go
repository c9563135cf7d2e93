package redlimit

// Tests of the Limiter contract (limiter.go) that every algorithm keeps:
// typed denials, misuse as errors, and any redis.Scripter as a client. The
// exact decisions of each algorithm are in table_test.go; what a key's
// state does over time in state_test.go.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every algorithm's TryAcquire denies with a *ViolationStrategyError that
// carries the Limit, Window and RetryAfter of the limit that denied.
func TestTypedDenials(t *testing.T) {
	want := map[string]ViolationStrategyError{
		"fixed_window":   {Limit: 3, Window: 10 * time.Second, RetryAfter: 10 * time.Second},
		"sliding_window": {Limit: 3, Window: 10 * time.Second, RetryAfter: 10 * time.Second},
		"sliding_log":    {Limit: 3, Window: 10 * time.Second, RetryAfter: 10 * time.Second},
		"leaky_bucket":   {Limit: 3, Window: 10 * time.Second, RetryAfter: 10 * time.Second / 3},
		"token_bucket":   {Limit: 3, Window: 10 * time.Second, RetryAfter: 10*time.Second/3 + time.Microsecond},
	}
	t.Parallel()
	for _, a := range algorithms {
		t.Run(a.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				b.keepKeys() // a fake clock: its TTLs, seconds at most, would pass in real time
				ctx := context.Background()
				clock := newClock()
				l, err := a.new(b.rdb, 3, 10*time.Second, WithClock(clock.Now))
				require.NoError(t, err)
				for i := range 3 {
					require.NoError(t, l.TryAcquire(ctx, "k"), "permit %d", i)
				}
				err = l.TryAcquire(ctx, "k")
				require.ErrorIs(t, err, ErrAcquireFailed)
				var v *ViolationStrategyError
				require.ErrorAs(t, err, &v)
				w := want[a.name]
				assert.Equal(t, w.Limit, v.Limit, "Limit")
				assert.Equal(t, w.Window, v.Window, "Window")
				assert.InDelta(t, float64(w.RetryAfter), float64(v.RetryAfter), float64(time.Microsecond), "RetryAfter")
				r, err := l.AllowN(ctx, "k", 4)
				require.NoError(t, err)
				assert.False(t, r.Allowed)
				assert.Equal(t, Never, r.RetryAfter, "more than the capacity: Never")
			})
		})
	}
}

// A limiter no constructor made, and a nil ctx, are errors with a sentinel
// and the algorithm's name, never a panic and never a round trip.
func TestMisuseIsAnError(t *testing.T) {
	t.Parallel()
	zero := []Limiter{&FixedWindow{}, &SlidingWindow{}, &SlidingLog{}, &LeakyBucket{}, &TokenBucket{}}
	for _, l := range zero {
		ctx := context.Background()
		assert.ErrorIs(t, l.TryAcquire(ctx, "k"), ErrInvalidConfig)
		_, err := l.AllowN(ctx, "k", 1)
		assert.ErrorIs(t, err, ErrInvalidConfig)
		assert.ErrorIs(t, l.Reset(ctx, "k"), ErrInvalidConfig)
	}
	rdb := deadRedis(t, "", 0) // never dialled
	for _, a := range algorithms {
		l, err := a.new(rdb, 3, 10*time.Second)
		require.NoError(t, err)
		//lint:ignore SA1012 a nil ctx is the misuse under test
		_, err = l.AllowN(nil, "k", 1) //nolint:staticcheck
		require.ErrorIs(t, err, ErrInvalidArgument, a.name)
		assert.Contains(t, err.Error(), a.name)
		_, err = l.AllowN(context.Background(), "", 1)
		require.ErrorIs(t, err, ErrInvalidArgument, a.name)
		assert.Contains(t, err.Error(), a.name)
		_, err = l.AllowN(context.Background(), "k", -1)
		require.ErrorIs(t, err, ErrInvalidArgument, a.name)
		assert.Contains(t, err.Error(), a.name)
		assert.Equal(t, 1, strings.Count(err.Error(), "redlimit:"), "%q says redlimit: once", err)

		clocked, err := a.new(rdb, 3, 10*time.Second, WithClock(func() time.Time { return time.Unix(-1, 0) }))
		require.NoError(t, err)
		_, err = clocked.AllowN(context.Background(), "k", 1)
		require.ErrorIs(t, err, ErrInvalidArgument, "a clock before 1970")
		assert.Contains(t, err.Error(), a.name)
		clocked, err = a.new(rdb, 3, 10*time.Second, WithClock(func() time.Time { return time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC) }))
		require.NoError(t, err)
		_, err = clocked.AllowN(context.Background(), "k", 1)
		require.ErrorIs(t, err, ErrInvalidArgument, "a clock after 2112")
	}
}

// scripterOnly hides every method of a client but redis.Scripter's, as a
// wrapper or mock of the interface would: the engine then runs its script
// through redis.Script.Run instead of a prepared command.
type scripterOnly struct{ redis.Scripter }

// A client that is only a redis.Scripter decides as a *redis.Client does,
// its Results field for field, and loads the script again after SCRIPT
// FLUSH: EVALSHA, NOSCRIPT, then one EVAL. Not parallel: SCRIPT FLUSH
// empties the shared server's cache under every other test.
func TestScripterWithoutProcess(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newClock()
				rec := &commandRecorder{}
				b.rdb.AddHook(rec)
				only, err := a.new(scripterOnly{b.rdb}, 3, 10*time.Second, WithClock(clock.Now), WithPrefix("only:"))
				require.NoError(t, err)
				client, err := a.new(b.rdb, 3, 10*time.Second, WithClock(clock.Now), WithPrefix("client:"))
				require.NoError(t, err)
				for i, n := range []int{1, 0, 2, 1, 4, 0} {
					clock.Advance(100 * time.Millisecond)
					got, err := only.AllowN(ctx, "k", n)
					require.NoError(t, err, "call %d, n=%d, through a Scripter only", i, n)
					want, err := client.AllowN(ctx, "k", n)
					require.NoError(t, err)
					require.Equal(t, withoutGrant(want), withoutGrant(got), "call %d, n=%d: the same Result as through a *redis.Client", i, n)
				}
				require.ErrorIs(t, only.TryAcquire(ctx, "k"), ErrAcquireFailed, "the key is spent")

				rec.take()
				_, err = only.AllowN(ctx, "k", 0)
				require.NoError(t, err)
				require.Equal(t, []string{"evalsha"}, rec.names(), "one EVALSHA per decision")
				// miniredis and redis-server both empty the script cache.
				require.NoError(t, b.rdb.ScriptFlush(ctx).Err())
				rec.take()
				_, err = only.AllowN(ctx, "k", 0)
				require.NoError(t, err, "after SCRIPT FLUSH the script is sent again")
				require.Equal(t, []string{"evalsha", "eval"}, rec.names(), "NOSCRIPT, then one EVAL")
				require.NoError(t, only.Reset(ctx, "k"))
				requireFullyAvailable(t, only, "k", 3, "after Reset through a Scripter only")
			})
		})
	}
}
