//go:build !386 && !arm && !mips && !mipsle

// Limits up to 2^40 need a 64-bit int: on 32-bit platforms int cannot hold
// them, and these tests of the bounds do not build there.

package redlimit

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// validRate and validWindow are arguments that pass validation, for cases
// where another argument is the bad one.
var (
	validRate   = PerSecond(10)
	validWindow = time.Second
)

// maxValidMicros is the longest window, precision or rate period: 2^44µs.
const maxValidMicros = (1 << 44) * time.Microsecond

func TestValidConfigRejected(t *testing.T) {
	t.Parallel()
	// No client is needed to reject a configuration: a nil one would be
	// reported after the bad argument, and a real one must not be touched.
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	cmds := &commandRecorder{}
	rdb.AddHook(cmds)

	type newFunc func() error
	fw := func(limit int, window time.Duration, opts ...Option) newFunc {
		return func() error { _, err := NewFixedWindow(rdb, limit, window, opts...); return err }
	}
	sw := func(limit int, window, precision time.Duration) newFunc {
		return func() error { _, err := NewSlidingWindow(rdb, limit, window, precision); return err }
	}
	sl := func(precision time.Duration, strategies ...Strategy) newFunc {
		return func() error { _, err := NewSlidingLog(rdb, precision, strategies); return err }
	}
	lb := func(capacity int, rate Rate) newFunc {
		return func() error { _, err := NewLeakyBucket(rdb, capacity, rate); return err }
	}
	tb := func(capacity int, rate Rate) newFunc {
		return func() error { _, err := NewTokenBucket(rdb, capacity, rate); return err }
	}
	const tooMany = 1<<40 + 1
	tooLong := maxValidMicros + time.Microsecond
	cases := []struct {
		name string
		new  newFunc
		want []string // the message must name the field and the value
	}{
		{"fixed_window/limit 0", fw(0, validWindow), []string{"limit 0"}},
		{"fixed_window/limit -1", fw(-1, validWindow), []string{"limit -1"}},
		{"fixed_window/limit 2^40+1", fw(tooMany, validWindow), []string{"limit 1099511627777"}},
		{"fixed_window/window 0", fw(10, 0), []string{"window 0s"}},
		{"fixed_window/window -1s", fw(10, -time.Second), []string{"window -1s"}},
		{"fixed_window/window 999us", fw(10, 999*time.Microsecond), []string{"window 999µs"}},
		{"fixed_window/window 1ns", fw(10, time.Nanosecond), []string{"window 1ns"}},
		{"fixed_window/window 1ms+1ns", fw(10, time.Millisecond+time.Nanosecond), []string{"window 1.000001ms"}},
		{"fixed_window/window 1s+500ns", fw(10, time.Second+500*time.Nanosecond), []string{"window 1.0000005s"}},
		{"fixed_window/window 2^44us+1us", fw(10, tooLong), []string{"window " + tooLong.String()}},

		{"sliding_window/limit 0", sw(0, validWindow, 100*time.Millisecond), []string{"limit 0"}},
		{"sliding_window/limit -1", sw(-1, validWindow, 100*time.Millisecond), []string{"limit -1"}},
		{"sliding_window/limit 2^40+1", sw(tooMany, validWindow, 100*time.Millisecond), []string{"limit 1099511627777"}},
		{"sliding_window/window 0", sw(10, 0, time.Millisecond), []string{"window 0s"}},
		{"sliding_window/window -1s", sw(10, -time.Second, time.Millisecond), []string{"window -1s"}},
		{"sliding_window/window 1ms+1ns", sw(10, time.Millisecond+time.Nanosecond, time.Millisecond), []string{"window 1.000001ms"}},
		{"sliding_window/window 2^44us+1ms", sw(10, maxValidMicros+time.Millisecond, time.Millisecond), []string{"window " + (maxValidMicros + time.Millisecond).String()}},
		{"sliding_window/precision 0", sw(10, validWindow, 0), []string{"precision 0s"}},
		{"sliding_window/precision -100ms", sw(10, validWindow, -100*time.Millisecond), []string{"precision -100ms"}},
		{"sliding_window/precision 500us", sw(10, validWindow, 500*time.Microsecond), []string{"precision 500µs"}},
		{"sliding_window/precision 1ms+1ns", sw(10, validWindow, time.Millisecond+time.Nanosecond), []string{"precision 1.000001ms"}},
		{"sliding_window/window not a multiple", sw(10, time.Second, 300*time.Millisecond), []string{"window 1s", "precision 300ms", "multiple"}},
		{"sliding_window/window shorter than precision", sw(10, 100*time.Millisecond, time.Second), []string{"window 100ms", "precision 1s", "multiple"}},

		{"sliding_log/no strategies", sl(100 * time.Millisecond), []string{"no strategies"}},
		{"sliding_log/empty strategies", func() error { _, err := NewSlidingLog(rdb, time.Second, []Strategy{}); return err }, []string{"no strategies"}},
		{"sliding_log/limit 0", sl(100*time.Millisecond, Strategy{0, time.Second}), []string{"limit 0"}},
		{"sliding_log/limit -1", sl(100*time.Millisecond, Strategy{5, time.Second}, Strategy{-1, time.Minute}), []string{"limit -1"}},
		{"sliding_log/limit 2^40+1", sl(100*time.Millisecond, Strategy{tooMany, time.Second}), []string{"limit 1099511627777"}},
		{"sliding_log/window 0", sl(time.Millisecond, Strategy{5, 0}), []string{"window 0s"}},
		{"sliding_log/window -1s", sl(time.Millisecond, Strategy{5, -time.Second}), []string{"window -1s"}},
		{"sliding_log/window 1ms+1ns", sl(time.Millisecond, Strategy{5, time.Millisecond + time.Nanosecond}), []string{"window 1.000001ms"}},
		{"sliding_log/precision 0", sl(0, Strategy{5, time.Second}), []string{"precision 0s"}},
		{"sliding_log/precision -1ms", sl(-time.Millisecond, Strategy{5, time.Second}), []string{"precision -1ms"}},
		{"sliding_log/precision 999us", sl(999*time.Microsecond, Strategy{5, time.Second}), []string{"precision 999µs"}},
		{"sliding_log/precision 1ms+1ns", sl(time.Millisecond+time.Nanosecond, Strategy{5, time.Second}), []string{"precision 1.000001ms"}},
		{"sliding_log/window not a multiple", sl(time.Second, Strategy{5, time.Second}, Strategy{50, 1500 * time.Millisecond}), []string{"window 1.5s", "precision 1s", "multiple"}},
		{"sliding_log/equal windows", sl(time.Second, Strategy{5, time.Minute}, Strategy{10, time.Minute}), []string{"window 1m0s"}},
		{"sliding_log/equal windows and limits", sl(time.Second, Strategy{5, time.Minute}, Strategy{5, time.Minute}), []string{"window 1m0s"}},
		{"sliding_log/longer window smaller limit", sl(time.Second, Strategy{10, time.Second}, Strategy{5, time.Minute}), []string{"5 per 1m0s", "10 per 1s"}},
		{"sliding_log/longer window equal limit", sl(time.Second, Strategy{10, time.Minute}, Strategy{10, time.Second}), []string{"10 per 1m0s", "10 per 1s"}},
	}
	for _, b := range []struct {
		name  string
		field string // the rate's name in messages
		new   func(capacity int, rate Rate) newFunc
	}{{"leaky_bucket", "leak", lb}, {"token_bucket", "refill", tb}} {
		cases = append(cases, []struct {
			name string
			new  newFunc
			want []string
		}{
			{b.name + "/capacity 0", b.new(0, validRate), []string{"capacity 0"}},
			{b.name + "/capacity -1", b.new(-1, validRate), []string{"capacity -1"}},
			{b.name + "/capacity 2^40+1", b.new(tooMany, validRate), []string{"capacity 1099511627777"}},
			{b.name + "/count 0", b.new(10, Rate{Count: 0, Per: time.Second}), []string{b.field + " count 0"}},
			{b.name + "/count -1", b.new(10, Rate{Count: -1, Per: time.Second}), []string{b.field + " count -1"}},
			{b.name + "/zero Rate", b.new(10, Rate{}), []string{b.field + " count 0"}},
			{b.name + "/period 0", b.new(10, Rate{Count: 1}), []string{b.field + " period 0s"}},
			{b.name + "/period -1s", b.new(10, Rate{Count: 1, Per: -time.Second}), []string{b.field + " period -1s"}},
			{b.name + "/period 999us", b.new(10, Rate{Count: 1, Per: 999 * time.Microsecond}), []string{b.field + " period 999µs"}},
			{b.name + "/period 1ms+1ns", b.new(10, Rate{Count: 1, Per: time.Millisecond + time.Nanosecond}), []string{b.field + " period 1.000001ms"}},
			{b.name + "/period 2^44us+1us", b.new(10, Rate{Count: 1, Per: tooLong}), []string{b.field + " period " + tooLong.String()}},
			// 2^40 × 10^6 ticks of the reduced rate 1/10^6µs: far above 2^52.
			{b.name + "/capacity 2^40 at 1/s", b.new(1<<40, PerSecond(1)), []string{"capacity 1099511627776", "1 per 1s"}},
			// 4097 × 2^40 is just above 2^52; 4096 × 2^40 is accepted below.
			{b.name + "/capacity x period 2^52+2^40", b.new(4097, Rate{Count: 1, Per: 1 << 40 * time.Microsecond}), []string{"capacity 4097"}},
		}...)
		if strconv.IntSize == 64 { // a 32-bit int cannot say more than 2^52
			// A reduced count above 2^52 ticks a µs; the largest int.
			twoTo52, largest := int64(1<<52), int64(math.MaxInt64)
			cases = append(cases, []struct {
				name string
				new  newFunc
				want []string
			}{
				{b.name + "/count 2^52+1 per 1s", b.new(10, Rate{Count: int(twoTo52 + 1), Per: time.Second}), []string{b.field + " 4503599627370497 per 1s"}},
				{b.name + "/count MaxInt64 per 1s", b.new(3, Rate{Count: int(largest), Per: time.Second}), []string{b.field + " 9223372036854775807 per 1s"}},
			}...)
		}
	}
	type optionCase struct {
		name string
		opts []Option
		want []string
	}
	for _, o := range []optionCase{
		{"WithClock(nil)", []Option{WithClock(nil)}, []string{"WithClock(nil)"}},
		{"WithDenyCache(0)", []Option{WithDenyCache(0)}, []string{"deny cache size 0"}},
		{"WithDenyCache(-1)", []Option{WithDenyCache(-1)}, []string{"deny cache size -1"}},
		{"nil Option", []Option{WithPrefix("x:"), nil}, []string{"nil Option"}},
	} {
		for _, alg := range algorithms {
			cases = append(cases, struct {
				name string
				new  newFunc
				want []string
			}{alg.name + "/" + o.name, func() error { _, err := alg.new(rdb, 4, time.Second, o.opts...); return err }, o.want})
		}
	}
	for _, alg := range algorithms {
		cases = append(cases, struct {
			name string
			new  newFunc
			want []string
		}{alg.name + "/nil client", func() error { _, err := alg.new(nil, 4, time.Second); return err }, []string{"nil"}})
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { err = c.new() }, "a bad configuration must be an error, not a panic")
			require.ErrorIs(t, err, ErrInvalidConfig, "want ErrInvalidConfig")
			for _, want := range c.want {
				require.Contains(t, err.Error(), want, "the message must name the field and the value")
			}
			require.True(t, strings.HasPrefix(err.Error(), "redlimit: "), "messages start with redlimit: %q", err)
		})
	}
	require.Empty(t, cmds.take(), "constructors that reject their arguments must not touch Redis")
}

