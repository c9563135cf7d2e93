package redlimit

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// soakEnv holds how long TestSoak runs ("60s"); unset, it is skipped.
const soakEnv = "REDLIMIT_SOAK"

// soakLimiter is one limiter of the soak test and what it may grant.
type soakLimiter struct {
	name string
	make func(rdb redis.Scripter) (Limiter, error)
	// bound is the most permits the limiter may grant one key in any
	// interval of d on the server's clock.
	bound func(d time.Duration) int
	// spans are the interval lengths checked, besides the whole run.
	spans []time.Duration
	// ttl is the longest a key may live after its last call.
	ttl time.Duration
}

// soakCeilDiv is ceil(a / b) for durations a >= 0, b > 0.
func soakCeilDiv(a, b time.Duration) int { return int((a + b - 1) / b) }

// soakRate is the most a bucket of capacity refilled (or drained) at count
// per per grants in d: a full bucket, plus what d brings.
func soakRate(capacity, count int, per time.Duration) func(time.Duration) int {
	return func(d time.Duration) int { return capacity + int(int64(d)*int64(count)/int64(per)) }
}

// soakLimiters use short windows and rates, so that keys expire within a
// second or two of the end.
func soakLimiters() []soakLimiter {
	const fwLimit, fwWindow = 10, 300 * time.Millisecond
	const swLimit, swWindow, swPrecision = 10, 500 * time.Millisecond, 50 * time.Millisecond
	const slPrecision = 50 * time.Millisecond
	slStrategies := []Strategy{{Limit: 5, Window: 200 * time.Millisecond}, {Limit: 12, Window: time.Second}}
	return []soakLimiter{
		{
			name: "fixed_window",
			make: func(rdb redis.Scripter) (Limiter, error) { return NewFixedWindow(rdb, fwLimit, fwWindow) },
			// An interval meets at most ceil(d/W)+1 windows.
			bound: func(d time.Duration) int { return fwLimit * (soakCeilDiv(d, fwWindow) + 1) },
			spans: []time.Duration{fwWindow},
			ttl:   fwWindow,
		},
		{
			name: "sliding_window",
			make: func(rdb redis.Scripter) (Limiter, error) {
				return NewSlidingWindow(rdb, swLimit, swWindow, swPrecision)
			},
			// Two grants less than W-P apart fall in one window of buckets.
			bound: func(d time.Duration) int { return swLimit * soakCeilDiv(d, swWindow-swPrecision) },
			spans: []time.Duration{swWindow - swPrecision},
			ttl:   swWindow,
		},
		{
			name: "sliding_log",
			make: func(rdb redis.Scripter) (Limiter, error) { return NewSlidingLog(rdb, slPrecision, slStrategies) },
			bound: func(d time.Duration) int {
				b := -1
				for _, s := range slStrategies {
					if n := s.Limit * soakCeilDiv(d, s.Window-slPrecision); b < 0 || n < b {
						b = n
					}
				}
				return b
			},
			spans: []time.Duration{slStrategies[0].Window - slPrecision, slStrategies[1].Window - slPrecision},
			ttl:   slStrategies[1].Window,
		},
		{
			name:  "leaky_bucket",
			make:  func(rdb redis.Scripter) (Limiter, error) { return NewLeakyBucket(rdb, 10, PerSecond(20)) },
			bound: soakRate(10, 20, time.Second),
			spans: []time.Duration{100 * time.Millisecond, time.Second},
			ttl:   time.Second / 2,
		},
		{
			name:  "token_bucket",
			make:  func(rdb redis.Scripter) (Limiter, error) { return NewTokenBucket(rdb, 10, PerSecond(20)) },
			bound: soakRate(10, 20, time.Second),
			spans: []time.Duration{100 * time.Millisecond, time.Second},
			ttl:   time.Second / 2,
		},
		{
			name: "token_bucket+deny_cache",
			make: func(rdb redis.Scripter) (Limiter, error) {
				return NewTokenBucket(rdb, 5, PerSecond(7), WithPrefix("soak:tbdc:"), WithDenyCache(1000))
			},
			bound: soakRate(5, 7, time.Second),
			spans: []time.Duration{100 * time.Millisecond, time.Second},
			ttl:   time.Second * 5 / 7,
		},
	}
}

// soakGrant is one allowed call: n permits decided at a server time between
// start and end (Unix ns: Redis TIME and time.Now read the same clock).
type soakGrant struct {
	start, end int64
	n          int
}

