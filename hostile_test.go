package redlimit

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// Regression tests for an adversarial probe of the limiters (issue 8):
// values other applications write, and Redis refusing writes.

// foreignStrings are values another application may keep at a key: small
// counters, timestamps in seconds, milliseconds, microseconds and
// nanoseconds, numbers of every length, and text. None was written by
// redlimit.
var foreignStrings = []string{
	"0", "1", "42", "-5", "1.5", "", "abc", "1234567890",
	"1800000000", "1800000000000", "1800000000000000", "1800000000000000000",
	"1180000000000000003", "9223372036854775807", "18000000000000002+0/2",
	"1 2", "m",
}

// shapedStrings have exactly the shape of a redlimit state (a 16-digit
// microsecond time and a tag; with a count before it for a fixed window).
// Without a TTL they are still foreign; with one, they are the one case
// the README says is taken for state.
var shapedStrings = []string{
	"18000000000000001", "18000000000000002", "118000000000000003",
	"18000000000000002+1/2",
}

// A value redlimit did not write is never taken for state: every call on it
// is ErrForeignState, and the key keeps its value and TTL. Without a TTL,
// for every value; with one, for every value whose shape is not exactly a
// redlimit state (a 16-digit microsecond time and the algorithm's tag).
func TestForeignValuesNeverTaken(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		decided := 0
		cases := 0
		check := func(t *testing.T, alg string, l Limiter, key, what string) {
			t.Helper()
			call := strings.TrimPrefix(key, keyPrefix(l))
			typ := b.rdb.Type(ctx, key).Val()
			dump := b.rdb.Dump(ctx, key).Val()
			ttl := b.rdb.PTTL(ctx, key).Val()
			for _, n := range []int{0, 1, 1000} {
				cases++
				r, err := l.AllowN(ctx, call, n)
				if !assert.ErrorIs(t, err, ErrForeignState, "%s on %s, n=%d: decided %+v", alg, what, n, r) {
					decided++
				}
				require.Equal(t, typ, b.rdb.Type(ctx, key).Val(), "%s on %s: type unchanged", alg, what)
				require.Equal(t, dump, b.rdb.Dump(ctx, key).Val(), "%s on %s: value unchanged", alg, what)
				after := b.rdb.PTTL(ctx, key).Val()
				if ttl < 0 {
					require.Equal(t, ttl, after, "%s on %s: still no TTL", alg, what)
				} else {
					require.LessOrEqual(t, after, ttl, "%s on %s: TTL not extended", alg, what)
				}
			}
		}
		for _, a := range algorithms {
			l, err := a.new(b.rdb, 3, 10*time.Second, WithPrefix(""))
			require.NoError(t, err)
			for i, v := range append(foreignStrings, shapedStrings...) {
				for _, ttl := range []time.Duration{0, time.Hour} {
					if ttl > 0 && i >= len(foreignStrings) {
						continue
					}
					key := fmt.Sprintf("app:%s:%d:%v", a.name, i, ttl)
					require.NoError(t, b.rdb.Set(ctx, key, v, ttl).Err())
					check(t, a.name, l, key, fmt.Sprintf("%q (TTL %v)", v, ttl))
				}
			}
			key := "app:hash:" + a.name
			require.NoError(t, b.rdb.HSet(ctx, key, "m", "1 1 1 -1 0 -1 0", "visits", "3").Err())
			check(t, a.name, l, key, "a hash")
			key = "app:list:" + a.name
			require.NoError(t, b.rdb.RPush(ctx, key, "a").Err())
			check(t, a.name, l, key, "a list")

			// Each other algorithm's state, written through a shared prefix.
			for _, other := range algorithms {
				if other.name == a.name {
					continue
				}
				o, err := other.new(b.rdb, 3, 10*time.Second, WithPrefix("shared:"))
				require.NoError(t, err)
				key := "shared:" + a.name + ":" + other.name
				_, err = o.Allow(ctx, a.name+":"+other.name)
				require.NoError(t, err)
				l, err := a.new(b.rdb, 3, 10*time.Second, WithPrefix("shared:"))
				require.NoError(t, err)
				check(t, a.name, l, key, other.name+"'s state")
			}
		}
		t.Logf("%s: %d of %d calls on foreign values were decided", b.name, decided, cases)
	})
}

