package redlimit_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/inmem"
)

// At most 2 requests of a user in flight: each holds a lease while it
// runs, and releases it when done.
func ExampleConcurrency() {
	rdb, done := newRedis()
	defer done()
	limiter, err := redlimit.NewConcurrency(rdb, 2, 30*time.Second, redlimit.WithClock(exampleClock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	first, _ := limiter.Acquire(ctx, "user:42")
	second, _ := limiter.Acquire(ctx, "user:42")
	if _, err := limiter.Acquire(ctx, "user:42"); errors.Is(err, redlimit.ErrAcquireFailed) {
		fmt.Println("third:", err)
	}
	_ = first.Release(ctx)
	third, err := limiter.Acquire(ctx, "user:42")
	fmt.Println("after a release:", err)
	_ = second.Release(ctx)
	_ = third.Release(ctx)
	// Output:
	// third: redlimit: rate limit exceeded: limit 2, retry after 30s
	// after a release: <nil>
}

// TestConcurrencyFallbackLeases: while Redis is down the fallback grants
// leases, and their Release and Extend go to it too.
func TestConcurrencyFallbackLeases(t *testing.T) {
	ctx := context.Background()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(redlimit.ClientOptions(m.Addr()))
	defer rdb.Close()
	fallback, err := inmem.NewConcurrency(1, time.Minute)
	require.NoError(t, err)
	c, err := redlimit.NewConcurrency(rdb, 5, time.Minute, redlimit.WithFallback(fallback), redlimit.WithoutBreaker())
	require.NoError(t, err)
	m.Close()

	lease, err := c.Acquire(ctx, "k")
	require.NoError(t, err, "the fallback grants while Redis is down")
	_, err = c.Acquire(ctx, "k")
	var denial *redlimit.ViolationStrategyError
	require.ErrorAs(t, err, &denial, "the fallback's share is 1")
	require.Equal(t, 1, denial.Limit)
	require.NoError(t, lease.Extend(ctx), "the fallback extends its own lease")
	require.NoError(t, lease.Release(ctx), "the fallback releases its own lease")
	again, err := c.Acquire(ctx, "k")
	require.NoError(t, err, "the released place is free in the fallback")
	require.NoError(t, again.Release(ctx))
}
