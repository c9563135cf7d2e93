package redlimit

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
)

// Units of the calendar step tables.
const (
	sec  = time.Second
	min_ = time.Minute
	hour = time.Hour
	day  = 24 * time.Hour
)

// calendarStep is one call of a step table: n permits at base + at, and
// the Result expected, to the microsecond.
type calendarStep struct {
	at        time.Duration
	n         int
	allowed   bool
	remaining int
	retry     time.Duration // RetryAfter: 0 when allowed
	reset     time.Duration // ResetAfter
}

// loadZone returns the named location from the system's zone data.
func loadZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err, "the calendar tests need the zone %s", name)
	return loc
}

// runCalendarSteps runs steps on one key of a calendar window of limit per
// period, on a fake clock, and checks every Result to the microsecond.
func runCalendarSteps(t *testing.T, rdb redis.Scripter, period Period, limit int, base time.Time, steps []calendarStep) {
	t.Helper()
	ctx := context.Background()
	clock := &fakeClock{now: base}
	l, err := NewCalendarWindow(rdb, limit, period, WithClock(clock.Now))
	require.NoError(t, err)
	for i, s := range steps {
		clock.now = base.Add(s.at)
		r, err := l.AllowN(ctx, "k", s.n)
		require.NoError(t, err, "step %d", i)
		where := clock.now.In(period.Location()).Format("2006-01-02 15:04:05.999999 MST")
		assert.Equal(t, s.allowed, r.Allowed, "step %d (n=%d at %s): Allowed", i, s.n, where)
		assert.Equal(t, limit, r.Limit, "step %d: Limit", i)
		assert.Equal(t, s.remaining, r.Remaining, "step %d (n=%d at %s): Remaining", i, s.n, where)
		assert.Equal(t, s.retry, r.RetryAfter, "step %d (n=%d at %s): RetryAfter", i, s.n, where)
		assert.Equal(t, s.reset, r.ResetAfter, "step %d (n=%d at %s): ResetAfter", i, s.n, where)
		if s.allowed && s.n > 0 {
			assert.Equal(t, s.n, r.Grant.N(), "step %d: the Grant", i)
		} else {
			assert.Equal(t, Grant{}, r.Grant, "step %d: no Grant", i)
		}
	}
}