// oomCase is a key that a first limiter exhausts, and the limiter that asks
// it again once Redis refuses writes: the same configuration, or one deployed
// after it. Every configuration recovers in no less than an hour, so every
// call after the first phase is a denial.
type oomCase struct {
	name        string
	first, then func(rdb redis.Scripter, opts ...Option) (Limiter, error)
}

func oomCases() []oomCase {
	fw := func(limit int, window time.Duration) func(redis.Scripter, ...Option) (Limiter, error) {
		return func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewFixedWindow(rdb, limit, window, opts...)
		}
	}
	sw := func(precision time.Duration) func(redis.Scripter, ...Option) (Limiter, error) {
		return func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingWindow(rdb, 6, time.Hour, precision, opts...)
		}
	}
	sl := func(precision time.Duration, s ...Strategy) func(redis.Scripter, ...Option) (Limiter, error) {
		return func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingLog(rdb, precision, s, opts...)
		}
	}
	lb := func(c int) func(redis.Scripter, ...Option) (Limiter, error) {
		return func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewLeakyBucket(rdb, c, PerHour(6), opts...)
		}
	}
	tb := func(c int) func(redis.Scripter, ...Option) (Limiter, error) {
		return func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewTokenBucket(rdb, c, PerHour(6), opts...)
		}
	}
	log := sl(time.Second, Strategy{3, 10 * time.Second}, Strategy{6, time.Hour})
	return []oomCase{
		{"fixed_window", fw(6, time.Hour), fw(6, time.Hour)},
		{"fixed_window after a shorter window", fw(6, 2*time.Hour), fw(6, time.Hour)},
		{"sliding_window", sw(time.Second), sw(time.Second)},
		{"sliding_window after a new precision", sw(time.Second), sw(2 * time.Second)},
		// Denials move the 10s strategy's cursor: writes the old script needed.
		{"sliding_log", log, log},
		{"sliding_log after new strategies", log, sl(time.Second, Strategy{2, 5 * time.Second}, Strategy{3, 10 * time.Second}, Strategy{5, time.Hour})},
		{"leaky_bucket", lb(6), lb(6)},
		{"leaky_bucket after a lowered capacity", lb(8), lb(4)},
		{"token_bucket", tb(6), tb(6)},
		{"token_bucket after a lowered capacity", tb(8), tb(4)},
	}
}

