package calendar

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/model"
)

// zones are locations with every kind of offset change: none, an hour, 30
// minutes (Lord_Howe), changes at midnight that skip it (Santiago,
// Havana, Asuncion, Beirut) or repeat the hour before it (Sao_Paulo until
// 2019), and offsets of quarter hours (Kathmandu, Chatham).
var zones = []string{
	"UTC", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "America/Santiago",
	"America/Havana", "America/Asuncion", "Asia/Beirut", "America/Sao_Paulo", "Asia/Kathmandu",
	"Pacific/Chatham", "Europe/London", "Pacific/Apia", "Asia/Tehran",
}

func load(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err, "the test needs the zone %s (tzdata)", name)
	return loc
}

// Bounds agrees with the model's plain computation (bisection on the
// local date) for every day of 2016 to 2030 in every zone, for days,
// weeks from Monday and Sunday, and months anchored on 1, 15, 29 and 31:
// a midnight skipped by a change of offset begins its day at the change.
func TestBoundsAgreeWithModel(t *testing.T) {
	t.Parallel()
	sentinel := errors.New("invalid")
	for _, name := range zones {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			loc := load(t, name)
			periods := []struct {
				p Period
				m model.CalendarPeriod
			}{
				{Daily(loc), model.CalendarPeriod{Kind: "day", Loc: loc}},
				{Weekly(loc, time.Monday), model.CalendarPeriod{Kind: "week", Loc: loc, Weekday: time.Monday}},
				{Weekly(loc, time.Sunday), model.CalendarPeriod{Kind: "week", Loc: loc, Weekday: time.Sunday}},
				{Monthly(loc, 1), model.CalendarPeriod{Kind: "month", Loc: loc, Day: 1}},
				{Monthly(loc, 15), model.CalendarPeriod{Kind: "month", Loc: loc, Day: 15}},
				{Monthly(loc, 29), model.CalendarPeriod{Kind: "month", Loc: loc, Day: 29}},
				{Monthly(loc, 31), model.CalendarPeriod{Kind: "month", Loc: loc, Day: 31}},
			}
			for _, pp := range periods {
				require.NoError(t, Check(pp.p, sentinel, "test"))
				step := 24 * time.Hour
				if pp.m.Kind != "day" {
					step = 5 * 24 * time.Hour // fewer checks for the longer periods
				}
				for at := time.Date(2016, 1, 1, 0, 0, 0, 0, time.UTC); at.Year() < 2031; at = at.Add(step) {
					// The instants around the day's start, and a noon.
					start, _ := pp.p.Bounds(at)
					for _, tt := range []time.Time{at, start, start.Add(-time.Microsecond), at.Add(13 * time.Hour)} {
						s, e := pp.p.Bounds(tt)
						ms, me := pp.m.Bounds(tt.UnixMicro())
						if s.UnixMicro() != ms || e.UnixMicro() != me {
							t.Fatalf("%v at %v (%v): Bounds %v to %v, model %v to %v", pp.p, tt, tt.In(loc),
								s.In(loc), e.In(loc), time.UnixMicro(ms).In(loc), time.UnixMicro(me).In(loc))
						}
						require.False(t, tt.Before(s), "start after t")
						require.True(t, tt.Before(e), "end not after t")
					}
				}
			}
		})
	}
}

// Boundaries are five period starts in a row, now in the second period.
func TestBoundaries(t *testing.T) {
	t.Parallel()
	ny := load(t, "America/New_York")
	now := time.Date(2026, 3, 8, 1, 30, 0, 0, ny) // the day clocks skip 02:00
	b := Boundaries(Daily(ny), now)
	want := []time.Time{
		time.Date(2026, 3, 7, 0, 0, 0, 0, ny), time.Date(2026, 3, 8, 0, 0, 0, 0, ny),
		time.Date(2026, 3, 9, 0, 0, 0, 0, ny), time.Date(2026, 3, 10, 0, 0, 0, 0, ny),
		time.Date(2026, 3, 11, 0, 0, 0, 0, ny),
	}
	for i, w := range want {
		assert.Equal(t, w.UnixMicro(), b[i], "boundary %d", i)
	}
	assert.Equal(t, 23*time.Hour, time.Duration(b[2]-b[1])*time.Microsecond, "the day of the change lasts 23h")

	b = Boundaries(Monthly(time.UTC, 31), time.Date(2028, 2, 29, 12, 0, 0, 0, time.UTC))
	for i, w := range []time.Time{
		time.Date(2028, 1, 31, 0, 0, 0, 0, time.UTC), time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC),
		time.Date(2028, 3, 31, 0, 0, 0, 0, time.UTC), time.Date(2028, 4, 30, 0, 0, 0, 0, time.UTC),
		time.Date(2028, 5, 31, 0, 0, 0, 0, time.UTC),
	} {
		assert.Equal(t, w.UnixMicro(), b[i], "boundary %d of months anchored on 31", i)
	}
}

// Check names the field of an invalid period.
func TestCheck(t *testing.T) {
	t.Parallel()
	sentinel := errors.New("invalid")
	for _, c := range []struct {
		p    Period
		want string
	}{
		{Period{}, "zero Period"},
		{Daily(nil), "location is nil"},
		{Weekly(time.UTC, 7), "start weekday 7"},
		{Weekly(time.UTC, -1), "start weekday -1"},
		{Monthly(time.UTC, 0), "day 0"},
		{Monthly(time.UTC, 32), "day 32"},
	} {
		err := Check(c.p, sentinel, "calendar_window")
		require.ErrorIs(t, err, sentinel, "%+v", c.p)
		assert.Contains(t, err.Error(), c.want)
	}
	for _, p := range []Period{Daily(time.UTC), Weekly(time.UTC, time.Saturday), Monthly(time.UTC, 1), Monthly(time.UTC, 31)} {
		assert.NoError(t, Check(p, sentinel, "calendar_window"), "%v", p)
	}
}