// TestSoak runs for $REDLIMIT_SOAK (say 60s): 200 goroutines over four
// clients hit six limiters (every algorithm, one with a deny cache) on
// thousands of keys, some hot, most cold, with n of 0 to 3. At the end every
// key's grants are checked against its limiter's bound over every interval,
// no key may lack a TTL, and once the TTLs have passed Redis must be back to
// an empty keyspace and its baseline memory.
func TestSoak(t *testing.T) {
	raw := os.Getenv(soakEnv)
	if raw == "" {
		t.Skipf("soak test: set %s=60s to run it", soakEnv)
	}
	duration, err := time.ParseDuration(raw)
	require.NoError(t, err, "%s=%q: want a duration such as 60s", soakEnv, raw)

	const (
		clients    = 4
		perClient  = 50 // 200 goroutines
		hotKeys    = 20
		coldKeys   = 3000
		hotPercent = 30
	)
	srv := redistest.Start(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1})
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()

	specs := soakLimiters()
	var rdbs []*redis.Client
	sets := make([][]Limiter, clients)
	for c := range clients {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: perClient, ContextTimeoutEnabled: true})
		rdbs = append(rdbs, rdb)
		for _, s := range specs {
			l, err := s.make(rdb)
			require.NoError(t, err, "constructing %s", s.name)
			sets[c] = append(sets[c], l)
		}
	}
	// Baseline: scripts loaded, no keys, no load clients connected.
	for _, l := range sets[0] {
		_, err := l.Allow(ctx, "warmup")
		require.NoError(t, err)
	}
	require.NoError(t, rdbs[0].Close())
	rdbs[0] = redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: perClient, ContextTimeoutEnabled: true})
	sets[0] = nil
	for _, s := range specs {
		l, err := s.make(rdbs[0])
		require.NoError(t, err)
		sets[0] = append(sets[0], l)
	}
	require.NoError(t, admin.FlushAll(ctx).Err())
	time.Sleep(100 * time.Millisecond)
	baseline := relInfoInt(t, admin, "memory", "used_memory")

	keyName := func(i int) string {
		if i < hotKeys {
			return fmt.Sprintf("hot:%d", i)
		}
		return fmt.Sprintf("cold:%d", i-hotKeys)
	}
	// grants[limiter][key index], merged from every goroutine at the end.
	type local struct {
		grants        [][][]soakGrant
		calls, errors int
		firstErr      error
	}
	var (
		mu      sync.Mutex
		merged  []*local
		stop    atomic.Bool
		wg      sync.WaitGroup
		started = time.Now()
	)
	for c := range clients {
		for g := range perClient {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(c), uint64(g)))
				mine := &local{grants: make([][][]soakGrant, len(specs))}
				for i := range mine.grants {
					mine.grants[i] = make([][]soakGrant, hotKeys+coldKeys)
				}
				defer func() {
					mu.Lock()
					merged = append(merged, mine)
					mu.Unlock()
				}()
				for !stop.Load() {
					alg := r.IntN(len(specs))
					k := hotKeys + r.IntN(coldKeys)
					if r.IntN(100) < hotPercent {
						k = r.IntN(hotKeys)
					}
					n := 1
					switch x := r.IntN(20); {
					case x == 0:
						n = 0
					case x <= 2:
						n = 2 + r.IntN(2)
					}
					callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
					start := time.Now().UnixNano()
					res, err := sets[c][alg].AllowN(callCtx, keyName(k), n)
					end := time.Now().UnixNano()
					cancel()
					mine.calls++
					if err != nil {
						mine.errors++
						if mine.firstErr == nil {
							mine.firstErr = err
						}
						continue
					}
					if res.Allowed && n > 0 {
						mine.grants[alg][k] = append(mine.grants[alg][k], soakGrant{start, end, n})
					}
				}
			})
		}
	}

	// While it runs: no key without a TTL, and how big Redis gets.
	var peakKeys, peakMemory int64
	for time.Since(started) < duration {
		time.Sleep(min(5*time.Second, duration-time.Since(started)+time.Millisecond))
		soakRequireTTLs(t, admin, 500)
		peakKeys = max(peakKeys, admin.DBSize(ctx).Val())
		peakMemory = max(peakMemory, relInfoInt(t, admin, "memory", "used_memory"))
	}
	stop.Store(true)
	wg.Wait()
	ran := time.Since(started)
	soakRequireTTLs(t, admin, -1)
	for _, rdb := range rdbs {
		require.NoError(t, rdb.Close())
	}

	var calls, errs int
	var firstErr error
	for _, m := range merged {
		calls += m.calls
		errs += m.errors
		if firstErr == nil {
			firstErr = m.firstErr
		}
	}
	t.Logf("soak: %v, %d goroutines, %d calls (%.0f/s), %d errors (first: %v); peak %d keys, %d KiB used (baseline %d KiB)",
		ran.Round(time.Millisecond), clients*perClient, calls, float64(calls)/ran.Seconds(), errs, firstErr, peakKeys, peakMemory>>10, baseline>>10)
	require.Zero(t, errs, "no fault was injected: every call must be decided")

	for alg, s := range specs {
		var granted, keys, checks, tightest int
		tightestSpan := time.Duration(0)
		for k := range hotKeys + coldKeys {
			var grants []soakGrant
			for _, m := range merged {
				grants = append(grants, m.grants[alg][k]...)
			}
			if len(grants) == 0 {
				continue
			}
			keys++
			slices.SortFunc(grants, func(a, b soakGrant) int { return cmp.Compare(a.start, b.start) })
			whole := time.Duration(grants[len(grants)-1].end-grants[0].start) + 1
			for _, span := range append(slices.Clone(s.spans), whole) {
				most, at := soakMostIn(grants, span)
				checks++
				require.LessOrEqual(t, most, s.bound(span),
					"%s key %s: %d permits granted in %v starting at %v, bound %d", s.name, keyName(k), most, span, time.Unix(0, at).Format(time.RFC3339Nano), s.bound(span))
				if span != whole && most*100/s.bound(span) > tightest {
					tightest, tightestSpan = most*100/s.bound(span), span
				}
			}
			for _, g := range grants {
				granted += g.n
			}
		}
		t.Logf("%-24s %7d permits granted on %4d keys; %d interval checks; fullest interval %d%% of its bound (%v)", s.name, granted, keys, checks, tightest, tightestSpan)
		require.Positive(t, tightest, "%s: no key was ever busy: the bounds were not tested", s.name)
	}

	// Every TTL passes, and Redis forgets everything.
	var longest time.Duration
	for _, s := range specs {
		longest = max(longest, s.ttl)
	}
	time.Sleep(longest)
	deadline := time.Now().Add(10 * time.Second)
	for admin.DBSize(ctx).Val() > 0 {
		require.True(t, time.Now().Before(deadline), "%d keys still in Redis %v after the last TTL: some key never expires", admin.DBSize(ctx).Val(), 10*time.Second)
		time.Sleep(50 * time.Millisecond)
	}
	used := relInfoInt(t, admin, "memory", "used_memory")
	t.Logf("after the TTLs: 0 keys, %d KiB used (baseline %d KiB, peak %d KiB)", used>>10, baseline>>10, peakMemory>>10)
	require.LessOrEqual(t, used, baseline+512<<10, "used_memory must return to its baseline once every key expired")
}