// A denial, and n == 0, are decided while Redis refuses every write
// (maxmemory reached under noeviction): they need no write (DESIGN
// property 10). Behind a fail-open middleware, an OOM error on a denial
// would let every request through.
func TestDenialsNeedNoWrite(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory", strconv.Itoa(4<<20), "--maxmemory-policy", "noeviction")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	clock := newClock()
	opts := []Option{WithPrefix("oom:"), WithClock(clock.Now)}
	cases := oomCases()
	// Phase 1, writes work: 3 permits at 0s and 3 at 25s exhaust every key;
	// the 3 at 25s leave the sliding log's 10s window during phase 2.
	for s := range 30 {
		for i, c := range cases {
			first, err := c.first(rdb, opts...)
			require.NoError(t, err)
			if s == 0 || s == 25 {
				r, err := first.AllowN(ctx, strconv.Itoa(i), 3)
				require.NoError(t, err)
				require.True(t, r.Allowed, "%s at %ds", c.name, s)
			}
			// Load the script of the limiter asked later, while writes work.
			then, err := c.then(rdb, opts...)
			require.NoError(t, err)
			_, err = then.AllowN(ctx, "warm", 0)
			require.NoError(t, err)
		}
		clock.Advance(time.Second)
	}
	filler := strings.Repeat("x", 16<<10)
	var oom error
	for i := 0; oom == nil; i++ {
		require.Less(t, i, 1000, "maxmemory never reached")
		oom = rdb.Set(ctx, fmt.Sprintf("filler:%d", i), filler, 0).Err()
	}
	require.ErrorContains(t, oom, "OOM", "writes are refused")
	// Full, not just under the limit: no write of any size fits.
	used, err := rdb.MemoryUsage(ctx, "filler:0").Result()
	require.NoError(t, err)
	require.Positive(t, used)
	info := rdb.Info(ctx, "memory").Val()
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", strconv.Itoa(1<<20)).Err(), "well under used memory (%d B a filler key)", used)
	require.ErrorContains(t, rdb.Set(ctx, "tiny", "1", 0).Err(), "OOM", "even a tiny write is refused\n%s", info)

	// Phase 2, writes refused: 30 more seconds of calls, all denials.
	for range 30 {
		for i, c := range cases {
			l, err := c.then(rdb, opts...)
			require.NoError(t, err)
			key := strconv.Itoa(i)
			for _, n := range []int{1, 0, 1000} {
				r, err := l.AllowN(ctx, key, n)
				require.NoError(t, err, "%s: n=%d at %v on an exhausted key while Redis refuses writes", c.name, n, clock.now.Sub(epoch))
				require.Equal(t, n == 0, r.Allowed, "%s: n=%d: %+v", c.name, n, r)
			}
			require.ErrorIs(t, l.TryAcquire(ctx, key), ErrAcquireFailed, c.name)
		}
		clock.Advance(time.Second)
	}
	l, err := cases[0].first(rdb, opts...)
	require.NoError(t, err)
	_, err = l.Allow(ctx, "fresh")
	require.ErrorContains(t, err, "OOM", "a grant needs a write: it is an error, not a denial")
	require.NotErrorIs(t, err, ErrAcquireFailed)
}

// manyBuckets grants one permit in each of buckets one-permit buckets of l
// at key, one bucket (precision) apart, from the clock's time on.
func manyBuckets(t *testing.T, l Limiter, clock *fakeClock, key string, buckets int, precision time.Duration) {
	t.Helper()
	ctx := context.Background()
	for i := range buckets {
		r, err := l.Allow(ctx, key)
		require.NoError(t, err, "bucket %d", i)
		require.True(t, r.Allowed, "bucket %d", i)
		clock.Advance(precision)
	}
}

// Thousands of buckets leaving the window at once: every call decides, and
// exactly (a window's count is a difference of cumulative counts, whatever
// has been trimmed); grants that open buckets trim dead ones, a bounded
// number at a time.
func TestSlidingManyBucketsLeaveAtOnce(t *testing.T) {
	skipShort(t, "builds keys of thousands of buckets")
	t.Parallel()
	for _, a := range []struct {
		name string
		make func(rdb redis.Scripter, buckets int, opts ...Option) (Limiter, error)
		// remaining is Remaining once the dead buckets are walked: the
		// late permit counts in the hour, not in the sliding log's 30min.
		remaining func(buckets int) int
	}{
		{"sliding_window", func(rdb redis.Scripter, buckets int, opts ...Option) (Limiter, error) {
			return NewSlidingWindow(rdb, 2*buckets, time.Hour, time.Millisecond, opts...)
		}, func(buckets int) int { return 2*buckets - 1 }},
		{"sliding_log", func(rdb redis.Scripter, buckets int, opts ...Option) (Limiter, error) {
			return NewSlidingLog(rdb, time.Millisecond, []Strategy{{2 * buckets, 30 * time.Minute}, {3 * buckets, time.Hour}}, opts...)
		}, func(buckets int) int { return 2 * buckets }},
	} {
		t.Run(a.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				// Redis's Lua unpacks at most 7,999 values: the old
				// failure. miniredis has no such limit, and its Lua is
				// slow: 1,000 buckets there still outrun the budget.
				buckets := 8500
				if b.mini != nil {
					buckets = 1000
				}
				ctx := context.Background()
				clock := newClock()
				l, err := a.make(b.rdb, buckets, WithClock(clock.Now))
				require.NoError(t, err)
				manyBuckets(t, l, clock, "k", buckets, time.Millisecond)
				// One more permit, late in the window, that stays in it.
				clock.Advance(30 * time.Minute)
				r, err := l.Allow(ctx, "k")
				require.NoError(t, err)
				require.True(t, r.Allowed)
				// Now the first 8,500 buckets leave the window at once;
				// the last permit does not.
				clock.now = epoch.Add(time.Hour + time.Duration(buckets)*time.Millisecond)
				last, err := l.AllowN(ctx, "k", 0)
				require.NoError(t, err)
				require.Equal(t, a.remaining(buckets), last.Remaining, "only the late permit counts")
				// Grants in new buckets trim 8 dead ones each time they pass a
				// multiple of 8 permits.
				size := b.rdb.ZCard(ctx, keyPrefix(l)+"k").Val()
				for i := range 8 {
					clock.Advance(time.Millisecond)
					r, err = l.Allow(ctx, "k")
					require.NoError(t, err)
					require.True(t, r.Allowed)
					require.Equal(t, a.remaining(buckets)-1-i, r.Remaining)
				}
				// They trim dead ones as they go, a bounded number a call
				// (property 9): the set does not grow, and shrinks by no
				// more than a few dozen.
				after := b.rdb.ZCard(ctx, keyPrefix(l)+"k").Val()
				require.Less(t, after, size+8, "8 grants in new buckets trim dead ones")
				require.GreaterOrEqual(t, after, size+8-8*16, "a call trims a bounded number of dead buckets")
			})
		})
	}
}

