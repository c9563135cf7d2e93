package redlimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/inmem"
)

// stepClock is a settable clock.
type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time { return c.now }

// lookRemaining returns l's Remaining for key (an n == 0 look).
func lookRemaining(t *testing.T, l redlimit.Limiter, key string) int {
	t.Helper()
	r, err := l.AllowN(context.Background(), key, 0)
	require.NoError(t, err)
	return r.Remaining
}

// An in-process part that denies stops the call before Redis is asked,
// and one that granted is given back when a Redis part denies.
func TestAllowAllWithInProcessParts(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { rdb.Close() })
	{
		ctx := context.Background()
		clock := &stepClock{now: time.Unix(1_800_000_000, 0)}
		local, err := inmem.NewFixedWindow(2, time.Minute, inmem.WithClock(clock.Now))
		require.NoError(t, err)
		shared, err := redlimit.NewFixedWindow(rdb, 1, time.Minute, redlimit.WithClock(clock.Now))
		require.NoError(t, err)
		parts := []redlimit.Part{{local, "k"}, {shared, "k"}}

		r, err := redlimit.AllowAll(ctx, 1, parts...)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		r, err = redlimit.AllowAll(ctx, 1, parts...)
		require.NoError(t, err)
		require.False(t, r.Allowed)
		require.Equal(t, 1, r.Part, "the Redis part denied")
		require.Equal(t, 1, lookRemaining(t, local, "k"), "the in-process part's permit was given back")
	}
}
