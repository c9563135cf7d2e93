package redlimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/faultproxy"
	"github.com/redlimit/redlimit/internal/redistest"
)

// breakerHarness is a breaker on a settable clock that records its state
// changes.
type breakerHarness struct {
	*Breaker
	mu      sync.Mutex
	now     time.Time
	changes []string
	lastErr error
	changed chan struct{} // a token after each change, for waitState
}

func newBreakerHarness(t *testing.T, cfg BreakerConfig) *breakerHarness {
	h := &breakerHarness{now: epoch, changed: make(chan struct{}, 1)}
	cfg.Now = func() time.Time {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.now
	}
	cfg.OnChange = func(from, to BreakerState, err error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.changes = append(h.changes, from.String()+">"+to.String())
		if err != nil {
			h.lastErr = err
		}
		select {
		case h.changed <- struct{}{}:
		default: // a token is waiting already
		}
	}
	b, err := NewBreaker(cfg)
	require.NoError(t, err)
	h.Breaker = b
	return h
}

// waitState waits for the breaker to be in want, woken by its changes: a
// probe may record its outcome after its caller has returned. timeout only
// stops a test whose breaker never gets there.
func (h *breakerHarness) waitState(t *testing.T, want BreakerState, timeout time.Duration, why string) {
	t.Helper()
	stuck := time.NewTimer(timeout)
	defer stuck.Stop()
	for h.State() != want {
		select {
		case <-h.changed:
		case <-stuck.C:
			require.Equal(t, want, h.State(), "%s (changes seen: %v)", why, h.seen())
		}
	}
}

func (h *breakerHarness) advance(d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.now = h.now.Add(d)
}

func (h *breakerHarness) seen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.changes...)
}

// callWithin makes one call with a ctx deadline and returns how long it took
// and its error.
func callWithin(l Limiter, key string, deadline time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	_, err := l.Allow(ctx, key)
	return time.Since(start), err
}

// resetWithin resets key with a ctx deadline and returns how long it took
// and its error.
func resetWithin(l Limiter, key string, deadline time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	err := l.Reset(ctx, key)
	return time.Since(start), err
}

// TestBreakerOnKilledRedis kills a real Redis under every algorithm: the
// breaker opens after its failures, answers at once with ErrUnavailable
// wrapping the refused dial, lets one probe through after the cooldown, and
// closes when Redis is back.
func TestBreakerOnKilledRedis(t *testing.T) {
	skipShort(t, "fault test: kills and restarts a redis-server")
	srv := redistest.Start(t)
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			// A client each: after PoolSize failed dials in a row, go-redis
			// stops dialing for up to a second on its own.
			rdb := recommendedClient(t, srv.Addr())
			h := newBreakerHarness(t, BreakerConfig{Failures: 3, Cooldown: time.Second})
			l, err := alg.new(rdb, 4, time.Second, WithBreaker(h.Breaker))
			require.NoError(t, err)
			_, err = l.Allow(context.Background(), "k")
			require.NoError(t, err)

			require.NoError(t, srv.Kill())
			for i := range 3 {
				_, err := callWithin(l, "k", 300*time.Millisecond)
				require.Error(t, err, "call %d", i)
				require.NotErrorIs(t, err, ErrUnavailable, "call %d: the breaker is still closed", i)
			}
			require.Equal(t, BreakerOpen, h.State())
			require.Equal(t, []string{"closed>open"}, h.seen())
			for range 20 {
				took, err := callWithin(l, "k", 300*time.Millisecond)
				require.ErrorIs(t, err, ErrUnavailable)
				require.ErrorIs(t, err, syscall.ECONNREFUSED, "the last Redis error is wrapped: %v", err)
				require.NotErrorIs(t, err, ErrAcquireFailed)
				var ra interface{ RetryAfter() time.Duration }
				require.True(t, errors.As(err, &ra))
				require.Equal(t, time.Second, ra.RetryAfter(), "the fake clock stands still: the whole cooldown is left")
				require.Less(t, took, 50*time.Millisecond, "an open breaker answers without a round trip")
			}

			// The cooldown passes while Redis is still down: the probe fails
			// and the breaker opens again.
			h.advance(time.Second)
			_, err = callWithin(l, "k", 300*time.Millisecond)
			require.Error(t, err)
			require.NotErrorIs(t, err, ErrUnavailable, "this call is the probe: it went to Redis")
			require.Equal(t, BreakerOpen, h.State())

			srv.Restart(t)
			_, err = callWithin(l, "k", 300*time.Millisecond)
			require.ErrorIs(t, err, ErrUnavailable, "still within the cooldown")
			h.advance(time.Second)
			_, err = callWithin(l, "k", time.Second)
			require.NoError(t, err, "the probe after the cooldown finds Redis back")
			require.Equal(t, BreakerClosed, h.State())
			require.Equal(t, []string{"closed>open", "open>half-open", "half-open>open", "open>half-open", "half-open>closed"}, h.seen())
		})
	}
}

