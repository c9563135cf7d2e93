package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/engine"
	"github.com/redlimit/redlimit/internal/redistest"
)

// The sliding scripts' denial stamp (scripts/sliding.lua): a denial of one
// permit that leaves the state as it found it writes, in field m, what
// every request for one permit gets until the first oldest bucket leaves a
// window, and moves the meta to field d; those requests are then answered
// from two numbers.

// stampConfig is one sliding configuration as the script sees it.
type stampConfig struct {
	name string
	args []any // ARGV after now and n
}

// scriptLog is the engine.Log of a sliding script's ARGV after now and n:
// own, precision, then limit and size per strategy, and maybe an owner.
func scriptLog(args []any) *engine.Log {
	l := &engine.Log{Precision: args[1].(int64)}
	for i := 2; i+1 < len(args); i += 2 {
		l.Limits = append(l.Limits, int64(args[i].(int)))
		l.Sizes = append(l.Sizes, args[i+1].(int64))
	}
	return l
}

// stampConfigs draws a sliding window and three sliding logs from rng,
// limits up to most (small, so that denials are frequent), and for each but one a second
// configuration that may share its key through WithPrefix (a deploy that
// changed the limit); the one alone is on a default key.
func stampConfigs(rng *rand.Rand, most int) [][2]stampConfig {
	precision := int64(1+rng.IntN(200)) * 1000
	limit := 1 + rng.IntN(most)
	size := int64(1 + rng.IntN(20))
	// The ARGV of a limiter with WithPrefix: its stamps name it.
	shared := func(args []any) []any { return append(args, stampOwner(args[0].(string))) }
	sw := func(limit int) stampConfig {
		return stampConfig{fmt.Sprintf("sliding_window(%d per %d×%dµs)", limit, size, precision), shared(slidingArgs("W4", precision, []int{limit}, []int64{size}))}
	}
	sl := func(limits []int, sizes []int64) stampConfig {
		return stampConfig{fmt.Sprintf("sliding_log(%v per %v×%dµs)", limits, sizes, precision), shared(slidingArgs("L4", precision, limits, sizes))}
	}
	two := []int64{size, size * int64(2+rng.IntN(4))}
	three := []int64{size, two[1], two[1] * 3}
	// A default key: one configuration alone, its stamps name none.
	alone := stampConfig{fmt.Sprintf("sliding_log(%v per %v×%dµs), default key", []int{limit, limit + 2}, two, precision), slidingArgs("L4", precision, []int{limit, limit + 2}, two)}
	return [][2]stampConfig{
		{sw(limit), sw(limit + 2)},
		{alone, alone},
		{sl([]int{limit, limit + 3}, two), sl([]int{limit + 1, limit + 4}, two)},
		{sl([]int{limit, limit + 3, limit + 9}, three), sl([]int{limit, limit + 3}, two)},
	}
}

// pairCall is one call of a pairTraces trace, which both keys of a pair
// are to see.
type pairCall struct {
	keys [2]string
	cfg  stampConfig // the pair's first configuration, or now and then its second
	own  bool        // cfg is the pair's first
	now  int64
	n    int
	at   string // where in the traces, for messages
}

