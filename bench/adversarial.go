package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

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
	// build writes the state at key, the window's buckets ending near now,
	// and returns the n of the call and the clock time to call at.
	build func(e *environment, key string, now time.Time) (n int, at time.Time, err error)
	// fresh rebuilds the state every round: a call changes it.
	fresh bool
	// step is how far the clock moves after each call.
	step time.Duration
}

// writeLog writes a sliding-window state directly, in the layout
// scripts/sliding.lua keeps (format 9, docs/internals.md): one-permit
// buckets at the given indices (ascending), the last of them the tail,
// which lives in the note; each other bucket a member of score 2^52 +
// index and the cumulative count as text; the note, score 0, with the
// total; and the meta of a WithPrefix key. Building a million buckets
// through the limiter would take a million round trips. cursor and total
// are kept for the callers: every bucket counts.
func writeLog(e *environment, key string, indices []int64, cursor int64, total int64) error {
	_, _ = cursor, total
	const bucket0 = 1 << 52
	pipe := e.admin.Pipeline()
	pipe.Del(e.ctx, key)
	members := make([]redis.Z, 0, 2000)
	last := len(indices) - 1
	for i, idx := range indices[:last] {
		members = append(members, redis.Z{Score: float64(bucket0 + idx), Member: strconv.Itoa(i + 1)})
		if len(members) == cap(members) || i == last-1 {
			pipe.ZAdd(e.ctx, key, members...)
			members = members[:0:0]
			// A pipeline of a million members outlasts the write timeout.
			if pipe.Len() >= 50 {
				if _, err := pipe.Exec(e.ctx); err != nil {
					return err
				}
			}
		}
	}
	note := fmt.Sprintf("w9:%d %d 0 0", len(indices), indices[last])
	meta := fmt.Sprintf("w9 %d %d %d %d %d", advPrecision.Microseconds(), advWindow.Microseconds(), int64(advLimit), advWindow.Microseconds(), int64(advLimit))
	pipe.ZAdd(e.ctx, key, redis.Z{Score: 0, Member: note}, redis.Z{Score: math.Inf(1), Member: meta})
	pipe.PExpire(e.ctx, key, 3*advWindow)
	_, err := pipe.Exec(e.ctx)
	return err
}

func consecutive(from int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = from + int64(i)
	}
	return out
}

func advStates(quick bool) []advState {
	size := int64(advWindow / advPrecision)
	index := func(t time.Time) int64 { return t.UnixMicro() / advPrecision.Microseconds() }
	nonempty := func(n int) func(e *environment, key string, now time.Time) (int, time.Time, error) {
		return func(e *environment, key string, now time.Time) (int, time.Time, error) {
			first := index(now) - int64(n) + 1
			// The limit is advLimit: n near it is denied, and its exact
			// RetryAfter needs the walk of nearly every bucket.
			return advLimit - 10, now, writeLog(e, key, consecutive(first, n), first, int64(n))
		}
	}
	states := []advState{
		{name: "normal: a new bucket each call", step: advPrecision, build: func(e *environment, key string, now time.Time) (int, time.Time, error) {
			first := index(now) - 10
			return 1, now, writeLog(e, key, consecutive(first, 10), first, 10)
		}},
		{name: "10k dead buckets, walked 8 a call", fresh: true, build: func(e *environment, key string, now time.Time) (int, time.Time, error) {
			// 10,000 buckets an hour old and one live: every call finds
			// buckets leaving the window.
			first := index(now) - size - 10_000
			indices := append(consecutive(first, 10_000), index(now)-5)
			return 1, now, writeLog(e, key, indices, first, 10_001)
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
		n, at, err := states[i].build(e, s.key, now)
		if err != nil {
			return fmt.Errorf("adversarial %s: %w", states[i].name, err)
		}
		s.n, s.clock = n, newFakeClock(at)
		s.l, err = redlimit.NewSlidingWindow(e.rdb, advLimit, advWindow, advPrecision,
			redlimit.WithPrefix(""), redlimit.WithClock(s.clock.now))
		return err
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
