package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// AllowAll's batch over the ways a part's request can travel: parts on two
// clients (two pipelines, sent at once), a server that lost its scripts
// (NOSCRIPT inside a pipeline), and a deadline too short for a pipeline
// (the request goes alone). Each way, a grant takes one permit from every
// part and a denial takes none.
func TestAllowAllBatchPaths(t *testing.T) {
	redistest.Require(t)
	for _, tc := range []struct {
		name string
		// before runs before each call; ctx returns the call's context.
		before func(t *testing.T, a, b *redis.Client)
		ctx    func() (context.Context, context.CancelFunc)
	}{
		{name: "two clients"},
		{name: "scripts flushed", before: func(t *testing.T, a, b *redis.Client) {
			require.NoError(t, a.ScriptFlush(context.Background()).Err())
			require.NoError(t, b.ScriptFlush(context.Background()).Err())
		}},
		{name: "short deadline", ctx: func() (context.Context, context.CancelFunc) {
			// Below the least a pipeline is given (the engine's
			// DefaultMinDeadline, 20ms): each request goes alone.
			return context.WithTimeout(context.Background(), defaultBreakerMinDeadline-time.Millisecond)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, dbA := redistest.DB(t)
			_, dbB := redistest.DB(t)
			a, b := newClient(t, addr, dbA), newClient(t, addr, dbB)
			clock := newClock()
			perUser, err := NewFixedWindow(a, 3, time.Hour, WithClock(clock.Now))
			require.NoError(t, err)
			perTenant, err := NewSlidingWindow(b, 5, time.Hour, time.Minute, WithClock(clock.Now))
			require.NoError(t, err)
			burst, err := NewTokenBucket(a, 10, PerHour(1), WithClock(clock.Now))
			require.NoError(t, err)
			parts := []Part{{perUser, "alice"}, {perTenant, "acme"}, {burst, "alice"}}
			call := func() Result {
				t.Helper()
				if tc.before != nil {
					tc.before(t, a, b)
				}
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if tc.ctx != nil {
					ctx, cancel = tc.ctx()
				}
				defer cancel()
				r, err := AllowAll(ctx, 1, parts...)
				require.NoError(t, err)
				return r
			}
			for i := range 3 {
				r := call()
				require.True(t, r.Allowed, "call %d", i)
				require.Equal(t, 0, r.Part, "the user's limit has the fewest permits left")
				require.Equal(t, 2-i, r.Remaining)
			}
			r := call()
			require.False(t, r.Allowed, "the user's limit is used up")
			require.Equal(t, 0, r.Part)
			require.Equal(t, 2, remaining(t, perTenant, "acme"), "the denied call took nothing from the tenant's limit")
			require.Equal(t, 7, remaining(t, burst, "alice"), "nor from the bucket")
		})
	}
}
