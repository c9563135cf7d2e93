package redlimit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/engine"
	"github.com/redlimit/redlimit/internal/redistest"
)

// The sliding scripts' grant in the tail's bucket (scripts/sliding.lua): a
// grant of a busy key, in the bucket it last granted in, rewrites the meta
// from its own text and replies "=", now and the meta's numbers, which the
// Go side turns into a Result (engine.ParseReplyText). It is a shortcut of
// the path below it in the script: these tests hold the two to the same
// Results and the same writes.

// withoutTailGrant is the sliding scripts' source with the grant in the
// tail's bucket cut out: the path it shortcuts decides every call.
var withoutTailGrant = func() *redis.Script {
	src := slidingWindowScript.source
	begin := strings.Index(src, "-- A grant in the tail's bucket")
	end := strings.Index(src, "\n-- Tables built by a constructor")
	cut := src
	if begin >= 0 && end > begin {
		cut = src[:begin] + src[end+1:]
	}
	if cut == src || strings.Contains(cut, "'='") || !strings.Contains(src, "return '=' ..") || slidingLogScript.source != src {
		panic("grant_test: the grant in the tail's bucket is not where the test cuts it out")
	}
	return redis.NewScript(cut)
}()

// tailGrantOutcome runs script for one decision on key and returns what the
// Go side makes of it: the Reply, or the error text. raw is the reply as
// the script sent it.
func tailGrantOutcome(t *testing.T, rdb *redis.Client, script *redis.Script, key string, now any, n int, args []any) (outcome, raw string) {
	t.Helper()
	text, err := script.Run(context.Background(), rdb, []string{key}, append([]any{now, n}, args...)...).Text()
	if err != nil {
		return "error: " + err.Error(), ""
	}
	r, err := engine.ParseReplyText(text, scriptLog(args))
	require.NoError(t, err, "reply %q", text)
	return fmt.Sprintf("%+v", r), text
}

// The grant changes nothing but the cost. Two keys see the same random
// calls (pairTraces): one on the script, the other on the script without
// the grant in the tail's bucket. After every call the two Results (or
// errors) must be equal, and so must the two hashes, field by field (and,
// on miniredis, where the clock does not run, the TTLs).
func TestSlidingTailGrantChangesNothing(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		grants, calls := 0, 0
		pairTraces(t, b, "grant", 17, 40, 1500, 4, func(c pairCall) {
			before := b.rdb.HGetAll(ctx, c.keys[0]).Val()
			fast, raw := tailGrantOutcome(t, b.rdb, slidingWindowScript.Script, c.keys[0], c.now, c.n, c.cfg.args)
			slow, _ := tailGrantOutcome(t, b.rdb, withoutTailGrant, c.keys[1], c.now, c.n, c.cfg.args)
			require.Equal(t, slow, fast, "%s, state before %v", c.at, before)
			require.Equal(t, b.rdb.HGetAll(ctx, c.keys[1]).Val(), b.rdb.HGetAll(ctx, c.keys[0]).Val(), "%s: the writes differ (state before %v)", c.at, before)
			if b.mini != nil {
				require.Equal(t, b.mini.TTL(c.keys[1]), b.mini.TTL(c.keys[0]), "%s: TTL", c.at)
			}
			calls++
			if strings.HasPrefix(raw, "=") {
				grants++
			}
		})
		t.Logf("%s: %d of %d calls were grants in the tail's bucket", b.name, grants, calls)
		require.Greater(t, grants, calls/10, "the traces grant in the tail's bucket often")
	})
}

