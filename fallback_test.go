package redlimit_test

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/inmem"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/redlimittest"
)

// fallbackCase builds a Redis limiter of limit 100 and an in-process
// fallback of limit 5, for each algorithm.
type fallbackCase struct {
	name     string
	fallback func(opts ...inmem.Option) (redlimit.Limiter, error)
	limiter  func(rdb redis.Scripter, opts ...redlimit.Option) (redlimit.Limiter, error)
}

func fallbackCases() []fallbackCase {
	return []fallbackCase{
		{"fixed_window",
			func(opts ...inmem.Option) (redlimit.Limiter, error) {
				return inmem.NewFixedWindow(5, time.Minute, opts...)
			},
			func(rdb redis.Scripter, opts ...redlimit.Option) (redlimit.Limiter, error) {
				return redlimit.NewFixedWindow(rdb, 100, time.Minute, opts...)
			}},
		{"sliding_window",
			func(opts ...inmem.Option) (redlimit.Limiter, error) {
				return inmem.NewSlidingWindow(5, time.Minute, time.Second, opts...)
			},
			func(rdb redis.Scripter, opts ...redlimit.Option) (redlimit.Limiter, error) {
				return redlimit.NewSlidingWindow(rdb, 100, time.Minute, time.Second, opts...)
			}},
		{"sliding_log",
			func(opts ...inmem.Option) (redlimit.Limiter, error) {
				return inmem.NewSlidingLog(time.Second, []redlimit.Strategy{{Limit: 5, Window: time.Minute}, {Limit: 50, Window: time.Hour}}, opts...)
			},
			func(rdb redis.Scripter, opts ...redlimit.Option) (redlimit.Limiter, error) {
				return redlimit.NewSlidingLog(rdb, time.Second, []redlimit.Strategy{{Limit: 100, Window: time.Minute}, {Limit: 1000, Window: time.Hour}}, opts...)
			}},
		{"leaky_bucket",
			func(opts ...inmem.Option) (redlimit.Limiter, error) {
				return inmem.NewLeakyBucket(5, redlimit.PerMinute(5), opts...)
			},
			func(rdb redis.Scripter, opts ...redlimit.Option) (redlimit.Limiter, error) {
				return redlimit.NewLeakyBucket(rdb, 100, redlimit.PerMinute(100), opts...)
			}},
		{"token_bucket",
			func(opts ...inmem.Option) (redlimit.Limiter, error) {
				return inmem.NewTokenBucket(5, redlimit.PerMinute(5), opts...)
			},
			func(rdb redis.Scripter, opts ...redlimit.Option) (redlimit.Limiter, error) {
				return redlimit.NewTokenBucket(rdb, 100, redlimit.PerMinute(100), opts...)
			}},
	}
}

// decisions records what an observer sees.
type decisions struct {
	mu   sync.Mutex
	list []redlimit.Decision
}

func (d *decisions) observe(dec redlimit.Decision) {
	d.mu.Lock()
	d.list = append(d.list, dec)
	d.mu.Unlock()
}

func (d *decisions) last(t *testing.T) redlimit.Decision {
	d.mu.Lock()
	defer d.mu.Unlock()
	require.NotEmpty(t, d.list, "the observer saw the call")
	return d.list[len(d.list)-1]
}

// TestFallbackOnErrorReply is the finding of a fallback that let every
// request through while Redis answered each with an error (redlimittest's
// way to test the failure path): the fallback decides every call Redis left
// undecided, whatever the error, and observers see the Redis error as the
// Decision's Cause. Once Redis answers again, it decides again.
func TestFallbackOnErrorReply(t *testing.T) {
	for _, c := range fallbackCases() {
		t.Run(c.name, func(t *testing.T) {
			env := redlimittest.New(t)
			fb, err := c.fallback()
			require.NoError(t, err)
			var seen decisions
			l, err := c.limiter(env.Client(), env.Options(redlimit.WithFallback(fb), redlimit.WithObserver(seen.observe))...)
			require.NoError(t, err)
			ctx := context.Background()

			env.Server().SetError("simulated outage")
			allowed := 0
			for i := range 15 {
				r, err := l.Allow(ctx, "client")
				require.NoError(t, err, "call %d: the fallback decides", i)
				if r.Allowed {
					allowed++
				}
				d := seen.last(t)
				require.True(t, d.Fallback, "call %d: the observer sees the fallback decide", i)
				require.NoError(t, d.Err)
				require.ErrorContains(t, d.Cause, "simulated outage", "call %d: the Redis error is the Cause", i)
				var reply redis.Error
				require.ErrorAs(t, d.Cause, &reply, "the Cause wraps Redis's error reply")
			}
			require.Equal(t, 5, allowed, "15 requests at the fallback's limit of 5")
			require.ErrorIs(t, l.TryAcquire(ctx, "client"), redlimit.ErrAcquireFailed, "a fallback denial is a denial")

			env.Server().SetError("")
			r, err := l.Allow(ctx, "client")
			require.NoError(t, err)
			require.True(t, r.Allowed, "Redis decides again: %+v", r)
			d := seen.last(t)
			require.False(t, d.Fallback)
			require.NoError(t, d.Cause)
		})
	}
}

