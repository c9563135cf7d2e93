package redlimit

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

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
// separate go-redis client with its own pool, on a database of the shared
// redis-server of their own. The limiters grant exactly limit permits per
// key for as long as the test runs (they read the server's TIME, and
// nothing refills within forever), so a test can demand an exact count.
func hammerLimiters(t *testing.T, alg algorithm, limit int) []Limiter {
	t.Helper()
	addr, db := redistest.DB(t)
	limiters := make([]Limiter, hammerClients)
	for i := range limiters {
		l, err := alg.new(newClient(t, addr, db), limit, forever)
		require.NoError(t, err, "constructing %s with limit %d", alg.name, limit)
		limiters[i] = l
	}
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
	t.Parallel()
	const limit = 137 // well under the 1000 attempts, so most are denied
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			key := t.Name()
			limiters := hammerLimiters(t, alg, limit)

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
	t.Parallel()
	const limit = 301 // the ~2000 permits asked for are far more
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			key := t.Name()
			limiters := hammerLimiters(t, alg, limit)

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
