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

// soakLimiter is one limiter of the soak test: alg.new(rdb, limit, period,
// opts...).
type soakLimiter struct {
	name   string
	alg    algorithm
	limit  int
	period time.Duration
	opts   []Option
}

func (s soakLimiter) make(rdb redis.Scripter) (Limiter, error) {
	return s.alg.new(rdb, s.limit, s.period, s.opts...)
}

// soakCeilDiv is ceil(a / b) for durations a >= 0, b > 0.
func soakCeilDiv(a, b time.Duration) int { return int((a + b - 1) / b) }

// windows returns the limiter's windows and their limits (the registry's:
// the sliding log adds 2×limit per 10×period), for the windowed algorithms.
func (s soakLimiter) windows() (limits []int, windows []time.Duration) {
	if s.alg.name == "sliding_log" {
		return []int{s.limit, 2 * s.limit}, []time.Duration{s.period, 10 * s.period}
	}
	return []int{s.limit}, []time.Duration{s.period}
}

// bound is the most permits the limiter may grant one key in any interval
// of d on the server's clock.
func (s soakLimiter) bound(d time.Duration) int {
	switch s.alg.name {
	case "fixed_window":
		// An interval meets at most ceil(d/W)+1 windows.
		return s.limit * (soakCeilDiv(d, s.period) + 1)
	case "sliding_window", "sliding_log":
		// Two grants less than W-P apart fall in one window of buckets.
		limits, windows := s.windows()
		most := -1
		for i, w := range windows {
			if n := limits[i] * soakCeilDiv(d, w-s.period/10); most < 0 || n < most {
				most = n
			}
		}
		return most
	default:
		// A full bucket, plus what d brings.
		return s.limit + int(int64(d)*int64(s.limit)/int64(s.period))
	}
}

// spans are the interval lengths checked, besides the whole run.
func (s soakLimiter) spans() []time.Duration {
	switch s.alg.name {
	case "fixed_window":
		return []time.Duration{s.period}
	case "sliding_window", "sliding_log":
		_, windows := s.windows()
		var spans []time.Duration
		for _, w := range windows {
			spans = append(spans, w-s.period/10)
		}
		return spans
	default:
		return []time.Duration{100 * time.Millisecond, time.Second}
	}
}

// soakLimiters use short windows and rates, so that keys expire within a
// few seconds of the end (a key lives at most a recovery after its last
// call).
func soakLimiters() []soakLimiter {
	byName := map[string]algorithm{}
	for _, a := range algorithms {
		byName[a.name] = a
	}
	return []soakLimiter{
		{name: "fixed_window", alg: byName["fixed_window"], limit: 10, period: 300 * time.Millisecond},
		{name: "sliding_window", alg: byName["sliding_window"], limit: 10, period: 500 * time.Millisecond},
		{name: "sliding_log", alg: byName["sliding_log"], limit: 5, period: 200 * time.Millisecond},
		{name: "leaky_bucket", alg: byName["leaky_bucket"], limit: 10, period: 500 * time.Millisecond},
		{name: "token_bucket", alg: byName["token_bucket"], limit: 10, period: 500 * time.Millisecond},
		{name: "token_bucket+deny_cache", alg: byName["token_bucket"], limit: 7, period: time.Second,
			opts: []Option{WithPrefix("soak:tbdc:"), WithDenyCache(1000)}},
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
	time.Sleep(100 * time.Millisecond) // Redis frees memory in real time; a baseline, not a check
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
		// The soak runs for real time (REDLIMIT_SOAK); these are its checkpoints.
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
			for _, span := range append(s.spans(), whole) {
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
		longest = max(longest, s.alg.recovery(s.period))
	}
	// Real Redis TTLs expire in real time: this is what the soak checks.
	// Redis expires keys in a background cycle that a loaded machine
	// slows, so the minute after the last TTL only stops a key that never
	// expires.
	time.Sleep(longest)
	const expiryGrace = time.Minute
	deadline := time.Now().Add(expiryGrace)
	for admin.DBSize(ctx).Val() > 0 {
		require.True(t, time.Now().Before(deadline), "%d keys still in Redis %v after the last TTL: some key never expires", admin.DBSize(ctx).Val(), expiryGrace)
		time.Sleep(50 * time.Millisecond) // polling: nothing signals an expiry
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