// TestFallbackOnOOM: on a real server that refuses writes (maxmemory with
// noeviction), the grants it cannot write go to the fallback, with the OOM
// error as their Cause: Redis is up, and the observer still shows it.
func TestFallbackOnOOM(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DisableIdentity: true})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", "1").Err())
	fb, err := inmem.NewFixedWindow(5, time.Minute)
	require.NoError(t, err)
	var seen decisions
	l, err := redlimit.NewFixedWindow(rdb, 100, time.Minute, redlimit.WithFallback(fb), redlimit.WithObserver(seen.observe))
	require.NoError(t, err)
	allowed := 0
	for i := range 15 {
		r, err := l.Allow(ctx, "client")
		require.NoError(t, err, "call %d", i)
		if r.Allowed {
			allowed++
		}
		d := seen.last(t)
		require.True(t, d.Fallback, "call %d", i)
		require.ErrorContains(t, d.Cause, "OOM", "call %d", i)
	}
	require.Equal(t, 5, allowed, "15 requests at the fallback's limit of 5")
}

// TestFallbackNotForCallersOwn: what the caller chose never reaches the
// fallback: bad input, its own ctx, and a key that holds a value this
// library did not write each return their error.
func TestFallbackNotForCallersOwn(t *testing.T) {
	env := redlimittest.New(t)
	fb, err := inmem.NewFixedWindow(5, time.Minute)
	require.NoError(t, err)
	var seen decisions
	l, err := redlimit.NewFixedWindow(env.Client(), 100, time.Minute,
		env.Options(redlimit.WithPrefix("own:"), redlimit.WithFallback(fb), redlimit.WithObserver(seen.observe))...)
	require.NoError(t, err)
	ctx := context.Background()

	_, err = l.AllowN(ctx, "client", -1)
	require.ErrorIs(t, err, redlimit.ErrInvalidArgument)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = l.Allow(cancelled, "client")
	require.ErrorIs(t, err, context.Canceled)
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	_, err = l.Allow(expired, "client")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, env.Server().Set("own:foreign", "another app's value"))
	_, err = l.Allow(ctx, "foreign")
	require.ErrorIs(t, err, redlimit.ErrForeignState)

	seen.mu.Lock()
	defer seen.mu.Unlock()
	require.Len(t, seen.list, 4)
	for i, d := range seen.list {
		require.False(t, d.Fallback, "call %d: %v", i, d.Err)
		require.Error(t, d.Err, "call %d", i)
		require.NoError(t, d.Cause, "call %d", i)
	}
	r, err := fb.AllowN(ctx, "client", 0)
	require.NoError(t, err)
	require.Equal(t, 5, r.Remaining, "the fallback decided none of them")
	r, err = fb.AllowN(ctx, "foreign", 0)
	require.NoError(t, err)
	require.Equal(t, 5, r.Remaining, "the fallback decided none of them")
}

