package inmem

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
)

// calendarPeriods are the periods the calendar traces run on, as the
// limiter and as the model take them.
func calendarPeriods(t *testing.T) []struct {
	p redlimit.Period
	m model.CalendarPeriod
} {
	t.Helper()
	load := func(name string) *time.Location {
		loc, err := time.LoadLocation(name)
		require.NoError(t, err)
		return loc
	}
	ny, lordHowe, kolkata := load("America/New_York"), load("Australia/Lord_Howe"), load("Asia/Kolkata")
	return []struct {
		p redlimit.Period
		m model.CalendarPeriod
	}{
		{redlimit.Daily(ny), model.CalendarPeriod{Kind: "day", Loc: ny}},
		{redlimit.Daily(lordHowe), model.CalendarPeriod{Kind: "day", Loc: lordHowe}},
		{redlimit.Weekly(kolkata, time.Monday), model.CalendarPeriod{Kind: "week", Loc: kolkata, Weekday: time.Monday}},
		{redlimit.Monthly(time.UTC, 31), model.CalendarPeriod{Kind: "month", Loc: time.UTC, Day: 31}},
	}
}

// The in-process calendar window answers random traces as the model
// does: across daylight-saving days, clocks a few seconds behind the
// key's time, clocks gone wrong, and refunds.
func TestCalendarWindowAgreesWithModel(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	starts := []time.Time{
		time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC), time.Date(2026, 10, 31, 12, 0, 0, 0, time.UTC),
		time.Date(2026, 4, 4, 0, 0, 0, 0, time.UTC), time.Date(2028, 1, 30, 0, 0, 0, 0, time.UTC),
	}
	for i, pp := range calendarPeriods(t) {
		for seed := uint64(0); seed < 8; seed++ {
			rng := rand.New(rand.NewPCG(seed+offset, uint64(i)))
			limit := 1 + rng.Int64N(4)
			trace := model.CalendarTrace(rng, pp.m, limit, starts[i].UnixMicro(), 80)
			t.Run(fmt.Sprintf("%v/%d", pp.p, seed), func(t *testing.T) {
				clock := &fakeClock{}
				l, err := NewCalendarWindow(int(limit), pp.p, WithClock(clock.Now))
				require.NoError(t, err)
				runCalendarTrace(t, l, clock, trace)
			})
		}
	}
}

// runCalendarTrace replays trace on l and checks every Result.
func runCalendarTrace(t *testing.T, l redlimit.Limiter, clock *fakeClock, trace []model.CalendarStep) {
	t.Helper()
	ctx := context.Background()
	grants := make([]redlimit.Grant, len(trace))
	for i, s := range trace {
		clock.now = time.UnixMicro(s.AtUS)
		if s.Refund > 0 {
			require.NoError(t, grants[s.Refund-1].Refund(ctx, int(s.N)), "step %d: refund", i)
		}
		n := s.N
		if s.Refund > 0 {
			n = 0
		}
		r, err := l.AllowN(ctx, "k", int(n))
		require.NoError(t, err)
		grants[i] = r.Grant
		want := redlimit.Result{
			Allowed:    s.Want.Allowed,
			Limit:      int(s.Want.Limit),
			Remaining:  int(s.Want.Remaining),
			RetryAfter: microsDuration(s.Want.RetryAfterUS),
			ResetAfter: microsDuration(s.Want.ResetAfterUS),
		}
		r.Grant = redlimit.Grant{}
		require.Equal(t, want, r, "step %d: n=%d (refund of step %d) at %v", i, s.N, s.Refund-1, clock.now.UTC())
	}
}

// Refunds give back into the period that counted the grant, partly, at
// most once, never past what the grant took, and nothing once the period
// is over.
func TestCalendarWindowRefunds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := &fakeClock{now: time.Date(2026, 5, 10, 12, 0, 0, 0, time.UTC)}
	l, err := NewCalendarWindow(10, redlimit.Daily(time.UTC), WithClock(clock.Now))
	require.NoError(t, err)
	remaining := func() int {
		r, err := l.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		return r.Remaining
	}
	r, err := l.AllowN(ctx, "k", 6)
	require.NoError(t, err)
	g := r.Grant
	require.Equal(t, 6, g.N())
	require.NoError(t, g.Refund(ctx, 2))
	assert.Equal(t, 6, remaining(), "2 of 6 given back")
	require.NoError(t, g.Refund(ctx, 2))
	assert.Equal(t, 6, remaining(), "the same refund twice gives nothing more")
	require.NoError(t, g.Refund(ctx, 1))
	assert.Equal(t, 6, remaining(), "a smaller refund gives nothing")
	require.NoError(t, g.Refund(ctx, 6))
	assert.Equal(t, 10, remaining(), "all 6 given back in all")
	assert.ErrorIs(t, g.Refund(ctx, 7), redlimit.ErrInvalidArgument, "past the grant")

	r, err = l.AllowN(ctx, "k", 3)
	require.NoError(t, err)
	clock.now = time.Date(2026, 5, 11, 0, 0, 0, 0, time.UTC)
	_, err = l.AllowN(ctx, "k", 4)
	require.NoError(t, err)
	require.NoError(t, r.Grant.Refund(ctx, 3))
	assert.Equal(t, 6, remaining(), "a grant of the day before gives nothing back into today")
}