// The edges of the grant in the tail's bucket, on states written by hand:
// each is decided by the grant (fast) or by the path below it, and either
// way as the script without the grant decides it, to the same Result and
// the same writes. A sliding window of 5 per 10 buckets of 1ms, a sliding
// log of 5 per 10 and 8 per 30, and one of those and 12 per 90; the tail is bucket T, now is in it
// unless a case says otherwise.
func TestSlidingTailGrantEdges(t *testing.T) {
	t.Parallel()
	sw := slidingArgs("W4", 1000, []int{5}, []int64{10})
	sl := slidingArgs("L4", 1000, []int{5, 8}, []int64{10, 30})
	sl3 := slidingArgs("L4", 1000, []int{5, 8, 12}, []int64{10, 30, 90})
	const T int64 = 1_800_000_000_000 // bucket index: epoch in 1ms buckets
	// state is a meta's numbers after own (tail count (cursor total)*S
	// [head all]), and the bucket fields: index -> "count next".
	type state struct {
		meta    string
		buckets map[int64]string
	}
	older := func(c int64) map[int64]string { return map[int64]string{T - c: fmt.Sprintf("1 %d", T)} }
	// three: the three-strategy log with a permit in T-9 and T-29, and in
	// its third cursor's bucket T-c3 (c3 as written); t3 the third total.
	three := func(c3, t3 string) state {
		var c int64
		fmt.Sscan(c3, &c)
		meta := fmt.Sprintf("1 9 2 29 3 %s %s", c3, t3)
		return state{meta, map[int64]string{T - c: fmt.Sprintf("1 %d", T-29), T - 29: fmt.Sprintf("1 %d", T-9), T - 9: fmt.Sprintf("1 %d", T)}}
	}
	cases := []struct {
		name  string
		args  []any
		state state
		at    int64 // µs into bucket T (from its start: 0 to 999)
		n     int
		fast  bool
	}{
		{name: "cursor at the tail", args: sw, state: state{"2 0 2", nil}, at: 500, n: 1, fast: true},
		{name: "first µs of the bucket", args: sw, state: state{"2 0 2", nil}, at: 0, n: 1, fast: true},
		{name: "last µs of the bucket", args: sw, state: state{"2 0 2", nil}, at: 999, n: 1, fast: true},
		{name: "first µs of the next bucket", args: sw, state: state{"2 0 2", nil}, at: 1000, n: 1},
		{name: "clock before the tail", args: sw, state: state{"2 0 2", nil}, at: -1, n: 1},
		{name: "oldest bucket last in the window", args: sw, state: state{"1 9 2", older(9)}, at: 500, n: 1, fast: true},
		{name: "oldest bucket out of the window", args: sw, state: state{"1 10 2", older(10)}, at: 500, n: 1},
		{name: "oldest bucket far out", args: sw, state: state{"1 100 2", older(100)}, at: 500, n: 1},
		{name: "last permit", args: sw, state: state{"4 0 4", nil}, at: 500, n: 1, fast: true},
		{name: "one too many", args: sw, state: state{"5 0 5", nil}, at: 500, n: 1},
		{name: "n=2 to the limit", args: sw, state: state{"3 0 3", nil}, at: 500, n: 2, fast: true},
		{name: "n=2 past the limit", args: sw, state: state{"4 0 4", nil}, at: 500, n: 2},
		{name: "n=0", args: sw, state: state{"2 0 2", nil}, at: 500, n: 0},
		{name: "n above the limit", args: sw, state: state{"1 0 1", nil}, at: 500, n: 6},
		{name: "head apart from the cursor", args: sw, state: state{"1 0 1 9 2", older(9)}, at: 500, n: 1},
		{name: "no cursor", args: sw, state: state{"1 -1 0 9 2", older(9)}, at: 500, n: 1},
		{name: "count above the total", args: sw, state: state{"3 0 2", nil}, at: 500, n: 1},
		{name: "cursor with a leading zero (the path below reads it)", args: sw, state: state{"1 09 2", older(9)}, at: 500, n: 1},
		{name: "cursor with a leading zero, out of the window", args: sw, state: state{"1 010 2", older(10)}, at: 500, n: 1},

		{name: "log: both cursors inside", args: sl, state: state{"1 9 2 29 3", map[int64]string{T - 29: fmt.Sprintf("1 %d", T-9), T - 9: fmt.Sprintf("1 %d", T)}}, at: 500, n: 1, fast: true},
		{name: "log: second cursor out", args: sl, state: state{"1 9 2 30 3", map[int64]string{T - 30: fmt.Sprintf("1 %d", T-9), T - 9: fmt.Sprintf("1 %d", T)}}, at: 500, n: 1},
		{name: "log: first full", args: sl, state: state{"5 0 5 0 5", nil}, at: 500, n: 1},
		{name: "log: second full", args: sl, state: state{"1 0 1 29 8", map[int64]string{T - 29: fmt.Sprintf("7 %d", T)}}, at: 500, n: 1},
		{name: "log: second to its limit", args: sl, state: state{"1 0 1 29 7", map[int64]string{T - 29: fmt.Sprintf("6 %d", T)}}, at: 500, n: 1, fast: true},
		{name: "log: equal left", args: sl, state: state{"1 0 1 29 4", map[int64]string{T - 29: fmt.Sprintf("3 %d", T)}}, at: 500, n: 1, fast: true},
		{name: "log: second cursor with a leading zero", args: sl, state: state{"1 0 1 09 2", older(9)}, at: 500, n: 1},
		{name: "log: count above the second total", args: sl, state: state{"2 0 2 0 1", nil}, at: 500, n: 1},
		{name: "three: every cursor inside", args: sl3, state: three("89", "4"), at: 999, n: 1, fast: true},
		{name: "three: third cursor out", args: sl3, state: three("90", "4"), at: 500, n: 1},
		{name: "three: third to its limit", args: sl3, state: three("89", "11"), at: 500, n: 1, fast: true},
		{name: "three: third full", args: sl3, state: three("89", "12"), at: 500, n: 1},
		{name: "three: n=3 to the first limit", args: sl3, state: three("89", "4"), at: 500, n: 3, fast: true},
		{name: "three: third cursor with a leading zero", args: sl3, state: three("05", "4"), at: 500, n: 1},
		{name: "three: count above the third total", args: sl3, state: state{"2 0 2 0 2 0 1", nil}, at: 500, n: 1},
		{name: "three: next bucket", args: sl3, state: three("89", "4"), at: 1000, n: 1},
	}
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		if b.mini == nil {
			keepTTL(b.rdb, time.Hour)
		}
		for i, tc := range cases {
			keys := []string{fmt.Sprintf("edge:%d:fast", i), fmt.Sprintf("edge:%d:slow", i)}
			for _, key := range keys {
				fields := []any{"m", tc.args[0].(string) + fmt.Sprintf(" %d ", T) + tc.state.meta}
				for index, v := range tc.state.buckets {
					fields = append(fields, fmt.Sprint(index), v)
				}
				require.NoError(t, b.rdb.HSet(ctx, key, fields...).Err())
				require.NoError(t, b.rdb.PExpire(ctx, key, time.Hour).Err())
			}
			now := T*1000 + tc.at
			fast, raw := tailGrantOutcome(t, b.rdb, slidingWindowScript.Script, keys[0], now, tc.n, tc.args)
			slow, _ := tailGrantOutcome(t, b.rdb, withoutTailGrant, keys[1], now, tc.n, tc.args)
			require.Equal(t, slow, fast, "%s: the Result", tc.name)
			require.Equal(t, tc.fast, strings.HasPrefix(raw, "="), "%s: decided by the grant in the tail's bucket (reply %q)", tc.name, raw)
			require.Equal(t, b.rdb.HGetAll(ctx, keys[1]).Val(), b.rdb.HGetAll(ctx, keys[0]).Val(), "%s: the writes", tc.name)
		}
	})
}