// TestFallbackDeadlines on a paused real server: a call whose own ctx
// deadline passes mid-call returns that error (the caller chose the
// deadline), while one that the client's own ReadTimeout ends goes to the
// fallback.
func TestFallbackDeadlines(t *testing.T) {
	if testing.Short() {
		t.Skip("pauses a redis-server: a fault test")
	}
	srv := redistest.Start(t)
	fb, err := inmem.NewFixedWindow(5, time.Minute)
	require.NoError(t, err)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DisableIdentity: true,
		ReadTimeout: 200 * time.Millisecond, PoolSize: 4})
	t.Cleanup(func() { rdb.Close() })
	var seen decisions
	l, err := redlimit.NewFixedWindow(rdb, 100, time.Minute, redlimit.WithFallback(fb), redlimit.WithObserver(seen.observe))
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, l.TryAcquire(ctx, "warm"), "a connection is open before the pause")

	require.NoError(t, syscall.Kill(srv.Pid(), syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(srv.Pid(), syscall.SIGCONT) })
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = l.Allow(short, "client")
	require.ErrorIs(t, err, context.DeadlineExceeded, "the caller's own deadline passed")
	require.False(t, seen.last(t).Fallback)

	r, err := l.Allow(ctx, "client")
	require.NoError(t, err, "the client's ReadTimeout is Redis's failure: the fallback decides")
	require.True(t, r.Allowed)
	d := seen.last(t)
	require.True(t, d.Fallback)
	require.True(t, errors.Is(d.Cause, syscall.ETIMEDOUT) || errors.Is(d.Cause, context.DeadlineExceeded) || isTimeout(d.Cause), "Cause: %v", d.Cause)
}

func isTimeout(err error) bool {
	var timeout interface{ Timeout() bool }
	return errors.As(err, &timeout) && timeout.Timeout()
}

// TestFallbackReadsLimiterClock is the finding of a fallback that ignored
// the limiter's fake clock: with WithClock, an in-process fallback without
// a clock of its own decides on the limiter's, so advancing it refills
// both; one given its own clock keeps it.
func TestFallbackReadsLimiterClock(t *testing.T) {
	for _, c := range fallbackCases() {
		t.Run(c.name, func(t *testing.T) {
			env := redlimittest.New(t)
			fb, err := c.fallback()
			require.NoError(t, err)
			frozen := env.Now()
			own, err := c.fallback(inmem.WithClock(func() time.Time { return frozen }))
			require.NoError(t, err)
			l, err := c.limiter(env.Client(), env.Options(redlimit.WithFallback(fb))...)
			require.NoError(t, err)
			withOwn, err := c.limiter(env.Client(), env.Options(redlimit.WithFallback(own))...)
			require.NoError(t, err)
			ctx := context.Background()

			env.Server().SetError("simulated outage")
			drain := func(l redlimit.Limiter) int {
				granted := 0
				for range 6 {
					r, err := l.Allow(ctx, "client")
					require.NoError(t, err)
					if r.Allowed {
						granted++
					}
				}
				return granted
			}
			require.Equal(t, 5, drain(l), "the fallback's limit")
			require.Equal(t, 5, drain(withOwn), "the fallback's limit")
			env.Advance(time.Hour)
			require.Equal(t, 5, drain(l), "an hour later on the limiter's clock, the fallback has refilled")
			require.Equal(t, 0, drain(withOwn), "a fallback with its own clock, which stood still, has not")
		})
	}
}

// A grant the fallback made refunds into the fallback, on the limiter's
// clock as it decided: 5 granted, 3 given back, 3 granted again. That
// clock is a year behind time.Now, where the grant's window is long over.
func TestFallbackGrantsRefundOnTheLimitersClock(t *testing.T) {
	for _, c := range fallbackCases() {
		t.Run(c.name, func(t *testing.T) {
			env := redlimittest.New(t)
			env.Set(time.Now().AddDate(-1, 0, 0))
			fb, err := c.fallback()
			require.NoError(t, err)
			l, err := c.limiter(env.Client(), env.Options(redlimit.WithFallback(fb))...)
			require.NoError(t, err)
			ctx := context.Background()
			env.Server().SetError("simulated outage")
			r, err := l.AllowN(ctx, "client", 5)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			env.Advance(time.Millisecond)
			require.NoError(t, r.Grant.Refund(ctx, 3))
			r, err = l.AllowN(ctx, "client", 3)
			require.NoError(t, err)
			require.True(t, r.Allowed, "the fallback took the 3 back")
			r, err = l.AllowN(ctx, "client", 1)
			require.NoError(t, err)
			require.False(t, r.Allowed, "and no more")
		})
	}
}

