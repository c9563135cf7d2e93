// Package calendar holds the calendar periods of redlimit's calendar
// windows: days, weeks and billing months in a time zone, from local
// midnight to local midnight. The root package exports Period (an alias of
// this package's) with its constructors Daily, Weekly and Monthly; the
// Redis limiter sends the boundaries Boundaries computes to its script,
// and the in-process limiter decides on Period.Bounds. Check validates a
// Period for both.
package calendar

import (
	"fmt"
	"time"

	"github.com/redlimit/redlimit/internal/engine"
)

// kind is the length of a period: a day, a week or a month.
type kind int

const (
	daily kind = iota + 1
	weekly
	monthly
)

// Period is one way of cutting time into calendar periods in a location:
// days, weeks from a weekday, or months from an anchor day. Every period
// begins at local midnight (or, where a change of offset skips midnight,
// when the date begins), so a day lasts 23, 24 or 25 hours (or 23.5 and
// 24.5 where the change is of 30 minutes). The zero Period is not valid.
type Period struct {
	kind    kind
	loc     *time.Location
	weekday time.Weekday // weekly: the day a week begins
	day     int          // monthly: the anchor day, 1 to 31
}

// Daily is the period of calendar days in loc.
func Daily(loc *time.Location) Period { return Period{kind: daily, loc: loc} }

// Weekly is the period of weeks in loc beginning on start.
func Weekly(loc *time.Location, start time.Weekday) Period {
	return Period{kind: weekly, loc: loc, weekday: start}
}

// Monthly is the period of months in loc beginning on day: a billing
// anchor. A month without that day (29 to 31) begins on its last day.
func Monthly(loc *time.Location, day int) Period {
	return Period{kind: monthly, loc: loc, day: day}
}

// Check returns an error matching sentinel that names the bad field of p,
// or nil when p is valid.
func Check(p Period, sentinel error, algorithm string) error {
	switch {
	case p.kind == 0:
		return engine.Errorf(sentinel, "redlimit: %s: period is the zero Period: make it with Daily, Weekly or Monthly", algorithm)
	case p.loc == nil:
		return engine.Errorf(sentinel, "redlimit: %s: period location is nil: use time.UTC or time.LoadLocation", algorithm)
	case p.kind == weekly && (p.weekday < time.Sunday || p.weekday > time.Saturday):
		return engine.Errorf(sentinel, "redlimit: %s: period start weekday %d: must be from time.Sunday (0) to time.Saturday (6)", algorithm, int(p.weekday))
	case p.kind == monthly && (p.day < 1 || p.day > 31):
		return engine.Errorf(sentinel, "redlimit: %s: period day %d: must be from 1 to 31 (31 is each month's last day)", algorithm, p.day)
	}
	return nil
}

// Location is the location whose calendar p follows.
func (p Period) Location() *time.Location { return p.loc }

// String describes p, with its location's name: "daily in UTC", "weekly
// from Monday in Europe/Paris", "monthly from day 15 in Asia/Kolkata". It
// is part of a calendar window's default key.
func (p Period) String() string {
	name := "<nil>"
	if p.loc != nil {
		name = p.loc.String()
	}
	switch p.kind {
	case daily:
		return "daily in " + name
	case weekly:
		return fmt.Sprintf("weekly from %v in %s", p.weekday, name)
	case monthly:
		return fmt.Sprintf("monthly from day %d in %s", p.day, name)
	}
	return "zero Period"
}

// Bounds returns the period that holds t: its start, at or before t, and
// its end, the next period's start, after t. p must be valid.
func (p Period) Bounds(t time.Time) (start, end time.Time) {
	d := p.dateOf(t)
	first := p.firstDate(d)
	return dayStart(first, p.loc), dayStart(p.nextDate(first), p.loc)
}

// Boundaries returns, in Unix µs, the starts of five periods of p in a
// row around now: the one before now's, now's own, and the three after it,
// so that b[1] <= now < b[2]. p must be valid.
func Boundaries(p Period, now time.Time) [5]int64 {
	start, end := p.Bounds(now)
	before, _ := p.Bounds(start.Add(-time.Nanosecond))
	b := [5]int64{before.UnixMicro(), start.UnixMicro(), end.UnixMicro()}
	first := p.dateOf(end)
	for i := 3; i < 5; i++ {
		first = p.nextDate(first)
		b[i] = dayStart(first, p.loc).UnixMicro()
	}
	return b
}

