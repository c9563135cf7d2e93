package model

import (
	"fmt"
	"time"
)

// CalendarPeriod is a way of cutting time into calendar periods in Loc:
// Kind "day", "week" (beginning on Weekday) or "month" (beginning on Day,
// or on the month's last day when it has fewer days). Every period begins
// with the first second whose local date is its first day.
type CalendarPeriod struct {
	Kind    string
	Loc     *time.Location
	Weekday time.Weekday
	Day     int
}

// Bounds returns, in Unix µs, the start and end of the period holding tUS.
// It is written apart from the limiters' own (internal/calendar), the
// plain way: a day's first second is found by bisection on the local
// date, and a period's first day by stepping a day at a time.
func (p CalendarPeriod) Bounds(tUS int64) (startUS, endUS int64) {
	d := p.dayOf(tUS)
	for !p.first(d) {
		d = d.AddDate(0, 0, -1)
	}
	next := d.AddDate(0, 0, 1)
	for !p.first(next) {
		next = next.AddDate(0, 0, 1)
	}
	return p.dayStart(d) * 1e6, p.dayStart(next) * 1e6
}

// dayOf returns the local date (a noon in UTC) whose day holds tUS: the
// latest day that has begun.
func (p CalendarPeriod) dayOf(tUS int64) time.Time {
	y, m, dd := time.UnixMicro(tUS).In(p.Loc).Date()
	d := time.Date(y, m, dd, 12, 0, 0, 0, time.UTC)
	if next := d.AddDate(0, 0, 1); p.dayStart(next)*1e6 <= tUS {
		return next
	}
	return d
}

// first reports whether the date d (a noon in UTC) is a period's first day.
func (p CalendarPeriod) first(d time.Time) bool {
	switch p.Kind {
	case "day":
		return true
	case "week":
		return d.Weekday() == p.Weekday
	case "month":
		last := time.Date(d.Year(), d.Month()+1, 0, 12, 0, 0, 0, time.UTC).Day()
		return d.Day() == min(p.Day, last)
	}
	panic(fmt.Sprintf("model: calendar period kind %q", p.Kind))
}

// dayStart returns the first Unix second whose local date is the date d (a
// noon in UTC) or later, by bisection over the two days around it.
func (p CalendarPeriod) dayStart(d time.Time) int64 {
	lo, hi := d.Unix()-48*3600, d.Unix()+48*3600 // lo reads before d, hi after
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		y, m, dd := time.Unix(mid, 0).In(p.Loc).Date()
		if time.Date(y, m, dd, 12, 0, 0, 0, time.UTC).Before(d) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

// CalendarWindow is the reference model of a calendar window: at most L
// permits per calendar period. A key decides at its time: the caller's
// clock, or the time of the first grant of the period it counts when that
// is later, so a call whose clock still reads the period before decides in
// the key's period. A first grant more than a period ahead of the clock's
// (at or past the end of the period after the clock's) is a clock gone
// wrong: the call decides on its own clock and counts all the state holds
// as used, and a grant then starts the state afresh on that clock, with
// the count it held. Refunds give back into the period that counted the
// grant while the key still counts it.
type CalendarWindow struct {
	limit  int64
	period CalendarPeriod

	count   int64 // permits counted; firstUS == 0: none
	firstUS int64 // the key's time: the first grant of the state
	endUS   int64 // the end of the period the state counts
	grants  map[int64]*calendarGrant
	lastID  int64
	state   int64 // names the state: a grant starting one afresh changes it
}

type calendarGrant struct {
	state       int64 // the state that counted it
	took, given int64
}

// NewCalendarWindow returns a calendar-window model granting at most
// limit permits per period.
func NewCalendarWindow(limit int64, period CalendarPeriod) *CalendarWindow {
	if limit < 0 || period.Loc == nil {
		panic(fmt.Sprintf("model: invalid calendar window limit=%d period=%+v", limit, period))
	}
	return &CalendarWindow{limit: limit, period: period, grants: map[int64]*calendarGrant{}}
}

// Reset forgets the state: no grant of before refunds.
func (m *CalendarWindow) Reset() {
	m.count, m.firstUS, m.endUS = 0, 0, 0
	m.state++
}

// at returns the key's time for a call at nowUS, its period, whether the
// state counts in it and the permits it counts, and whether the clock has
// gone wrong.
func (m *CalendarWindow) at(nowUS int64) (t, startUS, endUS int64, counted bool, used int64, wrong bool) {
	t = nowUS
	if m.firstUS > nowUS {
		_, end := m.period.Bounds(nowUS)
		if _, after := m.period.Bounds(end); m.firstUS >= after {
			wrong = true
		} else {
			t = m.firstUS
		}
	}
	startUS, endUS = m.period.Bounds(t)
	if m.firstUS != 0 && (wrong || m.endUS > startUS) {
		counted, used = true, m.count
	}
	return t, startUS, endUS, counted, used, wrong
}

// Step decides a request for n permits at time nowUS.
func (m *CalendarWindow) Step(nowUS int64, n int64) Result {
	t, _, endUS, counted, used, wrong := m.at(nowUS)
	L := m.limit
	res := Result{Limit: L}
	switch {
	case n > L:
		res.RetryAfterUS = Never
	case n == 0:
		res.Allowed = true
	case used+n <= L:
		res.Allowed = true
		if !counted || wrong {
			m.count, m.firstUS, m.endUS = used, t, endUS
			m.state++
		}
		m.count += n
		used = m.count
		m.lastID++
		m.grants[m.lastID] = &calendarGrant{state: m.state, took: n}
		res.GrantID = m.lastID
	default:
		res.RetryAfterUS = endUS - t
	}
	res.Remaining = max(0, L-used)
	if used > 0 {
		res.ResetAfterUS = endUS - t
	}
	return res
}

// Refund gives back permits of the grant grantID at nowUS until k of them
// in all have been given back, while the key's period is the one that
// counted it; it returns how many this call gave back.
func (m *CalendarWindow) Refund(nowUS, grantID, k int64) int64 {
	g := m.grants[grantID]
	_, _, _, counted, _, wrong := m.at(nowUS)
	if g == nil || wrong || !counted || g.state != m.state {
		return 0
	}
	give := max(0, min(k, g.took)-g.given)
	g.given += give
	m.count -= give
	return give
}

// Clone returns an independent copy of m.
func (m *CalendarWindow) Clone() Model {
	c := *m
	c.grants = make(map[int64]*calendarGrant, len(m.grants))
	for id, g := range m.grants {
		copied := *g
		c.grants[id] = &copied
	}
	return &c
}

var (
	_ Model    = (*CalendarWindow)(nil)
	_ Refunder = (*CalendarWindow)(nil)
)
