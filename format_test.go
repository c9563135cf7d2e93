package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Keys written by the previous released format (the fixed window's format
// 2, whose two forms format 3 keeps as they are; the buckets' format 2, a
// level at the reader's own rate) under an explicit WithPrefix, where a rolling upgrade
// meets them, are read as they were. Each case is a value in the exact
// shape format 2 wrote, with the TTL it had; the calls decide on it, and
// the value left behind is the current format's (WithPrefix: the buckets
// store their rate and capacity).
func TestStateFormat2StillRead(t *testing.T) {
	now := epoch.UnixMicro() // 1800000000000000
	cases := []struct {
		name      string
		make      func(rdb redis.Scripter, opts ...Option) (Limiter, error)
		value     string
		ttl       time.Duration
		remaining int
		reset     time.Duration
		after     string // the value after one allowed permit (current format)
	}{
		{
			name: "fixed window, short form",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewFixedWindow(rdb, 10, time.Minute, opts...)
			},
			// count 4, window ends 30s from now, tag 3.
			value: "418000000300000003", ttl: 30 * time.Second,
			remaining: 5, reset: 30 * time.Second,
			after: "5 1800000030000000 60000000 3", // WithPrefix stores the window's length
		},
		{
			name: "fixed window, form with the window's length",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewFixedWindow(rdb, 10, time.Minute, opts...)
			},
			value: "4 1800000030000000 60000000 3", ttl: 30 * time.Second,
			remaining: 5, reset: 30 * time.Second,
			after: "5 1800000030000000 60000000 3",
		},
		{
			name: "leaky bucket, whole microseconds",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewLeakyBucket(rdb, 10, PerSecond(1), opts...)
			},
			// level 4: empty 4s from now, tag 1.
			value: "18000000040000001", ttl: 4 * time.Second,
			remaining: 5, reset: 5 * time.Second,
			after: "1800000005000000 0 1 1000000 10 1",
		},
		{
			name: "leaky bucket, a fraction of a microsecond",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewLeakyBucket(rdb, 10, PerSecond(3), opts...)
			},
			// level 1 at 3 per second: empty 333333 1/3 µs from now.
			value: "18000000003333331+1/3", ttl: 334 * time.Millisecond,
			remaining: 8, reset: 666667 * time.Microsecond,
			after: "1800000000666666 2 3 1000000 10 1",
		},
		{
			name: "token bucket, whole microseconds",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewTokenBucket(rdb, 10, PerSecond(1), opts...)
			},
			// 4 tokens missing: full 4s from now, tag 2.
			value: "18000000040000002", ttl: 4 * time.Second,
			remaining: 5, reset: 5 * time.Second,
			after: "1800000005000000 0 1 1000000 10 2",
		},
		{
			name: "token bucket, a fraction, read at another rate",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewTokenBucket(rdb, 10, PerSecond(2), opts...)
			},
			// Written at 3 per second: 1 token missing, full 333333 1/3 µs
			// from now. At 2 per second (ticks of whole µs) the fraction
			// rounds up to 333334 µs, then one more token (500000 µs).
			value: "18000000003333332+1/3", ttl: 334 * time.Millisecond,
			remaining: 8, reset: 833334 * time.Microsecond,
			after: "1800000000833334 0 1 500000 10 2",
		},
	}
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				clock := &fakeClock{now: epoch}
				l, err := tc.make(b.rdb, WithPrefix("fmt:"), WithClock(clock.Now))
				require.NoError(t, err)
				require.Equal(t, "fmt:k", redisKey(l, "k"))
				require.NoError(t, b.rdb.Set(ctx, "fmt:k", tc.value, tc.ttl).Err())
				require.Equal(t, now, clock.now.UnixMicro())

				r, err := l.AllowN(ctx, "k", 0)
				require.NoError(t, err, "n=0 on a format 2 value %q", tc.value)
				assert.Equal(t, tc.remaining+1, r.Remaining, "n=0 reads the format 2 value %q", tc.value)

				r, err = l.Allow(ctx, "k")
				require.NoError(t, err, "a format 2 value %q is read, never an error", tc.value)
				assert.True(t, r.Allowed, "allowed on %q", tc.value)
				assert.Equal(t, tc.remaining, r.Remaining, "Remaining after one permit on %q", tc.value)
				assert.Equal(t, tc.reset, r.ResetAfter, "ResetAfter after one permit on %q", tc.value)
				assert.Equal(t, tc.after, b.rdb.Get(ctx, "fmt:k").Val(), "written back in the current format")
				require.NoError(t, b.rdb.Del(ctx, "fmt:k").Err())
			})
		}
	})
}