// The calendar's periods, step by step on a fake clock: days across both
// of New York's 2026 daylight-saving changes (23 and 25 hours), in
// Kolkata (+5:30) and Lord Howe (a change of 30 minutes), weeks from
// Monday and from Sunday, and months anchored on 1, 15, 29, 30 and 31
// over the leap February of 2028. Every step checks the grant, Remaining,
// RetryAfter and ResetAfter to the microsecond, against durations worked
// out by hand from the calendar.
func TestCalendarWindowSteps(t *testing.T) {
	t.Parallel()
	ny := loadZone(t, "America/New_York")
	kolkata := loadZone(t, "Asia/Kolkata")
	lordHowe := loadZone(t, "Australia/Lord_Howe")
	utc := time.UTC
	date := func(y int, m time.Month, d int, loc *time.Location) time.Time {
		return time.Date(y, m, d, 0, 0, 0, 0, loc)
	}
	// The zone data agree with the durations below.
	require.Equal(t, 23*hour, date(2026, 3, 9, ny).Sub(date(2026, 3, 8, ny)))
	require.Equal(t, 25*hour, date(2026, 11, 2, ny).Sub(date(2026, 11, 1, ny)))
	require.Equal(t, time.Date(2025, 12, 31, 18, 30, 0, 0, utc), date(2026, 1, 1, kolkata).UTC())
	require.Equal(t, 24*hour+30*min_, date(2026, 4, 6, lordHowe).Sub(date(2026, 4, 5, lordHowe)))
	require.Equal(t, 23*hour+30*min_, date(2026, 10, 5, lordHowe).Sub(date(2026, 10, 4, lordHowe)))

	cases := []struct {
		name   string
		period Period
		limit  int
		base   time.Time
		steps  []calendarStep
	}{
		{"New York spring forward", Daily(ny), 3, date(2026, 3, 8, ny), []calendarStep{
			{at: -us, n: 3, allowed: true, remaining: 0, reset: us},
			{at: -us, n: 1, remaining: 0, retry: us, reset: us},
			{at: 0, n: 1, allowed: true, remaining: 2, reset: 23 * hour},
			{at: 2*hour - sec, n: 1, allowed: true, remaining: 1, reset: 21*hour + sec},
			{at: 2 * hour, n: 2, remaining: 1, retry: 21 * hour, reset: 21 * hour}, // 03:00 EDT
			{at: 2 * hour, n: 0, allowed: true, remaining: 1, reset: 21 * hour},
			{at: 2 * hour, n: 4, remaining: 1, retry: Never, reset: 21 * hour},
			{at: 23*hour - us, n: 1, allowed: true, remaining: 0, reset: us},
			{at: 23*hour - us, n: 1, remaining: 0, retry: us, reset: us},
			{at: 23 * hour, n: 1, allowed: true, remaining: 2, reset: 24 * hour},
		}},
		{"New York fall back", Daily(ny), 3, date(2026, 11, 1, ny), []calendarStep{
			{at: 0, n: 2, allowed: true, remaining: 1, reset: 25 * hour},
			{at: 90 * min_, n: 1, allowed: true, remaining: 0, reset: 23*hour + 30*min_},             // 01:30 EDT
			{at: 150 * min_, n: 1, remaining: 0, retry: 22*hour + 30*min_, reset: 22*hour + 30*min_}, // 01:30 EST
			{at: 25*hour - us, n: 1, remaining: 0, retry: us, reset: us},
			{at: 25 * hour, n: 3, allowed: true, remaining: 0, reset: 24 * hour},
		}},
		{"Kolkata", Daily(kolkata), 2, date(2026, 1, 1, kolkata), []calendarStep{
			{at: -30 * min_, n: 2, allowed: true, remaining: 0, reset: 30 * min_},
			{at: -us, n: 1, remaining: 0, retry: us, reset: us},
			{at: 0, n: 1, allowed: true, remaining: 1, reset: 24 * hour},
			{at: 5*hour + 30*min_, n: 1, allowed: true, remaining: 0, reset: 18*hour + 30*min_}, // UTC midnight: no boundary
			{at: 6 * hour, n: 1, remaining: 0, retry: 18 * hour, reset: 18 * hour},
		}},
		{"Lord Howe, 30 minutes back", Daily(lordHowe), 1, date(2026, 4, 5, lordHowe), []calendarStep{
			{at: 0, n: 1, allowed: true, remaining: 0, reset: 24*hour + 30*min_},
			{at: 2 * hour, n: 1, remaining: 0, retry: 22*hour + 30*min_, reset: 22*hour + 30*min_},
			{at: 24*hour + 30*min_ - us, n: 1, remaining: 0, retry: us, reset: us},
			{at: 24*hour + 30*min_, n: 1, allowed: true, remaining: 0, reset: 24 * hour},
		}},
		{"Lord Howe, 30 minutes forward", Daily(lordHowe), 1, date(2026, 10, 4, lordHowe), []calendarStep{
			{at: 0, n: 1, allowed: true, remaining: 0, reset: 23*hour + 30*min_},
			{at: 23*hour + 30*min_ - us, n: 1, remaining: 0, retry: us, reset: us},
			{at: 23*hour + 30*min_, n: 1, allowed: true, remaining: 0, reset: 24 * hour},
		}},
		{"UTC", Daily(utc), 2, date(2026, 6, 15, utc), []calendarStep{
			{at: 12 * hour, n: 1, allowed: true, remaining: 1, reset: 12 * hour},
			{at: 12 * hour, n: 2, remaining: 1, retry: 12 * hour, reset: 12 * hour},
			{at: 24 * hour, n: 2, allowed: true, remaining: 0, reset: 24 * hour},
		}},
		{"weeks from Monday", Weekly(utc, time.Monday), 2, date(2026, 1, 5, utc), []calendarStep{
			{at: 3 * day, n: 2, allowed: true, remaining: 0, reset: 4 * day},
			{at: 7*day - us, n: 1, remaining: 0, retry: us, reset: us},
			{at: 7 * day, n: 1, allowed: true, remaining: 1, reset: 7 * day},
		}},
		{"weeks from Sunday", Weekly(utc, time.Sunday), 2, date(2026, 1, 5, utc), []calendarStep{ // a Monday
			{at: 0, n: 1, allowed: true, remaining: 1, reset: 6 * day},
			{at: 6*day - us, n: 1, allowed: true, remaining: 0, reset: us},
			{at: 6 * day, n: 2, allowed: true, remaining: 0, reset: 7 * day},
		}},
		{"New York weeks from Sunday, spring forward", Weekly(ny, time.Sunday), 1, date(2026, 3, 8, ny), []calendarStep{
			{at: 0, n: 1, allowed: true, remaining: 0, reset: 7*day - hour},
			{at: 3 * day, n: 1, remaining: 0, retry: 4*day - hour, reset: 4*day - hour},
			{at: 7*day - hour, n: 1, allowed: true, remaining: 0, reset: 7 * day},
		}},
		{"months anchored on 31, leap year", Monthly(utc, 31), 1, date(2028, 1, 31, utc), []calendarStep{
			{at: 0, n: 1, allowed: true, remaining: 0, reset: 29 * day}, // to February 29
			{at: 29*day - us, n: 1, remaining: 0, retry: us, reset: us},
			{at: 29 * day, n: 1, allowed: true, remaining: 0, reset: 31 * day},        // to March 31
			{at: (29 + 31) * day, n: 1, allowed: true, remaining: 0, reset: 30 * day}, // to April 30
		}},
		{"months anchored on 29, leap year", Monthly(utc, 29), 1, date(2028, 1, 29, utc), []calendarStep{
			{at: 0, n: 1, allowed: true, remaining: 0, reset: 31 * day},
			{at: 31 * day, n: 1, allowed: true, remaining: 0, reset: 29 * day}, // February 29 to March 29
		}},
		{"months anchored on 15, leap year", Monthly(utc, 15), 1, date(2028, 2, 15, utc), []calendarStep{
			{at: 0, n: 1, allowed: true, remaining: 0, reset: 29 * day},
			{at: 28 * day, n: 1, remaining: 0, retry: day, reset: day},
			{at: 29 * day, n: 1, allowed: true, remaining: 0, reset: 31 * day},
		}},
		{"months anchored on 1, leap year", Monthly(utc, 1), 1, date(2028, 2, 1, utc), []calendarStep{
			{at: 28 * day, n: 1, allowed: true, remaining: 0, reset: day}, // February 29
			{at: 29 * day, n: 1, allowed: true, remaining: 0, reset: 31 * day},
		}},
		{"months anchored on 30, common year", Monthly(utc, 30), 1, date(2027, 1, 30, utc), []calendarStep{
			{at: 0, n: 1, allowed: true, remaining: 0, reset: 29 * day},        // to February 28
			{at: 29 * day, n: 1, allowed: true, remaining: 0, reset: 30 * day}, // to March 30
		}},
		{"New York months anchored on 31, spring forward", Monthly(ny, 31), 1, date(2026, 2, 28, ny), []calendarStep{
			{at: 0, n: 1, allowed: true, remaining: 0, reset: 31*day - hour},
			{at: 31*day - hour, n: 1, allowed: true, remaining: 0, reset: 30 * day},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, b backend) {
				// Steps a µs before a period's end leave keys of a 1ms
				// TTL, which a loaded server lets expire between steps.
				b.keepKeys()
				runCalendarSteps(t, b.rdb, c.period, c.limit, c.base, c.steps)
			})
		})
	}
}

