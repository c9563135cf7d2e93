package redlimit

// Tests of the sliding state (scripts/sliding.lua, docs/internals.md): the
// findings of the shared-state review as regression tests, and the
// properties every configuration sharing a key keeps. The script's size is
// counted by `bash scripts/size.sh`.

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/testseed"
)

type slidingMaker func(rdb redis.Scripter, opts ...Option) (Limiter, error)

func slidingWindowMaker(limit int, window, precision time.Duration) slidingMaker {
	return func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
		return NewSlidingWindow(rdb, limit, window, precision, opts...)
	}
}

func slidingLogMaker(precision time.Duration, s ...Strategy) slidingMaker {
	return func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
		return NewSlidingLog(rdb, precision, s, opts...)
	}
}

// onePrefix returns limiters made by a and b that share keys under one
// prefix (named by name and the backend), on one fake clock.
func onePrefix(t *testing.T, be backend, name string, a, b slidingMaker) (Limiter, Limiter, *fakeClock) {
	t.Helper()
	clock := newClock()
	prefix := WithPrefix(name + ":" + be.name + ":")
	la, err := a(be.rdb, prefix, WithClock(clock.Now))
	require.NoError(t, err)
	lb, err := b(be.rdb, prefix, WithClock(clock.Now))
	require.NoError(t, err)
	return la, lb, clock
}

// A call that grants nothing never wipes another configuration's count:
// a = 5 per 1m, b = 20 per 10s (1s buckets), one prefix.
func TestSlidingFindingZeroCallKeepsOtherCounts(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		clock := newClock()
		prefix := WithPrefix("f1:" + be.name + ":")
		a, err := NewSlidingWindow(be.rdb, 5, time.Minute, time.Second, prefix, WithClock(clock.Now))
		require.NoError(t, err)
		b, err := NewSlidingWindow(be.rdb, 20, 10*time.Second, time.Second, prefix, WithClock(clock.Now))
		require.NoError(t, err)
		_, err = a.AllowN(ctx, "k", 1)
		require.NoError(t, err)
		clock.now = epoch.Add(49323 * ms)
		r, err := b.AllowN(ctx, "k", 2)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		clock.now = epoch.Add(62679 * ms)
		r, err = a.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Equal(t, 3, r.Remaining, "b's 2 grants are in a's window: %+v", r)
		_, err = b.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Greater(t, be.rdb.PTTL(ctx, a.redisKey("k")).Val(), 10*time.Second, "the key lives while a's window counts on it")
		r, err = a.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Equal(t, 3, r.Remaining, "after b's n == 0 call, b's grants still count for a: %+v", r)
	})
}

// Configurations that differ only in their limits share the count exactly
// and each applies its own (DESIGN property 8): a plan upgraded from 5 to 20
// per minute keeps the 5 used and gets 15 more, and a downgrade back to 5
// denies at once.
func TestSlidingPlanUpgradeKeepsCount(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		free, paid slidingMaker
		extra      int
	}{
		{"window", slidingWindowMaker(5, time.Minute, time.Second), slidingWindowMaker(20, time.Minute, time.Second), 15},
		{"log", slidingLogMaker(time.Second, Strategy{5, time.Minute}, Strategy{50, time.Hour}),
			slidingLogMaker(time.Second, Strategy{20, time.Minute}, Strategy{500, time.Hour}), 15},
	}
	for _, c := range cases {
		forEachBackend(t, func(t *testing.T, be backend) {
			ctx := context.Background()
			free, paid, clock := onePrefix(t, be, "upgrade:"+c.name, c.free, c.paid)
			for i := range 5 {
				r, err := free.AllowN(ctx, "tenant", 1)
				require.NoError(t, err)
				require.True(t, r.Allowed, "free grant %d: %+v", i, r)
			}
			clock.now = clock.now.Add(time.Second)
			granted := 0
			for range 25 {
				r, err := paid.AllowN(ctx, "tenant", 1)
				require.NoError(t, err)
				if r.Allowed {
					granted++
				}
			}
			require.Equal(t, c.extra, granted, "%s: the paid plan gets what is left of its own limit", c.name)
			r, err := free.AllowN(ctx, "tenant", 1)
			require.NoError(t, err)
			require.False(t, r.Allowed, "%s: back on the free plan, the 20 used deny: %+v", c.name, r)
		})
	}
}

