package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
				runCalendarSteps(t, b.rdb, c.period, c.limit, c.base, c.steps)
			})
		})
	}
}