// A grant in the tail's bucket costs Redis one HGET and one HSET, and
// nothing else; each Result counts down by one. On a server of its own:
// INFO commandstats counts every client's commands.
func TestSlidingTailGrantCost(t *testing.T) {
	t.Parallel()
	rdb := newClient(t, redistest.Start(t).Addr(), 0)
	for _, alg := range algorithms {
		if alg.code != "sw" && alg.code != "sl" {
			continue
		}
		t.Run(alg.name, func(t *testing.T) {
			clock := newClock()
			l, err := alg.new(rdb, 100, time.Second, WithClock(clock.Now))
			require.NoError(t, err)
			first, err := l.Allow(context.Background(), "k")
			require.NoError(t, err)
			require.True(t, first.Allowed)
			calls := func() map[string]int64 {
				c := cmdCalls(t, rdb)
				delete(c, "evalsha")
				delete(c, "info")
				return c
			}
			before := calls()
			const grants = 50
			for i := range grants {
				clock.Advance(time.Microsecond)
				r, err := l.Allow(context.Background(), "k")
				require.NoError(t, err)
				require.True(t, r.Allowed)
				require.Equal(t, first.Remaining-i-1, r.Remaining, "grant %d", i)
				require.Equal(t, first.ResetAfter-time.Duration(i+1)*time.Microsecond, r.ResetAfter, "grant %d", i)
			}
			after := calls()
			for cmd, n := range after {
				want := before[cmd]
				if cmd == "hget" || cmd == "hset" {
					want += grants
				}
				require.Equal(t, want, n, "%s: a grant in the tail's bucket runs one HGET, one HSET and nothing else", cmd)
			}
		})
	}
}

