package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

// Refunds (DESIGN "Grants and refunds") against the model: random traces
// of grants, denials, n == 0 and partial refunds, some of them retried or
// summing past their grant, some of grants whose window has closed, with
// the clock going back now and then. Every Result, and every later one,
// is the model's: exact where the window still counts the permits.
func TestFixedWindowRefundTracesMatchModel(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		b.keepKeys()
		for trace := range shortOr(4, 10) {
			seed := uint64(trace) + offset
			rng := rand.New(rand.NewPCG(seed, 35))
			limit := 2 + rng.IntN(30)
			window := time.Duration(1+rng.IntN(2000)) * time.Millisecond
			W := window.Microseconds()
			clock := newClock()
			l, err := NewFixedWindow(b.rdb, limit, window, WithClock(clock.Now))
			require.NoError(t, err)
			m := model.NewFixedWindow(int64(limit), W)
			key := fmt.Sprintf("refund%d", trace)
			type grant struct {
				g  Grant
				id int64
			}
			var grants []grant
			for i := range 300 {
				var stepUS int64
				switch p := rng.IntN(100); {
				case p < 40:
				case p < 80:
					stepUS = rng.Int64N(W/8 + 1)
				case p < 90:
					stepUS = -rng.Int64N(W/4 + 1)
				default:
					stepUS = rng.Int64N(2 * W)
				}
				clock.now = clock.now.Add(time.Duration(stepUS) * time.Microsecond)
				where := fmt.Sprintf("trace %d (seed %d), %d per %v, call %d at %v", trace, seed, limit, window, i, clock.now.Sub(epoch))
				if len(grants) > 0 && rng.IntN(3) == 0 {
					// A refund of a recent grant, or any.
					j := len(grants) - 1 - rng.IntN(min(len(grants), 4))
					if rng.IntN(4) == 0 {
						j = rng.IntN(len(grants))
					}
					g := grants[j]
					k := 1 + rng.IntN(g.g.N())
					require.NoError(t, g.g.Refund(ctx, k), where)
					m.Refund(clock.now.UnixMicro(), g.id, int64(k))
				}
				n := rng.IntN(limit/2 + 2)
				got, err := l.AllowN(ctx, key, n)
				require.NoError(t, err, where)
				want := m.Step(clock.now.UnixMicro(), int64(n))
				require.Equal(t, modelResult(want), withoutGrant(got), "%s: n=%d", where, n)
				require.Equal(t, want.GrantID != 0, got.Grant.N() != 0, "%s: a grant has a Grant", where)
				if want.GrantID != 0 {
					require.Equal(t, n, got.Grant.N(), where)
					grants = append(grants, grant{got.Grant, want.GrantID})
				}
			}
		}
	})
}

// A refund gives back into the window that counted the grant, at most
// once: the same refund twice gives nothing more, refunds of one grant
// give back the largest any asked for, and nothing once the window closed.
// It changes neither the window's end nor the key's TTL.
func TestFixedWindowRefundAtMostOnce(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newClock()
		l, err := NewFixedWindow(b.rdb, 10, time.Minute, WithClock(clock.Now))
		require.NoError(t, err)
		remaining := func() int {
			r, err := l.AllowN(ctx, "k", 0)
			require.NoError(t, err)
			return r.Remaining
		}
		first, err := l.AllowN(ctx, "k", 4)
		require.NoError(t, err)
		clock.Advance(10 * time.Second)
		second, err := l.AllowN(ctx, "k", 5)
		require.NoError(t, err)
		require.Equal(t, 1, second.Remaining)
		ttl := b.rdb.PTTL(ctx, keyPrefix(l)+"k").Val()

		for _, c := range []struct {
			g    Grant
			n    int
			want int
			what string
		}{
			{second.Grant, 2, 3, "2 of the second grant's 5"},
			{second.Grant, 2, 3, "the same refund again: nothing more"},
			{second.Grant, 1, 3, "less than already given back: nothing"},
			{second.Grant, 5, 6, "5 in all: 3 more"},
			{second.Grant, 5, 6, "all 5 again: nothing"},
			{first.Grant, 1, 7, "1 of the first grant's 4"},
		} {
			require.NoError(t, c.g.Refund(ctx, c.n), c.what)
			assert.Equal(t, c.want, remaining(), c.what)
		}
		r, err := l.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		assert.Equal(t, 50*time.Second, r.ResetAfter, "the window still ends a minute after its start")
		assert.LessOrEqual(t, b.rdb.PTTL(ctx, keyPrefix(l)+"k").Val(), ttl, "the TTL is not extended")
		assert.Positive(t, b.rdb.PTTL(ctx, keyPrefix(l)+"k").Val(), "the key keeps a TTL")

		require.ErrorIs(t, first.Grant.Refund(ctx, 5), ErrInvalidArgument, "more than the grant took")
		require.ErrorIs(t, first.Grant.Refund(ctx, 0), ErrInvalidArgument)
		require.ErrorIs(t, Grant{}.Refund(ctx, 1), ErrInvalidArgument)

		// A refund from a clock behind the key's time gives back into the
		// key's window.
		clock.Advance(-20 * time.Second)
		require.NoError(t, first.Grant.Refund(ctx, 2))
		clock.Advance(20 * time.Second)
		assert.Equal(t, 8, remaining(), "2 of the first grant in all")

		// The window closes: a new one opens, and the first window's
		// grants give nothing back into it.
		clock.Advance(50 * time.Second)
		third, err := l.AllowN(ctx, "k", 10)
		require.NoError(t, err)
		require.True(t, third.Allowed, "a new window")
		require.NoError(t, first.Grant.Refund(ctx, 4))
		assert.Equal(t, 0, remaining(), "a grant of a closed window gives nothing")
		require.NoError(t, third.Grant.Refund(ctx, 10))
		assert.Equal(t, 10, remaining(), "the open window's grant gives back")
		r, err = l.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		assert.Equal(t, time.Minute, r.ResetAfter, "a window emptied by refunds stays open until its end")
	})
}

