package redlimit

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/shadow"
)

// A call in shadow mode (a middleware's) is decided and counted like any other, and
// its observer sees Decision.Shadow; other calls do not. Every algorithm,
// with and without the deny cache, which answers without a round trip.
func TestObserverSeesShadow(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		var mu sync.Mutex
		var seen []Decision
		observe := WithObserver(func(d Decision) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, d)
		})
		for _, l := range newLimiters(t, b.rdb, 1, time.Minute, observe, WithDenyCache(10)) {
			shadowed := shadow.With(context.Background())
			for i, step := range []struct {
				ctx                  context.Context
				wantAllowed, wantLoc bool
			}{
				{shadowed, true, false},
				{shadowed, false, false}, // counted: the shadow grant took the permit
				{shadowed, false, true},  // the deny cache keeps the mark
				{context.Background(), false, true},
			} {
				seen = nil
				res, err := l.Allow(step.ctx, "k")
				require.NoError(t, err)
				assert.Equal(t, step.wantAllowed, res.Allowed, "%T call %d", l, i)
				require.Len(t, seen, 1)
				assert.Equal(t, shadow.Is(step.ctx), seen[0].Shadow, "%T call %d: Decision.Shadow", l, i)
				assert.Equal(t, step.wantLoc, seen[0].Local, "%T call %d: Decision.Local", l, i)
			}
		}
	})
	var nilCtx context.Context // a nil ctx, on purpose
	assert.False(t, shadow.Is(nilCtx), "a nil ctx is not shadow")
}

// shadow.With(nil) is nil, which a limiter refuses as bad input, as it
// refuses a nil ctx: no panic.
func TestShadowOfNilContext(t *testing.T) {
	//lint:ignore SA1012 a nil ctx is what this test passes
	ctx := shadow.With(nil)
	require.Nil(t, ctx)
	require.False(t, shadow.Is(ctx))
	l, err := NewFixedWindow(deadRedis(t, "", 0), 1, time.Second)
	require.NoError(t, err)
	_, err = l.Allow(ctx, "k")
	require.ErrorIs(t, err, ErrInvalidArgument)
}