// Only a configuration that differs from the caller in nothing but its
// limits shares a window's count under the caller's own limit (DESIGN
// property 8). One that differs in a window or precision too binds the
// caller with every one of its strategies while its last grant is in its
// window, including a strategy over the same buckets as one of the
// caller's. Otherwise the pair can grant more than either alone (found
// with REDLIMIT_SEED=157 and 181 in TestSharedKeySlidingAnyPair).
func TestSlidingSameWindowOfAnotherShapeBinds(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		first  slidingMaker
		grants []int // the first configuration's grants, at 0.5s, 1.5s, ...
		second slidingMaker
		at     time.Duration // when the second asks for 1
		bound  string
	}{
		{
			// 4 per 7s grants 4 at 0.5s, then {1 per 4s, 11 per 7s} at 4.5s
			// would be a fifth grant within 4s, where the first alone grants
			// 4 and the second 2.
			"longer", slidingLogMaker(time.Second, Strategy{4, 7 * time.Second}), []int{4},
			slidingLogMaker(time.Second, Strategy{1, 4 * time.Second}, Strategy{11, 7 * time.Second}),
			4500 * ms, "the first's 4 per 7s",
		},
		{
			// {5 per 3s, 12 per 10s} grants 4 at 0.5s and 1 at 1.5s, then
			// {2 per 1s, 11 per 3s} at 1.6s would be a sixth grant within
			// 1.1s, where the first alone grants 5 and the second 4 (2 in
			// each of the two buckets).
			"shorter", slidingLogMaker(time.Second, Strategy{5, 3 * time.Second}, Strategy{12, 10 * time.Second}), []int{4, 1},
			slidingLogMaker(time.Second, Strategy{2, time.Second}, Strategy{11, 3 * time.Second}),
			1600 * ms, "the first's 5 per 3s",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, be backend) {
				ctx := context.Background()
				first, second, clock := onePrefix(t, be, "shape:"+c.name, c.first, c.second)
				for bucket, n := range c.grants {
					clock.now = epoch.Add(time.Duration(bucket)*time.Second + 500*ms)
					r, err := first.AllowN(ctx, "k", n)
					require.NoError(t, err)
					require.True(t, r.Allowed, "the first's grant of %d in bucket %d: %+v", n, bucket, r)
				}
				clock.now = epoch.Add(c.at)
				r, err := second.AllowN(ctx, "k", 1)
				require.NoError(t, err)
				require.False(t, r.Allowed, "%s binds the second while its grants are in its window: %+v", c.bound, r)
			})
		})
	}
}

// A longer window sees what a shorter one granted, whatever was trimmed:
// X = 10 per 1s serves 9s (90 grants), then Y = 100 per 10s grants only
// what is left of 100 in its window.
func TestSlidingFindingLongerWindowSeesShorter(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		be.keepKeys() // a fake clock: its TTLs, seconds at most, would pass in real time
		ctx := context.Background()
		clock := newClock()
		prefix := WithPrefix("f2:" + be.name + ":")
		x, err := NewSlidingWindow(be.rdb, 10, time.Second, time.Second, prefix, WithClock(clock.Now))
		require.NoError(t, err)
		y, err := NewSlidingWindow(be.rdb, 100, 10*time.Second, time.Second, prefix, WithClock(clock.Now))
		require.NoError(t, err)
		granted := 0
		for s := range 9 {
			clock.now = epoch.Add(time.Duration(s)*time.Second + 100*ms)
			for range 10 {
				r, err := x.Allow(ctx, "k")
				require.NoError(t, err)
				require.True(t, r.Allowed)
				granted++
			}
		}
		clock.now = epoch.Add(9500 * ms)
		for range 100 {
			r, err := y.Allow(ctx, "k")
			require.NoError(t, err)
			if r.Allowed {
				granted++
			}
		}
		require.Equal(t, 100, granted, "grants in one 10s window, where Y alone grants 100")
	})
}

// The clock going back after an n == 0 call grants nothing extra and
// leaves no key in errors: {1 per 1s, 5 per 10s}, 1s buckets.
func TestSlidingFindingClockBackAfterZero(t *testing.T) {
	t.Parallel()
	for _, limits := range [][2]int{{1, 5}, {2, 10}} {
		t.Run(fmt.Sprint(limits), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, be backend) {
				be.keepKeys() // a fake clock: its TTLs, seconds at most, would pass in real time
				ctx := context.Background()
				clock := newClock()
				l, err := NewSlidingLog(be.rdb, time.Second, []Strategy{{limits[0], time.Second}, {limits[1], 10 * time.Second}},
					WithPrefix(fmt.Sprintf("f4:%s:%d:", be.name, limits[0])), WithClock(clock.Now))
				require.NoError(t, err)
				clock.now = epoch.Add(500 * ms)
				r, err := l.AllowN(ctx, "k", limits[0])
				require.NoError(t, err)
				require.True(t, r.Allowed)
				clock.now = epoch.Add(1500 * ms)
				_, err = l.AllowN(ctx, "k", 0)
				require.NoError(t, err)
				for at := 600 * ms; at < time.Second; at += 100 * ms {
					clock.now = epoch.Add(at)
					r, err = l.Allow(ctx, "k")
					require.NoError(t, err, "at %v: the key holds our own state", at)
					require.False(t, r.Allowed, "at %v: %d granted in this 1s window already: %+v", at, limits[0], r)
				}
			})
		})
	}
}