// calendarTracePeriods are the periods of the random traces, as the
// limiter and the model take them, with a time to start near a change.
func calendarTracePeriods(t *testing.T) []struct {
	p     Period
	m     model.CalendarPeriod
	start time.Time
} {
	ny, lordHowe, kolkata := loadZone(t, "America/New_York"), loadZone(t, "Australia/Lord_Howe"), loadZone(t, "Asia/Kolkata")
	return []struct {
		p     Period
		m     model.CalendarPeriod
		start time.Time
	}{
		{Daily(ny), model.CalendarPeriod{Kind: "day", Loc: ny}, time.Date(2026, 3, 7, 12, 0, 0, 0, ny)},
		{Daily(ny), model.CalendarPeriod{Kind: "day", Loc: ny}, time.Date(2026, 10, 31, 12, 0, 0, 0, ny)},
		{Daily(lordHowe), model.CalendarPeriod{Kind: "day", Loc: lordHowe}, time.Date(2026, 4, 4, 0, 0, 0, 0, lordHowe)},
		{Weekly(kolkata, time.Sunday), model.CalendarPeriod{Kind: "week", Loc: kolkata, Weekday: time.Sunday}, time.Date(2026, 1, 1, 0, 0, 0, 0, kolkata)},
		{Monthly(time.UTC, 31), model.CalendarPeriod{Kind: "month", Loc: time.UTC, Day: 31}, time.Date(2028, 1, 30, 0, 0, 0, 0, time.UTC)},
	}
}

