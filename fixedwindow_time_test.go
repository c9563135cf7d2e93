package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
)

// A key's time (DESIGN) for the fixed window, and what one configuration's
// grant does to another's under WithPrefix (property 8).

// Issue 34, finding 4: "4 per minute" grants 2 on two keys; two minutes
// later it grants 1 more on one of them. "4 per hour" must never find more
// permits on that key than on its twin, now or later in the hour: a grant
// by one configuration never re-opens what another still counts.
func TestFixedWindowGrantNeverLoosensAnother(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		b.keepKeys()
		clock := newClock()
		opts := []Option{WithPrefix("f4:"), WithClock(clock.Now)}
		hour, err := NewFixedWindow(b.rdb, 4, time.Hour, opts...)
		require.NoError(t, err)
		minute, err := NewFixedWindow(b.rdb, 4, time.Minute, opts...)
		require.NoError(t, err)
		for _, key := range []string{"k", "twin"} {
			r, err := minute.AllowN(ctx, key, 2)
			require.NoError(t, err)
			require.True(t, r.Allowed, "%s: a fresh key grants 2", key)
		}
		clock.Advance(2 * time.Minute)
		r, err := minute.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, r.Allowed, "the minute's window ended: a new one opens")
		for _, after := range []time.Duration{0, time.Second, 10 * time.Minute, 59 * time.Minute, 61 * time.Minute} {
			at := clock.now.Add(after)
			probe := &fakeClock{now: at}
			h, err := NewFixedWindow(b.rdb, 4, time.Hour, WithPrefix("f4:"), WithClock(probe.Now))
			require.NoError(t, err)
			got, err := h.AllowN(ctx, "k", 0)
			require.NoError(t, err)
			twin, err := h.AllowN(ctx, "twin", 0)
			require.NoError(t, err)
			assert.LessOrEqual(t, got.Remaining, twin.Remaining,
				"+%v after the minute's grant: 4 per hour finds %d on the key, %d on its twin", after, got.Remaining, twin.Remaining)
		}
		_ = hour
	})
}

// The same clause on random configurations: keys with the same history,
// one of which gets one more grant by any configuration; read with n == 0
// by every configuration, now and at later times, that key is never the
// looser.
func TestFixedWindowSharedGrantNeverLoosens(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		b.keepKeys()
		for trace := range 24 {
			seed := uint64(trace) + offset
			rng := rand.New(rand.NewPCG(seed, 4))
			clock := newClock()
			prefix := fmt.Sprintf("loosen:%d:", trace)
			type config struct {
				limit  int
				window time.Duration
			}
			var configs []config
			for range 2 + rng.IntN(2) {
				configs = append(configs, config{1 + rng.IntN(5), time.Duration(1+rng.IntN(60)) * time.Second})
			}
			limiterAt := func(c config, at time.Time) Limiter {
				l, err := NewFixedWindow(b.rdb, c.limit, c.window, WithPrefix(prefix), WithClock(func() time.Time { return at }))
				require.NoError(t, err)
				return l
			}
			desc := fmt.Sprintf("trace %d (seed %d), configurations %v", trace, seed, configs)
			for range rng.IntN(20) {
				clock.Advance(time.Duration(rng.Int64N(int64(20 * time.Second))).Truncate(time.Microsecond))
				c, n := configs[rng.IntN(len(configs))], rng.IntN(3)
				for _, key := range []string{"extra", "twin"} {
					_, err := limiterAt(c, clock.now).AllowN(ctx, key, n)
					require.NoError(t, err, desc)
				}
			}
			clock.Advance(time.Duration(rng.Int64N(int64(20 * time.Second))).Truncate(time.Microsecond))
			c := configs[rng.IntN(len(configs))]
			r, err := limiterAt(c, clock.now).AllowN(ctx, "extra", 1)
			require.NoError(t, err, desc)
			if !r.Allowed {
				continue
			}
			for _, after := range []time.Duration{0, time.Second, 30 * time.Second, time.Minute, 90 * time.Second} {
				for _, reader := range configs {
					l := limiterAt(reader, clock.now.Add(after))
					got, err := l.AllowN(ctx, "extra", 0)
					require.NoError(t, err, desc)
					twin, err := l.AllowN(ctx, "twin", 0)
					require.NoError(t, err, desc)
					require.LessOrEqual(t, got.Remaining, twin.Remaining,
						"%s: +%v after a grant by %v on one key only, %v finds more permits there than on its twin",
						desc, after, c, reader)
				}
			}
		}
	})
}

// A look (n == 0) and a denial from a clock that went back decide at the
// key's time and write nothing: the key answers as its twin does ever
// after (DESIGN property 10). 2 per 10s: 1 granted at 100s on both keys; on
// one, calls at 95s; then 1 granted at 106s on both; at 111s both deny 2.
func TestFixedWindowClockBackWritesNothing(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		b.keepKeys()
		clock := newClock()
		l, err := NewFixedWindow(b.rdb, 2, 10*time.Second, WithClock(clock.Now))
		require.NoError(t, err)
		both := func(n int) [2]Result {
			var rs [2]Result
			for i, key := range []string{"k", "twin"} {
				r, err := l.AllowN(ctx, key, n)
				require.NoError(t, err)
				rs[i] = r
			}
			return rs
		}
		clock.Advance(100 * time.Second)
		require.True(t, both(1)[0].Allowed)
		stored := b.rdb.Get(ctx, keyPrefix(l)+"k").Val()

		clock.Advance(-5 * time.Second)
		r, err := l.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		assert.Equal(t, Result{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: 10 * time.Second}, r,
			"n == 0 at 95s decides at the key's time, 100s")
		r, err = l.AllowN(ctx, "k", 2)
		require.NoError(t, err)
		assert.Equal(t, Result{Limit: 2, Remaining: 1, RetryAfter: 10 * time.Second, ResetAfter: 10 * time.Second}, r,
			"a denial at 95s decides at 100s")
		assert.Equal(t, stored, b.rdb.Get(ctx, keyPrefix(l)+"k").Val(), "nothing written")

		clock.Advance(11 * time.Second) // 106s
		rs := both(1)
		assert.Equal(t, withoutGrant(rs[1]), withoutGrant(rs[0]), "at 106s")
		clock.Advance(5 * time.Second) // 111s
		rs = both(2)
		assert.Equal(t, withoutGrant(rs[1]), withoutGrant(rs[0]), "at 111s the key that saw the clock go back answers as its twin")
		assert.True(t, rs[0].Allowed, "at 111s the window of 100s has closed: %+v", rs[0])
	})
}