// pairTraces drives each pair of stampConfigs(rng, most), on two seeds of
// stream, through steps random calls on a pair of keys named after prefix:
// the clock steps forward (timeStep, at scale buckets), often to the last
// microsecond of a bucket or the first of the next, and now and then back;
// n is mostly 1; now and then the pair's second configuration calls (the
// general path reads its state), and now and then both keys are deleted.
// call makes the call on both keys and compares them.
func pairTraces(t *testing.T, b backend, prefix string, stream uint64, most, steps int, scale int64, call func(c pairCall)) {
	t.Helper()
	ctx := context.Background()
	if b.mini == nil {
		keepTTL(b.rdb, time.Hour)
	}
	for seed := uint64(1); seed <= 2; seed++ {
		rng := rand.New(rand.NewPCG(seed, stream))
		for c, pair := range stampConfigs(rng, most) {
			keys := [2]string{fmt.Sprintf("%s:%d:%d:0", prefix, seed, c), fmt.Sprintf("%s:%d:%d:1", prefix, seed, c)}
			require.NoError(t, b.rdb.Del(ctx, keys[:]...).Err())
			precision := pair[0].args[1].(int64)
			now := epoch.UnixMicro() + rng.Int64N(1e9)
			for step := range steps {
				switch p := rng.IntN(100); {
				case p < 2:
					now -= rng.Int64N(precision*scale + 1)
				case p < 12:
					now += precision - now%precision - 1 + rng.Int64N(2)
				default:
					now += timeStep(rng, time.Duration(precision*scale)*time.Microsecond).Microseconds()
				}
				if rng.IntN(250) == 0 {
					require.NoError(t, b.rdb.Del(ctx, keys[:]...).Err())
				}
				cfg, own := pair[0], true
				if rng.IntN(25) == 0 {
					cfg, own = pair[1], pair[1].name == pair[0].name
				}
				n := 1
				if rng.IntN(10) < 3 {
					n = rng.IntN(4)
				}
				call(pairCall{keys: keys, cfg: cfg, own: own, now: now, n: n,
					at: fmt.Sprintf("%s, seed %d, step %d at %dµs, n=%d", cfg.name, seed, step, now, n)})
			}
		}
	}
}

// The stamp changes no reply. Two keys see the same random calls
// (pairTraces); one keeps its stamps, the other has them removed after
// every call. Every reply, as the Go side reads it (stable too, which the
// deny cache keeps), must be the same on both.
func TestSlidingDenialStampChangesNoReply(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		stamped, hits := 0, 0
		pairTraces(t, b, "stamp", 16, 6, 1200, 20, func(c pairCall) {
			before := b.rdb.HGet(ctx, c.keys[0], "m").Val()
			argv := append([]any{c.now, c.n}, c.cfg.args...)
			var replies [2]string
			var parsed [2]engine.Reply
			for i, key := range c.keys {
				var err error
				replies[i], err = slidingWindowScript.Run(ctx, b.rdb, []string{key}, argv...).Text()
				require.NoError(t, err, "%s, key %s, meta %q", c.at, key, b.rdb.HGet(ctx, key, "m").Val())
				parsed[i], err = engine.ParseReplyText(replies[i], scriptLog(c.cfg.args))
				require.NoError(t, err)
			}
			require.Equal(t, parsed[1], parsed[0], "%s: the stamped key's reply %q differs from %q (meta before: %q)", c.at, replies[0], replies[1], before)
			if strings.HasPrefix(replies[0], "~") {
				require.True(t, strings.HasPrefix(before, "!") && c.own && c.n == 1, "a stamped reply to another call: %q", before)
				hits++
			}
			if unstamp(t, b.rdb, c.keys[1]) {
				stamped++
			}
		})
		t.Logf("%s: %d stamps written, %d denials read one", b.name, stamped, hits)
		require.Greater(t, stamped, 200, "the traces stamp often")
		require.Greater(t, hits, 500, "and read stamps often")
	})
}

// unstamp moves key's meta back to field m when a stamp holds it, as if
// the stamp had never been written, and reports whether one did.
func unstamp(t *testing.T, rdb *redis.Client, key string) bool {
	t.Helper()
	ctx := context.Background()
	if !strings.HasPrefix(rdb.HGet(ctx, key, "m").Val(), "!") {
		return false
	}
	meta, err := rdb.HGet(ctx, key, "d").Result()
	require.NoError(t, err, "a stamp moves the meta to d")
	require.NoError(t, rdb.HSet(ctx, key, "m", meta).Err())
	require.NoError(t, rdb.HDel(ctx, key, "d").Err())
	return true
}