// TestBreakerOnStoppedRedis pauses a real Redis (SIGSTOP) and then drops
// every reply at a proxy: the calls that wait for their deadline count as
// failures, the breaker opens, and calls then fail at once with an error
// that still matches context.DeadlineExceeded.
func TestBreakerOnStoppedRedis(t *testing.T) {
	skipShort(t, "fault test: stops a redis-server and drops replies for seconds")
	const stoppedReadTimeout = 2 * time.Second
	srv := redistest.Start(t)
	proxy, err := faultproxy.Start(srv.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })

	for _, fault := range []struct {
		name        string
		break_, fix func()
	}{
		{"SIGSTOP", func() { require.NoError(t, syscall.Kill(srv.Pid(), syscall.SIGSTOP)) }, func() { require.NoError(t, syscall.Kill(srv.Pid(), syscall.SIGCONT)) }},
		{"proxy drops replies", func() { proxy.SetDrop(true) }, func() { proxy.SetDrop(false) }},
	} {
		for _, client := range []string{"recommended", "AutoPipeline", "without ContextTimeoutEnabled"} {
			t.Run(fault.name+"/"+client, func(t *testing.T) {
				// A call that nothing ends at its deadline waits for
				// ReadTimeout: long here, so that the bounds below tell the
				// two apart with room for a loaded machine (one was seen
				// adding 430ms to a 100ms call).
				o := RecommendedOptions(proxy.Addr())
				o.ReadTimeout = stoppedReadTimeout
				recommended := redis.NewClient(o)
				t.Cleanup(func() { recommended.Close() })
				var rdb redis.Scripter = recommended
				switch client {
				case "AutoPipeline":
					// go-redis's AutoPipeliner ignores ctx deadlines of queued
					// commands: the engine must end the call itself.
					ap, err := recommended.AutoPipeline()
					require.NoError(t, err)
					rdb = ap
				case "without ContextTimeoutEnabled":
					// It waits for ReadTimeout: the engine ends the call.
					plain := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ReadTimeout: stoppedReadTimeout})
					t.Cleanup(func() { plain.Close() })
					rdb = plain
				}
				h := newBreakerHarness(t, BreakerConfig{Failures: 3, Cooldown: time.Second})
				l, err := NewTokenBucket(rdb, 10, PerSecond(10), WithBreaker(h.Breaker))
				require.NoError(t, err)
				_, err = l.Allow(context.Background(), "k")
				require.NoError(t, err)

				fault.break_()
				defer fault.fix()
				for i := range 3 {
					took, err := callWithin(l, "k", 100*time.Millisecond)
					require.ErrorIs(t, err, context.DeadlineExceeded, "call %d", i)
					// The outage table measures the margin (deadline + 10ms);
					// under a loaded CI only the order of magnitude is
					// asserted: far from ReadTimeout or dial retries.
					require.Less(t, took, stoppedReadTimeout/2, "call %d: about its 100ms deadline, not ReadTimeout", i)
				}
				require.Equal(t, BreakerOpen, h.State())
				// A round trip would wait for the whole deadline.
				took, err := callWithin(l, "k", stoppedReadTimeout)
				require.ErrorIs(t, err, ErrUnavailable)
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.Less(t, took, stoppedReadTimeout/2, "an open breaker answers without a round trip")
				// Reset is a call like the others.
				took, err = resetWithin(l, "k", stoppedReadTimeout)
				require.ErrorIs(t, err, ErrUnavailable, "Reset")
				require.Less(t, took, stoppedReadTimeout/2, "an open breaker answers Reset without a round trip")
				unguarded, err := NewTokenBucket(rdb, 10, PerSecond(10), WithoutBreaker())
				require.NoError(t, err)
				took, err = resetWithin(unguarded, "k", 100*time.Millisecond)
				require.ErrorIs(t, err, context.DeadlineExceeded, "Reset")
				require.Less(t, took, stoppedReadTimeout/2, "Reset: about its 100ms deadline, not ReadTimeout")

				fault.fix()
				h.advance(time.Second)
				// The AutoPipeliner sends one batch at a time: the probe may
				// queue behind a dropped reply until its ReadTimeout.
				_, err = callWithin(l, "k", 3*stoppedReadTimeout)
				require.NoError(t, err, "the probe finds Redis back")
				require.Equal(t, BreakerClosed, h.State())
			})
		}
	}
}