// The script answers random traces as the model does, on both backends:
// across daylight-saving days and months of every length, with clocks a
// few seconds behind the key's time, clocks gone wrong, and refunds.
func TestCalendarWindowAgreesWithModel(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	periods := calendarTracePeriods(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		b.keepKeys() // the fake clock goes back into periods whose keys a real server would have expired
		ctx := context.Background()
		for i, pp := range periods {
			for seed := uint64(0); seed < 3; seed++ {
				rng := rand.New(rand.NewPCG(seed+offset, uint64(i)))
				limit := 1 + rng.Int64N(4)
				trace := model.CalendarTrace(rng, pp.m, limit, pp.start.UnixMicro(), 60)
				clock := &fakeClock{}
				l, err := NewCalendarWindow(b.rdb, int(limit), pp.p, WithClock(clock.Now))
				require.NoError(t, err)
				key := fmt.Sprintf("trace-%d-%d", i, seed)
				grants := make([]Grant, len(trace))
				for j, s := range trace {
					clock.now = time.UnixMicro(s.AtUS)
					n := int(s.N)
					if s.Refund > 0 {
						require.NoError(t, grants[s.Refund-1].Refund(ctx, n), "step %d: refund", j)
						n = 0
					}
					r, err := l.AllowN(ctx, key, n)
					require.NoError(t, err)
					grants[j] = r.Grant
					r.Grant = Grant{}
					want := Result{Allowed: s.Want.Allowed, Limit: int(s.Want.Limit), Remaining: int(s.Want.Remaining),
						RetryAfter: usDuration(s.Want.RetryAfterUS), ResetAfter: usDuration(s.Want.ResetAfterUS)}
					require.Equal(t, want, r, "%v, limit %d, seed %d, step %d: n=%d (refund of step %d) at %v",
						pp.p, limit, seed, j, s.N, s.Refund-1, clock.now.In(pp.p.Location()))
				}
			}
		}
	})
}

// usDuration turns a model's µs into a Duration; model.Never is Never.
func usDuration(v int64) time.Duration {
	if v == model.Never {
		return Never
	}
	return time.Duration(v) * time.Microsecond
}

// Two limiters share a key with clocks 3 seconds apart, and call in turn
// every 250ms of real time from 10 seconds before midnight to 10 seconds
// after. The key's time keeps the slow one in the key's period once the
// fast one has granted in the next: together they never get more than
// one day's limit before midnight and one after.
func TestCalendarWindowClocksAroundMidnight(t *testing.T) {
	t.Parallel()
	const limit = 5
	ny := loadZone(t, "America/New_York")
	midnight := time.Date(2026, 3, 9, 0, 0, 0, 0, ny)
	forEachBackend(t, func(t *testing.T, b backend) {
		b.keepKeys() // the day before midnight lives seconds of fake time
		ctx := context.Background()
		for _, order := range []string{"fast first", "slow first"} {
			real := midnight.Add(-10 * sec)
			fast, err := NewCalendarWindow(b.rdb, limit, Daily(ny), WithClock(func() time.Time { return real.Add(3 * sec) }))
			require.NoError(t, err)
			slow, err := NewCalendarWindow(b.rdb, limit, Daily(ny), WithClock(func() time.Time { return real }))
			require.NoError(t, err)
			key := "k " + order
			granted, grantedAfter := 0, 0
			for ; real.Before(midnight.Add(10 * sec)); real = real.Add(250 * ms) {
				pair := []*CalendarWindow{fast, slow}
				if order == "slow first" {
					pair[0], pair[1] = slow, fast
				}
				for _, l := range pair {
					r, err := l.Allow(ctx, key)
					require.NoError(t, err)
					if r.Allowed {
						granted++
						if !real.Add(3 * sec).Before(midnight) {
							grantedAfter++ // the fast clock reads the next day
						}
					}
				}
			}
			assert.Equal(t, 2*limit, granted, "%s: one day's limit before midnight and one after", order)
			assert.Equal(t, limit, grantedAfter, "%s: the next day's limit once the fast clock reads it", order)
		}
	})
}

