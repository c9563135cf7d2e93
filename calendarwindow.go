package redlimit

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/calendar"
)

var calendarScript = loadScript("refunds.lua", "calendar.lua")

// Period is a way of cutting time into calendar periods in a location:
// days (Daily), weeks beginning on a weekday (Weekly) or months beginning
// on an anchor day (Monthly). Every period begins at local midnight of its
// first day, so across a daylight-saving change a day lasts 23 or 25 hours
// (23.5 or 24.5 where the change is of 30 minutes), and where a change
// skips midnight the day begins when it does. The zero Period is not
// valid: NewCalendarWindow refuses it.
//
// Its methods: Bounds(t) returns the start and the end (the next
// period's start) of the period holding t; Location returns its location;
// String describes it with the location's name ("monthly from day 15 in
// America/New_York"), as the default key's fingerprint does.
type Period = calendar.Period

// Daily is the period of calendar days in loc, from local midnight to
// local midnight. A nil loc is ErrInvalidConfig at NewCalendarWindow.
func Daily(loc *time.Location) Period { return calendar.Daily(loc) }

// Weekly is the period of weeks in loc, from local midnight of each start
// day (time.Monday, say) to the next one.
func Weekly(loc *time.Location, start time.Weekday) Period { return calendar.Weekly(loc, start) }

// Monthly is the period of months in loc beginning on day, from 1 to 31:
// a billing anchor. A month without that day begins on its last day: 31
// is each month's last day, and 29 to 31 fall on February's last.
// Monthly(loc, 15) runs from the 15th, local midnight, to the next 15th.
func Monthly(loc *time.Location, day int) Period { return calendar.Monthly(loc, day) }

// CalendarWindow grants at most limit permits per calendar period in a
// time zone: a day, a week or a billing month, from its local midnight.
// Unlike FixedWindow, whose window opens at a key's first request, every
// key's period begins and ends with the calendar, so a daily quota resets
// at the customer's midnight.
//
// Result.ResetAfter is the time until the period ends (0 while nothing is
// counted), and a denied request's RetryAfter is the same, to the
// microsecond, across daylight-saving changes. A denial's error has Window
// 0: periods differ in length.
//
// The decision is the script's, on the Redis server's clock (or
// WithClock's); the host computes the period boundaries, from its time
// package's zone data, and sends those around its own time. A key decides
// on its time: a caller whose clock still reads the period before the
// key's first grant of the next one decides in the key's period, so
// clocks that disagree near midnight never get two periods' limits.
// docs/calendar.md tells how boundaries and clocks are handled.
type CalendarWindow struct {
	limiter
	period Period
}

// NewCalendarWindow returns a limiter granting at most limit permits per
// period. limit must be between 1 and 2^40; period must be made by Daily,
// Weekly or Monthly with a non-nil location, a weekday from time.Sunday to
// time.Saturday and an anchor day from 1 to 31. Bad values are
// ErrInvalidConfig, naming the field. Keys are redlimit:cw:<config>:<key>,
// the config's fingerprint including the period and its location's name,
// unless WithPrefix says otherwise: limiters that differ only in their
// limit then share the count (a plan upgrade keeps what was used this
// period). Key TTLs end with the period the key counts.
//
// Give it a location by name (time.LoadLocation("America/New_York")), not
// time.Local: every process sharing a key must cut time the same way, and
// the fingerprint knows time.Local only as "Local".
func NewCalendarWindow(rdb redis.Scripter, limit int, period Period, opts ...Option) (*CalendarWindow, error) {
	const algorithm = "calendar_window"
	if err := permits(algorithm, "limit", limit); err != nil {
		return nil, err
	}
	if err := calendar.Check(period, ErrInvalidConfig, algorithm); err != nil {
		return nil, err
	}
	l, err := newLimiter(rdb, spec{
		algorithm: algorithm,
		code:      "cw",
		format:    1,
		script:    calendarScript,
		// A refund no observer reads is the bare "=": on the server's
		// clock it reads no TIME (scripts/calendar.lua).
		bareRefunds: true,
		args:        []any{limit},
		argsAt:      periodArgs(period),
		config:      []any{period.String()},
		// With a WithPrefix prefix the end of the period a key counts is
		// stored, so that configurations of other periods sharing the key
		// read it conservatively (see scripts/calendar.lua).
		sharedArgs: []any{1},
		limits:     []int{limit},
		windows:    []time.Duration{0},
	}, opts)
	if err != nil {
		return nil, err
	}
	return &CalendarWindow{limiter: l, period: period}, nil
}

// periodArgs returns the script's ARGV for a call at a time: the start and
// the end of its period, then the starts of the period before it and of
// the two after its end, in one argument that the script reads only for
// times outside that period (each argument costs Redis time on every
// call). They are computed once per period of the host's clock and kept.
func periodArgs(period Period) func(now time.Time) []any {
	type computed struct {
		fromUS, toUS int64 // the period they were computed for
		args         []any
	}
	var last atomic.Pointer[computed]
	return func(now time.Time) []any {
		us := now.UnixMicro()
		if c := last.Load(); c != nil && us >= c.fromUS && us < c.toUS {
			return c.args
		}
		b := calendar.Boundaries(period, now)
		others := fmt.Sprintf("%d %d %d", b[0], b[3], b[4])
		c := &computed{fromUS: b[1], toUS: b[2], args: []any{b[1], b[2], others}}
		last.Store(c)
		return c.args
	}
}

// Period returns the limiter's period.
func (l *CalendarWindow) Period() Period {
	if l == nil {
		return Period{}
	}
	return l.period
}
