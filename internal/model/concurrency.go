package model

import (
	"fmt"
	"sort"
)

// Concurrency is the reference model of a concurrency limiter with leases:
// at most L leases are live at any moment of the key's time. A lease is
// live from its grant until it is released or leaseUS passes without an
// Extend. A grant of n takes n leases that lapse together.
//
// The key's time is max(now, recorded), where recorded is the time of the
// latest grant or extend. A recorded time ahead of now by more than the
// longest lease the key holds (its latest expiry less the recorded time,
// or leaseUS: configurations sharing a key may differ) is a clock gone
// wrong: the leases live at the recorded time count as live for that long
// from now at most (stricter for at most a lease, never looser), and a grant or extend writes them so, with now as the
// recorded time. Denials, n == 0 and releases never move the recorded time.
// Every duration in a Result is counted from now, the caller's clock.
type Concurrency struct {
	limit   int64 // L
	leaseUS int64

	recordedUS int64
	lastID     int64           // ids are never given twice
	expiries   map[int64]int64 // lease id -> expiry; lapsed ones may stay
	grants     map[int64]int64 // grant id (its first lease's) -> leases taken
}

var (
	_ Model    = (*Concurrency)(nil)
	_ Refunder = (*Concurrency)(nil)
)

// NewConcurrency returns a model allowing limit live leases of leaseUS
// microseconds each. It panics if limit < 0 or leaseUS <= 0.
func NewConcurrency(limit, leaseUS int64) *Concurrency {
	if limit < 0 || leaseUS <= 0 {
		panic(fmt.Sprintf("model: invalid concurrency limit=%d leaseUS=%d", limit, leaseUS))
	}
	m := &Concurrency{limit: limit, leaseUS: leaseUS}
	m.Reset()
	return m
}

// Reset forgets every lease and the recorded time. Ids are still never
// given twice.
func (m *Concurrency) Reset() {
	m.recordedUS = 0
	m.expiries = map[int64]int64{}
	m.grants = map[int64]int64{}
}

// Clone returns an independent copy of m.
func (m *Concurrency) Clone() Model {
	c := *m
	c.expiries = make(map[int64]int64, len(m.expiries))
	for id, e := range m.expiries {
		c.expiries[id] = e
	}
	c.grants = make(map[int64]int64, len(m.grants))
	for id, n := range m.grants {
		c.grants[id] = n
	}
	return &c
}

// view is the key as a call at nowUS sees it.
type concurrencyView struct {
	now, t   int64 // the caller's clock and the key's time
	windowUS int64 // the longest lease the key holds, or this lease
	wrong    bool  // the recorded time is ahead of now by more than windowUS
	live     []int64
}

// see returns the view at nowUS: the live leases' ids, ordered by their
// expiry as this call reads it (effective).
func (m *Concurrency) see(nowUS int64) concurrencyView {
	v := concurrencyView{now: nowUS, t: max(nowUS, m.recordedUS), windowUS: m.leaseUS}
	for id, e := range m.expiries {
		if e > v.t {
			v.live = append(v.live, id)
		}
		// The longest lease the key holds: another configuration's may be
		// longer than this one's.
		v.windowUS = max(v.windowUS, e-m.recordedUS)
	}
	v.wrong = m.recordedUS > nowUS+v.windowUS
	sort.Slice(v.live, func(i, j int) bool {
		ei, ej := m.effective(v, v.live[i]), m.effective(v, v.live[j])
		return ei < ej || ei == ej && v.live[i] < v.live[j]
	})
	return v
}

// effective is the expiry of live lease id as v reads it: its own, or at
// most the longest lease from now when the clock went wrong.
func (m *Concurrency) effective(v concurrencyView, id int64) int64 {
	if v.wrong {
		return min(m.expiries[id], v.now+v.windowUS)
	}
	return m.expiries[id]
}

// writeTime returns the time a grant or extend at v writes from, after
// rebasing the state on the caller's timeline when the clock went wrong:
// lapsed leases go, live ones lapse the longest lease from now at the
// latest.
func (m *Concurrency) writeTime(v concurrencyView) int64 {
	if !v.wrong {
		return v.t
	}
	live := map[int64]bool{}
	for _, id := range v.live {
		live[id] = true
	}
	for id := range m.expiries {
		if !live[id] {
			delete(m.expiries, id)
		} else {
			m.expiries[id] = m.effective(v, id)
		}
	}
	return v.now
}