// Refunds give back into the period that counted the grant: partly, at
// most once (the same refund twice gives nothing more), never past what
// the grant took, and nothing once the key is in the next period. A key
// keeps the records of 16 refunded grants: a 17th drops the oldest, which
// then gives nothing more, however often it is refunded.
func TestCalendarWindowRefunds(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := &fakeClock{now: time.Date(2026, 5, 10, 12, 0, 0, 0, time.UTC)}
		l, err := NewCalendarWindow(b.rdb, 40, Daily(time.UTC), WithClock(clock.Now))
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
		assert.Equal(t, 36, remaining(), "2 of 6 given back")
		require.NoError(t, g.Refund(ctx, 2))
		assert.Equal(t, 36, remaining(), "the same refund twice gives nothing more")
		require.NoError(t, g.Refund(ctx, 1))
		assert.Equal(t, 36, remaining(), "a smaller refund gives nothing")
		require.NoError(t, g.Refund(ctx, 6))
		assert.Equal(t, 40, remaining(), "all 6 given back in all")
		assert.ErrorIs(t, g.Refund(ctx, 7), ErrInvalidArgument, "past the grant")
		r, err = l.AllowN(ctx, "k", 40)
		require.NoError(t, err)
		assert.True(t, r.Allowed, "the whole limit, once all was given back")
		require.NoError(t, g.Refund(ctx, 6))
		assert.Equal(t, 0, remaining(), "a refund of a grant fully given back gives nothing")
		require.NoError(t, r.Grant.Refund(ctx, 40))

		// 17 grants of 2, each refunded by 1: the first one's record goes.
		var grants []Grant
		for range 17 {
			r, err := l.AllowN(ctx, "k", 2)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			grants = append(grants, r.Grant)
		}
		for _, g := range grants {
			require.NoError(t, g.Refund(ctx, 1))
		}
		assert.Equal(t, 40-17, remaining(), "17 grants of 2, each refunded by 1")
		require.NoError(t, grants[0].Refund(ctx, 2))
		require.NoError(t, grants[0].Refund(ctx, 1))
		assert.Equal(t, 40-17, remaining(), "the oldest grant's record is gone: it gives nothing more")
		require.NoError(t, grants[1].Refund(ctx, 1))
		assert.Equal(t, 40-17, remaining(), "a kept record: the same refund gives nothing more")
		require.NoError(t, grants[16].Refund(ctx, 2))
		assert.Equal(t, 40-16, remaining(), "a kept record: the rest of the grant")

		// The next day: yesterday's grants give nothing back.
		clock.now = time.Date(2026, 5, 11, 0, 0, 0, 0, time.UTC)
		r, err = l.AllowN(ctx, "k", 5)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.NoError(t, grants[15].Refund(ctx, 2))
		assert.Equal(t, 35, remaining(), "a grant of the day before gives nothing back into today")

		// A refund from a clock behind the key's time decides in the
		// key's period, and one from a clock gone wrong gives nothing.
		clock.now = time.Date(2026, 5, 10, 23, 59, 58, 0, time.UTC)
		require.NoError(t, r.Grant.Refund(ctx, 2))
		clock.now = time.Date(2026, 5, 11, 0, 0, 1, 0, time.UTC)
		assert.Equal(t, 37, remaining(), "a refund from a clock 2s behind the key's period")
		clock.now = time.Date(2026, 5, 8, 12, 0, 0, 0, time.UTC)
		require.NoError(t, r.Grant.Refund(ctx, 5))
		clock.now = time.Date(2026, 5, 11, 0, 0, 1, 0, time.UTC)
		assert.Equal(t, 37, remaining(), "a refund from a clock gone wrong gives nothing")
	})
}