// TestBreakerStaysClosed checks what must never open the breaker: denials,
// bad input, a ctx the caller cancelled or that was done before the call,
// and a key holding a foreign value.
func TestBreakerStaysClosed(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		h := newBreakerHarness(t, BreakerConfig{Failures: 1, Cooldown: time.Second})
		l, err := NewFixedWindow(b.rdb, 1, time.Minute, WithBreaker(h.Breaker), WithPrefix("closed:"))
		require.NoError(t, err)
		ctx := context.Background()
		require.NoError(t, l.TryAcquire(ctx, "k"))
		for range 3 {
			require.ErrorIs(t, l.TryAcquire(ctx, "k"), ErrAcquireFailed)
		}
		_, err = l.AllowN(ctx, "", 1)
		require.ErrorIs(t, err, ErrInvalidArgument)
		_, err = l.AllowN(ctx, "k", -1)
		require.ErrorIs(t, err, ErrInvalidArgument)
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		_, err = l.Allow(cancelled, "k")
		require.ErrorIs(t, err, context.Canceled)
		expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		defer cancel()
		_, err = l.Allow(expired, "k")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NoError(t, b.rdb.Set(ctx, "closed:foreign", "hello", 0).Err())
		_, err = l.Allow(ctx, "foreign")
		require.Error(t, err)
		require.Equal(t, BreakerClosed, h.State(), "Failures is 1: any of these would have opened it")
		require.Empty(t, h.seen())
	})
}

// TestRecommendedClientFailsFast kills Redis and compares go-redis with
// its default dial retries (5 tries 100ms apart: a 300ms deadline is spent
// in full) with the README's client (one dial: refused at once), with the
// breaker off to see the client alone.
func TestRecommendedClientFailsFast(t *testing.T) {
	skipShort(t, "fault test: kills a redis-server and times calls against it")
	srv := redistest.Start(t)
	plain := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { plain.Close() })
	recommended := recommendedClient(t, srv.Addr())
	lp, err := NewTokenBucket(plain, 10, PerSecond(10), WithoutBreaker())
	require.NoError(t, err)
	lr, err := NewTokenBucket(recommended, 10, PerSecond(10), WithoutBreaker())
	require.NoError(t, err)
	require.NoError(t, srv.Kill())

	var slowest time.Duration
	for range 5 {
		took, err := callWithin(lr, "k", 300*time.Millisecond)
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
		slowest = max(slowest, took)
	}
	require.Less(t, slowest, 50*time.Millisecond, "the recommended client fails at once")
	took, err := callWithin(lp, "k", 300*time.Millisecond)
	require.Error(t, err)
	require.Greater(t, took, 250*time.Millisecond, "go-redis's default dial retries hold the call to its deadline")
	t.Logf("killed Redis: recommended client slowest of 5 calls %v; default client %v (deadline 300ms)", slowest, took)
}