// A look after the clock went back changes no other configuration's
// count: Y = (3 per 100ms) grants at 0 and at 105ms (10ms buckets), the
// clock goes back to 60ms, and on one key X = (1 per 20ms) looks (n == 0).
// Y then asks for 2 on both keys and gets the same answer: granted, as the
// grant at 0 left Y's window before the clock went back. A look that
// trimmed that grant with X's window in mind would leave Y, whose window
// reaches past the trim, counting it as used on the key X looked at.
func TestSlidingClockBackLookKeepsOthersCount(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		be.keepKeys() // a fake clock: its TTLs, seconds at most, would pass in real time
		ctx := context.Background()
		clock := newClock()
		opts := []Option{WithPrefix("lookback:" + be.name + ":"), WithClock(clock.Now)}
		x, err := NewSlidingWindow(be.rdb, 1, 20*ms, 10*ms, opts...)
		require.NoError(t, err)
		y, err := NewSlidingWindow(be.rdb, 3, 100*ms, 10*ms, opts...)
		require.NoError(t, err)
		for _, key := range []string{"plain", "looked"} {
			for _, at := range []time.Duration{0, 105 * ms} {
				clock.now = epoch.Add(at)
				r, err := y.Allow(ctx, key)
				require.NoError(t, err)
				require.True(t, r.Allowed, "%s: Y's grant at %v", key, at)
			}
		}
		clock.now = epoch.Add(60 * ms)
		_, err = x.AllowN(ctx, "looked", 0)
		require.NoError(t, err)
		want, err := y.AllowN(ctx, "plain", 2)
		require.NoError(t, err)
		require.True(t, want.Allowed, "one grant in Y's window when the clock went back: %+v", want)
		got, err := y.AllowN(ctx, "looked", 2)
		require.NoError(t, err)
		require.Equal(t, withoutGrant(want), withoutGrant(got), "X's look changed what Y reads")
	})
}

// A grant in the tail's bucket by a configuration denser than any before
// counts for what a longer configuration reads of buckets trimmed away:
// A = 1 per 10ms grants 1 at 0, B = 10 per 10ms grants 6 in the same bucket,
// and A's grant at 20ms trims that bucket (B lapsed at 10ms). At 31ms (A
// lapsed too), Z = 20 per 40ms, whose window reaches it, counts all 8
// granted: the 7 trimmed ones as what the densest writer, B, could have
// granted there (a bound of 30, so the 7 themselves), where A's rate and
// burst alone would bound them by 3.
func TestSlidingTrimmedCountsDensestWriter(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		clock, opts := prefixClock(be, "densest")
		a, err := NewSlidingWindow(be.rdb, 1, 10*ms, ms, opts...)
		require.NoError(t, err)
		b, err := NewSlidingWindow(be.rdb, 10, 10*ms, ms, opts...)
		require.NoError(t, err)
		z, err := NewSlidingWindow(be.rdb, 20, 40*ms, ms, opts...)
		require.NoError(t, err)
		steps := []struct {
			l  *SlidingWindow
			at time.Duration
			n  int
		}{{a, 0, 1}, {b, 500 * us, 6}, {a, 20 * ms, 1}}
		for i, s := range steps {
			clock.now = epoch.Add(s.at)
			r, err := s.l.AllowN(ctx, "k", s.n)
			require.NoError(t, err)
			require.True(t, r.Allowed, "step %d: %+v", i, r)
		}
		clock.now = epoch.Add(31 * ms)
		r, err := z.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Equal(t, 12, r.Remaining, "Z's window holds the 8 granted: %+v", r)
	})
}

// prefixClock is a fake clock and the options of a test on a prefix of its
// own. A real server keeps the test's keys: their TTLs run on the server's
// clock, not on the test's, and windows of milliseconds would expire them.
func prefixClock(be backend, name string) (*fakeClock, []Option) {
	be.keepKeys()
	clock := newClock()
	return clock, []Option{WithPrefix(name + ":" + be.name + ":"), WithClock(clock.Now)}
}

// What a longer configuration counts as used in buckets trimmed away is
// bounded by every writer's burst, not only by the densest rate: X = 1 per
// 1ms and Y = 10 per 10ms have the same rate, but Y put 10 in two buckets
// that X's grants then trim away. Z = 18 per 18ms, whose window reaches
// them, must count the 10: in the 18 buckets from 11ms on, Y alone allows
// 20 and X or Z alone 18.
func TestSlidingTrimmedCountsWritersBurst(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		clock, opts := prefixClock(be, "burst")
		x, err := NewSlidingWindow(be.rdb, 1, ms, ms, opts...)
		require.NoError(t, err)
		y, err := NewSlidingWindow(be.rdb, 10, 10*ms, ms, opts...)
		require.NoError(t, err)
		z, err := NewSlidingWindow(be.rdb, 18, 18*ms, ms, opts...)
		require.NoError(t, err)
		steps := []struct {
			l  *SlidingWindow
			at time.Duration
			n  int
		}{{x, 0, 1}, {y, 11 * ms, 9}, {y, 12 * ms, 1}, {x, 23 * ms, 1}, {x, 24 * ms, 1}, {x, 25 * ms, 1}, {x, 26 * ms, 1}, {x, 27 * ms, 1}, {z, 28 * ms, 10}}
		total := 0
		for i, s := range steps {
			clock.now = epoch.Add(s.at)
			r, err := s.l.AllowN(ctx, "k", s.n)
			require.NoError(t, err)
			if i < len(steps)-1 {
				require.True(t, r.Allowed, "step %d", i)
			}
			if r.Allowed && s.at >= 11*ms {
				total += s.n
			}
		}
		require.LessOrEqual(t, total, 18, "grants in the 18 buckets from 11ms: Z's window holds Y's 10 and X's 5")
	})
}