// A denial is cached until the period ends: the same request is denied
// without a round trip, with the Result Redis gave, its durations
// counting down; once the period ends it goes to Redis and is allowed.
func TestCalendarWindowDenyCache(t *testing.T) {
	t.Parallel()
	ny := loadZone(t, "America/New_York")
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := &fakeClock{now: time.Date(2026, 11, 1, 22, 0, 0, 0, ny)}
		var last Decision
		l, err := NewCalendarWindow(b.rdb, 2, Daily(ny), WithClock(clock.Now), WithDenyCache(10),
			WithObserver(func(d Decision) { last = d }))
		require.NoError(t, err)
		r, err := l.AllowN(ctx, "k", 2)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		r, err = l.Allow(ctx, "k")
		require.NoError(t, err)
		require.False(t, r.Allowed)
		assert.False(t, last.Local, "the first denial is Redis's")
		assert.Equal(t, 2*hour, r.RetryAfter)

		clock.now = clock.now.Add(119 * min_)
		r, err = l.Allow(ctx, "k")
		require.NoError(t, err)
		assert.False(t, r.Allowed)
		assert.True(t, last.Local, "denied from the cache a minute before midnight")
		assert.Equal(t, min_, r.RetryAfter, "the cached RetryAfter counts down")
		assert.Equal(t, min_, r.ResetAfter)

		clock.now = time.Date(2026, 11, 2, 0, 0, 0, 0, ny)
		r, err = l.Allow(ctx, "k")
		require.NoError(t, err)
		assert.True(t, r.Allowed, "the next day")
		assert.False(t, last.Local)
	})
}

// Under WithPrefix, limiters of one period that differ only in their
// limit share the count: a plan upgrade mid-month keeps what was used
// this month. A limiter of another period (another zone) reads the count
// conservatively: permits counted until the other's period ends are used
// in its own, until its first period that starts after that end.
func TestCalendarWindowSharedPrefix(t *testing.T) {
	t.Parallel()
	ny := loadZone(t, "America/New_York")
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := &fakeClock{now: time.Date(2026, 6, 20, 15, 0, 0, 0, ny)}
		basic, err := NewCalendarWindow(b.rdb, 100, Monthly(ny, 15), WithPrefix("plan:"), WithClock(clock.Now))
		require.NoError(t, err)
		pro, err := NewCalendarWindow(b.rdb, 1000, Monthly(ny, 15), WithPrefix("plan:"), WithClock(clock.Now))
		require.NoError(t, err)
		r, err := basic.AllowN(ctx, "acme", 90)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		toAnchor := time.Date(2026, 7, 15, 0, 0, 0, 0, ny).Sub(clock.now)
		assert.Equal(t, toAnchor, r.ResetAfter)

		clock.now = clock.now.Add(day)
		r, err = pro.AllowN(ctx, "acme", 0)
		require.NoError(t, err)
		assert.Equal(t, 910, r.Remaining, "the upgrade keeps the 90 used this month")
		r, err = pro.AllowN(ctx, "acme", 500)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		r, err = basic.Allow(ctx, "acme")
		require.NoError(t, err)
		assert.False(t, r.Allowed, "590 used: above the basic plan")
		assert.Equal(t, toAnchor-day, r.RetryAfter)

		// A daily limiter in UTC on a key a day in New York counted:
		// New York's day ends at 04:00 UTC, so the count is used in UTC's
		// day until the UTC day that starts after it.
		clock.now = time.Date(2026, 6, 22, 22, 0, 0, 0, ny) // 02:00 UTC on the 23rd
		nyDay, err := NewCalendarWindow(b.rdb, 3, Daily(ny), WithPrefix("day:"), WithClock(clock.Now))
		require.NoError(t, err)
		utcDay, err := NewCalendarWindow(b.rdb, 3, Daily(time.UTC), WithPrefix("day:"), WithClock(clock.Now))
		require.NoError(t, err)
		r, err = nyDay.AllowN(ctx, "acme", 3)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		assert.Equal(t, 2*hour, r.ResetAfter)
		r, err = utcDay.Allow(ctx, "acme")
		require.NoError(t, err)
		assert.False(t, r.Allowed, "New York's 3 are used in UTC's day")
		assert.Equal(t, 22*hour, r.RetryAfter, "until the UTC day after New York's ends")
		clock.now = time.Date(2026, 6, 24, 0, 0, 0, 0, time.UTC)
		r, err = utcDay.AllowN(ctx, "acme", 3)
		require.NoError(t, err)
		assert.True(t, r.Allowed, "the next UTC day")
	})
}

