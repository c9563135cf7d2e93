package model

import "math/rand/v2"

// CalendarStep is one call of a random calendar trace, with what the
// model answers: n permits at AtUS, or, when Refund > 0, a refund of the
// grant made at step Refund-1 until N of its permits have been given
// back, followed at once by a call for 0 permits, whose Result is Want.
type CalendarStep struct {
	AtUS   int64
	N      int64
	Refund int
	Want   Result
}

// CalendarTrace draws a trace of steps calls on a calendar window of
// limit per period, decided by a fresh model as it goes, for the
// differential tests of the script and of the in-process limiter. The
// clock starts at startUS and mostly moves on, in steps that land on
// period boundaries, a microsecond either side of them, or inside a
// period; it also goes back, by a few seconds (clocks that disagree near
// midnight) or, rarely, by two or three periods (a clock gone wrong).
// Refunds take back part or all of earlier grants, or repeat a refund;
// at most 16 grants are refunded in a trace, the most a key keeps records
// for, so that the model's answers are exact for the limiters too. The
// clock never comes back to a microsecond it left (calls at one instant
// follow each other): the limiters name a key's state by its first
// grant's microsecond, so a grant of an earlier state whose first grant
// fell on the very microsecond of the current one's would refund into it.
func CalendarTrace(rng *rand.Rand, period CalendarPeriod, limit int64, startUS int64, steps int) []CalendarStep {
	m := NewCalendarWindow(limit, period)
	now := startUS
	var trace []CalendarStep
	used := map[int64]bool{}   // the clock's readings
	var granted []int          // steps whose call was granted
	refunded := map[int]bool{} // steps whose grant was refunded
	for len(trace) < steps {
		start, end := period.Bounds(now)
		switch r := rng.IntN(20); {
		case r < 3:
			now = end - 1
		case r < 6:
			now = end + int64(rng.IntN(3))
		case r < 12:
			now += rng.Int64N((end-start)/3 + 1)
		case r < 14:
			now -= 1 + rng.Int64N(5_000_000) // a clock a few seconds behind
		case r == 14 && rng.IntN(4) == 0:
			back := start - 1
			for range 1 + rng.IntN(2) {
				back, _ = period.Bounds(back - 1)
			}
			now = back + rng.Int64N(end-start) // two or three periods back
		}
		if len(trace) > 0 && now != trace[len(trace)-1].AtUS {
			for used[now] {
				now++
			}
		}
		used[now] = true
		if len(granted) > 0 && rng.IntN(4) == 0 {
			g := granted[rng.IntN(len(granted))]
			if !refunded[g] && len(refunded) >= 16 {
				continue
			}
			refunded[g] = true
			k := 1 + rng.Int64N(trace[g].N)
			m.Refund(now, trace[g].Want.GrantID, k)
			trace = append(trace, CalendarStep{AtUS: now, N: k, Refund: g + 1, Want: m.Step(now, 0)})
			continue
		}
		n := rng.Int64N(limit + 2)
		want := m.Step(now, n)
		if want.Allowed && n > 0 {
			granted = append(granted, len(trace))
		}
		trace = append(trace, CalendarStep{AtUS: now, N: n, Want: want})
	}
	return trace
}