// A nil *redis.Client in a redis.Scripter is not == nil. It is as much a
// nil client as an untyped nil: it must be rejected, not panic at the first
// call.
func TestValidTypedNilClient(t *testing.T) {
	t.Parallel()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			var nilClient *redis.Client
			var l Limiter
			var err error
			require.NotPanics(t, func() { l, err = alg.new(nilClient, 4, time.Second) })
			if err == nil {
				var callErr error
				panicked := false
				func() {
					defer func() {
						if p := recover(); p != nil {
							panicked, callErr = true, fmt.Errorf("%v", p)
						}
					}()
					_, callErr = l.AllowN(context.Background(), "k", 1)
				}()
				t.Fatalf("want ErrInvalidConfig from the constructor for a nil *redis.Client; it was accepted, and the first call panicked=%v: %v", panicked, callErr)
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.Contains(t, err.Error(), "nil", "the message must say the client is nil")
		})
	}
}

func TestValidArgumentsRejectedWithoutRedis(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	cmds := &commandRecorder{}
	rdb.AddHook(cmds)
	ctx := context.Background()
	for _, alg := range algorithms {
		for _, cache := range []bool{false, true} {
			name := alg.name
			opts := []Option{WithPrefix("")} // an empty prefix must not make "" a key
			if cache {
				name += "/deny_cache"
				opts = append(opts, WithDenyCache(4))
			}
			t.Run(name, func(t *testing.T) {
				l, err := alg.new(rdb, 4, time.Second, opts...)
				require.NoError(t, err)
				calls := []struct {
					name string
					call func() error
					want string
				}{
					{"AllowN empty key", func() error { _, err := l.AllowN(ctx, "", 1); return err }, "key is empty"},
					{"AllowN empty key n=0", func() error { _, err := l.AllowN(ctx, "", 0); return err }, "key is empty"},
					{"AllowN n=-1", func() error { _, err := l.AllowN(ctx, "k", -1); return err }, "n -1"},
					{"AllowN n=MinInt", func() error { _, err := l.AllowN(ctx, "k", -1<<63); return err }, fmt.Sprintf("n %d", -1<<63)},
					{"AllowN empty key n=-1", func() error { _, err := l.AllowN(ctx, "", -1); return err }, ""},
					{"Allow empty key", func() error { _, err := l.Allow(ctx, ""); return err }, "key is empty"},
					{"TryAcquire empty key", func() error { return l.TryAcquire(ctx, "") }, "key is empty"},
					{"Reset empty key", func() error { return l.Reset(ctx, "") }, "key is empty"},
				}
				for _, c := range calls {
					err := c.call()
					require.ErrorIs(t, err, ErrInvalidArgument, "%s: want ErrInvalidArgument", c.name)
					require.NotErrorIs(t, err, ErrAcquireFailed, "%s: bad input is no denial", c.name)
					require.Contains(t, err.Error(), c.want, "%s: the message must name the problem", c.name)
				}
				require.Empty(t, cmds.take(), "invalid arguments must never reach Redis")
				require.Zero(t, cmds.dialed(), "invalid arguments must not even open a connection")
			})
		}
	}
	// The hook sees what does reach Redis, or the test above proves nothing.
	l, err := NewFixedWindow(rdb, 1, time.Second)
	require.NoError(t, err)
	_, err = l.AllowN(ctx, "k", 1)
	require.NoError(t, err)
	require.NotEmpty(t, cmds.take(), "the command hook must see a valid call")
}

