package redlimit

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// noRefillAlgorithm builds a limiter that, for as long as a test runs, grants
// exactly limit permits per key and no more: windows last an hour, buckets
// regain one permit per hour. Time passing on the server's clock (these
// limiters read TIME, not a fake clock) then cannot add a permit, and a test
// can demand an exact count.
type noRefillAlgorithm struct {
	name string
	make func(rdb redis.Scripter, limit int) (Limiter, error)
}

func noRefillAlgorithms() []noRefillAlgorithm {
	return []noRefillAlgorithm{
		{"fixed_window", func(rdb redis.Scripter, limit int) (Limiter, error) {
			return NewFixedWindow(rdb, limit, time.Hour)
		}},
		{"sliding_window", func(rdb redis.Scripter, limit int) (Limiter, error) {
			// A permit leaves an hour window of minute buckets 59 minutes later at the earliest.
			return NewSlidingWindow(rdb, limit, time.Hour, time.Minute)
		}},
		{"sliding_log", func(rdb redis.Scripter, limit int) (Limiter, error) {
			return NewSlidingLog(rdb, time.Minute, []Strategy{
				{Limit: limit, Window: time.Hour},
				{Limit: 2 * limit, Window: 2 * time.Hour},
			})
		}},
		{"leaky_bucket", func(rdb redis.Scripter, limit int) (Limiter, error) {
			return NewLeakyBucket(rdb, limit, PerHour(1))
		}},
		{"token_bucket", func(rdb redis.Scripter, limit int) (Limiter, error) {
			return NewTokenBucket(rdb, limit, PerHour(1))
		}},
	}
}

// attempt is one AllowN made by a hammering goroutine.
type attempt struct {
	n      int
	result Result
	err    error
}

// Shape of the hammering: separate clients stand for separate service
// instances, each with its own connection pool and its own limiter.
const (
	hammerClients    = 4
	hammerGoroutines = 25 // per client
	hammerAttempts   = 10 // per goroutine
)

// hammer makes every goroutine of every limiter call AllowN on key
// hammerAttempts times, all starting together, with n from nextN, and
// returns every call made.
func hammer(limiters []Limiter, key string, nextN func(r *rand.Rand) int, seed uint64) []attempt {
	start := make(chan struct{})
	var (
		mu    sync.Mutex
		calls []attempt
		wg    sync.WaitGroup
	)
	for c, l := range limiters {
		for g := range hammerGoroutines {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(seed, uint64(c*hammerGoroutines+g)))
				mine := make([]attempt, 0, hammerAttempts)
				<-start
				for range hammerAttempts {
					n := nextN(r)
					res, err := l.AllowN(context.Background(), key, n)
					mine = append(mine, attempt{n: n, result: res, err: err})
				}
				mu.Lock()
				calls = append(calls, mine...)
				mu.Unlock()
			})
		}
	}
	close(start)
	wg.Wait()
	return calls
}

// hammerLimiters returns one limiter of alg per client, each client a
// separate go-redis client with its own pool, on the shared redis-server.
// The key is reset first, so that -count=N reruns start fresh.
func hammerLimiters(t *testing.T, alg noRefillAlgorithm, limit int, key string) []Limiter {
	t.Helper()
	addr := redistest.Addr(t)
	limiters := make([]Limiter, hammerClients)
	for i := range limiters {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { rdb.Close() })
		l, err := alg.make(rdb, limit)
		require.NoError(t, err, "constructing %s with limit %d", alg.name, limit)
		limiters[i] = l
	}
	require.NoError(t, limiters[0].Reset(context.Background(), key), "resetting %q before the test", key)
	return limiters
}

// requireSerial checks that the allowed calls are consistent with some serial
// order: ordered by what each reports consumed (limit - Remaining), every
// allowed call of n consumed exactly n more than the one before it, starting
// from nothing. Two calls that saw the same state, or a grant that was lost,
// break the chain. It returns the permits granted in total.
func requireSerial(t *testing.T, limit int, calls []attempt) int {
	t.Helper()
	var allowed []attempt
	for _, c := range calls {
		if c.result.Allowed {
			allowed = append(allowed, c)
		}
	}
	slices.SortStableFunc(allowed, func(a, b attempt) int {
		return cmp.Compare(b.result.Remaining, a.result.Remaining)
	})
	consumed := 0
	for i, c := range allowed {
		consumed += c.n
		require.Equal(t, limit-consumed, c.result.Remaining,
			"allowed call %d of %d (n=%d) in serial order: want Remaining = limit %d - %d consumed so far; two calls saw the same state or a grant went unrecorded",
			i+1, len(allowed), c.n, limit, consumed)
	}
	return consumed
}