// Another configuration's strategy binds with its limit even where its
// window is empty: X = {1 per 2ms, 3 per 20ms} grants at 0; at 5ms, Y = 5
// per 50ms sees Remaining 1 (X's 2ms window) and is denied 2, until X's
// entry lapses when its grant leaves its 20ms window.
func TestSlidingOtherLimitBelowN(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		clock, opts := prefixClock(be, "below")
		x, err := NewSlidingLog(be.rdb, ms, []Strategy{{1, 2 * ms}, {3, 20 * ms}}, opts...)
		require.NoError(t, err)
		y, err := NewSlidingLog(be.rdb, ms, []Strategy{{5, 50 * ms}}, opts...)
		require.NoError(t, err)
		allow := func(l *SlidingLog, at time.Duration, n int) Result {
			clock.now = epoch.Add(at)
			r, err := l.AllowN(ctx, "k", n)
			require.NoError(t, err)
			return r
		}
		require.True(t, allow(x, 0, 1).Allowed)
		require.Equal(t, 1, allow(y, 5*ms, 0).Remaining)
		r := allow(y, 5*ms, 2)
		require.False(t, r.Allowed, "Remaining was 1: %+v", r)
		require.Equal(t, 15*ms, r.RetryAfter, "X binds until its grant at 0 leaves its 20ms window")
		r = allow(y, 20*ms, 2)
		require.True(t, r.Allowed, "X's entry lapsed: %+v", r)
	})
}

// At the last µs a clock may read (2^52 - 2^44 after the epoch, in 2112),
// another configuration's entry still binds for exactly its window:
// X = 1 per 2 buckets of 1001µs grants, and in the next bucket Y = 5 per
// bucket is denied, on a bucket whose start an entry score would round if
// it were past 2^53 (b*G = 1 modulo 4). A clock 1µs later is refused.
func TestSlidingEntryAtTheLastClock(t *testing.T) {
	t.Parallel()
	const last = 1<<52 - 1<<44
	const g = 1001
	b := int64((last-g-5)/g - 8)
	for b%4 != 1 {
		b--
	}
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		clock, opts := prefixClock(be, "last")
		p := g * time.Microsecond
		x, err := NewSlidingWindow(be.rdb, 1, 2*p, p, opts...)
		require.NoError(t, err)
		y, err := NewSlidingWindow(be.rdb, 5, p, p, opts...)
		require.NoError(t, err)
		clock.now = time.UnixMicro(b*g + 5)
		r, err := x.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, r.Allowed)
		clock.now = time.UnixMicro((b+1)*g + 5)
		r, err = y.Allow(ctx, "k")
		require.NoError(t, err)
		require.False(t, r.Allowed, "X's grant is still in X's window: %+v", r)

		clock.now = time.UnixMicro(last)
		_, err = y.AllowN(ctx, "k", 0)
		require.NoError(t, err, "the last clock")
		clock.now = time.UnixMicro(last + 1)
		_, err = y.AllowN(ctx, "k", 0)
		require.ErrorIs(t, err, ErrInvalidArgument, "a clock past the last")
	})
}

// A key's count of every permit it granted wraps at 2^52 and the key stays
// exact: X = 2^38 per 1s grants 2^38 every 1s, past the wrap (2^14
// grants), never refused as foreign and never granting one more in its
// full window. Right after the wrap, Z = 2^40 per 10s, whose window
// reaches buckets X trimmed away, counts them as what X could have granted
// there (9 × 2^38 granted, 2^38 × 10 counted), not as the few the wrapped
// count would say: it is denied. In seconds: a key with a window of 1ms
// can expire on a loaded server between a grant and the harness's PEXPIRE.
func TestSlidingCountWraps(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		if math.MaxInt < 1<<40 {
			t.Skip("limits of 2^38 and 2^40 need a 64-bit int")
		}
		if be.mini != nil {
			skipShort(t, "16,386 script calls on miniredis's Lua")
		}
		clock, opts := prefixClock(be, "wrap")
		shift := 38 // not a constant: a 32-bit build compiles this test too
		L := 1 << shift
		x, err := NewSlidingWindow(be.rdb, L, time.Second, time.Second, opts...)
		require.NoError(t, err)
		z, err := NewSlidingWindow(be.rdb, 4*L, 10*time.Second, time.Second, opts...)
		require.NoError(t, err)
		for i := range 1<<14 + 2 {
			clock.now = epoch.Add(time.Duration(i) * time.Second)
			r, err := x.AllowN(ctx, "k", L)
			require.NoError(t, err, "grant %d", i)
			require.True(t, r.Allowed, "grant %d", i)
			if i%1000 == 0 || i >= 1<<14-2 {
				r, err = x.AllowN(ctx, "k", 1)
				require.NoError(t, err)
				require.False(t, r.Allowed, "one more after grant %d: %+v", i, r)
				require.Equal(t, time.Second, r.RetryAfter, "after grant %d", i)
			}
		}
		clock.now = epoch.Add((1<<14 + 2) * time.Second)
		r, err := z.Allow(ctx, "k")
		require.NoError(t, err)
		require.False(t, r.Allowed, "Z's window holds 9 × 2^38 granted by X: %+v", r)
	})
}

