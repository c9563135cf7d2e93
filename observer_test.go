package redlimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// decisionLog is an observer that keeps every Decision, safe for concurrent use.
type decisionLog struct {
	mu        sync.Mutex
	decisions []Decision
}

func (l *decisionLog) observe(d Decision) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.decisions = append(l.decisions, d)
}

// take returns the decisions seen since the last take.
func (l *decisionLog) take() []Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.decisions
	l.decisions = nil
	return d
}

// requireOneDecision checks that one call was observed once, as it returned.
func requireOneDecision(t *testing.T, log *decisionLog, alg, key string, n int, res Result, err error, what string) Decision {
	t.Helper()
	seen := log.take()
	require.Len(t, seen, 1, "%s: the observer should be told of the call exactly once", what)
	d := seen[0]
	require.Equal(t, alg, d.Algorithm, "%s: Algorithm", what)
	require.Equal(t, key, d.Key, "%s: Key, the caller's, without prefix", what)
	require.Equal(t, n, d.N, "%s: N", what)
	require.Equal(t, res, d.Result, "%s: Result, as the call returned it", what)
	require.Positive(t, d.Latency, "%s: Latency should be measured", what)
	require.False(t, d.Local, "%s: no deny cache, so nothing is answered locally", what)
	if err == nil {
		require.NoError(t, d.Err, "%s: Err should be nil when a decision was made", what)
	} else {
		require.Error(t, d.Err, "%s: Err should be set when no decision was made", what)
		require.Equal(t, err.Error(), d.Err.Error(), "%s: Err should be the error the call returned", what)
		require.Equal(t, Result{}, d.Result, "%s: Result should be zero when Err is set", what)
	}
	return d
}

func TestObserver(t *testing.T) {
	t.Parallel()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				b.keepKeys() // a fake clock: its TTLs, seconds at most, would pass in real time
				log := &decisionLog{}
				clock := newClock()
				l, err := alg.new(b.rdb, 3, 10*time.Second, WithClock(clock.Now), WithObserver(log.observe))
				require.NoError(t, err)
				ctx := context.Background()

				calls := []struct {
					name    string
					key     string
					n       int
					wantErr error // a sentinel the error must match, or nil
				}{
					{name: "allowed", key: "user", n: 1},
					{name: "two", key: "user", n: 2},
					{name: "denied", key: "user", n: 1},
					{name: "n == 0", key: "user", n: 0},
					{name: "above capacity", key: "user", n: 4},
					{name: "other key", key: "other", n: 3},
					{name: "negative n", key: "user", n: -1, wantErr: ErrInvalidArgument},
					{name: "empty key", key: "", n: 1, wantErr: ErrInvalidArgument},
				}
				for _, c := range calls {
					t.Run(c.name, func(t *testing.T) {
						clock.Advance(time.Millisecond)
						res, err := l.AllowN(ctx, c.key, c.n)
						if c.wantErr != nil {
							require.ErrorIs(t, err, c.wantErr, "AllowN(%q, %d)", c.key, c.n)
						} else {
							require.NoError(t, err, "AllowN(%q, %d)", c.key, c.n)
						}
						requireOneDecision(t, log, alg.name, c.key, c.n, res, err, fmt.Sprintf("AllowN(%q, %d)", c.key, c.n))
					})
				}

				t.Run("Allow", func(t *testing.T) {
					res, err := l.Allow(ctx, "third")
					require.NoError(t, err)
					require.True(t, res.Allowed, "a fresh key allows 1")
					requireOneDecision(t, log, alg.name, "third", 1, res, nil, "Allow")
				})
				t.Run("TryAcquire", func(t *testing.T) {
					// TryAcquire returns no Result; the observer still sees one.
					require.NoError(t, l.TryAcquire(ctx, "third"), "a second permit of 3")
					seen := log.take()
					require.Len(t, seen, 1, "TryAcquire should be observed once")
					require.Equal(t, Decision{Algorithm: alg.name, Key: "third", N: 1, Latency: seen[0].Latency,
						Result: Result{Allowed: true, Limit: 3, Remaining: 1, ResetAfter: seen[0].Result.ResetAfter, Grant: seen[0].Result.Grant}}, seen[0],
						"TryAcquire's Decision")
					require.Positive(t, seen[0].Latency, "Latency should be measured")

					require.ErrorIs(t, l.TryAcquire(ctx, "user"), ErrAcquireFailed, "user is spent")
					seen = log.take()
					require.Len(t, seen, 1, "a denied TryAcquire should be observed once")
					require.False(t, seen[0].Result.Allowed, "the observer should see TryAcquire's denial")
					require.NoError(t, seen[0].Err, "a denial is a decision: no Err")
				})
				t.Run("Refund", func(t *testing.T) {
					res, err := l.AllowN(ctx, "refund", 2)
					require.NoError(t, err)
					log.take()
					require.NoError(t, res.Grant.Refund(ctx, 1))
					seen := log.take()
					require.Len(t, seen, 1, "a refund should be observed once")
					look, err := l.AllowN(ctx, "refund", 0)
					require.NoError(t, err)
					log.take()
					require.True(t, seen[0].Refund)
					require.Equal(t, 1, seen[0].N)
					require.Equal(t, look, seen[0].Result, "a refund's Result: the key's state after it, as n == 0 sees it")
				})
				t.Run("Reset is no decision", func(t *testing.T) {
					require.NoError(t, l.Reset(ctx, "user"))
					require.Empty(t, log.take(), "Reset decides nothing and should not be observed")
				})
			})
		})
	}
}