func TestBreakerOptions(t *testing.T) {
	t.Parallel()
	rdb := deadRedis(t, "", 0)
	_, err := NewBreaker(BreakerConfig{Failures: -1})
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewBreaker(BreakerConfig{Cooldown: -time.Second})
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewFixedWindow(rdb, 1, time.Second, WithBreaker(nil))
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewFixedWindow(rdb, 1, time.Second, WithFallback(nil))
	require.ErrorIs(t, err, ErrInvalidConfig)
	var typedNil *FixedWindow
	_, err = NewFixedWindow(rdb, 1, time.Second, WithFallback(typedNil))
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewFixedWindow(rdb, 1, time.Second, WithBreaker(&Breaker{}))
	require.ErrorIs(t, err, ErrInvalidConfig, "a zero Breaker would turn the breaker off unsaid")
	require.Equal(t, BreakerClosed, (&Breaker{}).State(), "no panic")
	require.Equal(t, BreakerClosed, (*Breaker)(nil).State(), "no panic")
	require.Equal(t, "half-open", BreakerHalfOpen.String())

	// Without a breaker every call goes to the dead address.
	l, err := NewFixedWindow(rdb, 1, time.Second, WithoutBreaker())
	require.NoError(t, err)
	for i := range defaultBreakerFailures + 3 {
		_, err := l.Allow(context.Background(), "k")
		require.Error(t, err)
		require.NotErrorIs(t, err, ErrUnavailable, fmt.Sprint("call ", i))
	}
	// The default breaker opens after defaultBreakerFailures.
	l, err = NewFixedWindow(rdb, 1, time.Second)
	require.NoError(t, err)
	for range defaultBreakerFailures {
		_, err := l.Allow(context.Background(), "k")
		require.NotErrorIs(t, err, ErrUnavailable)
	}
	_, err = l.Allow(context.Background(), "k")
	require.ErrorIs(t, err, ErrUnavailable)
}

// TestBreakerOneProbe pauses Redis, opens the breaker, and lets the
// cooldown pass: of 16 goroutines calling at once, exactly one reaches
// Redis (and waits for its deadline); every other call fails at once,
// with ErrUnavailable and no round trip. The client's timeouts are a
// minute: the calls' deadlines, not a loaded machine, end them.
func TestBreakerOneProbe(t *testing.T) {
	srv := redistest.Start(t)
	rdb := patientClient(t, srv.Addr())
	sent := &commandRecorder{}
	rdb.AddHook(sent)
	h := newBreakerHarness(t, BreakerConfig{Failures: 1, Cooldown: time.Second})
	l, err := NewFixedWindow(rdb, 100, time.Minute, WithBreaker(h.Breaker))
	require.NoError(t, err)
	_, err = l.Allow(context.Background(), "k")
	require.NoError(t, err)

	require.NoError(t, syscall.Kill(srv.Pid(), syscall.SIGSTOP))
	defer func() { require.NoError(t, syscall.Kill(srv.Pid(), syscall.SIGCONT)) }()
	_, err = callWithin(l, "k", 50*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, BreakerOpen, h.State())

	h.advance(time.Second)
	sent.take()
	var wg sync.WaitGroup
	var fast, slow atomic.Int64
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				_, err := callWithin(l, "k", 100*time.Millisecond)
				require.Error(t, err)
				if errors.Is(err, ErrUnavailable) {
					// Answered by the open breaker, without a round trip
					// (one script in all, below); a wall-clock bound
					// here would be one a loaded machine can miss.
					fast.Add(1)
				} else {
					slow.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	h.waitState(t, BreakerOpen, 30*time.Second, "the probe failed: open again")
	require.Equal(t, 1, sent.scripts(), "exactly one probe reached Redis")
	require.EqualValues(t, 1, slow.Load(), "the probe's caller waited for its deadline")
	require.EqualValues(t, 159, fast.Load())
}