// Twin keys whose clock goes back, with precisions that do not divide
// each other: X = 21 per 4ms by 1ms (the key's grid), Y = 5 per 5ms by
// 5ms. An n == 0 call on b alone, at a clock further back than any call on
// a, moves b's time 3ms further ahead than a's; Y's windows still start at
// multiples of 5ms on the caller's clock, on a and b alike, so b, whose
// later grants are the same as a's, is never the stricter.
func TestSlidingTwinClockBackPrecisions(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		clock, opts := prefixClock(be, "twinprec")
		x, err := NewSlidingWindow(be.rdb, 21, 4*ms, ms, opts...)
		require.NoError(t, err)
		y, err := NewSlidingWindow(be.rdb, 5, 5*ms, 5*ms, opts...)
		require.NoError(t, err)
		at := func(usec int64) { clock.now = epoch.Add(time.Duration(usec) * us) }
		both := func(l *SlidingWindow, n int) (Result, Result) {
			ra, err := l.AllowN(ctx, "a", n)
			require.NoError(t, err)
			rb, err := l.AllowN(ctx, "b", n)
			require.NoError(t, err)
			return ra, rb
		}
		at(195457)
		both(x, 15)
		at(174285) // the clock went back 21.172ms: a call on b alone
		_, err = y.AllowN(ctx, "b", 0)
		require.NoError(t, err)
		at(177838)
		ra, rb := both(x, 2)
		require.Equal(t, withoutGrant(ra), withoutGrant(rb))
		at(185358)
		ra, rb = both(x, 4)
		require.Equal(t, ra.Allowed, rb.Allowed)
		at(177668)
		ra, _ = both(y, 4)
		at(177668 + ra.RetryAfter.Microseconds())
		ra, rb = both(y, 4)
		require.False(t, ra.Allowed && !rb.Allowed, "b, with the same grants and one n == 0 call, is the stricter: a %+v, b %+v", ra, rb)
	})
}

// A configuration binds others until its last grant leaves its window on
// the key's time of the call, however the clock moved since: Y = 1 per 2ms
// writes first (grid 2ms), X = 8 per 12ms by 3ms grants 8 at 17ms, and on
// key b alone an n == 0 call at 15ms (the clock went back) moves b's time
// 2ms ahead, which 3ms does not divide. At 25.5ms, Y's request still meets
// X's full window [15ms, 27ms) on both keys: an until fixed at X's grant
// would have let b's X lapse at 25ms and Y grant a 9th permit there.
func TestSlidingEntryBindsAfterClockBack(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		clock, opts := prefixClock(be, "lapse")
		y, err := NewSlidingWindow(be.rdb, 1, 2*ms, 2*ms, opts...)
		require.NoError(t, err)
		x, err := NewSlidingWindow(be.rdb, 8, 12*ms, 3*ms, opts...)
		require.NoError(t, err)
		allow := func(l *SlidingWindow, key string, at time.Duration, n int) Result {
			clock.now = epoch.Add(at)
			r, err := l.AllowN(ctx, key, n)
			require.NoError(t, err)
			return r
		}
		for _, k := range []string{"a", "b"} {
			require.True(t, allow(y, k, 0, 1).Allowed)
			require.True(t, allow(x, k, 17*ms, 8).Allowed)
		}
		require.True(t, allow(x, "b", 15*ms, 0).Allowed)
		for _, k := range []string{"a", "b"} {
			r := allow(y, k, 25500*us, 1)
			require.False(t, r.Allowed, "key %s: X's window [15ms, 27ms) holds 8, X's limit: %+v", k, r)
		}
	})
}

// randomSlidingConfig draws a sliding window or log with small windows:
// precisions of 1 to 4ms, limits that bind.
func randomSlidingConfig(rng *rand.Rand, window bool) (string, slidingMaker, int) {
	precision := time.Duration(1+rng.IntN(4)) * ms
	if window {
		limit := 1 + rng.IntN(6)
		window := precision * time.Duration(1+rng.IntN(12))
		return fmt.Sprintf("sw(%d per %v by %v)", limit, window, precision), slidingWindowMaker(limit, window, precision), limit
	}
	s := randomStrategies(rng, precision, 40*precision)
	return fmt.Sprintf("sl(by %v: %v)", precision, s), slidingLogMaker(precision, s...), s[0].Limit
}

