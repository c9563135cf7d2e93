package redlimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/faultproxy"
	"github.com/redlimit/redlimit/internal/redistest"
)

// Attackers whose calls carry deadlines of 150µs to 1.5ms (a gRPC client's
// grpc-timeout, handed down to the limiter), odd keys and odd n, against a
// healthy Redis, never open the breaker: an honest caller sharing the
// limiter keeps getting exact decisions, never ErrUnavailable.
func TestBreakerIgnoresCallersShortDeadlines(t *testing.T) {
	const (
		attackers      = 8
		limit          = 5
		honestDeadline = 30 * time.Second
	)
	length := time.Second
	if testing.Short() {
		length = 300 * time.Millisecond
	}
	forEachBackend(t, func(t *testing.T, b backend) {
		o := RecommendedOptions(b.rdb.Options().Addr)
		o.DB, o.PoolSize = b.rdb.Options().DB, 2*attackers
		// The honest caller's deadline bounds its calls, not the client's
		// timeouts, and it is generous: on a machine busy with other work
		// a round trip, a dial or a wait for a pooled connection may take
		// seconds, and that is no attack (a call that missed a deadline
		// of 20ms or more would count as a failure of Redis).
		o.DialTimeout, o.PoolTimeout = honestDeadline, honestDeadline
		o.ReadTimeout, o.WriteTimeout = honestDeadline, honestDeadline
		rdb := redis.NewClient(o)
		t.Cleanup(func() { rdb.Close() })
		var opened atomic.Int64
		breaker, err := NewBreaker(BreakerConfig{OnChange: func(_, to BreakerState, _ error) {
			if to == BreakerOpen {
				opened.Add(1)
			}
		}})
		require.NoError(t, err)
		l, err := NewFixedWindow(rdb, limit, time.Hour, WithBreaker(breaker), WithPrefix(fmt.Sprintf("deadline:%d:", time.Now().UnixNano())))
		require.NoError(t, err)

		attack, stop := context.WithCancel(context.Background())
		defer stop()
		ctx, cancel := context.WithTimeout(attack, length)
		defer cancel()
		var wg sync.WaitGroup
		var timedOut atomic.Int64
		for i := range attackers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), 7))
				for attack.Err() == nil {
					deadline := 150*time.Microsecond + rand.N(1350*time.Microsecond)
					callCtx, cancel := context.WithTimeout(context.Background(), deadline)
					key := fmt.Sprintf("attacker:%d", rng.IntN(1000))
					_, err := l.AllowN(callCtx, key, rng.IntN(3*limit))
					cancel()
					if errors.Is(err, context.DeadlineExceeded) {
						timedOut.Add(1)
					}
					// An attack, not a load test: pacing in real time, as
					// the deadlines are; a loaded machine only slows it.
					time.Sleep(200 * time.Microsecond)

				}
			}()
		}

		var allowed, denied int
		for ctx.Err() == nil || allowed+denied < 2*limit {
			callCtx, cancel := context.WithTimeout(context.Background(), honestDeadline)
			err := l.TryAcquire(callCtx, "honest")
			cancel()
			switch {
			case err == nil:
				allowed++
			case errors.Is(err, ErrAcquireFailed):
				denied++
			default:
				require.NoError(t, err, "the honest caller must always get a decision (after %d allowed, %d denied)", allowed, denied)
			}
			time.Sleep(time.Millisecond) // the honest caller's pace: no assertion times it
		}
		stop()
		wg.Wait()
		t.Logf("%s: %d attacker calls timed out; honest caller: %d allowed, %d denied", b.name, timedOut.Load(), allowed, denied)
		require.GreaterOrEqual(t, timedOut.Load(), int64(defaultBreakerFailures),
			"the attack must time calls out, or this test shows nothing")
		require.Zero(t, opened.Load(), "callers' own short deadlines must never open the breaker")
		require.Equal(t, BreakerClosed, breaker.State())
		require.Equal(t, limit, allowed, "the honest caller is limited exactly")
		require.Positive(t, denied)
	})
}

// A real outage still opens the breaker for callers with short deadlines:
// a killed Redis refuses at once, which is no caller's choice.
func TestBreakerOpensOnKilledRedisWithShortDeadlines(t *testing.T) {
	srv := redistest.Start(t)
	rdb := recommendedClient(t, srv.Addr())
	breaker, err := NewBreaker(BreakerConfig{})
	require.NoError(t, err)
	l, err := NewTokenBucket(rdb, 5, PerSecond(1), WithBreaker(breaker))
	require.NoError(t, err)
	require.NoError(t, l.TryAcquire(context.Background(), "k"))
	require.NoError(t, srv.Kill())
	// Each call ends in the refused dial, or, on a loaded machine, at its
	// deadline first: its round trip then runs on (MinDeadline) and its
	// refusal still reaches the breaker, which may open after the caller
	// returned (the next call is then ErrUnavailable).
	for attempt := 0; breaker.State() != BreakerOpen; attempt++ {
		require.Less(t, attempt, 100*defaultBreakerFailures, "the breaker never opened")
		_, err := callWithin(l, "k", 10*time.Millisecond)
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrUnavailable) {
			require.ErrorIs(t, err, syscall.ECONNREFUSED)
		}
	}
	_, err = callWithin(l, "k", slowMachine)
	require.ErrorIs(t, err, ErrUnavailable)
}