func TestObserverRedisDown(t *testing.T) {
	t.Parallel()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			log := &decisionLog{}
			l, err := alg.new(deadRedis(t, "", 0), 3, 10*time.Second, WithObserver(log.observe))
			require.NoError(t, err)
			ctx := context.Background()

			res, err := l.AllowN(ctx, "user", 2)
			require.Error(t, err, "AllowN with Redis down should fail")
			require.False(t, errors.Is(err, ErrAcquireFailed), "Redis down is no denial: %v", err)
			require.Equal(t, Result{}, res, "no decision, zero Result")
			d := requireOneDecision(t, log, alg.name, "user", 2, res, err, "AllowN with Redis down")
			require.ErrorIs(t, d.Err, err, "the observer should get the very error the caller got")

			err = l.TryAcquire(ctx, "user")
			require.Error(t, err, "TryAcquire with Redis down should fail")
			requireOneDecision(t, log, alg.name, "user", 1, Result{}, err, "TryAcquire with Redis down")
		})
	}
}

func TestObserverConcurrent(t *testing.T) {
	// Run with -race: the observer is called from every calling goroutine.
	t.Parallel()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				log := &decisionLog{}
				l, err := alg.new(b.rdb, 3, 10*time.Second, WithObserver(log.observe), WithDenyCache(4))
				require.NoError(t, err)
				const goroutines, perGoroutine = 8, 25
				var wg sync.WaitGroup
				var mu sync.Mutex
				returned := map[string]int{} // "key allowed" -> calls
				for g := range goroutines {
					wg.Add(1)
					go func() {
						defer wg.Done()
						key := fmt.Sprintf("k%d", g%3)
						for range perGoroutine {
							res, err := l.Allow(context.Background(), key)
							if err != nil {
								t.Errorf("Allow(%q): %v", key, err)
								return
							}
							mu.Lock()
							returned[fmt.Sprint(key, " ", res.Allowed)]++
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				seen := log.take()
				require.Len(t, seen, goroutines*perGoroutine, "one Decision per call")
				observed := map[string]int{}
				for _, d := range seen {
					require.Equal(t, alg.name, d.Algorithm)
					require.NoError(t, d.Err)
					require.Positive(t, d.Latency, "Latency should be measured")
					observed[fmt.Sprint(d.Key, " ", d.Result.Allowed)]++
				}
				require.Equal(t, returned, observed, "the decisions observed should be the ones returned, key by key")
			})
		})
	}
}
