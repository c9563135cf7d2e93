package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/engine"
	"github.com/redlimit/redlimit/internal/redistest"
)

// The sliding scripts' denial stamp (scripts/sliding.lua): a denial of one
// permit that leaves the state as it found it writes, in field d, what
// every request for one permit gets until the first oldest bucket leaves a
// window, and marks the meta with "!"; those requests are then answered
// from five numbers.

// stampConfig is one sliding configuration as the script sees it.
type stampConfig struct {
	name string
	args []any // ARGV after now and n
}

// stampConfigs draws a sliding window and two sliding logs from rng, small
// limits so that denials are frequent, and for each a second configuration
// that may share its key (a deploy that changed the limit).
func stampConfigs(rng *rand.Rand) [][2]stampConfig {
	precision := int64(1+rng.IntN(200)) * 1000
	limit := 1 + rng.IntN(6)
	size := int64(1 + rng.IntN(20))
	sw := func(limit int) stampConfig {
		return stampConfig{fmt.Sprintf("sliding_window(%d per %d×%dµs)", limit, size, precision), slidingArgs("W4", precision, []int{limit}, []int64{size})}
	}
	sl := func(limits []int, sizes []int64) stampConfig {
		return stampConfig{fmt.Sprintf("sliding_log(%v per %v×%dµs)", limits, sizes, precision), slidingArgs("L4", precision, limits, sizes)}
	}
	two := []int64{size, size * int64(2+rng.IntN(4))}
	three := []int64{size, two[1], two[1] * 3}
	return [][2]stampConfig{
		{sw(limit), sw(limit + 2)},
		{sl([]int{limit, limit + 3}, two), sl([]int{limit + 1, limit + 4}, two)},
		{sl([]int{limit, limit + 3, limit + 9}, three), sl([]int{limit, limit + 3}, two)},
	}
}

// The stamp changes no reply. Two keys see the same random calls, with the
// clock going forward and, now and then, back, n mostly 1, now and then a
// call of another configuration (the general path reads and drops a
// stamp) and a reset; one key keeps its stamps, the other has them removed
// after every call. Every reply, as the Go side reads it (stable too,
// which the deny cache keeps), must be the same on both.
func TestSlidingDenialStampChangesNoReply(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		if b.mini == nil {
			keepTTL(b.rdb, time.Hour)
		}
		stamped, hits := 0, 0
		for seed := uint64(1); seed <= 2; seed++ {
			rng := rand.New(rand.NewPCG(seed, 16))
			for c, pair := range stampConfigs(rng) {
				keys := []string{fmt.Sprintf("stamp:%d:%d:kept", seed, c), fmt.Sprintf("stamp:%d:%d:removed", seed, c)}
				require.NoError(t, b.rdb.Del(ctx, keys...).Err())
				now := epoch.UnixMicro() + rng.Int64N(1e9)
				scale := time.Duration(pair[0].args[1].(int64)) * time.Microsecond * 20
				for step := range 1200 {
					if rng.IntN(40) == 0 {
						now -= rng.Int64N(int64(scale/time.Microsecond) + 1)
					} else {
						now += timeStep(rng, scale).Microseconds()
					}
					if rng.IntN(200) == 0 {
						require.NoError(t, b.rdb.Del(ctx, keys...).Err())
					}
					cfg := pair[0]
					if rng.IntN(25) == 0 {
						cfg = pair[1]
					}
					n := 1
					if rng.IntN(10) < 3 {
						n = rng.IntN(4)
					}
					before := b.rdb.HGet(ctx, keys[0], "m").Val()
					argv := append([]any{now, n}, cfg.args...)
					var replies [2]string
					for i, key := range keys {
						var err error
						replies[i], err = slidingWindowScript.Run(ctx, b.rdb, []string{key}, argv...).Text()
						require.NoError(t, err, "%s step %d, key %s, n=%d now=%d meta %q pttl %v", cfg.name, step, key, n, now, b.rdb.HGet(ctx, key, "m").Val(), b.rdb.PTTL(ctx, key).Val())
					}
					var parsed [2]engine.Reply
					for i, text := range replies {
						var err error
						parsed[i], err = engine.ParseReplyText(text)
						require.NoError(t, err)
					}
					require.Equal(t, parsed[1], parsed[0], "%s, seed %d, step %d at %dµs, n=%d: the stamped key's reply %q differs from %q (meta before: %q)",
						cfg.name, seed, step, now, n, replies[0], replies[1], before)
					if strings.HasPrefix(replies[0], "~") {
						require.True(t, strings.HasPrefix(before, "!") && cfg.name == pair[0].name && n == 1, "a stamped reply to another call: %q", before)
						hits++
					}
					m := b.rdb.HGet(ctx, keys[1], "m").Val()
					if strings.HasPrefix(m, "!") {
						stamped++
						require.NoError(t, b.rdb.HSet(ctx, keys[1], "m", m[1:]).Err())
						require.NoError(t, b.rdb.HDel(ctx, keys[1], "d").Err())
					}
				}
			}
		}
		t.Logf("%s: %d stamps written, %d denials read one", b.name, stamped, hits)
		require.Greater(t, stamped, 200, "the traces stamp often")
		require.Greater(t, hits, 500, "and read stamps often")
	})
}