// The default key is redlimit:cw:<config>:<key>, the fingerprint naming
// the period and its location: limiters of other periods or zones never
// meet on a key, and equal configurations always do. A key's TTL ends
// with the period it counts, in whole milliseconds rounded up.
func TestCalendarWindowDefaultKeyAndTTL(t *testing.T) {
	t.Parallel()
	ny, paris := loadZone(t, "America/New_York"), loadZone(t, "Europe/Paris")
	forEachBackend(t, func(t *testing.T, b backend) {
		prefixes := map[string]string{}
		for _, p := range []Period{
			Daily(ny), Daily(paris), Daily(time.UTC), Weekly(ny, time.Monday), Weekly(ny, time.Sunday),
			Monthly(ny, 1), Monthly(ny, 31), Monthly(paris, 31),
		} {
			l, err := NewCalendarWindow(b.rdb, 10, p)
			require.NoError(t, err)
			prefix := keyPrefix(l)
			assert.Regexp(t, `^redlimit:cw:[0-9a-v]{6}:$`, prefix, "%v", p)
			assert.NotContains(t, prefixes, prefix, "%v shares its key with %s", p, prefixes[prefix])
			prefixes[prefix] = p.String()
			same, err := NewCalendarWindow(b.rdb, 10, p)
			require.NoError(t, err)
			assert.Equal(t, prefix, keyPrefix(same), "%v: equal configurations share keys", p)
			other, err := NewCalendarWindow(b.rdb, 11, p)
			require.NoError(t, err)
			assert.NotEqual(t, prefix, keyPrefix(other), "%v: another limit, another key", p)
		}
		if b.mini == nil {
			return // a real server's TTL counts down in real time
		}
		ctx := context.Background()
		clock := &fakeClock{now: time.Date(2026, 3, 8, 1, 0, 0, 500, ny)} // 500ns: the clock is read in µs
		l, err := NewCalendarWindow(b.rdb, 10, Daily(ny), WithClock(clock.Now))
		require.NoError(t, err)
		_, err = l.Allow(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, 22*hour, b.rdb.PTTL(ctx, l.redisKey("k")).Val(), "to the end of the 23-hour day")
		clock.now = clock.now.Add(time.Hour + 1500*us)
		_, err = l.Allow(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, 22*hour, b.rdb.PTTL(ctx, l.redisKey("k")).Val(), "a grant in the same period keeps the TTL")
		clock.now = time.Date(2026, 3, 9, 0, 0, 0, 0, ny).Add(-1500 * us)
		r, err := l.AllowN(ctx, "k2", 3)
		require.NoError(t, err)
		require.Equal(t, 1500*us, r.ResetAfter)
		assert.Equal(t, 2*ms, b.rdb.PTTL(ctx, l.redisKey("k2")).Val(), "rounded up to the millisecond")
	})
}

