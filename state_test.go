package redlimit

// How a key's state behaves over time, for every algorithm: Reset, TTLs
// and expiry, a configuration changed on a live key, and a clock that jumps.
// Faults (Redis down, foreign values, a flushed script cache) are in
// faults_test.go.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// stateBurst is what the state and fault tests build each algorithm with:
// alg.new(rdb, stateBurst, time.Second, ...) grants stateBurst at once.
const stateBurst = 4

// halfRemaining is, by algorithm, Remaining half a recovery after stateBurst
// was granted at one instant: the windows still hold the burst; the sliding
// log's 1s strategy is clear and its 10s one holds the burst (8 - 4 left);
// the buckets have regained half.
var halfRemaining = map[string]int{
	"fixed_window": 0, "sliding_window": 0, "sliding_log": 4, "leaky_bucket": 2, "token_bucket": 2,
}

// drainFault takes single permits from key until one is denied, at most
// limit+1 times, and returns how many were granted.
func drain(t *testing.T, l Limiter, key string, limit int) int {
	t.Helper()
	for granted := 0; granted <= limit; granted++ {
		r, err := l.AllowN(context.Background(), key, 1)
		require.NoError(t, err, "AllowN(%q, 1) after %d granted", key, granted)
		if !r.Allowed {
			require.Positive(t, r.RetryAfter, "a denial of one permit must say how long to wait: %+v", r)
			return granted
		}
	}
	return limit + 1
}

// requireFullyAvailable checks that key is back in its initial state: the
// full burst left and nothing to wait for.
func requireFullyAvailable(t *testing.T, l Limiter, key string, burst int, msgAndArgs ...any) {
	t.Helper()
	r, err := l.AllowN(context.Background(), key, 0)
	require.NoError(t, err, fmt.Sprint(msgAndArgs...))
	want := fmt.Sprintf("Allowed with Remaining %d and ResetAfter 0", burst)
	got := fmt.Sprintf("Allowed %v with Remaining %d and ResetAfter %v", r.Allowed, r.Remaining, r.ResetAfter)
	require.True(t, r.Allowed && r.Remaining == burst && r.ResetAfter == 0,
		"%s: want %s, got %s", fmt.Sprint(msgAndArgs...), want, got)
}

// requireTTLCovers checks that redisKey carries a TTL no shorter than
// r.ResetAfter (rounded down to the ms). The TTL was written by a call that
// started at or after since: a real server has counted it down in real time
// since then.
func requireTTLCovers(t *testing.T, b backend, redisKey string, r Result, since time.Time, msgAndArgs ...any) {
	t.Helper()
	pttl, err := b.rdb.PTTL(context.Background(), redisKey).Result()
	require.NoError(t, err)
	slack := time.Duration(0)
	if b.mini == nil {
		slack = time.Since(since).Truncate(time.Millisecond) + time.Millisecond
	}
	require.Positive(t, pttl, "%s: the key must carry a TTL after %+v", fmt.Sprint(msgAndArgs...), r)
	require.GreaterOrEqual(t, pttl+slack, r.ResetAfter.Truncate(time.Millisecond),
		"%s: the TTL must cover ResetAfter of %+v", fmt.Sprint(msgAndArgs...), r)
}

// Reset deletes the key and the cached denial; on a missing key it creates
// nothing.
func TestReset(t *testing.T) {
	t.Parallel()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newClock()
				l, err := alg.new(b.rdb, stateBurst, time.Second, WithClock(clock.Now), WithDenyCache(4))
				require.NoError(t, err)
				const key = "reset"
				redisKey := keyPrefix(l) + key

				require.Equal(t, stateBurst, drain(t, l, key, stateBurst), "a fresh key grants one burst")
				require.NoError(t, l.Reset(ctx, key))
				n, err := b.rdb.Exists(ctx, redisKey).Result()
				require.NoError(t, err)
				require.Zero(t, n, "Reset must delete the key")
				requireFullyAvailable(t, l, key, stateBurst, "after Reset")
				require.Equal(t, stateBurst, drain(t, l, key, stateBurst),
					"after Reset a full burst again, the cached denial forgotten")

				require.NoError(t, l.Reset(ctx, "never-used"), "Reset of a missing key")
				n, err = b.rdb.Exists(ctx, keyPrefix(l)+"never-used").Result()
				require.NoError(t, err)
				require.Zero(t, n, "Reset of a missing key must not create it")
				requireFullyAvailable(t, l, "never-used", stateBurst, "a missing key after Reset")
			})
		})
	}
}