// After an outage, the half-open breaker's probe says whether Redis
// answers, whoever's call carries it: callers whose deadlines are too short
// for any Redis (here 1ms, against a healthy Redis 5ms away each way) or
// who cancel mid-call, and who call first after every cooldown, cannot
// keep it half-open, failing everyone else with ErrUnavailable. The
// probe's caller still returns at its own deadline or cancel. MinDeadline
// is 1s, the least the probe gets: far above a reconnect through the proxy,
// however busy the machine.
func TestBreakerProbeOutlivesShortDeadlines(t *testing.T) {
	skipShort(t, "fault test: drops replies at a proxy, waiting out a read timeout and MinDeadline (2s, alone)")
	for _, c := range []struct {
		name              string
		cancelled, paused bool
	}{{"deadline", false, false}, {"cancelled", true, false}, {"deadline on a paused Redis", false, true}} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Start(t)
			proxy, err := faultproxy.Start(srv.Addr())
			require.NoError(t, err)
			t.Cleanup(func() { proxy.Close() })
			rdb := recommendedClient(t, proxy.Addr())
			h := newBreakerHarness(t, BreakerConfig{Failures: 1, Cooldown: time.Second, MinDeadline: time.Second})
			l, err := NewTokenBucket(rdb, 100, PerSecond(100), WithBreaker(h.Breaker))
			require.NoError(t, err)

			proxy.SetDrop(true)
			_, err = callWithin(l, "k", 2*time.Second)
			require.Error(t, err)
			require.Equal(t, BreakerOpen, h.State(), "a reply lost for longer than the ReadTimeout (500ms) opens it")
			proxy.SetDrop(c.paused)
			// Replies come 100ms late: after any caller's deadline
			// below, before the probe's MinDeadline (1s).
			proxy.SetDelay(100 * time.Millisecond)
			h.advance(time.Second)

			// The first call after the cooldown probes, and gives up first.
			if c.cancelled {
				ctx, cancel := context.WithCancel(context.Background())
				rdb.AddHook(beforeDecision{cancel})
				_, err = l.Allow(ctx, "attacker")
				require.ErrorIs(t, err, context.Canceled, "the caller returns when it cancels, not when the probe ends")
			} else {
				// A loaded machine can spend a caller's whole deadline
				// before its call reaches the breaker: such a call
				// neither reaches Redis nor probes (a ctx done before
				// the call does not count), and the caller tries again.
				for attempt := 0; !slices.Contains(h.seen(), "open>half-open"); attempt++ {
					require.Less(t, attempt, 100, "no call with a 10ms deadline reached the breaker")
					_, err = callWithin(l, "attacker", 10*time.Millisecond)
					require.ErrorIs(t, err, context.DeadlineExceeded, "the caller returns at its deadline, not the probe's")
				}
			}
			if c.paused {
				h.waitState(t, BreakerOpen, 30*time.Second, "the probe, given MinDeadline, fails and re-opens the breaker")
				require.Equal(t, []string{"closed>open", "open>half-open", "half-open>open"}, h.seen())
				return
			}
			h.waitState(t, BreakerClosed, 30*time.Second, "the probe outlives its caller and closes the breaker on a healthy Redis")
			_, err = callWithin(l, "honest", slowMachine)
			require.NoError(t, err, "an honest caller is decided")
			require.Equal(t, []string{"closed>open", "open>half-open", "half-open>closed"}, h.seen())
		})
	}
}

