package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/redlimittest"
)

func TestRun(t *testing.T) {
	// redlimittest's client outlasts Allow's 50ms decision deadline on a
	// busy machine: the output is the limits', never a timeout's.
	env := redlimittest.New(t)
	var out strings.Builder
	require.NoError(t, run(&out, env.Client(), "test"))
	require.Equal(t, `acme (5 per 1m0s): 5 of 8 allowed
globex (5 per 1m0s): 5 of 8 allowed
acme (20 per 1m0s): 15 of 20 allowed
2 limiters cached for 2 tenants on 2 plans, one breaker: closed
`, out.String(), "each tenant is limited by its plan; the upgraded one keeps what it used")
}

// Limiters of every plan share the one breaker: an outage seen through one
// plan's limiter opens it for the others, which then answer at once.
func TestLimitersShareOneBreaker(t *testing.T) {
	env := redlimittest.New(t)
	rdb := env.Client()
	breaker, err := redlimit.NewBreaker(redlimit.BreakerConfig{})
	require.NoError(t, err)
	limiters := NewLimiters(rdb, breaker)
	plans := &Plans{plans: map[string]Plan{"big": pro}, before: free}
	ctx := context.Background()

	for _, tenant := range []string{"small", "big", "small"} {
		require.NoError(t, Allow(ctx, limiters, plans, tenant))
	}
	require.Equal(t, 2, limiters.Size(), "one limiter per plan, not per tenant")
	l1, err := limiters.For(free)
	require.NoError(t, err)
	l2, err := limiters.For(free)
	require.NoError(t, err)
	require.Same(t, l1, l2, "the cache returns the plan's limiter")

	env.Server().Close()
	for range 5 { // the failures that open a default breaker
		err := Allow(ctx, limiters, plans, "small")
		require.Error(t, err)
		require.False(t, errors.Is(err, redlimit.ErrUnavailable), "the breaker is still closed")
	}
	require.Equal(t, redlimit.BreakerOpen, breaker.State())
	err = Allow(ctx, limiters, plans, "big")
	require.ErrorIs(t, err, redlimit.ErrUnavailable, "the other plan's limiter shares the open breaker")
}

func TestLimitersCacheBounded(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(redlimit.ClientOptions(m.Addr()))
	t.Cleanup(func() { rdb.Close() })
	breaker, err := redlimit.NewBreaker(redlimit.BreakerConfig{})
	require.NoError(t, err)
	limiters := NewLimiters(rdb, breaker)
	for n := 1; n <= maxPlans+10; n++ {
		_, err := limiters.For(Plan{Requests: n, Window: time.Minute})
		require.NoError(t, err)
	}
	require.LessOrEqual(t, limiters.Size(), maxPlans)
}