// Every write leaves a TTL covering ResetAfter, and expiry looks like a
// reset.
func TestTTL(t *testing.T) {
	t.Parallel()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newClock()
				l, err := alg.new(b.rdb, stateBurst, time.Second, WithClock(clock.Now))
				require.NoError(t, err)
				const key = "ttl"
				redisKey := keyPrefix(l) + key

				// A few calls spread over one recovery; every allowed
				// call writes, and must leave a TTL covering ResetAfter.
				steps := []struct {
					at time.Duration
					n  int
				}{{0, 1}, {alg.recovery(time.Second) / 4, 2}, {alg.recovery(time.Second) / 2, 1}, {alg.recovery(time.Second) / 2, 1}, {alg.recovery(time.Second) * 3 / 4, 1}}
				writes := 0
				// The start of the last call that may have set the TTL, and
				// when (clock time) the state it wrote empties. A grant that
				// leaves that time as it was may keep the TTL the earlier
				// call set (the sliding scripts do: same newest bucket), which
				// the real server has counted down since.
				var lastWrite, lastEnd time.Time
				for _, s := range steps {
					clock.now = epoch.Add(s.at)
					start := time.Now()
					r, err := l.AllowN(ctx, key, s.n)
					require.NoError(t, err)
					if r.Allowed {
						writes++
						if end := clock.now.Add(r.ResetAfter); !end.Equal(lastEnd) {
							lastWrite, lastEnd = start, end
						}
					}
					requireTTLCovers(t, b, redisKey, r, lastWrite, "at ", s.at)
				}
				require.GreaterOrEqual(t, writes, 3, "the steps must include writes")

				if b.mini != nil {
					// Expiry looks like a reset: the next call is that of a
					// fresh key at the same clock.
					pttl, err := b.rdb.PTTL(ctx, redisKey).Result()
					require.NoError(t, err)
					b.mini.FastForward(pttl + time.Millisecond)
					require.False(t, b.mini.Exists(redisKey), "the key must be gone after its TTL")
					got, err := l.AllowN(ctx, key, 1)
					require.NoError(t, err)
					want, err := l.AllowN(ctx, "ttl-fresh", 1)
					require.NoError(t, err)
					require.Equal(t, withoutGrant(want), withoutGrant(got), "after expiry the key must behave like a fresh key")
					require.Equal(t, stateBurst-1, got.Remaining, "a fresh key has one burst")
				}
			})
		})
	}
}

// A key whose TTL never ran out decides, once its time has passed, as a
// fresh key: correctness never depends on expiry (DESIGN property 3).
func TestNoExpiryNeeded(t *testing.T) {
	t.Parallel()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newClock()
				l, err := alg.new(b.rdb, stateBurst, time.Second, WithClock(clock.Now))
				require.NoError(t, err)
				const key = "stale"
				require.Equal(t, stateBurst, drain(t, l, key, stateBurst))
				clock.Advance(alg.recovery(time.Second) / 3)
				_, err = l.AllowN(ctx, key, 0)
				require.NoError(t, err)

				// As if expiry never ran: the key's TTL is pushed far out (a
				// key without one is foreign), and only the fake clock
				// moves, far past every window.
				extended, err := b.rdb.PExpire(ctx, keyPrefix(l)+key, 24*time.Hour).Result()
				require.NoError(t, err)
				require.True(t, extended, "the key must exist for this test to mean anything")
				clock.Advance(10 * alg.recovery(time.Second))
				for _, n := range []int{0, 1, stateBurst - 1} {
					got, err := l.AllowN(ctx, key, n)
					require.NoError(t, err)
					want, err := l.AllowN(ctx, "stale-fresh", n)
					require.NoError(t, err)
					require.Equal(t, withoutGrant(want), withoutGrant(got), "AllowN(%d) on a stale key must decide as on a fresh key", n)
				}
				got, err := l.AllowN(ctx, key, 1)
				require.NoError(t, err)
				require.False(t, got.Allowed, "the burst is spent again: %+v", got)
			})
		})
	}
}