// Invalid configurations are ErrInvalidConfig naming the field.
func TestCalendarWindowInvalidConfig(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, c := range []struct {
		limit  int
		period Period
		want   string
	}{
		{0, Daily(time.UTC), "limit 0"},
		{-1, Daily(time.UTC), "limit -1"},
		{math.MaxInt, Daily(time.UTC), "limit"},
		{1, Period{}, "zero Period"},
		{1, Daily(nil), "location is nil"},
		{1, Weekly(nil, time.Monday), "location is nil"},
		{1, Weekly(time.UTC, 7), "start weekday 7"},
		{1, Weekly(time.UTC, -1), "start weekday -1"},
		{1, Monthly(time.UTC, 0), "day 0"},
		{1, Monthly(time.UTC, 32), "day 32"},
		{1, Monthly(nil, 15), "location is nil"},
	} {
		l, err := NewCalendarWindow(rdb, c.limit, c.period)
		assert.Nil(t, l)
		require.ErrorIs(t, err, ErrInvalidConfig, "limit %d, %v", c.limit, c.period)
		assert.Contains(t, err.Error(), c.want)
		assert.Contains(t, err.Error(), "calendar_window")
	}
	_, err := (&CalendarWindow{}).Allow(context.Background(), "k")
	assert.ErrorIs(t, err, ErrInvalidConfig, "a zero-value CalendarWindow")
}

// On the server's clock (no WithClock), the host sends the periods around
// its own time: a server clock a day ahead still decides in its own
// period; one more than a period off the ones sent cannot be placed, and
// is denied for a second without a write (docs/calendar.md).
func TestCalendarWindowServerClock(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	rdb := newMiniClient(t, m)
	ctx := context.Background()
	l, err := NewCalendarWindow(rdb, 2, Daily(time.UTC))
	require.NoError(t, err)

	// A server a day ahead or behind decides in its own day, of those sent.
	for _, off := range []time.Duration{day, -day} {
		m.SetTime(time.Now().Add(off))
		key := fmt.Sprintf("off %v", off)
		r, err := l.AllowN(ctx, key, 2)
		require.NoError(t, err)
		assert.True(t, r.Allowed, "a server clock %v off the host's", off)
		_, serverEnd := Daily(time.UTC).Bounds(time.Now().Add(off))
		assert.InDelta(t, float64(serverEnd.Sub(time.Now().Add(off))), float64(r.ResetAfter), float64(time.Minute),
			"a server clock %v off the host's: ResetAfter is the end of the server's day", off)
		r, err = l.Allow(ctx, key)
		require.NoError(t, err)
		assert.False(t, r.Allowed, "a server clock %v off the host's: its day's 2 are used", off)
		assert.InDelta(t, float64(serverEnd.Sub(time.Now().Add(off))), float64(r.RetryAfter), float64(time.Minute),
			"a server clock %v off the host's: RetryAfter is the end of the server's day", off)
	}

	for _, off := range []time.Duration{3 * day, -2 * day} {
		m.SetTime(time.Now().Add(off))
		r, err := l.AllowN(ctx, "off", 1)
		require.NoError(t, err)
		assert.False(t, r.Allowed, "a server clock %v off the host's", off)
		assert.Equal(t, time.Second, r.RetryAfter)
		r, err = l.AllowN(ctx, "off", 0)
		require.NoError(t, err)
		assert.True(t, r.Allowed)
		assert.Equal(t, 0, r.Remaining, "n == 0: nothing known to be left")
	}
	assert.False(t, m.Exists(l.redisKey("off")), "denials wrote nothing")
}

// A calendar window is a part of AllowAll like any limiter: granted with
// the others, and given back when another part denies.
func TestCalendarWindowInAllowAll(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := &fakeClock{now: time.Date(2026, 5, 10, 12, 0, 0, 0, time.UTC)}
		month, err := NewCalendarWindow(b.rdb, 10, Monthly(time.UTC, 1), WithClock(clock.Now))
		require.NoError(t, err)
		minute, err := NewFixedWindow(b.rdb, 3, time.Minute, WithClock(clock.Now))
		require.NoError(t, err)
		parts := []Part{{Limiter: minute, Key: "k"}, {Limiter: month, Key: "k"}}
		r, err := AllowAll(ctx, 2, parts...)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		r, err = AllowAll(ctx, 2, parts...)
		require.NoError(t, err)
		require.False(t, r.Allowed, "the minute's limit denies")
		m, err := month.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		assert.Equal(t, 8, m.Remaining, "the month's part of the denied call was given back")
	})
}