// soakMostIn returns the most permits granted in an interval of span that
// starts at a grant's start, counting only grants that surely fell inside
// (started at or after it, ended before its end), and where that was.
func soakMostIn(grants []soakGrant, span time.Duration) (most int, at int64) {
	for i, first := range grants {
		limit := first.start + int64(span)
		sum := 0
		for _, g := range grants[i:] {
			if g.start >= limit {
				break
			}
			if g.end < limit {
				sum += g.n
			}
		}
		if sum > most {
			most, at = sum, first.start
		}
	}
	return most, at
}

// soakRequireTTLs checks that no key lacks a TTL, looking at up to count
// keys (all when count < 0).
func soakRequireTTLs(t *testing.T, admin *redis.Client, count int) {
	t.Helper()
	ctx := context.Background()
	var cursor uint64
	seen := 0
	for {
		keys, next, err := admin.Scan(ctx, cursor, "*", 500).Result()
		require.NoError(t, err)
		pipe := admin.Pipeline()
		ttls := make([]*redis.DurationCmd, len(keys))
		for i, k := range keys {
			ttls[i] = pipe.PTTL(ctx, k)
		}
		_, err = pipe.Exec(ctx)
		require.NoError(t, err)
		for i, c := range ttls {
			// -2: expired between SCAN and PTTL; -1: no TTL.
			require.NotEqual(t, time.Duration(-1), c.Val(), "key %q has no TTL: it would live forever", keys[i])
		}
		seen += len(keys)
		cursor = next
		if cursor == 0 || (count >= 0 && seen >= count) {
			return
		}
	}
}