// A key used under one configuration is read, clamped and recovered by
// another of the same algorithm: a deploy that changes limits.
func TestConfigChange(t *testing.T) {
	t.Parallel()
	type config struct {
		make    func(rdb redis.Scripter, opts ...Option) (Limiter, error)
		burst   int           // what a fresh key grants at one instant
		recover time.Duration // from exhausted to fully available
	}
	fw := func(limit int, window time.Duration) config {
		return config{func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewFixedWindow(rdb, limit, window, opts...)
		}, limit, window}
	}
	sw := func(limit int, window, precision time.Duration) config {
		return config{func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingWindow(rdb, limit, window, precision, opts...)
		}, limit, window}
	}
	sl := func(precision time.Duration, strategies ...Strategy) config {
		c := config{make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingLog(rdb, precision, strategies, opts...)
		}, burst: strategies[0].Limit}
		for _, s := range strategies {
			c.burst = min(c.burst, s.Limit)
			c.recover = max(c.recover, s.Window)
		}
		return c
	}
	// capacity × Per / Count, rounded up to the microsecond.
	bucket := func(capacity int, rate Rate) time.Duration {
		need := int64(capacity) * int64(rate.Per/time.Microsecond)
		return time.Duration((need+int64(rate.Count)-1)/int64(rate.Count)) * time.Microsecond
	}
	lb := func(capacity int, rate Rate) config {
		return config{func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewLeakyBucket(rdb, capacity, rate, opts...)
		}, capacity, bucket(capacity, rate)}
	}
	tb := func(capacity int, rate Rate) config {
		return config{func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewTokenBucket(rdb, capacity, rate, opts...)
		}, capacity, bucket(capacity, rate)}
	}
	const ms = time.Millisecond
	// A real server expires keys in real time, and expiry looks like a
	// reset: every TTL here is at least a second, far longer than a test step.
	changes := []struct {
		name    string
		before  config
		consume int // permits taken under before
		after   config
	}{
		{"fixed_window/limit 100 to 10", fw(100, time.Second), 60, fw(10, time.Second)},
		{"fixed_window/window 1h to 1s", fw(100, time.Hour), 60, fw(10, time.Second)},
		{"fixed_window/window 1s to 1h", fw(100, time.Second), 60, fw(10, time.Hour)},
		{"fixed_window/limit 10 to 100", fw(10, time.Second), 10, fw(100, time.Second)},
		{"sliding_window/limit 100 to 10", sw(100, time.Second, 100*ms), 60, sw(10, time.Second, 100*ms)},
		{"sliding_window/window 1h to 1s", sw(100, time.Hour, time.Second), 60, sw(10, time.Second, 100*ms)},
		{"sliding_window/window 1s to 2s", sw(100, time.Second, 100*ms), 60, sw(10, 2*time.Second, 100*ms)},
		{"sliding_window/precision 100ms to 10ms", sw(100, time.Second, 100*ms), 60, sw(10, time.Second, 10*ms)},
		{"sliding_window/precision 10ms to 250ms", sw(100, time.Second, 10*ms), 60, sw(10, time.Second, 250*ms)},
		{"sliding_log/fewer strategies", sl(100*ms, Strategy{10, time.Second}, Strategy{100, time.Hour}), 10, sl(100*ms, Strategy{5, time.Second})},
		{"sliding_log/more strategies", sl(100*ms, Strategy{100, time.Second}), 60, sl(50*ms, Strategy{3, 100 * ms}, Strategy{10, time.Second}, Strategy{50, time.Minute})},
		{"sliding_log/precision 100ms to 1s", sl(100*ms, Strategy{100, time.Second}), 60, sl(time.Second, Strategy{5, time.Second}, Strategy{20, 10 * time.Second})},
		{"sliding_log/limits only", sl(100*ms, Strategy{100, time.Second}, Strategy{1000, time.Minute}), 60, sl(100*ms, Strategy{10, time.Second}, Strategy{20, time.Minute})},
		{"leaky_bucket/capacity 100 to 10", lb(100, PerSecond(10)), 60, lb(10, PerSecond(10))},
		{"leaky_bucket/rate 50/s to 10/s", lb(100, PerSecond(50)), 60, lb(10, PerSecond(10))},
		{"leaky_bucket/rate 3/s to 7/min", lb(100, PerSecond(3)), 61, lb(10, PerMinute(7))},
		{"leaky_bucket/capacity 10 to 100", lb(10, PerSecond(10)), 10, lb(100, PerSecond(3))},
		{"token_bucket/capacity 100 to 10", tb(100, PerSecond(10)), 60, tb(10, PerSecond(10))},
		{"token_bucket/rate 50/s to 10/s", tb(100, PerSecond(50)), 60, tb(10, PerSecond(10))},
		{"token_bucket/rate 3/s to 7/min", tb(100, PerSecond(3)), 61, tb(10, PerMinute(7))},
		{"token_bucket/capacity 10 to 100", tb(10, PerSecond(10)), 10, tb(100, PerSecond(3))},
	}
	for _, c := range changes {
		t.Run(c.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newClock()
				before, err := c.before.make(b.rdb, WithClock(clock.Now))
				require.NoError(t, err)
				after, err := c.after.make(b.rdb, WithClock(clock.Now))
				require.NoError(t, err)
				const key = "reconfigured"

				r, err := before.AllowN(ctx, key, c.consume)
				require.NoError(t, err)
				require.True(t, r.Allowed, "the old configuration grants %d: %+v", c.consume, r)

				clock.Advance(30 * time.Millisecond)
				r, err = after.AllowN(ctx, key, 0)
				require.NoError(t, err, "the new configuration must read the old state")
				require.LessOrEqual(t, r.Remaining, c.after.burst, "Remaining under the new configuration: %+v", r)
				got := drain(t, after, key, c.after.burst)
				require.LessOrEqual(t, got, c.after.burst, "permits granted at once under the new configuration")

				clock.Advance(c.after.recover)
				requireFullyAvailable(t, after, key, c.after.burst,
					"one recovery (", c.after.recover, ") of the new configuration after the change")
				require.Equal(t, c.after.burst, drain(t, after, key, c.after.burst),
					"one burst of the new configuration")
			})
		})
	}
}

