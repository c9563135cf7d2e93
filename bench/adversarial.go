package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/redlimit/redlimit"
)

// adversarialResult is the Redis script time of one sliding-window call on
// a state an attacker can build, next to a normal call (DESIGN property 9).
type adversarialResult struct {
	State    string  `json:"state"`
	ScriptUS float64 `json:"script_us_per_call"` // median over rounds
	VsNormal float64 `json:"vs_normal"`
}

// The limiter every state is measured with: a sliding window of an hour
// in 1ms buckets, a limit far above every state's count.
const (
	advPrecision = time.Millisecond
	advWindow    = time.Hour
	advLimit     = 1 << 40
)

// advState is one state and the call made on it.
type advState struct {
	name string
	// build makes the state at key through grant, the window's buckets
	// ending near now, and returns the n of the call and the clock time to
	// call at.
	build func(grant func(at time.Time) error, now time.Time) (n int, at time.Time, err error)
	// fresh rebuilds the state every round: a call changes it.
	fresh bool
	// step is how far the clock moves after each call.
	step time.Duration
}

// grantEach grants one permit in each of n consecutive buckets from the one
// holding from: the script writes its own state (a round trip a bucket:
// about 4s for 100,000 buckets on a local server).
func grantEach(grant func(at time.Time) error, from time.Time, n int) error {
	for i := range n {
		if err := grant(from.Add(time.Duration(i) * advPrecision)); err != nil {
			return err
		}
	}
	return nil
}

func advStates(quick bool) []advState {
	nonempty := func(n int) func(grant func(time.Time) error, now time.Time) (int, time.Time, error) {
		return func(grant func(time.Time) error, now time.Time) (int, time.Time, error) {
			// The limit is advLimit: n near it is denied, and its exact
			// RetryAfter needs the walk of nearly every bucket.
			return advLimit - 10, now, grantEach(grant, now.Add(-time.Duration(n-1)*advPrecision), n)
		}
	}
	states := []advState{
		{name: "normal: a new bucket each call", step: advPrecision, build: func(grant func(time.Time) error, now time.Time) (int, time.Time, error) {
			return 1, now, grantEach(grant, now.Add(-10*advPrecision), 10)
		}},
		{name: "10k dead buckets, walked 8 a call", fresh: true, build: func(grant func(time.Time) error, now time.Time) (int, time.Time, error) {
			// 10,000 buckets an hour old and one live: every call finds
			// buckets leaving the window.
			if err := grantEach(grant, now.Add(-advWindow-10_000*advPrecision), 10_000); err != nil {
				return 0, now, err
			}
			return 1, now, grant(now.Add(-5 * advPrecision))
		}},
		{name: "100k nonempty buckets, n near the limit (denied)", build: nonempty(100_000)},
	}
	if !quick {
		states = append(states, advState{name: "1M nonempty buckets, n near the limit (denied)", build: nonempty(1_000_000)})
	}
	return states
}

// adversarial measures the script µs of a sliding-window call on each
// state, rounds interleaved, and its ratio to the normal call.
func (e *environment) adversarial() ([]adversarialResult, error) {
	rounds, calls := 5, 200
	if e.f.quick {
		rounds, calls = 3, 100
	}
	states := advStates(e.f.quick)
	us := make([][]float64, len(states))
	now := time.Unix(1_900_000_000, 0)
	type subject struct {
		l     redlimit.Limiter
		key   string
		n     int
		clock *fakeClock
	}
	subjects := make([]subject, len(states))
	build := func(i int) error {
		s := &subjects[i]
		s.key = fmt.Sprintf("adv:%d:%s", i, e.run)
		e.admin.Unlink(e.ctx, s.key)
		s.clock = newFakeClock(now)
		var err error
		s.l, err = redlimit.NewSlidingWindow(e.rdb, advLimit, advWindow, advPrecision,
			redlimit.WithPrefix(""), redlimit.WithClock(s.clock.now))
		if err != nil {
			return err
		}
		grant := func(at time.Time) error {
			s.clock.ns.Store(at.UnixNano())
			r, err := s.l.Allow(e.ctx, s.key)
			if err == nil && !r.Allowed {
				err = fmt.Errorf("a grant at %v was denied", at)
			}
			return err
		}
		n, at, err := states[i].build(grant, now)
		if err != nil {
			return fmt.Errorf("adversarial %s: %w", states[i].name, err)
		}
		s.n = n
		s.clock.ns.Store(at.UnixNano())
		return nil
	}
	for i := range states {
		logf("adversarial: building %s", states[i].name)
		if err := build(i); err != nil {
			return nil, err
		}
	}
	for round := 0; round < rounds; round++ {
		for i := range states {
			if states[i].fresh && round > 0 {
				if err := build(i); err != nil {
					return nil, err
				}
			}
			s := subjects[i]
			before, err := readStats(e.ctx, e.admin)
			if err != nil {
				return nil, err
			}
			for k := 0; k < calls; k++ {
				if _, err := s.l.AllowN(e.ctx, s.key, s.n); err != nil {
					return nil, fmt.Errorf("adversarial %s: %w", states[i].name, err)
				}
				s.clock.advance(states[i].step)
			}
			after, err := readStats(e.ctx, e.admin)
			if err != nil {
				return nil, err
			}
			d := after.sub(before)
			us[i] = append(us[i], float64(d.scriptUS)/float64(d.scriptCall))
		}
	}
	var out []adversarialResult
	base := median(us[0])
	for i, st := range states {
		r := adversarialResult{State: st.name, ScriptUS: median(us[i])}
		r.VsNormal = r.ScriptUS / base
		logf("adversarial %-50s %7.2f µs/call  %.2f× normal", st.name, r.ScriptUS, r.VsNormal)
		out = append(out, r)
	}
	for i := range subjects {
		e.admin.Unlink(e.ctx, subjects[i].key)
	}
	return out, nil
}

func adversarialMarkdown(rs []adversarialResult) string {
	var b strings.Builder
	b.WriteString("\n| sliding window (1h in 1ms buckets): state | script µs per call | × normal |\n|---|--:|--:|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %.2f | %.2f |\n", r.State, r.ScriptUS, r.VsNormal)
	}
	return b.String()
}
