package inmem

import (
	"context"
	"fmt"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/calendar"
	"github.com/redlimit/redlimit/internal/engine"
)

// CalendarWindow grants at most limit permits per calendar period (a day,
// a week or a billing month in a time zone: redlimit.Daily, Weekly or
// Monthly), in process. It decides as redlimit.CalendarWindow does: on the
// key's time, the clock's or, when later, the key's first grant of the
// period it counts, so a clock that steps back across midnight decides in
// the key's period; a first grant at or past the end of the period after
// the clock's is a clock gone wrong, and the call decides on the clock,
// counting all the key holds as used. Its Grants refund into the period
// that counted them while the key still counts it, at most once, with
// refund records for at most 16 grants per key (a refund of an older
// grant of the period then gives nothing).
type CalendarWindow struct {
	limit  int64
	period redlimit.Period
	store  *store[calendarState]
	clock  // what it decides on (store.go): WithClock's, or OnClock's
}

// calendarState is one key's count in a period. firstUS == 0: none.
type calendarState struct {
	count   int64 // permits counted
	firstUS int64 // the key's time: the state's first grant
	endUS   int64 // the end of the period counted
	next    int64 // permits granted since firstUS: the next grant's position
	refunds
}

var _ redlimit.Limiter = (*CalendarWindow)(nil)

// NewCalendarWindow returns an in-process limiter granting at most limit
// permits per period. limit must be between 1 and 2^40, and period made by
// redlimit.Daily, Weekly or Monthly with a non-nil location, a weekday
// from time.Sunday to time.Saturday and an anchor day from 1 to 31. Bad
// values are redlimit.ErrInvalidConfig, naming the field.
func NewCalendarWindow(limit int, period redlimit.Period, opts ...Option) (*CalendarWindow, error) {
	const algorithm = "calendar_window"
	if err := permits(algorithm, "limit", limit); err != nil {
		return nil, err
	}
	if err := calendar.Check(period, redlimit.ErrInvalidConfig, "inmem "+algorithm); err != nil {
		return nil, err
	}
	o, err := newOptions(algorithm, opts)
	if err != nil {
		return nil, err
	}
	l := &CalendarWindow{limit: int64(limit), period: period}
	l.clock = newClock(o)
	l.store = newStore(o, l.used)
	return l, nil
}

// AllowN takes n permits for key if all n are available in the key's
// period, else none. err is non-nil only for a key that is empty or longer
// than redlimit.MaxKeyBytes, n < 0, a nil ctx or a clock outside 2001 to
// 2112 (redlimit.ErrInvalidArgument). n == 0 reports the state; n above
// the limit is denied with RetryAfter redlimit.Never. A granted Result's
// Grant refunds.
func (l *CalendarWindow) AllowN(ctx context.Context, key string, n int) (redlimit.Result, error) {
	if err := checkCall(ctx, "calendar_window", key, n); err != nil {
		return redlimit.Result{}, err
	}
	now, err := l.store.nowUS(l.clock, "calendar_window")
	if err != nil {
		return redlimit.Result{}, err
	}
	sh := l.store.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	var s calendarState
	if e != nil {
		s = e.state
	}
	v := l.view(&s, now)
	r := redlimit.Result{Limit: int(l.limit)}
	retry := int64(0)
	switch {
	case int64(n) > l.limit:
		retry = -1
	case n == 0:
		r.Allowed = true
	case v.used+int64(n) <= l.limit:
		r.Allowed = true
		if !v.counted || v.wrong {
			s = calendarState{count: v.used, firstUS: v.t, endUS: v.endUS, next: v.used}
		}
		pos := s.next
		s.count += int64(n)
		s.next += int64(n)
		v.used = s.count
		token := fmt.Sprintf("%d.%d.%d", s.firstUS, pos, n)
		r.Grant = engine.NewGrant(l, key, n, token)
		sh.put(l.store, key, e, s, now, s.endUS-now)
	default:
		retry = v.endUS - v.t
	}
	l.report(&r, v)
	r.RetryAfter = microsDuration(retry)
	return r, nil
}