// A clock that jumps back, by a microsecond or by years, with or without a
// deny cache, grants nothing extra and locks no key out for longer than its
// configuration allows; a jump forward is a recovery.
// fromClock reports the algorithms whose durations count from the caller's
// clock, so that a clock behind the key's time waits for it too; their
// TTL runs on the clock of the grant that set it.
func fromClock(alg algorithm) bool {
	return strings.HasPrefix(alg.name, "sliding")
}

func TestClockBackward(t *testing.T) {
	t.Parallel()
	const year = 365 * 24 * time.Hour
	for _, alg := range algorithms {
		moves := []time.Duration{-time.Microsecond, -alg.recovery(time.Second) / 2, -time.Hour, -year, 2 * year, -2 * year}
		for _, denyCache := range []bool{false, true} {
			name := alg.name
			if denyCache {
				name += "/deny_cache"
			}
			t.Run(name, func(t *testing.T) {
				forEachBackend(t, func(t *testing.T, b backend) {
					clock := newClock()
					opts := []Option{WithClock(clock.Now)}
					if denyCache {
						opts = append(opts, WithDenyCache(8))
					}
					l, err := alg.new(b.rdb, stateBurst, time.Second, opts...)
					require.NoError(t, err)
					const key = "backward"
					// The start of the last call that may have written the key.
					lastWrite := time.Now()
					granted := drain(t, l, key, stateBurst)
					require.Equal(t, stateBurst, granted, "a fresh key grants one burst")

					for _, move := range moves {
						clock.Advance(move)
						if move > 0 {
							requireFullyAvailable(t, l, key, stateBurst, "a clock moved ", move, " forward, past every window")
							lastWrite = time.Now()
							got := drain(t, l, key, stateBurst)
							require.Equal(t, stateBurst, got, "after the clock moved %v forward: one burst", move)
							granted += got
							continue
						}
						r, err := l.AllowN(context.Background(), key, 1)
						require.NoError(t, err)
						require.False(t, r.Allowed, "the clock moved %v back: an exhausted key must grant nothing: %+v", move, r)
						if !denyCache && !fromClock(alg) { // else Redis has not seen the clock go back yet
							requireTTLCovers(t, b, keyPrefix(l)+key, r, lastWrite, "after the clock moved ", move, " back")
						}
						// A key keeps its time (DESIGN "A key's time"): a
						// clock behind it by up to a recovery waits for it.
						most := alg.recovery(time.Second)
						if fromClock(alg) {
							most += min(-move, alg.recovery(time.Second))
						}
						require.LessOrEqual(t, r.RetryAfter, most,
							"the clock moved %v back: no wait may be longer than %v: %+v", move, most, r)
						require.LessOrEqual(t, r.ResetAfter, most,
							"the clock moved %v back: no reset may be further than %v: %+v", move, most, r)
						got := drain(t, l, key, stateBurst)
						require.Zero(t, got, "the clock moved %v back: an exhausted key must grant nothing", move)

						// A key that keeps its time is used up until the
						// moved clock reaches it again (or, past a recovery
						// behind, a real server's TTL ends the key sooner).
						clock.Advance(-move)
						clock.Advance(alg.recovery(time.Second) / 2)
						r, err = l.AllowN(context.Background(), key, 0)
						require.NoError(t, err)
						require.Equal(t, halfRemaining[alg.name], r.Remaining,
							"half a recovery (%v) after the clock moved %v back: %+v", alg.recovery(time.Second)/2, move, r)
						require.Positive(t, r.ResetAfter,
							"half a recovery after the clock moved %v back, the key is not yet reset: %+v", move, r)

						clock.Advance(alg.recovery(time.Second) - alg.recovery(time.Second)/2)
						requireFullyAvailable(t, l, key, stateBurst,
							"one recovery (", alg.recovery(time.Second), ") after the clock moved ", move, " back, the lockout must be over")
						lastWrite = time.Now()
						got = drain(t, l, key, stateBurst)
						require.Equal(t, stateBurst, got, "one recovery after the clock moved %v back: one burst", move)
						granted += got
					}
					// One burst at the start and one per recovery or
					// forward jump: a backward jump adds nothing.
					require.Equal(t, stateBurst*(1+len(moves)), granted, "permits granted over the whole run")
				})
			})
		}
	}
}

// TestZeroAfterLoweredLimit: n == 0 is always allowed, even on a key whose
// state holds more than a lowered limit (a deploy lowered it): the call
// only reports that nothing remains. Found by FuzzNewSlidingWindow.
func TestZeroAfterLoweredLimit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		b.keepKeys() // a fake clock: its TTLs, seconds at most, would pass in real time
		for _, alg := range algorithms {
			clock := newClock()
			prefix := WithPrefix("lowered:" + alg.code + ":")
			high, err := alg.new(b.rdb, 10, time.Second, prefix, WithClock(clock.Now))
			require.NoError(t, err)
			low, err := alg.new(b.rdb, 3, time.Second, prefix, WithClock(clock.Now))
			require.NoError(t, err)
			r, err := high.AllowN(context.Background(), "k", 10)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			r, err = low.AllowN(context.Background(), "k", 0)
			require.NoError(t, err)
			require.True(t, r.Allowed, "%s: n == 0 on a key over a lowered limit must be allowed: %+v", alg.name, r)
			require.Zero(t, r.RetryAfter, alg.name)
			require.Zero(t, r.Remaining, alg.name)
		}
	})
}