// Two keys with the same grants, one of which also gets n == 0 calls,
// denials and requests above the capacity by any configuration sharing the
// prefix: every answer on the two is the same (DESIGN property 10; nothing
// but a grant writes).
func TestSlidingTwinKeys(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	traces, steps := 40, 200
	if testing.Short() {
		traces, steps = 8, 150
	}
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		be.keepKeys()
		for tr := range traces {
			rng := rand.New(rand.NewPCG(uint64(tr)+offset, 19))
			clock := newClock()
			prefix := fmt.Sprintf("twin:%d:", tr)
			var names []string
			var limiters []Limiter
			var smallest []int
			// Sliding windows and logs read each other's state as foreign.
			windows := rng.IntN(2) == 0
			for range 2 + rng.IntN(2) {
				name, make, limit := randomSlidingConfig(rng, windows)
				l, err := make(be.rdb, WithPrefix(prefix), WithClock(clock.Now))
				require.NoError(t, err)
				names, limiters, smallest = append(names, name), append(limiters, l), append(smallest, limit)
			}
			for i := range steps {
				clock.Advance(time.Duration(rng.IntN(1500)) * us)
				c := rng.IntN(len(limiters))
				n := rng.IntN(smallest[c] + 1)
				a, err := limiters[c].AllowN(ctx, "a", n)
				require.NoError(t, err)
				b, err := limiters[c].AllowN(ctx, "b", n)
				require.NoError(t, err)
				if withoutGrant(a) != withoutGrant(b) {
					logTwinKeys(t, be, prefix)
				}
				require.Equal(t, withoutGrant(a), withoutGrant(b), "trace %d step %d: %s n=%d (configurations %v)", tr, i, names[c], n, names)
				a, b, differ := twinExtraCalls(t, rng, limiters, smallest)
				if differ {
					logTwinKeys(t, be, prefix)
				}
				require.False(t, differ, "trace %d step %d: a grant on b made on a too: on a %+v, on b %+v (configurations %v)", tr, i, a, b, names)
			}
		}
	})
}

// logTwinKeys logs what the twin keys under prefix hold (members with their
// scores, and their TTLs), for a failure that shows on a real server only
// (it once did, under load): the script decides on what a key holds and
// its ARGV alone, so two keys that answer differently hold different
// states, and these say how.
func logTwinKeys(t *testing.T, be backend, prefix string) {
	t.Helper()
	ctx := context.Background()
	keys, err := be.rdb.Keys(ctx, prefix+"*").Result()
	t.Logf("keys under %q: %v (%v)", prefix, keys, err)
	for _, k := range keys {
		members, err := be.rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
		ttl, _ := be.rdb.PTTL(ctx, k).Result()
		var held []string
		for _, m := range members {
			held = append(held, fmt.Sprintf("%.0f %q", m.Score, m.Member))
		}
		t.Logf("%s: TTL %v, %v (%v)", k, ttl, held, err)
	}
}

// grantAt is one grant of a shared-key trace.
type grantAt struct {
	atUS int64
	n    int
}

// alignedBound is the most one configuration alone grants in an interval
// [from, to) of µs: on its grid of precision P, the interval touches k
// buckets, and each strategy allows L * ceil(k / S) in them.
func alignedBound(P int64, strategies []Strategy, from, to int64) int64 {
	k := (to-1)/P - from/P + 1
	most := int64(-1)
	for _, s := range strategies {
		S := s.Window.Microseconds() / P
		if b := int64(s.Limit) * ((k + S - 1) / S); most < 0 || b < most {
			most = b
		}
	}
	return most
}