// calendarView is a key's state as a call at some clock sees it.
type calendarView struct {
	t, startUS, endUS int64 // the key's time and its period
	counted, wrong    bool  // the state counts in it; the clock went wrong
	used              int64 // permits counted
}

// view returns s as a call at nowUS sees it (see CalendarWindow).
func (l *CalendarWindow) view(s *calendarState, nowUS int64) calendarView {
	v := calendarView{t: nowUS}
	if s.firstUS > nowUS {
		_, end := l.period.Bounds(time.UnixMicro(nowUS))
		if _, after := l.period.Bounds(end); s.firstUS >= after.UnixMicro() {
			v.wrong = true
		} else {
			v.t = s.firstUS
		}
	}
	start, end := l.period.Bounds(time.UnixMicro(v.t))
	v.startUS, v.endUS = start.UnixMicro(), end.UnixMicro()
	if s.firstUS != 0 && (v.wrong || s.endUS > v.startUS) {
		v.counted, v.used = true, s.count
	}
	return v
}

// report sets r's Remaining and ResetAfter from v.
func (l *CalendarWindow) report(r *redlimit.Result, v calendarView) {
	r.Remaining = int(max(0, l.limit-v.used))
	if v.used > 0 {
		r.ResetAfter = microsDuration(v.endUS - v.t)
	}
}

// RefundGrant gives back permits of the grant of key named token until n
// of them in all have been given back, while the key still counts the
// period that counted it: the way redlimit.Grant.Refund reaches this
// limiter. Call the Grant's Refund, which checks n, rather than this.
func (l *CalendarWindow) RefundGrant(ctx context.Context, key, token string, took, n int) error {
	if err := checkCall(ctx, "calendar_window", key, 0); err != nil {
		return err
	}
	now, err := l.store.nowUS(l.clock, "calendar_window")
	if err != nil {
		return err
	}
	var firstUS, pos, grantN int64
	if _, err := fmt.Sscanf(token, "%d.%d.%d", &firstUS, &pos, &grantN); err != nil {
		return nil // not a grant of this limiter: it gives nothing
	}
	sh := l.store.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	if e == nil {
		return nil
	}
	s := e.state
	v := l.view(&s, now)
	if !v.counted || v.wrong || s.firstUS != firstUS || pos+grantN > s.next {
		return nil
	}
	had, ok := s.refunds.given(pos, grantN) // the grant holds [pos, pos+grantN)
	if !ok {
		return nil
	}
	give := min(min(int64(n), grantN)-had, s.count)
	if give <= 0 {
		return nil
	}
	s.count -= give
	s.refunds.add(pos+had, pos+had+give)
	sh.put(l.store, key, e, s, now, max(1, s.endUS-now))
	return nil
}

// used is the share of the limit s has in use at t.
func (l *CalendarWindow) used(s *calendarState, t int64) float64 {
	return float64(l.view(s, t).used) / float64(l.limit)
}

// Allow is AllowN(ctx, key, 1).
func (l *CalendarWindow) Allow(ctx context.Context, key string) (redlimit.Result, error) {
	return l.AllowN(ctx, key, 1)
}

// TryAcquire takes one permit for key: nil when allowed, a
// *redlimit.ViolationStrategyError (matching redlimit.ErrAcquireFailed)
// when denied, with Window 0: periods differ in length.
func (l *CalendarWindow) TryAcquire(ctx context.Context, key string) error {
	return tryAcquire(ctx, l, key, func(redlimit.Result) time.Duration { return 0 })
}

// OnClock returns a view of l that decides on now: the same
// configuration and the same keys (what either grants, the other sees),
// on another clock. The view's Grants refund through the view, on
// now. When l was built with WithClock (its own clock wins), or now is
// nil, OnClock returns l. redlimit.WithFallback calls it with the Redis
// limiter's clock (redlimit.WithClock).
func (l *CalendarWindow) OnClock(now func() time.Time) redlimit.Limiter { return onClock(l, now) }

// Reset forgets all state of key.
func (l *CalendarWindow) Reset(ctx context.Context, key string) error {
	if err := checkCall(ctx, "calendar_window", key, 0); err != nil {
		return err
	}
	return l.store.reset("calendar_window", key)
}