// A stamped denial costs Redis two HGETs and nothing else; the first
// denial writes the stamp, and a grant drops its mark. On a server of
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
					want += 2 * denials
				}
				require.Equal(t, want, n, "%s: a stamped denial runs two HGETs and nothing else", cmd)
			}
			clock.Advance(time.Second)
			r, err := l.Allow(ctx, alg.code)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			require.False(t, strings.HasPrefix(rdb.HGet(ctx, key, "m").Val(), "!"), "a grant drops the mark")
		})
	}
}

// A mark before anything but a format-4 meta is not redlimit's: every
// call is ErrForeignState and the key is left as it was. A marked meta
// whose stamp is missing or malformed is decided as if it were unmarked.
// (A well-formed stamp under a mark before the caller's own meta text is
// the README's one exception, a value in redlimit's exact format: a
// stamped denial reads no further.)
func TestSlidingDenialStampMalformed(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newClock()
		l, err := NewSlidingWindow(b.rdb, 3, time.Second, 100*time.Millisecond, WithClock(clock.Now), WithPrefix("badstamp:"))
		require.NoError(t, err)
		require.Equal(t, 3, drain(t, l, "real", 3))
		meta := strings.TrimPrefix(b.rdb.HGet(ctx, "badstamp:real", "m").Val(), "!")
		format3 := "W" + strings.TrimPrefix(meta, "W4")
		for i, bad := range []string{"!" + format3, "!!" + meta, "! " + meta, "!" + meta + " junk", "!W5" + strings.TrimPrefix(meta, "W4")} {
			key := fmt.Sprintf("bad%d", i)
			require.NoError(t, b.rdb.HSet(ctx, "badstamp:"+key, "m", bad).Err())
			require.NoError(t, b.rdb.PExpire(ctx, "badstamp:"+key, time.Hour).Err())
			for _, n := range []int{1, 0, 2, 1000} {
				r, err := l.AllowN(ctx, key, n)
				require.ErrorIs(t, err, ErrForeignState, "%q, n=%d: decided %+v", bad, n, r)
				require.Equal(t, bad, b.rdb.HGet(ctx, "badstamp:"+key, "m").Val(), "left as it was")
			}
		}
		now := clock.now.UnixMicro()
		for i, d := range []string{"", "x", "1 2 3 4", "1 2 3 4 0 5", fmt.Sprintf("%d -1 1 1 0", now), fmt.Sprintf(" %d 1 1 1 0", now), "-"} {
			marked, plain := fmt.Sprintf("marked%d", i), fmt.Sprintf("plain%d", i)
			require.NoError(t, b.rdb.HSet(ctx, "badstamp:"+marked, "m", "!"+meta).Err())
			require.NoError(t, b.rdb.HSet(ctx, "badstamp:"+plain, "m", meta).Err())
			if d != "-" {
				require.NoError(t, b.rdb.HSet(ctx, "badstamp:"+marked, "d", d).Err())
			}
			for _, key := range []string{marked, plain} {
				require.NoError(t, b.rdb.PExpire(ctx, "badstamp:"+key, time.Hour).Err())
			}
			for step := range 3 {
				got, err := l.Allow(ctx, marked)
				require.NoError(t, err, "stamp %q", d)
				want, err := l.Allow(ctx, plain)
				require.NoError(t, err)
				require.Equal(t, want, got, "stamp %q, call %d", d, step)
				require.False(t, got.Allowed)
				clock.Advance(time.Millisecond)
			}
		}
	})
}