// cmdCalls returns how many times Redis ran each command, scripts' calls
// included (INFO commandstats).
func cmdCalls(t *testing.T, rdb *redis.Client) map[string]int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	calls := map[string]int64{}
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		calls[name] = n
	}
	return calls
}

// A denied large n on a window of many buckets used to walk every bucket,
// and walk again on every repeat: 400k buckets took 1.5s of Redis per call.
// Now a call reads at most 8 buckets, whatever the state and n, and the
// RetryAfter it reports is never shorter than the truth. On a server of its
// own: INFO commandstats counts every client's commands.
func TestSlidingDeniedLargeNIsBounded(t *testing.T) {
	skipShort(t, "starts a redis-server and builds a key of 20,000 buckets")
	t.Parallel()
	const buckets = 20_000
	rdb := newClient(t, redistest.Start(t).Addr(), 0)
	ctx := context.Background()
	clock := newClock()
	l, err := NewSlidingWindow(rdb, 2*buckets, time.Hour, time.Millisecond, WithClock(clock.Now), WithPrefix("bounded:"))
	require.NoError(t, err)
	require.NoError(t, l.Reset(ctx, "k"))
	manyBuckets(t, l, clock, "k", buckets, time.Millisecond)
	clock.Advance(time.Minute)
	before := cmdCalls(t, rdb)
	const calls = 20
	for i := range calls {
		r, err := l.AllowN(ctx, "k", 2*buckets-10)
		require.NoError(t, err)
		require.False(t, r.Allowed)
		// The truth: the 10th-oldest permit has to leave, at epoch + 1h + 9ms.
		truth := epoch.Add(time.Hour + 9*time.Millisecond + time.Millisecond).Sub(clock.now)
		require.GreaterOrEqual(t, r.RetryAfter, truth, "call %d: never shorter than the truth", i)
		require.LessOrEqual(t, r.RetryAfter, truth+time.Hour, "call %d: longer by less than the window", i)
	}
	after := cmdCalls(t, rdb)
	reads := 0.0
	for _, name := range []string{"zrange", "zrangebyscore", "zrevrangebyscore"} {
		reads += float64(after[name] - before[name])
	}
	perCall := reads / calls
	t.Logf("sorted-set reads per denied call: %.1f (%d buckets in the window)", perCall, buckets)
	require.LessOrEqual(t, perCall, 4.0, "the tail and meta, the configurations' entries, the count before the window, 8 buckets of it")
}