func TestValidEdgeConfigs(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		make      func(rdb redis.Scripter, opts ...Option) (Limiter, error)
		limit     int           // what a fresh key grants at once
		retry     time.Duration // RetryAfter of one more permit right after
		bindLimit int           // Result.Limit of that denial
	}{
		{"fixed_window/1ms window, limit 1", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewFixedWindow(rdb, 1, time.Millisecond, opts...)
		}, 1, time.Millisecond, 1},
		{"fixed_window/largest limit and window", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewFixedWindow(rdb, 1<<40, maxValidMicros, opts...)
		}, 1 << 40, maxValidMicros, 1 << 40},
		{"sliding_window/1ms window and precision, limit 1", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingWindow(rdb, 1, time.Millisecond, time.Millisecond, opts...)
		}, 1, time.Millisecond, 1},
		{"sliding_window/largest limit and window", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingWindow(rdb, 1<<40, maxValidMicros, 1024*time.Microsecond, opts...)
		}, 1 << 40, maxValidMicros, 1 << 40},
		{"sliding_log/strategies out of order", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingLog(rdb, time.Millisecond, []Strategy{{100, time.Hour}, {1, time.Millisecond}, {10, time.Second}}, opts...)
		}, 1, time.Millisecond, 1},
		{"sliding_log/one strategy, 1ms", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingLog(rdb, time.Millisecond, []Strategy{{1, time.Millisecond}}, opts...)
		}, 1, time.Millisecond, 1},
		{"leaky_bucket/capacity 1 at 1 per 1ms", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewLeakyBucket(rdb, 1, Rate{Count: 1, Per: time.Millisecond}, opts...)
		}, 1, time.Millisecond, 1},
		{"leaky_bucket/capacity x period exactly 2^52", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewLeakyBucket(rdb, 4096, Rate{Count: 1, Per: 1 << 40 * time.Microsecond}, opts...)
		}, 4096, 1 << 40 * time.Microsecond, 4096},
		{"leaky_bucket/capacity 2^40", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewLeakyBucket(rdb, 1<<40, Rate{Count: 1 << 40, Per: time.Millisecond}, opts...)
		}, 1 << 40, time.Microsecond, 1 << 40},
		{"token_bucket/capacity 1 at 1 per 1ms", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewTokenBucket(rdb, 1, Rate{Count: 1, Per: time.Millisecond}, opts...)
		}, 1, time.Millisecond, 1},
		{"token_bucket/capacity x period exactly 2^52", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewTokenBucket(rdb, 4096, Rate{Count: 1, Per: 1 << 40 * time.Microsecond}, opts...)
		}, 4096, 1 << 40 * time.Microsecond, 4096},
		{"token_bucket/capacity 2^40", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewTokenBucket(rdb, 1<<40, Rate{Count: 1 << 40, Per: time.Millisecond}, opts...)
		}, 1 << 40, time.Microsecond, 1 << 40},
		{"token_bucket/reduced count 2^52", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewTokenBucket(rdb, 1<<40, Rate{Count: 1 << 52, Per: 1001 * time.Microsecond}, opts...)
		}, 1 << 40, time.Microsecond, 1 << 40},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newClock()
				l, err := c.make(b.rdb, WithClock(clock.Now), WithDenyCache(1), WithPrefix("edge:"), WithObserver(nil))
				require.NoError(t, err, "a valid configuration must construct")
				start := time.Now()
				r, err := l.AllowN(ctx, "k", c.limit)
				require.NoError(t, err)
				require.True(t, r.Allowed && r.Remaining == 0, "a fresh key grants its whole limit %d at once: %+v", c.limit, r)
				r, err = l.AllowN(ctx, "k", 1)
				require.NoError(t, err)
				if r.Allowed && b.mini == nil {
					// A real server counts the TTL (here as short as 1ms) in
					// real time, and expiry looks like a reset: only allowed
					// if that much real time has passed.
					require.GreaterOrEqual(t, time.Since(start), c.retry.Truncate(time.Millisecond),
						"one more permit granted before the key could have expired: %+v", r)
					return
				}
				require.Equal(t, Result{Allowed: false, Limit: c.bindLimit, Remaining: 0, RetryAfter: c.retry, ResetAfter: r.ResetAfter}, r,
					"one more permit waits %v", c.retry)
				clock.Advance(c.retry)
				r, err = l.AllowN(ctx, "k", 1)
				require.NoError(t, err)
				require.True(t, r.Allowed, "after RetryAfter (%v) the permit is granted: %+v", c.retry, r)
			})
		})
	}
}