// Two configurations alternating on one key: each grant leaves, in every
// window of the configuration that made it (ending with the grant's
// bucket), at most that strategy's limit, counting every configuration's
// grants. And in every window-aligned interval of either, no more than the
// looser of the two alone would grant there (DESIGN property 8): every
// call checks the other configuration's strategies too while its last
// grant is in its window, else a strict configuration's grant could land
// in a window the looser one filled (8 per 12ms filled, then 1 per 4ms
// grants one: 9 in 12ms).
func TestSlidingLooserBound(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	traces := 300
	if testing.Short() {
		traces = 30
	}
	type cfg struct {
		P          int64
		strategies []Strategy
		l          Limiter
		name       string
	}
	draw := func(rng *rand.Rand) (time.Duration, []Strategy) {
		precision := time.Duration(1+rng.IntN(4)) * ms
		if rng.IntN(2) == 0 {
			return precision, []Strategy{{1 + rng.IntN(6), precision * time.Duration(1+rng.IntN(12))}}
		}
		return precision, randomStrategies(rng, precision, 40*precision)
	}
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		be.keepKeys()
		n := traces
		if be.mini != nil {
			n = max(1, traces/3)
		}
		over := 0
		defer func() { t.Logf("%d traces: %d intervals over the looser bound", n, over) }()
		for tr := range n {
			rng := rand.New(rand.NewPCG(uint64(tr)+offset, 8))
			clock := newClock()
			var cfgs [2]cfg
			for i := range cfgs {
				precision, s := draw(rng)
				l, err := NewSlidingLog(be.rdb, precision, s, WithPrefix(fmt.Sprintf("loose:%d:", tr)), WithClock(clock.Now))
				require.NoError(t, err)
				cfgs[i] = cfg{P: precision.Microseconds(), strategies: s, l: l, name: fmt.Sprintf("by %v %v", precision, s)}
			}
			var grants []grantAt
			for i := range 300 {
				clock.Advance(time.Duration(rng.IntN(800)) * us)
				c := cfgs[i%2]
				n := 1 + rng.IntN(2)
				r, err := c.l.AllowN(ctx, "k", n)
				require.NoError(t, err)
				if !r.Allowed {
					continue
				}
				now := clock.now.UnixMicro()
				grants = append(grants, grantAt{now, n})
				for _, s := range c.strategies {
					from, sum := (now/c.P+1)*c.P-s.Window.Microseconds(), 0
					for _, g := range grants {
						if g.atUS >= from {
							sum += g.n
						}
					}
					require.LessOrEqual(t, sum, s.Limit, "trace %d: %s after a grant at %d: its window from %d", tr, c.name, now, from)
				}
			}
			if len(grants) == 0 {
				continue
			}
			for _, c := range cfgs {
				for _, s := range c.strategies {
					W := s.Window.Microseconds()
					for from := grants[0].atUS / c.P * c.P; from <= grants[len(grants)-1].atUS; from += c.P {
						to, sum := from+W, int64(0)
						for _, g := range grants {
							if g.atUS >= from && g.atUS < to {
								sum += int64(g.n)
							}
						}
						bound := max(alignedBound(cfgs[0].P, cfgs[0].strategies, from, to), alignedBound(cfgs[1].P, cfgs[1].strategies, from, to))
						if sum <= bound {
							continue
						}
						over++
						t.Errorf("trace %d: %s and %s: [%d, %d) granted %d, over %d", tr, cfgs[0].name, cfgs[1].name, from, to, sum, bound)
					}
				}
			}
		}
	})
}

// Single-configuration traces whose clock also jumps back, against the
// reference model: never an error, and the model's Result at every step.
// The test's keys outlive their TTLs, as a fake clock's do.
func TestSlidingClockBackAgainstModel(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	traces, steps := 30, 400
	if testing.Short() {
		traces, steps = 6, 300
	}
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		be.keepKeys()
		for tr := range traces {
			rng := rand.New(rand.NewPCG(uint64(tr)+offset, 4))
			precision := time.Duration(1+rng.IntN(5)) * ms
			s := randomStrategies(rng, precision, 30*precision)
			var limits, windows []int64
			for _, x := range s {
				limits, windows = append(limits, int64(x.Limit)), append(windows, x.Window.Microseconds())
			}
			m := model.NewSlidingLog(precision.Microseconds(), limits, windows)
			clock := newClock()
			l, err := NewSlidingLog(be.rdb, precision, s, WithPrefix(fmt.Sprintf("back:%d:", tr)), WithClock(clock.Now))
			require.NoError(t, err)
			for i := range steps {
				step := time.Duration(rng.IntN(int(precision/us)*3)) * us
				if rng.IntN(8) == 0 {
					step = -step * time.Duration(1+rng.IntN(4))
				}
				clock.Advance(step)
				n := rng.IntN(s[0].Limit + 2)
				got, err := l.AllowN(ctx, "k", n)
				require.NoError(t, err, "trace %d step %d", tr, i)
				want := m.Step(clock.now.UnixMicro(), int64(n))
				w := Result{Allowed: want.Allowed, Limit: int(want.Limit), Remaining: int(want.Remaining),
					RetryAfter: time.Duration(want.RetryAfterUS) * us, ResetAfter: time.Duration(want.ResetAfterUS) * us}
				if want.RetryAfterUS == model.Never {
					w.RetryAfter = Never
				}
				require.Equal(t, w, withoutGrant(got), "trace %d step %d (%v), n=%d", tr, i, clock.now.Sub(epoch), n)
			}
		}
	})
}

// With a deny cache, a sliding log of several strategies answers every
// call with the Result Redis gives for the same history, field for field
// (the deny cache holds a denial only while no count changes).
func TestSlidingDenyCacheFieldForField(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	traces, steps := 60, 400
	if testing.Short() {
		traces, steps = 10, 300
	}
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		be.keepKeys()
		local := 0
		for tr := range traces {
			rng := rand.New(rand.NewPCG(uint64(tr)+offset, 20))
			precision := time.Duration(1+rng.IntN(3)) * ms
			var s []Strategy
			for len(s) < 3 {
				s = randomStrategies(rng, precision, 90*precision)
			}
			clock := newClock()
			prefix := WithPrefix(fmt.Sprintf("dc:%d:", tr))
			plain, err := NewSlidingLog(be.rdb, precision, s, prefix, WithClock(clock.Now))
			require.NoError(t, err)
			cached, err := NewSlidingLog(be.rdb, precision, s, prefix, WithClock(clock.Now), WithDenyCache(64),
				WithObserver(func(d Decision) {
					if d.Local {
						local++
					}
				}))
			require.NoError(t, err)
			for i := range steps {
				step := time.Duration(rng.IntN(300)) * us
				if rng.IntN(50) == 0 {
					step = s[len(s)-1].Window * 3 / 2
				}
				clock.Advance(step)
				if rng.IntN(200) == 0 {
					require.NoError(t, plain.Reset(ctx, "a"))
					require.NoError(t, cached.Reset(ctx, "b"))
				}
				n := rng.IntN(s[0].Limit + 2)
				want, err := plain.AllowN(ctx, "a", n)
				require.NoError(t, err)
				got, err := cached.AllowN(ctx, "b", n)
				require.NoError(t, err)
				require.Equal(t, withoutGrant(want), withoutGrant(got), "trace %d (by %v %v) step %d n=%d", tr, precision, s, i, n)
			}
		}
		require.Positive(t, local, "the deny cache answered some calls")
	})
}

