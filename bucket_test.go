package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/skew"
	"github.com/redlimit/redlimit/internal/testseed"
)

// The buckets' key's time and shared keys (issue 34, findings 1 and 4).

var bucketAlgorithms = []string{"leaky_bucket", "token_bucket"}

// Issue 34, finding 1: two instances share a key, one clock ahead of the
// other. The one behind used to read a level above full, clamp it to full
// on its own clock and write it back, and the one ahead then found refill
// it never waited for: 204 granted in 2.2ms of 10 at 1000/s with clocks 2ms
// apart, and 43 where about 40 fit with 10 at 10/s, 10ms apart. A key's
// time that never goes back keeps both within DESIGN's bound: what the
// bucket grants in an interval lengthened by the clocks' spread.
func TestBucketSkewedClocksDoNotRatchet(t *testing.T) {
	t.Parallel()
	cases := []struct {
		capacity int
		rate     Rate
		skew     time.Duration
		step     time.Duration // real time between calls
		calls    int
	}{
		{10, PerSecond(1000), 2 * ms, 10 * us, 220},
		{10, PerSecond(10), 10 * ms, 2 * ms, 600},
	}
	for _, alg := range bucketAlgorithms {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				b.keepKeys()
				ctx := context.Background()
				for ci, c := range cases {
					var realUS int64
					behind, err := newBucket(alg, b.rdb, c.capacity, c.rate, WithClock(func() time.Time { return time.UnixMicro(realUS) }))
					require.NoError(t, err)
					ahead, err := newBucket(alg, b.rdb, c.capacity, c.rate, WithClock(func() time.Time { return time.UnixMicro(realUS).Add(c.skew) }))
					require.NoError(t, err)
					realUS = epoch.UnixMicro()
					key := fmt.Sprintf("ratchet-%d", ci)
					var grants []skew.Grant
					for i := range c.calls {
						realUS += c.step.Microseconds()
						l := behind
						if i%2 == 1 {
							l = ahead
						}
						r, err := l.Allow(ctx, key)
						require.NoError(t, err)
						if r.Allowed {
							grants = append(grants, skew.Grant{RealUS: realUS, N: 1})
						}
					}
					allow := skew.Bucket(int64(c.capacity), int64(c.rate.Count), c.rate.Per.Microseconds())
					require.NoError(t, skew.Check(grants, c.skew.Microseconds(), allow),
						"%d at %v, clocks %v apart: %d granted in %v", c.capacity, c.rate, c.skew, len(grants), time.Duration(c.calls)*c.step)
				}
			})
		})
	}
}

// Two clocks up to a full drain apart, calling in a random order: every
// Result is the reference model's, stepped with the same clock readings
// (the model keeps the key's time as the script does).
func TestBucketSkewTracesMatchModel(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	for _, alg := range bucketAlgorithms {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				b.keepKeys()
				ctx := context.Background()
				for trace := range 6 {
					seed := uint64(trace) + offset
					rng := rand.New(rand.NewPCG(seed, 41))
					capacity := 1 + rng.IntN(8)
					rate := Rate{Count: 1 + rng.IntN(5), Per: time.Duration(1+rng.IntN(2000)) * ms}
					full := time.Duration(int64(capacity) * int64(rate.Per) / int64(rate.Count))
					spread := time.Duration(rng.Int64N(int64(full) + 1))
					if trace%3 == 2 {
						spread = full + us + time.Duration(rng.Int64N(int64(full/us)))*us // a clock gone wrong
					}
					var clockUS int64
					l, err := newBucket(alg, b.rdb, capacity, rate, WithClock(func() time.Time { return time.UnixMicro(clockUS) }))
					require.NoError(t, err)
					m := newBucketModel(alg, capacity, rate)
					realUS := epoch.UnixMicro() + rng.Int64N(int64(time.Hour/us))
					key := fmt.Sprintf("skew-model-%d", trace)
					for i := range 150 {
						realUS += rng.Int64N(int64(full/us)/int64(capacity) + 1)
						clockUS = realUS
						if rng.IntN(2) == 0 {
							clockUS += spread.Microseconds()
						}
						n := rng.IntN(capacity + 2)
						got, err := l.AllowN(ctx, key, n)
						require.NoError(t, err)
						require.Equal(t, modelToResult(m.Step(clockUS, int64(n))), withoutGrant(got),
							"trace %d (seed %d, %d at %v, clocks %v apart) call %d at +%dµs, n=%d",
							trace, seed, capacity, rate, spread, i, clockUS-epoch.UnixMicro(), n)
					}
				}
			})
		})
	}
}

// newBucketModel is the reference model of a bucket of capacity at rate.
func newBucketModel(alg string, capacity int, rate Rate) model.Model {
	count, per := reduceRate(rate)
	if alg == "leaky_bucket" {
		return model.NewLeakyBucket(int64(capacity), count, per)
	}
	return model.NewTokenBucket(int64(capacity), count, per)
}

// reduceRate is rate as count per µs, reduced.
func reduceRate(rate Rate) (count, perUS int64) {
	count, perUS = int64(rate.Count), rate.Per.Microseconds()
	a, b := count, perUS
	for b != 0 {
		a, b = b, a%b
	}
	return count / a, perUS / a
}