// A caller's deadline too short for any Redis ends its call, not the
// client's connection: go-redis drops a connection whose read timed out
// (its reply may still come), so without care every such call would cost a
// dial, and callers with 100µs deadlines would make the client reconnect
// thousands of times a second, slowing every other caller. The round trip
// runs on with MinDeadline and leaves its connection in the pool.
func TestShortDeadlinesKeepConnections(t *testing.T) {
	const poolSize = 8
	forEachBackend(t, func(t *testing.T, b backend) {
		var dials atomic.Int64
		o := RecommendedOptions(b.rdb.Options().Addr)
		o.DB, o.PoolSize = b.rdb.Options().DB, poolSize
		dial := b.rdb.Options().Dialer
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return dial(ctx, network, addr)
		}
		rdb := redis.NewClient(o)
		t.Cleanup(func() { rdb.Close() })
		// A round trip that outlasts MinDeadline is cut there, on purpose,
		// and costs a dial: a loaded machine makes a few. Those are
		// counted apart; a cut at the caller's deadline is far shorter.
		slow := &slowCalls{least: defaultBreakerMinDeadline / 2}
		rdb.AddHook(slow)
		for _, opts := range [][]Option{nil, {WithoutBreaker()}} {
			dials.Store(0)
			slow.n.Store(0)
			l, err := NewTokenBucket(rdb, 1_000_000, PerSecond(1_000_000), append(opts, WithPrefix(fmt.Sprintf("churn:%d:", time.Now().UnixNano())))...)
			require.NoError(t, err)
			timedOut := 0
			for i := range 300 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(5+i%50)*time.Microsecond)
				_, err := l.Allow(ctx, "k")
				cancel()
				if errors.Is(err, context.DeadlineExceeded) {
					timedOut++
				}
				// An attack, not a load test: real-time pacing, which lets
				// the round trips run on finish; no assertion times it.
				time.Sleep(time.Millisecond)
			}
			require.GreaterOrEqual(t, timedOut, 10*poolSize, "the calls must time out, or this test shows nothing")
			// One dial per timed-out call without care; with it, enough to
			// fill the pool, and one per round trip cut at MinDeadline.
			require.LessOrEqual(t, dials.Load(), int64(poolSize+4)+slow.n.Load(), "%d calls timed out, %d round trips outlasted %v: connections dialled", timedOut, slow.n.Load(), slow.least)
		}
	})
}

// slowCalls is a go-redis hook that counts the commands that took least
// or longer.
type slowCalls struct {
	least time.Duration
	n     atomic.Int64
}

func (h *slowCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *slowCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		if time.Since(start) >= h.least {
			h.n.Add(1)
		}
		return err
	}
}

func (h *slowCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Callers with short deadlines in a flood, more at once than the round
// trips that may run on (64 a limiter), on a link slower than every
// deadline: a call that finds none free by its deadline ends there without
// reaching Redis, so no connection is cut and none dialled. Such a call
// once ran on its own deadline, and go-redis dropped its connection.
func TestShortDeadlineFloodKeepsConnections(t *testing.T) {
	const poolSize, callers, calls = 200, 150, 8
	forEachBackend(t, func(t *testing.T, b backend) {
		proxy, err := faultproxy.Start(b.rdb.Options().Addr)
		require.NoError(t, err)
		t.Cleanup(func() { proxy.Close() })
		proxy.SetDelay(2 * time.Millisecond)
		var dials atomic.Int64
		rdb := redis.NewClient(&redis.Options{
			Addr: proxy.Addr(), DB: b.rdb.Options().DB, PoolSize: poolSize,
			ContextTimeoutEnabled: true, DisableIdentity: true,
			// Generous: only the callers' deadlines are meant to end calls,
			// however slowly a loaded machine answers the warm-up's.
			DialTimeout: slowMachine, ReadTimeout: slowMachine, WriteTimeout: slowMachine, PoolTimeout: slowMachine,
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				dials.Add(1)
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			},
		})
		t.Cleanup(func() { rdb.Close() })
		// Round trips run on get 10s, far more than they need, so that
		// none of them is cut: one cut there costs a connection too. With
		// 200ms, a loaded CI machine under -race dialled 110 times, as a
		// run here does with 10ms.
		breaker, err := NewBreaker(BreakerConfig{MinDeadline: 10 * time.Second})
		require.NoError(t, err)
		l, err := NewTokenBucket(rdb, 1_000_000, PerSecond(1_000_000), WithBreaker(breaker), WithPrefix(fmt.Sprintf("flood:%d:", time.Now().UnixNano())))
		require.NoError(t, err)
		// The connections the flood may use, dialled, and the script
		// loaded: a dial counted below is a connection cut.
		var wg sync.WaitGroup
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := l.Allow(context.Background(), "k")
				assert.NoError(t, err)
			}()
		}
		wg.Wait()
		dials.Store(0)
		var timedOut atomic.Int64
		for g := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range calls {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(300+(g*7+i*13)%1000)*time.Microsecond)
					_, err := l.Allow(ctx, "k")
					cancel()
					if errors.Is(err, context.DeadlineExceeded) {
						timedOut.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		require.GreaterOrEqual(t, timedOut.Load(), int64(callers*calls/2), "the calls must time out, or this test shows nothing")
		// Cut at their callers' deadlines, the calls beyond 64 cost about
		// one dial in three.
		require.LessOrEqual(t, dials.Load(), int64(32), "%d calls timed out: connections dialled (%d found stale)", timedOut.Load(), rdb.PoolStats().StaleConns)
	})
}