// The Redis commands of a sliding decision are bounded (DESIGN property 9),
// whatever the key holds: a grant reads the note and one bucket per
// strategy (and one more per strategy it leaves full), writes the note and
// removes the old one, and now and then sets the TTL or trims; a denial
// only reads, and a denying strategy reads its window's first buckets once. On a server of its own: INFO commandstats
// counts every client's commands.
func TestSlidingCommandsPerDecision(t *testing.T) {
	skipShort(t, "starts a redis-server")
	t.Parallel()
	rdb := newClient(t, redistest.Start(t).Addr(), 0)
	ctx := context.Background()
	clock := newClock()
	window, err := NewSlidingWindow(rdb, 100, time.Minute, time.Second, WithClock(clock.Now))
	require.NoError(t, err)
	log, err := NewSlidingLog(rdb, time.Second, []Strategy{{100, time.Minute}, {1000, time.Hour}}, WithClock(clock.Now))
	require.NoError(t, err)
	for _, c := range []struct {
		l          Limiter
		strategies int64
	}{{window, 1}, {log, 2}} {
		before := cmdCalls(t, rdb)
		const grants, denials = 100, 40
		for i := range grants { // one grant every 300ms: some buckets hold 3, some 4
			r, err := c.l.Allow(ctx, "k")
			require.NoError(t, err)
			require.True(t, r.Allowed, "grant %d", i)
			clock.Advance(300 * time.Millisecond)
		}
		for range denials {
			r, err := c.l.AllowN(ctx, "k", 2)
			require.NoError(t, err)
			require.False(t, r.Allowed)
		}
		after := cmdCalls(t, rdb)
		total := int64(0)
		for name, n := range after {
			if name != "info" && name != "evalsha" {
				total += n - before[name]
			}
		}
		most := grants*(5+2*c.strategies+2) + denials*(1+2*c.strategies)
		require.LessOrEqual(t, total, most, "%T: commands for %d grants and %d denials (%v)", c.l, grants, denials, after)
		clock.Advance(2 * time.Hour)
	}
}

// A full key's note (docs/internals.md) lists at most one entry per
// strategy, each within its window. A list the script could not have
// written (written into Redis by hand) is not read: the call decides by the
// buckets, as on the same key with its own note, and never errs.
func TestSlidingFullNoteOutOfBoundsIsNotRead(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		be.keepKeys()
		clock := newClock()
		l, err := NewSlidingLog(be.rdb, 100*ms, []Strategy{{2, time.Second}, {3, 10 * time.Second}}, WithClock(clock.Now))
		require.NoError(t, err)
		// Full in both strategies: the note lists both.
		for _, at := range []time.Duration{0, 200 * ms, 1100 * ms} {
			clock.now = epoch.Add(at)
			r, err := l.Allow(ctx, "own")
			require.NoError(t, err)
			require.True(t, r.Allowed, "grant at %v", at)
		}
		own := redisKey(l, "own")
		note := be.rdb.ZRange(ctx, own, 0, 0).Val()
		require.Len(t, note, 1)
		require.Contains(t, note[0], "|", "the last grant left the key full")
		base := note[0][:strings.Index(note[0], "|")]
		for i, list := range []string{"|3:5", "|0:5", "|1:10000001", "|1:5,2:5,1:5", "|2:99999999999999999999"} {
			key := fmt.Sprintf("hand%d", i)
			// A copy of the key with that list (miniredis has no RESTORE of
			// a sorted set).
			members := be.rdb.ZRangeWithScores(ctx, own, 0, -1).Val()
			members[0].Member = base + list
			require.NoError(t, be.rdb.ZAdd(ctx, redisKey(l, key), members...).Err())
			require.NoError(t, be.rdb.PExpire(ctx, redisKey(l, key), time.Hour).Err())
			for _, at := range []time.Duration{1150 * ms, 2100 * ms} {
				clock.now = epoch.Add(at)
				want, err := l.Allow(ctx, "own")
				require.NoError(t, err)
				require.False(t, want.Allowed)
				got, err := l.Allow(ctx, key)
				require.NoError(t, err, "%q at %v", list, at)
				require.Equal(t, withoutGrant(want), withoutGrant(got), "%q at %v", list, at)
			}
		}
	})
}
