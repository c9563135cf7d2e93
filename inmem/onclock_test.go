package inmem

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
)

// viewable is every limiter here: OnClock gives a view on another clock.
type viewable interface {
	redlimit.Limiter
	OnClock(now func() time.Time) redlimit.Limiter
}

// onClockCases are one limiter of each type granting 5 permits, counted
// for at least a minute and refilled within a day.
func onClockCases() []struct {
	name string
	make func(opts ...Option) (viewable, error)
} {
	return []struct {
		name string
		make func(opts ...Option) (viewable, error)
	}{
		{"fixed_window", func(opts ...Option) (viewable, error) { return NewFixedWindow(5, time.Minute, opts...) }},
		{"calendar_window", func(opts ...Option) (viewable, error) { return NewCalendarWindow(5, redlimit.Daily(time.UTC), opts...) }},
		{"sliding_window", func(opts ...Option) (viewable, error) { return NewSlidingWindow(5, time.Minute, time.Second, opts...) }},
		{"sliding_log", func(opts ...Option) (viewable, error) {
			return NewSlidingLog(time.Second, []redlimit.Strategy{{Limit: 5, Window: time.Minute}}, opts...)
		}},
		{"leaky_bucket", func(opts ...Option) (viewable, error) { return NewLeakyBucket(5, redlimit.PerMinute(5), opts...) }},
		{"token_bucket", func(opts ...Option) (viewable, error) { return NewTokenBucket(5, redlimit.PerMinute(5), opts...) }},
		{"concurrency", func(opts ...Option) (viewable, error) { return NewConcurrency(5, time.Minute, opts...) }},
	}
}

// drain takes permits from l one at a time, 6 times: how many it granted.
func drain(t *testing.T, l redlimit.Limiter) int {
	t.Helper()
	granted := 0
	for range 6 {
		r, err := l.Allow(context.Background(), "k")
		require.NoError(t, err)
		if r.Allowed {
			granted++
		}
	}
	return granted
}

// An OnClock view decides on its clock, over the keys of the limiter it
// views: what one view granted, another view sees, and a Reset of the
// original frees the key for both.
func TestOnClockViewSharesKeys(t *testing.T) {
	for _, c := range onClockCases() {
		t.Run(c.name, func(t *testing.T) {
			l, err := c.make()
			require.NoError(t, err)
			first, second := &fakeClock{now: epoch}, &fakeClock{now: epoch}
			a, b := l.OnClock(first.Now), l.OnClock(second.Now)
			require.IsType(t, l, a, "a view is a limiter of the same type")
			require.Equal(t, 5, drain(t, a), "the limit, through a view")
			require.Equal(t, 0, drain(t, b), "another view of the same limiter sees the key spent")
			first.Advance(24 * time.Hour)
			require.Equal(t, 5, drain(t, a), "a day later on the view's clock, the key has refilled")
			require.NoError(t, l.Reset(context.Background(), "k"))
			require.Equal(t, 5, drain(t, b), "a Reset of the original frees the key for its views")
		})
	}
}

// A limiter built with WithClock keeps its clock: OnClock returns it, as
// it does for a nil clock.
func TestOnClockOwnClockWins(t *testing.T) {
	for _, c := range onClockCases() {
		t.Run(c.name, func(t *testing.T) {
			own := &fakeClock{now: epoch}
			l, err := c.make(WithClock(own.Now))
			require.NoError(t, err)
			other := &fakeClock{now: epoch}
			view := l.OnClock(other.Now)
			require.Same(t, l, view, "a limiter with its own clock is its own view")
			require.Equal(t, 5, drain(t, view))
			other.Advance(24 * time.Hour)
			require.Equal(t, 0, drain(t, view), "the other clock moved, the limiter's own did not")

			free, err := c.make()
			require.NoError(t, err)
			require.Same(t, free, free.OnClock(nil), "a nil clock changes nothing")
		})
	}
}

// A view's grants give back through the view, on its clock: a clock a
// year behind time.Now, in whose window the grant still is.
func TestOnClockViewRefundsOnItsClock(t *testing.T) {
	ctx := context.Background()
	for _, c := range onClockCases() {
		t.Run(c.name, func(t *testing.T) {
			l, err := c.make()
			require.NoError(t, err)
			behind := &fakeClock{now: time.Now().AddDate(-1, 0, 0)}
			view := l.OnClock(behind.Now)
			r, err := view.AllowN(ctx, "k", 5)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			behind.Advance(time.Millisecond)
			require.NoError(t, r.Grant.Refund(ctx, 3))
			r, err = view.AllowN(ctx, "k", 3)
			require.NoError(t, err)
			require.True(t, r.Allowed, "the refund gave 3 back in the grant's window, on the view's clock")
			r, err = view.AllowN(ctx, "k", 1)
			require.NoError(t, err)
			require.False(t, r.Allowed, "and no more")
		})
	}
}

// A lease a view granted extends through the view, on its clock (a lease
// still live there keeps its place: the same Grant), and through the
// original too, as the original's own leases extend through the view.
func TestOnClockViewExtendsOnItsClock(t *testing.T) {
	ctx := context.Background()
	l, err := NewConcurrency(2, time.Minute)
	require.NoError(t, err)
	behind := &fakeClock{now: time.Now().AddDate(-1, 0, 0)}
	view := l.OnClock(behind.Now).(*Concurrency)
	r, err := view.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, r.Allowed)
	behind.Advance(30 * time.Second)
	ext, err := view.ExtendGrant(ctx, r.Grant)
	require.NoError(t, err)
	require.True(t, ext.Allowed)
	require.Equal(t, r.Grant, ext.Grant, "live on the view's clock: the lease kept its place")

	_, err = l.ExtendGrant(ctx, r.Grant)
	require.NoError(t, err, "the original extends its view's leases")
	mine, err := l.Allow(ctx, "other")
	require.NoError(t, err)
	_, err = view.ExtendGrant(ctx, mine.Grant)
	require.NoError(t, err, "a view extends the original's leases")
}