// TestConcurrentExactLimit: 100 goroutines over 4 clients, one key, 1000
// calls for one permit each, and exactly limit are granted.
func TestConcurrentExactLimit(t *testing.T) {
	const limit = 137 // well under the 1000 attempts, so most are denied
	for _, alg := range noRefillAlgorithms() {
		t.Run(alg.name, func(t *testing.T) {
			key := t.Name()
			limiters := hammerLimiters(t, alg, limit, key)

			calls := hammer(limiters, key, func(*rand.Rand) int { return 1 }, 0)

			require.Len(t, calls, hammerClients*hammerGoroutines*hammerAttempts, "every attempt must be recorded")
			admitted := 0
			for i, c := range calls {
				require.NoError(t, c.err, "call %d: every call must be decided", i)
				require.Equal(t, limit, c.result.Limit, "call %d: Limit must be the configured limit", i)
				if c.result.Allowed {
					admitted++
					require.Zero(t, c.result.RetryAfter, "call %d: an allowed call has RetryAfter 0", i)
					continue
				}
				require.Zero(t, c.result.Remaining, "call %d: a denial of one permit must see none remaining", i)
				require.Positive(t, c.result.RetryAfter, "call %d: a denial of one permit must say when to retry", i)
			}
			require.Equal(t, limit, admitted, "exactly limit permits must be granted across %d clients × %d goroutines", hammerClients, hammerGoroutines)
			require.Equal(t, limit, requireSerial(t, limit, calls), "the serial order of grants must account for every permit")

			state, err := limiters[1].AllowN(context.Background(), key, 0)
			require.NoError(t, err, "reading the final state")
			require.Zero(t, state.Remaining, "after limit grants none must remain")
		})
	}
}

// TestConcurrentAllowN: as TestConcurrentExactLimit, with random n in 1..3.
// All or nothing under contention: the granted total never passes the limit,
// and a request is denied only when fewer than n permits were left.
func TestConcurrentAllowN(t *testing.T) {
	const limit = 301 // the ~2000 permits asked for are far more
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, alg := range noRefillAlgorithms() {
		t.Run(alg.name, func(t *testing.T) {
			key := t.Name()
			limiters := hammerLimiters(t, alg, limit, key)

			calls := hammer(limiters, key, func(r *rand.Rand) int { return 1 + r.IntN(3) }, seed)

			require.Len(t, calls, hammerClients*hammerGoroutines*hammerAttempts, "every attempt must be recorded")
			granted, smallestDenied := 0, 0
			for i, c := range calls {
				require.NoError(t, c.err, "call %d (n=%d): every call must be decided", i, c.n)
				require.Equal(t, limit, c.result.Limit, "call %d (n=%d): Limit must be the configured limit", i, c.n)
				if c.result.Allowed {
					granted += c.n
					require.Zero(t, c.result.RetryAfter, "call %d (n=%d): an allowed call has RetryAfter 0", i, c.n)
					continue
				}
				require.Less(t, c.result.Remaining, c.n, "call %d (n=%d): denied while enough permits remained", i, c.n)
				require.Positive(t, c.result.RetryAfter, "call %d (n=%d): a denial within capacity must say when to retry", i, c.n)
				if smallestDenied == 0 || c.n < smallestDenied {
					smallestDenied = c.n
				}
			}
			require.LessOrEqual(t, granted, limit, "permits granted must never exceed the limit")
			require.NotZero(t, smallestDenied, "asking for ~2000 permits of %d must see denials", limit)
			// Nothing refills, so a denial of n means fewer than n remain
			// from then on.
			require.Greater(t, granted+smallestDenied, limit,
				"a request for %d was denied, yet %d of %d permits were never granted", smallestDenied, limit-granted, limit)
			require.Equal(t, granted, requireSerial(t, limit, calls), "the serial order of grants must account for every permit")

			state, err := limiters[2].AllowN(context.Background(), key, 0)
			require.NoError(t, err, "reading the final state")
			require.Equal(t, limit-granted, state.Remaining, "the final state must hold exactly the permits not granted")
		})
	}
}