// take grants n new leases lapsing at w + leaseUS, and returns the grant's id.
func (m *Concurrency) take(w, n int64) int64 {
	first := max(m.lastID+1, w)
	for id := first; id < first+n; id++ {
		m.expiries[id] = w + m.leaseUS
	}
	m.lastID = first + n - 1
	m.grants[first] = n
	m.recordedUS = w
	return first
}

// report fills the Result's Remaining and ResetAfterUS from a fresh view.
func (m *Concurrency) report(r Result, nowUS int64) Result {
	v := m.see(nowUS)
	r.Limit = m.limit
	r.Remaining = max(0, m.limit-int64(len(v.live)))
	if len(v.live) > 0 {
		r.ResetAfterUS = m.effective(v, v.live[len(v.live)-1]) - nowUS
	}
	return r
}

// denial is a denial at v of a request that needs excess more of the live
// leases to lapse (the excess-th earliest's effective expiry), or Never.
func (m *Concurrency) denial(v concurrencyView, excess int64, never bool) Result {
	r := Result{RetryAfterUS: Never}
	if !never {
		r.RetryAfterUS = m.effective(v, v.live[excess-1]) - v.now
	}
	return m.report(r, v.now)
}

// Step decides a request for n leases at nowUS.
func (m *Concurrency) Step(nowUS int64, n int64) Result {
	v := m.see(nowUS)
	count := int64(len(v.live))
	switch {
	case n > m.limit:
		return m.denial(v, 0, true)
	case n == 0:
		return m.report(Result{Allowed: true}, nowUS)
	case count+n > m.limit:
		return m.denial(v, count+n-m.limit, false)
	}
	id := m.take(m.writeTime(v), n)
	return m.report(Result{Allowed: true, GrantID: id}, nowUS)
}

// Refund releases the first k leases of grant grantID at nowUS and returns
// how many of them were live. A released or lapsed lease frees nothing.
func (m *Concurrency) Refund(nowUS, grantID, k int64) int64 {
	v := m.see(nowUS)
	given := int64(0)
	for id := grantID; id < grantID+min(k, m.grants[grantID]); id++ {
		if e, ok := m.expiries[id]; ok {
			if e > v.t {
				given++
			}
			delete(m.expiries, id)
		}
	}
	return given
}

// Extend gives the leases of grant grantID another lease from nowUS. When
// all are live they keep their ids and lapse at the later of their expiry
// and a lease from the key's time; otherwise the grant is taken afresh, its
// live leases counting as room: all its leases go and n new ones come, if
// the others leave room for n, else nothing changes and the Result is a
// denial. It returns the Result and the grant's id from now on (the same,
// a new one, or grantID on a denial).
func (m *Concurrency) Extend(nowUS, grantID int64) (Result, int64) {
	n := m.grants[grantID]
	v := m.see(nowUS)
	mine := int64(0)
	for id := grantID; id < grantID+n; id++ {
		if e, ok := m.expiries[id]; ok && e > v.t {
			mine++
		}
	}
	others := int64(len(v.live)) - mine
	switch {
	case n == 0:
		panic(fmt.Sprintf("model: extend of unknown grant %d", grantID))
	case mine == n:
		w := m.writeTime(v)
		for id := grantID; id < grantID+n; id++ {
			m.expiries[id] = max(m.expiries[id], w+m.leaseUS)
		}
		m.recordedUS = w
		return m.report(Result{Allowed: true, GrantID: grantID}, nowUS), grantID
	case n > m.limit:
		return m.denial(v, 0, true), grantID
	case others+n > m.limit:
		// The others must lapse: mine, interleaved with them, lapse too.
		return m.denial(v, others+n-m.limit+mine, false), grantID
	}
	w := m.writeTime(v)
	for id := grantID; id < grantID+n; id++ {
		delete(m.expiries, id)
	}
	id := m.take(w, n)
	return m.report(Result{Allowed: true, GrantID: id}, nowUS), id
}

// ClockWrong reports whether a call at nowUS finds the recorded time ahead
// of it by more than a lease, for tests.
func (m *Concurrency) ClockWrong(nowUS int64) bool { return m.see(nowUS).wrong }

// Live returns the number of leases live at nowUS, for tests.
func (m *Concurrency) Live(nowUS int64) int64 { return int64(len(m.see(nowUS).live)) }