// A stamped denial costs Redis one HGET and nothing else; the first denial
// writes the stamp, and a grant writes the meta back in its place. On a server of
// its own: INFO commandstats counts every client's commands.
func TestSlidingDenialStampCost(t *testing.T) {
	t.Parallel()
	rdb := newClient(t, redistest.Start(t).Addr(), 0)
	ctx := context.Background()
	for _, alg := range algorithms {
		if alg.code != "sw" && alg.code != "sl" {
			continue
		}
		t.Run(alg.name, func(t *testing.T) {
			clock := newClock()
			l, err := alg.new(rdb, 3, time.Second, WithClock(clock.Now), WithPrefix("stampcost:"))
			require.NoError(t, err)
			key := "stampcost:" + alg.code
			require.Equal(t, 3, drain(t, l, alg.code, 3))
			calls := func() map[string]int64 {
				c := cmdCalls(t, rdb)
				delete(c, "evalsha")
				delete(c, "info")
				return c
			}
			// drain's last call, the first denial, stamped the meta.
			require.True(t, strings.HasPrefix(rdb.HGet(ctx, key, "m").Val(), "!"), "the first denial stamps the meta")
			first, err := l.Allow(ctx, alg.code)
			require.NoError(t, err)
			require.False(t, first.Allowed)
			mid := calls()
			const denials = 50
			for i := range denials {
				clock.Advance(time.Millisecond)
				r, err := l.Allow(ctx, alg.code)
				require.NoError(t, err)
				require.False(t, r.Allowed)
				require.Equal(t, first.RetryAfter-time.Duration(i+1)*time.Millisecond, r.RetryAfter, "denial %d", i)
			}
			after := calls()
			for cmd, n := range after {
				want := mid[cmd]
				if cmd == "hget" {
					want += denials
				}
				require.Equal(t, want, n, "%s: a stamped denial runs one HGET and nothing else", cmd)
			}
			clock.Advance(time.Second)
			r, err := l.Allow(ctx, alg.code)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			require.False(t, strings.HasPrefix(rdb.HGet(ctx, key, "m").Val(), "!"), "a grant writes the meta over the stamp")
		})
	}
}

// A hash whose field m starts like a stamp but is not one, or is one that
// is not in force with no meta in d, is not redlimit's: every call is ErrForeignState and the
// key is left as it was. A stamp that has run out, is not yet in force, or
// was written by another configuration is passed over: the call decides
// on the meta in d as if there were no stamp. (A well-formed stamp in
// force, of the caller's configuration, is the README's one exception, a
// value in redlimit's exact format: a stamped denial reads no further.)
func TestSlidingDenialStampMalformed(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newClock()
		l, err := NewSlidingWindow(b.rdb, 3, time.Second, 100*time.Millisecond, WithClock(clock.Now), WithPrefix("badstamp:"))
		require.NoError(t, err)
		owner := stampOwner(slidingArgs("W4", 100_000, []int{3}, []int64{10})[0].(string))
		require.Equal(t, 3, drain(t, l, "real", 3))
		unstamp(t, b.rdb, "badstamp:real")
		meta := b.rdb.HGet(ctx, "badstamp:real", "m").Val()
		require.True(t, strings.HasPrefix(meta, "W4 "), meta)
		now := clock.now.UnixMicro()
		stamp := func(from int64, owner string) string {
			return fmt.Sprintf("!%d 1000 1000 1000 0 %s", from, owner)
		}
		for i, bad := range []string{
			"!" + "W" + strings.TrimPrefix(meta, "W4"), // "!" before a format-3 meta
			"!!" + meta, "! " + meta, "!" + meta, "!" + meta + " junk",
			stamp(now-1000, owner), // run out, and no meta in d
			fmt.Sprintf("!%d 1000 x 1000 0 %s", now, owner),
			fmt.Sprintf("!%d 1000 1000 1000 0 %s junk", now, owner),
		} {
			key := fmt.Sprintf("bad%d", i)
			require.NoError(t, b.rdb.HSet(ctx, "badstamp:"+key, "m", bad).Err())
			require.NoError(t, b.rdb.PExpire(ctx, "badstamp:"+key, time.Hour).Err())
			for _, n := range []int{1, 0, 2, 1000} {
				r, err := l.AllowN(ctx, key, n)
				require.ErrorIs(t, err, ErrForeignState, "%q, n=%d: decided %+v", bad, n, r)
				require.Equal(t, bad, b.rdb.HGet(ctx, "badstamp:"+key, "m").Val(), "left as it was")
			}
		}
		for i, m := range []string{
			stamp(now-1000, owner),    // run out
			stamp(now+1, owner),       // not yet in force
			stamp(now, "someoneelse"), // another configuration's
			stamp(now, ""),            // a default key's
		} {
			stamped, plain := fmt.Sprintf("stamped%d", i), fmt.Sprintf("plain%d", i)
			require.NoError(t, b.rdb.HSet(ctx, "badstamp:"+stamped, "m", strings.TrimSpace(m), "d", meta).Err())
			require.NoError(t, b.rdb.HSet(ctx, "badstamp:"+plain, "m", meta).Err())
			for _, key := range []string{stamped, plain} {
				require.NoError(t, b.rdb.PExpire(ctx, "badstamp:"+key, time.Hour).Err())
			}
			got, err := l.Allow(ctx, stamped)
			require.NoError(t, err, "stamp %q", m)
			want, err := l.Allow(ctx, plain)
			require.NoError(t, err)
			require.Equal(t, want, got, "stamp %q", m)
			require.False(t, got.Allowed)
		}
	})
}

