package inmem

import (
	"context"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

func TestMain(m *testing.M) {
	// miniredis runs gopher-lua, which builds a new Lua state for every
	// script call: at the default GOGC, collecting them takes about half
	// the CPU of the tests that check the in-process limiters against the
	// scripts.
	debug.SetGCPercent(400)
	code := m.Run()
	redistest.Shutdown()
	os.Exit(code)
}

// miniClient returns a client, closed when t ends, of a miniredis of its
// own that it talks to over in-memory pipes (m.Dial) rather than TCP: the
// same commands and replies without a socket's system calls. Its timeouts
// are a minute: the traces check Results, which a loaded machine must not
// turn into i/o timeouts.
func miniClient(t *testing.T) *redis.Client {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{
		Addr:            m.Addr(),
		Dialer:          func(context.Context, string, string) (net.Conn, error) { return m.Dial() },
		DisableIdentity: true, MaxRetries: -1,
		ReadTimeout: time.Minute, WriteTimeout: time.Minute, PoolTimeout: time.Minute,
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// TestFallbackDecidesWhileRedisIsDown kills a real Redis under a limiter
// whose fallback holds this instance's share: every call during the outage
// is decided, observers see Decision.Fallback, the grants are exactly the
// share, and Redis decides again once the breaker closes.
func TestFallbackDecidesWhileRedisIsDown(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{
		Addr: srv.Addr(), DialTimeout: 100 * time.Millisecond, DialerRetries: 1,
		ContextTimeoutEnabled: true, MaxRetries: -1, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { rdb.Close() })
	const limit, instances = 40, 4
	clock := &fakeClock{now: epoch}
	fb, err := NewFixedWindow(Share(limit, instances), time.Minute, WithClock(clock.Now))
	require.NoError(t, err)

	var mu sync.Mutex
	breakerNow := epoch
	var changes []string
	breaker, err := redlimit.NewBreaker(redlimit.BreakerConfig{
		Failures: 2,
		Now:      func() time.Time { mu.Lock(); defer mu.Unlock(); return breakerNow },
		OnChange: func(from, to redlimit.BreakerState, _ error) {
			changes = append(changes, from.String()+">"+to.String())
		},
	})
	require.NoError(t, err)
	var decisions []redlimit.Decision
	l, err := redlimit.NewFixedWindow(rdb, limit, time.Minute, redlimit.WithFallback(fb), redlimit.WithBreaker(breaker),
		redlimit.WithObserver(func(d redlimit.Decision) { mu.Lock(); decisions = append(decisions, d); mu.Unlock() }))
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, l.TryAcquire(ctx, "k"))

	require.NoError(t, srv.Kill())
	granted := 0
	for i := range 50 {
		r, err := l.Allow(ctx, "k")
		require.NoError(t, err, "call %d: the fallback decides", i)
		if r.Allowed {
			granted++
		}
		require.Equal(t, Share(limit, instances), r.Limit, "the fallback's own Result")
	}
	require.Equal(t, Share(limit, instances), granted, "exactly the share during the outage")
	require.Equal(t, redlimit.BreakerOpen, breaker.State())
	require.ErrorIs(t, l.TryAcquire(ctx, "k"), redlimit.ErrAcquireFailed, "a fallback denial is a denial")

	mu.Lock()
	require.False(t, decisions[0].Fallback, "Redis decided the first call")
	for i, d := range decisions[1:] {
		require.True(t, d.Fallback, "decision %d", i+1)
		require.NoError(t, d.Err, "decision %d", i+1)
	}
	mu.Unlock()

	_, err = l.AllowN(ctx, "k", -1)
	require.ErrorIs(t, err, redlimit.ErrInvalidArgument, "bad input never reaches the fallback")
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	_, err = l.Allow(expired, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded, "a ctx done before the call reaches neither Redis nor the fallback")
	cancelled, cancel2 := context.WithCancel(ctx)
	cancel2()
	_, err = l.Allow(cancelled, "k")
	require.ErrorIs(t, err, context.Canceled)

	srv.Restart(t)
	mu.Lock()
	breakerNow = breakerNow.Add(time.Second) // the default cooldown
	mu.Unlock()
	r, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, limit, r.Limit, "Redis decides again")
	mu.Lock()
	require.False(t, decisions[len(decisions)-1].Fallback)
	require.Equal(t, []string{"closed>open", "open>half-open", "half-open>closed"}, changes)
	mu.Unlock()
}

// TestFallbackSlidingLogDenial: a TryAcquire the fallback denies names the
// fallback's strategy, not the Redis limiter's.
func TestFallbackSlidingLogDenial(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{
		Addr: srv.Addr(), DialTimeout: 100 * time.Millisecond, DialerRetries: 1,
		ContextTimeoutEnabled: true, MaxRetries: -1, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { rdb.Close() })
	clock := &fakeClock{now: epoch}
	fb, err := NewSlidingLog(100*time.Millisecond, []redlimit.Strategy{{Limit: 3, Window: time.Second}, {Limit: 10, Window: time.Minute}}, WithClock(clock.Now))
	require.NoError(t, err)
	l, err := redlimit.NewSlidingLog(rdb, 100*time.Millisecond, []redlimit.Strategy{{Limit: 12, Window: time.Second}, {Limit: 40, Window: time.Minute}}, redlimit.WithFallback(fb))
	require.NoError(t, err)
	require.NoError(t, srv.Kill())
	ctx := context.Background()
	for i := range 3 {
		require.NoError(t, l.TryAcquire(ctx, "k"), "call %d: within the fallback's 3 per second", i)
	}
	err = l.TryAcquire(ctx, "k")
	var v *redlimit.ViolationStrategyError
	require.ErrorAs(t, err, &v)
	require.Equal(t, 3, v.Limit)
	require.Equal(t, time.Second, v.Window)
	require.Equal(t, time.Second, v.RetryAfter)
}