// A clock a little behind the key's time grants into the key's window,
// never a new one: one caller 1ms behind another gets nothing extra.
func TestFixedWindowClockBehindJoinsTheWindow(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		b.keepKeys()
		clock := newClock()
		l, err := NewFixedWindow(b.rdb, 3, time.Second, WithClock(clock.Now))
		require.NoError(t, err)
		r, err := l.AllowN(ctx, "k", 3)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		for _, back := range []time.Duration{time.Millisecond, 999 * time.Millisecond, time.Second} {
			behind := &fakeClock{now: clock.now.Add(-back)}
			lb, err := NewFixedWindow(b.rdb, 3, time.Second, WithClock(behind.Now))
			require.NoError(t, err)
			r, err := lb.Allow(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, Result{Limit: 3, RetryAfter: time.Second, ResetAfter: time.Second}, r,
				"%v behind: decided in the key's window, at its start", back)
		}
	})
}

// A key's time ahead of the caller by more than its window is a clock gone
// wrong: the caller decides on its own clock, counting what the key holds
// as used, and a grant moves the window to the caller's timeline.
func TestFixedWindowClockGoneWrong(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		b.keepKeys()
		clock := newClock()
		l, err := NewFixedWindow(b.rdb, 3, 10*time.Second, WithClock(clock.Now))
		require.NoError(t, err)
		r, err := l.AllowN(ctx, "k", 2)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		clock.Advance(-time.Hour)
		r, err = l.AllowN(ctx, "k", 2)
		require.NoError(t, err)
		assert.Equal(t, Result{Limit: 3, Remaining: 1, RetryAfter: 10 * time.Second, ResetAfter: 10 * time.Second}, r,
			"an hour behind: the 2 the key holds count as used")
		r, err = l.Allow(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, Result{Allowed: true, Limit: 3, ResetAfter: 10 * time.Second}, withoutGrant(r), "the third permit fits")
		clock.Advance(9 * time.Second)
		r, err = l.Allow(ctx, "k")
		require.NoError(t, err)
		assert.False(t, r.Allowed, "the window moved to the caller's clock: full for its 10s")
		assert.Equal(t, time.Second, r.RetryAfter)
		clock.Advance(time.Second)
		r, err = l.AllowN(ctx, "k", 3)
		require.NoError(t, err)
		assert.True(t, r.Allowed, "10s on the caller's clock: a new window")
	})
}

// Clock traces against the model, which keeps the key's time the same way:
// steps forward, back a little, back more than a window, with n of 0 to
// the limit and above.
func TestFixedWindowClockTracesMatchModel(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		b.keepKeys()
		for trace := range shortOr(3, 8) {
			seed := uint64(trace) + offset
			rng := rand.New(rand.NewPCG(seed, 34))
			limit := 1 + rng.IntN(6)
			window := time.Duration(1+rng.IntN(2000)) * time.Millisecond
			W := window.Microseconds()
			clock := newClock()
			l, err := NewFixedWindow(b.rdb, limit, window, WithClock(clock.Now))
			require.NoError(t, err)
			m := model.NewFixedWindow(int64(limit), W)
			key := fmt.Sprintf("trace%d", trace)
			for i := range 200 {
				var stepUS int64
				switch p := rng.IntN(100); {
				case p < 20:
				case p < 60:
					stepUS = rng.Int64N(W/4 + 1)
				case p < 75:
					stepUS = -rng.Int64N(W/4 + 1) // a little behind
				case p < 85:
					stepUS = -rng.Int64N(2*W + 1)
				case p < 90:
					stepUS = -W - 1 - rng.Int64N(10*W)
				default:
					stepUS = rng.Int64N(3 * W)
				}
				clock.now = clock.now.Add(time.Duration(stepUS) * time.Microsecond)
				n := rng.IntN(limit + 1)
				if rng.IntN(20) == 0 {
					n = limit + 1
				}
				got, err := l.AllowN(ctx, key, n)
				require.NoError(t, err)
				want := m.Step(clock.now.UnixMicro(), int64(n))
				require.Equal(t, modelResult(want), withoutGrant(got),
					"trace %d (seed %d), %d per %v, call %d at %v: n=%d", trace, seed, limit, window, i, clock.now.Sub(epoch), n)
			}
		}
	})
}

// modelResult is the Result a limiter reports for a model's r, its Grant
// aside.
func modelResult(r model.Result) Result {
	want := Result{
		Allowed:    r.Allowed,
		Limit:      int(r.Limit),
		Remaining:  int(r.Remaining),
		RetryAfter: time.Duration(r.RetryAfterUS) * time.Microsecond,
		ResetAfter: time.Duration(r.ResetAfterUS) * time.Microsecond,
	}
	if r.RetryAfterUS == model.Never {
		want.RetryAfter = Never
	}
	return want
}