// On the server's clock, a grant replies now as TIME's two strings joined,
// its microseconds padded to six digits. miniredis's clock is set to
// microseconds of every width, and each Result must equal the script's
// without the grant at the same instant; the real server's runs for over a
// second, so that its microseconds pass below 100,000, and every reply must
// parse and count down by one.
func TestSlidingTailGrantServerTime(t *testing.T) {
	t.Parallel()
	args := slidingArgs("W4", 10_000_000, []int{1_000_000}, []int64{6})
	forEachBackend(t, func(t *testing.T, b backend) {
		if b.mini != nil {
			start := epoch.Add(5123 * time.Microsecond)
			for i, at := range []time.Duration{0, 7, 99_999, 100_000, 999_999, 1_000_000, 1_000_007, 3_012_345} {
				b.mini.SetTime(start.Add(at * time.Microsecond))
				fast, raw := tailGrantOutcome(t, b.rdb, slidingWindowScript.Script, "servertime:fast", "", 1, args)
				slow, _ := tailGrantOutcome(t, b.rdb, withoutTailGrant, "servertime:slow", "", 1, args)
				require.Equal(t, slow, fast, "at +%dµs", at)
				require.Equal(t, i > 0, strings.HasPrefix(raw, "="), "at +%dµs: reply %q", at, raw)
			}
			return
		}
		ctx := context.Background()
		grants, low := 0, 0
		remaining := int64(-1)
		for begin := time.Now(); time.Since(begin) < 1200*time.Millisecond; time.Sleep(time.Millisecond) {
			now, err := b.rdb.Time(ctx).Result()
			require.NoError(t, err)
			if now.Nanosecond() < 100_000_000 {
				low++
			}
			text, err := slidingWindowScript.Run(ctx, b.rdb, []string{"servertime"}, append([]any{"", 1}, args...)...).Text()
			require.NoError(t, err)
			r, err := engine.ParseReplyText(text, scriptLog(args))
			require.NoError(t, err, "reply %q", text)
			require.True(t, r.Allowed)
			if remaining >= 0 {
				require.Equal(t, remaining-1, r.Remaining, "reply %q", text)
			}
			remaining = r.Remaining
			if strings.HasPrefix(text, "=") {
				grants++
			}
		}
		require.Positive(t, low, "calls in the first 100ms of a second")
		require.Greater(t, grants, 100, "grants in the tail's bucket")
	})
}