// modelToResult is the Result a limiter gives for the model's m.
func modelToResult(m model.Result) Result {
	r := Result{Allowed: m.Allowed, Limit: int(m.Limit), Remaining: int(m.Remaining),
		RetryAfter: time.Duration(m.RetryAfterUS) * us, ResetAfter: time.Duration(m.ResetAfterUS) * us}
	if m.RetryAfterUS == model.Never {
		r.RetryAfter = Never
	}
	return r
}

// Issue 34, finding 4: under WithPrefix, a grant by one configuration
// rewrote the whole level to drain at its own rate, so that a token bucket
// of 5 at 1 a minute had 5 permits a minute after one grant by a bucket of
// 20 at 10 a minute, where its twin key (the same history but that grant)
// had 1. A grant adds to the level at its own rate and re-rates nothing:
// at any time after it, every configuration has at most what it has on
// the twin key. Histories half used, exhausted and mixed, the extra grant
// by the faster or the slower configuration.
func TestBucketGrantNeverReRates(t *testing.T) {
	t.Parallel()
	type call struct {
		fast bool // by "20 at 10/min", else by "5 at 1/min"
		n    int
		wait time.Duration // before the call
	}
	cases := []struct {
		name      string
		history   []call
		extraFast bool
	}{
		{"slow exhausted, the faster grants", []call{{false, 5, 0}}, true},
		{"slow half used, the faster grants", []call{{false, 3, 0}}, true},
		{"both used, the faster grants", []call{{false, 3, 0}, {true, 10, 10 * time.Second}}, true},
		{"fast used, the slower grants", []call{{true, 3, 0}}, false},
		{"mixed, the slower grants", []call{{true, 2, 0}, {false, 1, 6 * time.Second}, {true, 1, time.Second}}, false},
	}
	checks := []time.Duration{0, time.Second, 6 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 10 * time.Minute}
	for _, alg := range bucketAlgorithms {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				b.keepKeys()
				ctx := context.Background()
				for ci, c := range cases {
					clock := newClock()
					opts := []Option{WithPrefix(fmt.Sprintf("rerate:%d:", ci)), WithClock(clock.Now)}
					slow, err := newBucket(alg, b.rdb, 5, PerMinute(1), opts...)
					require.NoError(t, err)
					fast, err := newBucket(alg, b.rdb, 20, PerMinute(10), opts...)
					require.NoError(t, err)
					for i, h := range c.history {
						clock.Advance(h.wait)
						l := slow
						if h.fast {
							l = fast
						}
						for _, key := range []string{"key", "twin"} {
							r, err := l.AllowN(ctx, key, h.n)
							require.NoError(t, err)
							require.True(t, r.Allowed, "%s: history call %d on %s: %+v", c.name, i, key, r)
						}
					}
					extra := slow
					if c.extraFast {
						extra = fast
					}
					r, err := extra.Allow(ctx, "key")
					require.NoError(t, err)
					require.True(t, r.Allowed, "%s: the extra grant: %+v", c.name, r)
					start := clock.now
					for _, at := range checks {
						clock.now = start.Add(at)
						for _, l := range []Limiter{slow, fast} {
							onKey, err := l.AllowN(ctx, "key", 0)
							require.NoError(t, err)
							onTwin, err := l.AllowN(ctx, "twin", 0)
							require.NoError(t, err)
							require.LessOrEqual(t, onKey.Remaining, onTwin.Remaining,
								"%s, %v after the extra grant: the key that had it is never looser than its twin (%d permits; twin %d)",
								c.name, at, onKey.Remaining, onTwin.Remaining)
						}
					}
				}
			})
		})
	}
}

// What one configuration imposes on a shared key ends with its grants: one
// permit by "5 at 1/min", then "20 at 10/min" granting as fast as it may.
// Once that permit has drained, the faster configuration alone grants at
// its own rate, as on a key it has to itself; never at the slower one's.
func TestBucketOtherRateEndsWithItsGrants(t *testing.T) {
	t.Parallel()
	for _, alg := range bucketAlgorithms {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				b.keepKeys()
				ctx := context.Background()
				clock := newClock()
				opts := []Option{WithPrefix("ends:"), WithClock(clock.Now)}
				slow, err := newBucket(alg, b.rdb, 5, PerMinute(1), opts...)
				require.NoError(t, err)
				fast, err := newBucket(alg, b.rdb, 20, PerMinute(10), opts...)
				require.NoError(t, err)
				r, err := slow.Allow(ctx, "shared")
				require.NoError(t, err)
				require.True(t, r.Allowed)
				// Greedy: at every call's RetryAfter, on the shared key and
				// on one the fast configuration has alone.
				perMinute := func(key string) []int {
					counts := make([]int, 10)
					now := clock.now
					for at := now; at.Before(now.Add(10 * time.Minute)); {
						clock.now = at
						r, err := fast.Allow(ctx, key)
						require.NoError(t, err)
						if r.Allowed {
							counts[int(at.Sub(now)/time.Minute)]++
							continue
						}
						at = at.Add(r.RetryAfter)
					}
					clock.now = now
					return counts
				}
				shared, alone := perMinute("shared"), perMinute("alone")
				require.Equal(t, alone[4:], shared[4:],
					"minutes 4 to 10: the slower configuration's permit drained long ago (shared %v, alone %v)", shared, alone)
				total := 0
				for _, c := range shared {
					total += c
				}
				require.GreaterOrEqual(t, total, 20+90-10, "the faster configuration keeps about its own rate over 10 minutes: %v", shared)
			})
		})
	}
}