// dateOf returns the local date whose day holds t: t's own, or the next
// one where the clock went back across midnight and reads the day before
// again although the next day has begun.
func (p Period) dateOf(t time.Time) date {
	d := dateIn(t, p.loc)
	if next := d.add(1); !t.Before(dayStart(next, p.loc)) {
		return next
	}
	return d
}

// firstDate returns the first day of the period that holds the day d.
func (p Period) firstDate(d date) date {
	switch p.kind {
	case weekly:
		back := (int(d.weekday()) - int(p.weekday) + 7) % 7
		return d.add(-back)
	case monthly:
		if d.day >= anchor(d.year, d.month, p.day) {
			return date{d.year, d.month, anchor(d.year, d.month, p.day)}
		}
		y, m := d.year, d.month-1
		if m < time.January {
			y, m = y-1, time.December
		}
		return date{y, m, anchor(y, m, p.day)}
	}
	return d
}

// nextDate returns the first day of the period after the one whose first
// day is first.
func (p Period) nextDate(first date) date {
	switch p.kind {
	case weekly:
		return first.add(7)
	case monthly:
		y, m := first.year, first.month+1
		if m > time.December {
			y, m = y+1, time.January
		}
		return date{y, m, anchor(y, m, p.day)}
	}
	return first.add(1)
}

// anchor returns the day of month y-m a month anchored on day begins: day,
// or the month's last day when it has fewer.
func anchor(y int, m time.Month, day int) int {
	return min(day, daysIn(y, m))
}

// daysIn returns the number of days of month y-m.
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 12, 0, 0, 0, time.UTC).Day()
}

// date is a calendar date, without a location.
type date struct {
	year  int
	month time.Month
	day   int
}

func dateIn(t time.Time, loc *time.Location) date {
	y, m, d := t.In(loc).Date()
	return date{y, m, d}
}

// add returns the date days after d (before, when negative).
func (d date) add(days int) date {
	y, m, dd := time.Date(d.year, d.month, d.day+days, 12, 0, 0, 0, time.UTC).Date()
	return date{y, m, dd}
}

func (d date) weekday() time.Weekday {
	return time.Date(d.year, d.month, d.day, 12, 0, 0, 0, time.UTC).Weekday()
}

// before reports whether d is an earlier date than e.
func (d date) before(e date) bool {
	if d.year != e.year {
		return d.year < e.year
	}
	if d.month != e.month {
		return d.month < e.month
	}
	return d.day < e.day
}

// dayStart returns the first instant whose local date in loc is d or
// later: local midnight, or, where a change of offset skips midnight, the
// instant of the change. time.Date alone is not enough there: for a
// skipped or repeated midnight it picks one of the offsets on either side
// of the change, so the instant it returns is checked against the zone
// bounds around it.
func dayStart(d date, loc *time.Location) time.Time {
	t := time.Date(d.year, d.month, d.day, 0, 0, 0, 0, loc)
	if dateIn(t, loc).before(d) {
		// Midnight is skipped, and time.Date put it before the change:
		// the date begins where t's offset ends.
		if _, end := t.ZoneBounds(); !end.IsZero() && end.Sub(t) < 48*time.Hour {
			return end
		}
		return t
	}
	start, _ := t.ZoneBounds()
	if start.IsZero() || t.Sub(start) >= 48*time.Hour {
		return t // no change of offset near midnight
	}
	if prev := start.Add(-time.Second); !dateIn(prev, loc).before(d) {
		// The offset before the change read the date too (midnight is
		// repeated, or the clock went back across it): the date began
		// at midnight on that offset.
		_, offset := prev.Zone()
		y, m, dd := d.year, d.month, d.day
		first := time.Unix(time.Date(y, m, dd, 0, 0, 0, 0, time.UTC).Unix()-int64(offset), 0)
		if first.Before(start) && !dateIn(first, loc).before(d) {
			return first
		}
		return start
	}
	if h, mi, s := t.In(loc).Clock(); h == 0 && mi == 0 && s == 0 {
		return t
	}
	// Midnight is skipped, and time.Date put it after the change: the date
	// begins at the change.
	return start
}
