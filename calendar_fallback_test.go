package redlimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/inmem"
	"github.com/redlimit/redlimit/redlimittest"
)

// While Redis fails, an inmem calendar window decides, with the same
// periods: its share of the day, refilled at the zone's midnight, and
// Grants that refund into it.
func TestCalendarWindowFallback(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	env := redlimittest.New(t)
	env.Set(time.Date(2026, 11, 1, 23, 0, 0, 0, ny))
	// Its own clock, the limiter's (without one it would decide, and its
	// grants refund, on the limiter's clock all the same: OnClock).
	fb, err := inmem.NewCalendarWindow(inmem.Share(100, 20), redlimit.Daily(ny), inmem.WithClock(env.Now))
	require.NoError(t, err)
	var last redlimit.Decision
	l, err := redlimit.NewCalendarWindow(env.Client(), 100, redlimit.Daily(ny),
		env.Options(redlimit.WithFallback(fb), redlimit.WithObserver(func(d redlimit.Decision) { last = d }))...)
	require.NoError(t, err)
	ctx := context.Background()

	env.Server().SetError("simulated outage")
	r, err := l.AllowN(ctx, "acme", 5)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	assert.True(t, last.Fallback, "decided by the fallback")
	assert.Equal(t, 5, r.Limit, "the fallback's share")
	assert.Equal(t, time.Hour, r.ResetAfter, "to New York's midnight")
	require.NoError(t, r.Grant.Refund(ctx, 2), "the fallback's grant refunds into it")
	r, err = l.Allow(ctx, "acme")
	require.NoError(t, err)
	assert.True(t, r.Allowed, "2 were given back")
	assert.Equal(t, 1, r.Remaining)

	env.Advance(59 * time.Minute)
	r, err = l.AllowN(ctx, "acme", 2)
	require.NoError(t, err)
	assert.False(t, r.Allowed)
	assert.Equal(t, time.Minute, r.RetryAfter)
	env.Advance(time.Minute)
	r, err = l.AllowN(ctx, "acme", 5)
	require.NoError(t, err)
	assert.True(t, r.Allowed, "the next day, on the limiter's clock")
	assert.Equal(t, 24*time.Hour, r.ResetAfter)
}
