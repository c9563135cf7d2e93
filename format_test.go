package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Keys written by the previous released formats (the fixed window's format
// 2, whose two forms format 3 keeps as they are; the buckets' format 2, a
// level at the reader's own rate, and 3, a level at its writer's rate)
// under an explicit WithPrefix, where a rolling upgrade meets them, are
// read as they were. Each case is a value in the exact
// shape format 2 wrote, with the TTL it had; the calls decide on it, and
// the value left behind is the current format's (WithPrefix: the buckets
// store their rate and capacity).
func TestStateFormat2StillRead(t *testing.T) {
	now := epoch.UnixMicro() // 1800000000000000
	cases := []struct {
		name      string
		make      func(rdb redis.Scripter, opts ...Option) (Limiter, error)
		value     string
		remaining int
		reset     time.Duration
		after     string // the value after one allowed permit (current format), if pinned
	}{
		{
			name: "fixed window, short form",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewFixedWindow(rdb, 10, time.Minute, opts...)
			},
			// count 4, window ends 30s from now, tag 3.
			value:     "418000000300000003",
			remaining: 5, reset: 30 * time.Second,
			after: "5 1800000030000000 60000000 3", // WithPrefix stores the window's length
		},
		{
			name: "fixed window, form with the window's length",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewFixedWindow(rdb, 10, time.Minute, opts...)
			},
			value:     "4 1800000030000000 60000000 3",
			remaining: 5, reset: 30 * time.Second,
			after: "5 1800000030000000 60000000 3",
		},
		{
			name: "leaky bucket, whole microseconds",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewLeakyBucket(rdb, 10, PerSecond(1), opts...)
			},
			// level 4: empty 4s from now, tag 1.
			value:     "18000000040000001",
			remaining: 5, reset: 5 * time.Second,
		},
		{
			name: "leaky bucket, a fraction of a microsecond",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewLeakyBucket(rdb, 10, PerSecond(3), opts...)
			},
			// level 1 at 3 per second: empty 333333 1/3 µs from now.
			value:     "18000000003333331+1/3",
			remaining: 8, reset: 666667 * time.Microsecond,
		},
		{
			name: "token bucket, whole microseconds",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewTokenBucket(rdb, 10, PerSecond(1), opts...)
			},
			// 4 tokens missing: full 4s from now, tag 2.
			value:     "18000000040000002",
			remaining: 5, reset: 5 * time.Second,
		},
		{
			name: "leaky bucket, format 3 (its rate and capacity)",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewLeakyBucket(rdb, 10, PerSecond(1), opts...)
			},
			// Written at 2 per second by a bucket of 10: level 4 (empty 2s
			// from now), read at its writer's rate. The permit at this
			// slower rate drains first (1s), then the 4 at theirs.
			value:     "1800000002000000 0 1 500000 10 1",
			remaining: 5, reset: 3 * time.Second,
		},
		{
			name: "token bucket, format 3 (its rate and capacity)",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewTokenBucket(rdb, 10, PerSecond(1), opts...)
			},
			// Written at 1 per second by a bucket of 20: 14 tokens missing,
			// above this bucket's 10: it reads as empty.
			value:     "1800000014000000 0 1 1000000 20 2",
			remaining: -1,
		},
		{
			name: "token bucket, a fraction, read at another rate",
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewTokenBucket(rdb, 10, PerSecond(2), opts...)
			},
			// Written at 3 per second: 1 token missing, full 333333 1/3 µs
			// from now. At 2 per second (ticks of whole µs) the fraction
			// rounds up to 333334 µs, then one more token (500000 µs).
			value:     "18000000003333332+1/3",
			remaining: 8, reset: 833334 * time.Microsecond,
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
				// An hour: the fake clock stands still while a real server
				// spends a value's TTL (334 ms for some) in real time,
				// which a loaded machine can outlast before the first call.
				require.NoError(t, b.rdb.Set(ctx, "fmt:k", tc.value, time.Hour).Err())
				require.Equal(t, now, clock.now.UnixMicro())

				r, err := l.AllowN(ctx, "k", 0)
				require.NoError(t, err, "n=0 on a format 2 value %q", tc.value)
				if tc.remaining < 0 { // full: denied, and nothing written
					assert.Equal(t, 0, r.Remaining, "n=0 reads the value %q", tc.value)
					r, err = l.Allow(ctx, "k")
					require.NoError(t, err)
					assert.False(t, r.Allowed, "denied on %q", tc.value)
					assert.Equal(t, tc.value, b.rdb.Get(ctx, "fmt:k").Val(), "a denial writes nothing")
					require.NoError(t, b.rdb.Del(ctx, "fmt:k").Err())
					return
				}
				assert.Equal(t, tc.remaining+1, r.Remaining, "n=0 reads the format 2 value %q", tc.value)

				granted := time.Now() // before the grant: its TTL has run since
				r, err = l.Allow(ctx, "k")
				require.NoError(t, err, "a format 2 value %q is read, never an error", tc.value)
				assert.True(t, r.Allowed, "allowed on %q", tc.value)
				assert.Equal(t, tc.remaining, r.Remaining, "Remaining after one permit on %q", tc.value)
				assert.Equal(t, tc.reset, r.ResetAfter, "ResetAfter after one permit on %q", tc.value)
				if tc.after != "" {
					assert.Equal(t, tc.after, b.rdb.Get(ctx, "fmt:k").Val(), "written back in the current format")
				}
				// What the grant wrote reads back as the same state, with a
				// TTL that covers it.
				again, err := l.AllowN(ctx, "k", 0)
				require.NoError(t, err, "the value written on %q", tc.value)
				assert.Equal(t, r.Remaining, again.Remaining, "n=0 after the grant on %q", tc.value)
				assert.Equal(t, r.ResetAfter, again.ResetAfter, "n=0 after the grant on %q", tc.value)
				assert.GreaterOrEqual(t, b.rdb.PTTL(ctx, "fmt:k").Val(), r.ResetAfter-time.Since(granted)-time.Millisecond, "TTL after the grant on %q", tc.value)
				require.NoError(t, b.rdb.Del(ctx, "fmt:k").Err())
			})
		}
	})
}