// BenchmarkFallbackDecision measures a call the fallback decides while the
// circuit breaker is open (no round trip): a grant, and a grant given
// back, with and without WithClock.
func BenchmarkFallbackDecision(b *testing.B) {
	at := redlimittest.Epoch
	for _, clocked := range []bool{false, true} {
		fb, err := inmem.NewFixedWindow(1_000_000_000, time.Hour)
		require.NoError(b, err)
		breaker, err := redlimit.NewBreaker(redlimit.BreakerConfig{Failures: 1, Cooldown: time.Hour})
		require.NoError(b, err)
		opts := []redlimit.Option{redlimit.WithFallback(fb), redlimit.WithBreaker(breaker)}
		name := "time_now"
		if clocked {
			opts, name = append(opts, redlimit.WithClock(func() time.Time { return at })), "with_clock"
		}
		rdb := redis.NewClient(redlimit.ClientOptions("127.0.0.1:1")) // refused: the breaker opens
		b.Cleanup(func() { rdb.Close() })
		l, err := redlimit.NewFixedWindow(rdb, 1000, time.Minute, opts...)
		require.NoError(b, err)
		ctx := context.Background()
		r, err := l.Allow(ctx, "client")
		require.NoError(b, err)
		require.True(b, r.Allowed, "the fallback decides")
		require.Equal(b, redlimit.BreakerOpen, breaker.State())
		b.Run(name+"/allow", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Allow(ctx, "client"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/allow_refund", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r, err := l.Allow(ctx, "client")
				if err != nil {
					b.Fatal(err)
				}
				if err := r.Grant.Refund(ctx, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// The leases a fallback granted extend and release on the limiter's
// clock, unless the fallback has its own (inmem.WithClock). The clock
// each call read shows in its answer: a lease still live on the limiter's
// clock (a year behind time.Now) keeps its place when extended; a clock
// set past 2112 is refused (ErrInvalidArgument) by the fallback that reads
// it, and by that one alone.
func TestFallbackLeasesOnTheLimitersClock(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T, opts ...inmem.Option) (*redlimittest.Env, *redlimit.Concurrency) {
		env := redlimittest.New(t)
		env.Set(time.Now().AddDate(-1, 0, 0))
		fb, err := inmem.NewConcurrency(2, time.Minute, opts...)
		require.NoError(t, err)
		c, err := redlimit.NewConcurrency(env.Client(), 10, time.Minute, env.Options(redlimit.WithFallback(fb))...)
		require.NoError(t, err)
		env.Server().SetError("simulated outage")
		return env, c
	}
	tooLate := time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)

	t.Run("extend", func(t *testing.T) {
		env, c := setup(t)
		r, err := c.Allow(ctx, "client")
		require.NoError(t, err)
		require.True(t, r.Allowed)
		env.Advance(30 * time.Second)
		ext, err := c.ExtendGrant(ctx, r.Grant)
		require.NoError(t, err)
		require.True(t, ext.Allowed)
		require.Equal(t, r.Grant, ext.Grant, "live on the limiter's clock: the lease kept its place")
		env.Set(tooLate)
		_, err = c.ExtendGrant(ctx, r.Grant)
		require.ErrorIs(t, err, redlimit.ErrInvalidArgument, "the fallback read the limiter's clock")
	})
	t.Run("release", func(t *testing.T) {
		env, c := setup(t)
		lease, err := c.Acquire(ctx, "client")
		require.NoError(t, err)
		now := env.Now()
		env.Set(tooLate)
		require.ErrorIs(t, lease.Release(ctx), redlimit.ErrInvalidArgument, "the fallback read the limiter's clock")
		env.Set(now)
		require.NoError(t, lease.Release(ctx))
		for range 2 {
			_, err := c.Acquire(ctx, "client")
			require.NoError(t, err, "the release freed its place")
		}
	})
	t.Run("own_clock", func(t *testing.T) {
		env, c := setup(t, inmem.WithClock(time.Now))
		lease, err := c.Acquire(ctx, "client")
		require.NoError(t, err)
		env.Set(tooLate)
		require.NoError(t, lease.Extend(ctx), "the fallback reads its own clock")
		require.NoError(t, lease.Release(ctx), "the fallback reads its own clock")
	})
}