// On the server's clock, a stamped denial replies now as TIME's two
// strings joined, its microseconds padded to six digits. miniredis's clock
// is set to microseconds of every width, and must give the same Results as
// a key without a stamp at the same instant; the real server's runs for
// over a second, so that its microseconds pass below 100,000, and every
// reply must parse and count down.
func TestSlidingDenialStampServerTime(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		l, err := NewSlidingWindow(b.rdb, 3, 10*time.Second, time.Second, WithPrefix("stamptime:"))
		require.NoError(t, err)
		if b.mini != nil {
			start := epoch.Add(5123 * time.Microsecond)
			b.mini.SetTime(start)
			require.Equal(t, 3, drain(t, l, "kept", 3))
			require.Equal(t, 3, drain(t, l, "removed", 3))
			for _, at := range []time.Duration{7, 99_999, 100_000, 999_999, 1_000_000, 1_000_007, 3_012_345} {
				b.mini.SetTime(start.Add(at * time.Microsecond))
				require.True(t, strings.HasPrefix(b.rdb.HGet(ctx, "stamptime:kept", "m").Val(), "!"), "kept has its stamp")
				unstamp(t, b.rdb, "stamptime:removed")
				kept, err := l.Allow(ctx, "kept")
				require.NoError(t, err)
				removed, err := l.Allow(ctx, "removed")
				require.NoError(t, err)
				require.Equal(t, removed, kept, "at +%dµs", at)
				require.False(t, kept.Allowed)
			}
			return
		}
		require.Equal(t, 3, drain(t, l, "real", 3))
		last, low := 10*time.Second, 0
		for begin := time.Now(); time.Since(begin) < 1200*time.Millisecond; time.Sleep(time.Millisecond) {
			now, err := b.rdb.Time(ctx).Result()
			require.NoError(t, err)
			if now.Nanosecond() < 100_000_000 {
				low++
			}
			r, err := l.Allow(ctx, "real")
			require.NoError(t, err)
			require.False(t, r.Allowed)
			require.Positive(t, r.RetryAfter)
			require.LessOrEqual(t, r.RetryAfter, last, "a denial's wait counts down")
			last = r.RetryAfter
		}
		require.Positive(t, low, "calls in the first 100ms of a second")
		require.True(t, strings.HasPrefix(b.rdb.HGet(ctx, "stamptime:real", "m").Val(), "!"), "the denials read a stamp")
	})
}