// The records of at most 16 refunded grants a window: a 17th drops the
// oldest's, and that grant gives nothing more (stricter, never looser).
func TestFixedWindowRefundRecordsBounded(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newClock()
		l, err := NewFixedWindow(b.rdb, 100, time.Minute, WithClock(clock.Now))
		require.NoError(t, err)
		var grants []Grant
		for range 20 {
			r, err := l.AllowN(ctx, "k", 2)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			grants = append(grants, r.Grant)
		}
		for _, g := range grants[:17] {
			require.NoError(t, g.Refund(ctx, 1))
		}
		r, err := l.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Equal(t, 100-40+17, r.Remaining, "17 refunds of 1")
		for i, g := range grants[:17] {
			require.NoError(t, g.Refund(ctx, 1), "retry %d", i)
		}
		require.NoError(t, grants[0].Refund(ctx, 2))
		require.NoError(t, grants[1].Refund(ctx, 2))
		r, err = l.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		assert.Equal(t, 100-40+17+1, r.Remaining,
			"retries give nothing; the oldest grant's record is gone and it gives nothing more; the second gives its other permit")
		require.NoError(t, grants[18].Refund(ctx, 2))
		r, err = l.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		assert.Equal(t, 100-40+17+1+2, r.Remaining, "a grant after the horizon still gives back")
	})
}

// Refunds on a key two configurations share (WithPrefix), by either: the
// key is left as its twin, on which the refunded grant took that many
// fewer, for every configuration, now and later.
func TestFixedWindowSharedRefundAsTwin(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		b.keepKeys()
		for trace := range 16 {
			seed := uint64(trace) + offset
			rng := rand.New(rand.NewPCG(seed, 36))
			clock := newClock()
			prefix := fmt.Sprintf("refundtwin:%d:", trace)
			type config struct {
				limit  int
				window time.Duration
			}
			configs := []config{
				{4 + rng.IntN(8), time.Duration(1+rng.IntN(10)) * time.Second},
				{4 + rng.IntN(8), time.Duration(10+rng.IntN(60)) * time.Second},
			}
			limiterAt := func(c config, at time.Time) Limiter {
				l, err := NewFixedWindow(b.rdb, c.limit, c.window, WithPrefix(prefix), WithClock(func() time.Time { return at }))
				require.NoError(t, err)
				return l
			}
			desc := fmt.Sprintf("trace %d (seed %d), configurations %v", trace, seed, configs)
			for range rng.IntN(12) {
				clock.Advance(time.Duration(rng.Int64N(int64(8 * time.Second))).Truncate(time.Microsecond))
				c, n := configs[rng.IntN(2)], 1+rng.IntN(2)
				for _, key := range []string{"refunded", "twin"} {
					_, err := limiterAt(c, clock.now).AllowN(ctx, key, n)
					require.NoError(t, err, desc)
				}
			}
			clock.Advance(time.Duration(rng.Int64N(int64(8 * time.Second))).Truncate(time.Microsecond))
			by, n := configs[rng.IntN(2)], 2+rng.IntN(3)
			r, err := limiterAt(by, clock.now).AllowN(ctx, "refunded", n)
			require.NoError(t, err, desc)
			if !r.Allowed {
				continue
			}
			k := 1 + rng.IntN(n-1)
			twin, err := limiterAt(by, clock.now).AllowN(ctx, "twin", n-k)
			require.NoError(t, err, desc)
			require.True(t, twin.Allowed, desc)
			clock.Advance(time.Duration(rng.Int64N(int64(3 * time.Second))).Truncate(time.Microsecond))
			require.NoError(t, r.Grant.Refund(ctx, k), desc)
			for _, after := range []time.Duration{0, time.Second, 10 * time.Second, time.Minute} {
				for _, reader := range configs {
					l := limiterAt(reader, clock.now.Add(after))
					got, err := l.AllowN(ctx, "refunded", 0)
					require.NoError(t, err, desc)
					want, err := l.AllowN(ctx, "twin", 0)
					require.NoError(t, err, desc)
					require.Equal(t, want, got, "%s: +%v after %v's grant of %d gave %d back, %v reads it as the twin",
						desc, after, by, n, k, reader)
				}
			}
		}
	})
}

// A refund on a key that holds a foreign value is ErrForeignState and
// leaves it; a token of another window, or a key gone, gives nothing.
func TestFixedWindowRefundForeignAndGone(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newClock()
		l, err := NewFixedWindow(b.rdb, 3, time.Minute, WithClock(clock.Now))
		require.NoError(t, err)
		r, err := l.AllowN(ctx, "k", 2)
		require.NoError(t, err)
		require.NoError(t, l.Reset(ctx, "k"))
		require.NoError(t, r.Grant.Refund(ctx, 2), "the key is gone: nothing to give back")
		_, err = b.rdb.Get(ctx, keyPrefix(l)+"k").Result()
		require.ErrorIs(t, err, redis.Nil, "a refund writes no key")

		r, err = l.AllowN(ctx, "k", 2)
		require.NoError(t, err)
		require.NoError(t, b.rdb.Set(ctx, keyPrefix(l)+"k", "foreign", 0).Err())
		require.ErrorIs(t, r.Grant.Refund(ctx, 1), ErrForeignState)
		require.Equal(t, "foreign", b.rdb.Get(ctx, keyPrefix(l)+"k").Val())
	})
}
