package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
	"github.com/stretchr/testify/require"
)

// pairConfig is one random configuration of an algorithm, with bound: the
// most permits it grants alone, from a fresh key, in any interval [t, t+T).
// The bounds are closed forms, upper bounds of the exact maxima.
type pairConfig struct {
	desc    string
	make    func(rdb redis.Scripter, opts ...Option) (Limiter, error)
	bound   func(T time.Duration) int
	periods []time.Duration // the interval lengths worth checking
}

func pairCeilDiv(a, b time.Duration) int { return int((a + b - 1) / b) }

func pairWindowBound(limit int, window, precision time.Duration) func(time.Duration) int {
	size := int(window / precision)
	return func(T time.Duration) int {
		// [t, t+T) touches at most ceil(T/P)+1 buckets, which fit in that
		// many buckets' worth of windows.
		buckets := pairCeilDiv(T, precision) + 1
		return limit * ((buckets + size - 1) / size)
	}
}

func randomPairConfig(alg string, rng *rand.Rand) pairConfig {
	second := time.Second
	switch alg {
	case "fixed_window":
		limit, window := 1+rng.IntN(10), time.Duration(1+rng.IntN(60))*second
		return pairConfig{
			desc: fmt.Sprintf("FixedWindow(%d per %v)", limit, window),
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewFixedWindow(rdb, limit, window, opts...)
			},
			bound:   func(T time.Duration) int { return limit * (pairCeilDiv(T, window) + 1) },
			periods: []time.Duration{window},
		}
	case "sliding_window":
		precision := time.Duration(1+rng.IntN(3)) * second
		limit, window := 1+rng.IntN(10), precision*time.Duration(1+rng.IntN(20))
		return pairConfig{
			desc: fmt.Sprintf("SlidingWindow(%d per %v, %v)", limit, window, precision),
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewSlidingWindow(rdb, limit, window, precision, opts...)
			},
			bound:   pairWindowBound(limit, window, precision),
			periods: []time.Duration{window},
		}
	case "sliding_log":
		precision := time.Duration(1+rng.IntN(2)) * second
		var strategies []Strategy
		limit, size := 0, 0
		for range 1 + rng.IntN(3) {
			limit += 1 + rng.IntN(5)
			size += 1 + rng.IntN(15)
			strategies = append(strategies, Strategy{Limit: limit, Window: precision * time.Duration(size)})
		}
		return pairConfig{
			desc: fmt.Sprintf("SlidingLog(%v, %v)", precision, strategies),
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewSlidingLog(rdb, precision, strategies, opts...)
			},
			bound: func(T time.Duration) int {
				most := -1
				for _, s := range strategies {
					if b := pairWindowBound(s.Limit, s.Window, precision)(T); most < 0 || b < most {
						most = b
					}
				}
				return most
			},
			periods: func() []time.Duration {
				var ps []time.Duration
				for _, s := range strategies {
					ps = append(ps, s.Window)
				}
				return ps
			}(),
		}
	default: // leaky_bucket, token_bucket
		capacity, rate := 1+rng.IntN(10), Rate{Count: 1 + rng.IntN(3), Per: time.Duration(1+rng.IntN(30)) * second}
		return pairConfig{
			desc: fmt.Sprintf("%s(%d, %d per %v)", alg, capacity, rate.Count, rate.Per),
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				if alg == "leaky_bucket" {
					return NewLeakyBucket(rdb, capacity, rate, opts...)
				}
				return NewTokenBucket(rdb, capacity, rate, opts...)
			},
			bound: func(T time.Duration) int {
				// A full bucket, and what refills in T.
				return capacity + int((int64(T)*int64(rate.Count)+int64(rate.Per)-1)/int64(rate.Per))
			},
			periods: []time.Duration{rate.Per, rate.Per * time.Duration(capacity) / time.Duration(rate.Count)},
		}
	}
}

type pairGrant struct {
	at time.Time
	n  int
}

// violation returns a description of the first interval of a length in
// periods whose grants exceed bound, or "".
func pairViolation(grants []pairGrant, periods []time.Duration, bound func(time.Duration) int) string {
	sort.Slice(grants, func(i, j int) bool { return grants[i].at.Before(grants[j].at) })
	for _, T := range periods {
		limit := bound(T)
		sum, lo := 0, 0
		for hi := range grants {
			sum += grants[hi].n
			for grants[lo].at.Add(T).Compare(grants[hi].at) <= 0 {
				sum -= grants[lo].n
				lo++
			}
			if sum > limit {
				return fmt.Sprintf("%d permits granted in [%v, +%v), bound %d", sum, grants[lo].at.Sub(epoch), T, limit)
			}
		}
	}
	return ""
}

// Limiters of one algorithm with different configurations sharing a key
// (WithPrefix: a rolling deploy) never pairGrant more, in any interval, than
// the looser of the two would alone (DESIGN property 8): random pairs,
// driven alternately and at random on one key. Each configuration alone
// is checked against its own bound too, so that the bounds are sound.
// Before this release, a sliding log of 10/h next to {3/min, 5/10min}
// granted 1,440 in a fake day (240 alone), a token bucket of capacity 10
// next to one of 3 granted 8,642 (34 alone), and a sliding window of 2 per
// 12s next to 4 per 16s granted 5 in 16s (4 alone).
func TestSharedKeyUnorderedPairs(t *testing.T) {
	skipShort(t, "random configuration pairs, thousands of calls a backend")
	t.Parallel()
	const (
		pairs = 8
		steps = 400
	)
	offset := testseed.Offset(t)
	for _, alg := range []string{"fixed_window", "sliding_window", "sliding_log", "leaky_bucket", "token_bucket"} {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				pairs := pairs
				if b.mini != nil {
					pairs = 3 // gopher-lua is slow; the real server takes all
				}
				for p := range pairs {
					seed := uint64(p) + offset
					rng := rand.New(rand.NewPCG(seed, uint64(len(alg))))
					cfgs := [2]pairConfig{randomPairConfig(alg, rng), randomPairConfig(alg, rng)}
					var periods []time.Duration
					longest, shortest := time.Duration(0), time.Duration(1<<62)
					for _, c := range cfgs {
						for _, d := range c.periods {
							periods = append(periods, d)
							longest, shortest = max(longest, d), min(shortest, d)
						}
					}
					bound := func(T time.Duration) int { return max(cfgs[0].bound(T), cfgs[1].bound(T)) }
					for mode, who := range []string{"A alone", "B alone", "alternating", "random"} {
						clock := newClock()
						prefix := fmt.Sprintf("p8:%s:%d:%d:", alg, p, mode)
						var ls [2]Limiter
						for i, c := range cfgs {
							l, err := c.make(b.rdb, WithPrefix(prefix), WithClock(clock.Now))
							require.NoError(t, err)
							ls[i] = l
						}
						var grants []pairGrant
						for s := range steps {
							i := s % 2
							switch who {
							case "A alone":
								i = 0
							case "B alone":
								i = 1
							case "random":
								i = rng.IntN(2)
							}
							n := 1
							if r := rng.IntN(10); r == 0 {
								n = 0
							} else if r == 1 {
								n = 2
							}
							r, err := ls[i].AllowN(ctx, "k", n)
							require.NoError(t, err, "seed %d %s %s vs %s, step %d", seed, who, cfgs[0].desc, cfgs[1].desc, s)
							if r.Allowed && n > 0 {
								grants = append(grants, pairGrant{clock.now, n})
							}
							// Mostly dense calls, within the shortest period;
							// sometimes a jump across the longest.
							step := shortest / 4
							if rng.IntN(10) < 3 {
								step = longest / 4
							}
							clock.Advance(time.Duration(rng.Int64N(int64(step) + 1)))
						}
						check := bound
						switch who {
						case "A alone":
							check = cfgs[0].bound
						case "B alone":
							check = cfgs[1].bound
						}
						if v := pairViolation(grants, periods, check); v != "" {
							t.Errorf("seed %d, %s: A=%s, B=%s: %s", seed, who, cfgs[0].desc, cfgs[1].desc, v)

						}
					}
				}
			})
		})
	}
}

// Sliding windows and logs of any two configurations on one key, neither
// looser than the other (2 per 12s next to 4 per 16s, precisions that do not
// divide each other), alternating and interleaved: the grants in every
// interval of every window length stay within the larger of the two exact
// bounds (the greedy reference model from a fresh key). Each call checks
// the other configuration's windows too, until they lapse (DESIGN
// property 8). Before, each checked only its own, and 2 per 12s next to
// 4 per 16s granted 5 in 12s where either alone grants at most 4.
func TestSharedKeySlidingAnyPair(t *testing.T) {
	skipShort(t, "random configuration pairs against the greedy bound")
	t.Parallel()
	seed := sharedKeySeed(t)
	t.Logf("seed %d (%s=%d repeats this run)", seed, testseed.Env, seed)
	draw := func(rng *rand.Rand) (string, sharedConfig) {
		precision := time.Duration(500+500*rng.IntN(6)) * time.Millisecond
		if rng.IntN(2) == 0 {
			limit := 1 + rng.IntN(8)
			window := precision * time.Duration(1+rng.IntN(24))
			return "sliding_window", slidingWindowConfig(limit, window, precision)
		}
		return "sliding_log", slidingLogConfig(precision, randomStrategies(rng, precision, 20*time.Second))
	}
	forEachBackend(t, func(t *testing.T, b backend) {
		pairs := 64
		if b.mini != nil {
			pairs = 16 // gopher-lua is slower
		}
		for p := range pairs {
			rng := rand.New(rand.NewPCG(seed, uint64(1000+p)))
			algA, cfgA := draw(rng)
			algB, cfgB := draw(rng)
			for algB != algA {
				algB, cfgB = draw(rng)
			}
			periods := slices.Compact(slices.Sorted(slices.Values(slices.Concat(cfgA.periods, cfgB.periods))))
			bound := func(T int64) int64 { return max(cfgA.most(T), cfgB.most(T)) }
			clock := &fakeClock{}
			var limiters [2]Limiter
			for i, cfg := range []sharedConfig{cfgA, cfgB} {
				l, err := cfg.make(b.rdb, WithPrefix("p8:"), WithClock(clock.Now))
				require.NoError(t, err, "%s", cfg.desc)
				limiters[i] = l
			}
			for _, mode := range []string{"alternate", "interleave"} {
				start := epoch.Add(time.Duration(rng.Int64N(int64(10 * time.Second))).Truncate(time.Microsecond))
				who := func(i int) int { return i % 2 }
				if mode == "interleave" {
					who = func(int) int { return rng.IntN(2) }
				}
				steps := sharedTrace(rng, cfgA, cfgB, sharedKeyMaxSteps, who)
				key := fmt.Sprintf("any:%d:%s", p, mode)
				clock.now = start
				decisions := runShared(t, b, clock, limiters, key, steps)
				if v := worstViolation(decisions, periods, bound); v != nil {
					t.Errorf("seed %d, pair %d, %s: A = %s, B = %s: [+%v, +%v) granted %d (A %d, B %d), more than either alone grants in %v: %d (A %d, B %d)\n%s",
						seed, p, mode, cfgA.desc, cfgB.desc,
						time.Duration(v.fromUS)*time.Microsecond, time.Duration(v.fromUS)*time.Microsecond+v.T,
						v.granted, v.byWho[0], v.byWho[1], v.T, v.bound,
						cfgA.most(v.T.Microseconds()), cfgB.most(v.T.Microseconds()), describeInterval(decisions, v))
				}
			}
		}
	})
}

// No sliding state format before format 10 was released, so none is read
// (docs/internals.md): a key in an earlier layout (a hash whose field m
// holds "W4 ...", a sorted set whose first member is a format 8 or format
// 9 note) is foreign, and a call leaves it as it is.
func TestSlidingEarlierLayoutsAreForeign(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	forEachBackend(t, func(t *testing.T, be backend) {
		be.keepKeys() // a fake clock: its TTLs, seconds at most, would pass in real time
		clock := newClock()
		l, err := NewSlidingWindow(be.rdb, 3, 10*time.Second, time.Second, WithPrefix("early:"), WithClock(clock.Now))
		require.NoError(t, err)
		require.NoError(t, be.rdb.HSet(ctx, "early:hash", "m", "W4 1000000 1 0 10 3 0", "1800000000", "3").Err())
		for name, note := range map[string]string{"eight": "w:1800000000 0 0 9 0 9", "nine": "w9:3 1800000000 0 0"} {
			require.NoError(t, be.rdb.ZAdd(ctx, "early:"+name, redis.Z{Score: 0, Member: note}).Err())
		}
		for _, key := range []string{"hash", "eight", "nine"} {
			dump := be.rdb.Dump(ctx, "early:"+key).Val()
			for _, n := range []int{0, 1} {
				_, err = l.AllowN(ctx, key, n)
				require.ErrorIs(t, err, ErrForeignState, "%s, n=%d", key, n)
			}
			require.Equal(t, dump, be.rdb.Dump(ctx, "early:"+key).Val(), "%s is left as it was", key)
		}
	})
}

// A sliding log of many strategies keeps a meta field of more numbers than
// one Lua pattern can capture (32), which the script parses field by field:
// the decisions stay the reference model's.
func TestSlidingLogManyStrategies(t *testing.T) {
	t.Parallel()
	precision := time.Second
	var strategies []Strategy
	var limits, windows []int64
	for i := range 7 {
		s := Strategy{Limit: 3 + 4*i, Window: time.Duration(2+3*i) * precision}
		strategies = append(strategies, s)
		limits, windows = append(limits, int64(s.Limit)), append(windows, s.Window.Microseconds())
	}
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newClock()
		l, err := NewSlidingLog(b.rdb, precision, strategies, WithClock(clock.Now))
		require.NoError(t, err)
		m := model.NewSlidingLog(precision.Microseconds(), limits, windows)
		rng := rand.New(rand.NewPCG(7+testseed.Offset(t), 7))
		for i := range 300 {
			n := rng.IntN(4)
			got, err := l.AllowN(ctx, "k", n)
			require.NoError(t, err, "call %d", i)
			r := m.Step(clock.now.UnixMicro(), int64(n))
			want := Result{
				Allowed:    r.Allowed,
				Limit:      int(r.Limit),
				Remaining:  int(r.Remaining),
				RetryAfter: time.Duration(r.RetryAfterUS) * time.Microsecond,
				ResetAfter: time.Duration(r.ResetAfterUS) * time.Microsecond,
			}
			if r.RetryAfterUS == model.Never {
				want.RetryAfter = Never
			}
			require.Equal(t, withoutGrant(want), withoutGrant(got), "call %d, n %d", i, n)
			clock.Advance(time.Duration(rng.Int64N(int64(1500 * time.Millisecond))))
		}
	})
}

// Two configurations of a fixed window, a sliding window or a bucket of
// which neither is looser in both terms (a larger limit over a longer window, a larger
// capacity at a slower rate: 10 at 10/s next to 100 at 1/s), alternating
// on one key: the grants in any interval stay within the envelope of the
// two, what a configuration with the larger limit over the shorter window
// (the larger capacity at the faster rate) grants alone (docs/keys.md).
// The first trace of each is a client that uses the faster configuration
// to the full, then the larger one: 10 a second for 10 s, then 100.
func TestSharedKeyNeitherLooser(t *testing.T) {
	type config struct {
		limit int
		per   time.Duration // a window, or the time one permit takes to drain
	}
	newLimiter := func(alg string, c config) func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
		return func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			switch alg {
			case "fixed_window":
				return NewFixedWindow(rdb, c.limit, c.per, opts...)
			case "sliding_window":
				return NewSlidingWindow(rdb, c.limit, c.per, 100*time.Millisecond, opts...)
			case "leaky_bucket":
				return NewLeakyBucket(rdb, c.limit, Rate{Count: 1, Per: c.per}, opts...)
			}
			return NewTokenBucket(rdb, c.limit, Rate{Count: 1, Per: c.per}, opts...)
		}
	}
	envelope := func(alg string, fast, large config) func(time.Duration) int {
		switch alg {
		case "fixed_window":
			return func(T time.Duration) int { return large.limit * (pairCeilDiv(T, fast.per) + 1) }
		case "sliding_window":
			return pairWindowBound(large.limit, fast.per, 100*time.Millisecond)
		}
		return func(T time.Duration) int { return large.limit + pairCeilDiv(T, fast.per) }
	}
	for _, alg := range []string{"fixed_window", "sliding_window", "leaky_bucket", "token_bucket"} {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				rng := rand.New(rand.NewPCG(7+testseed.Offset(t), uint64(len(alg))))
				for trace := range shortOr(2, 6) {
					fast := config{1 + rng.IntN(10), time.Duration(1+rng.IntN(10)) * 100 * time.Millisecond}
					large := config{fast.limit * (2 + rng.IntN(10)), fast.per * time.Duration(2+rng.IntN(20))}
					if trace == 0 {
						fast, large = config{10, 100 * time.Millisecond}, config{100, time.Second}
						if alg == "fixed_window" || alg == "sliding_window" {
							fast, large = config{10, time.Second}, config{100, 100 * time.Second}
						}
					}
					clock := newClock()
					prefix := fmt.Sprintf("neither:%s:%d:", alg, trace)
					var ls [2]Limiter
					for i, c := range []config{fast, large} {
						l, err := newLimiter(alg, c)(b.rdb, WithPrefix(prefix), WithClock(clock.Now))
						require.NoError(t, err)
						ls[i] = l
					}
					desc := fmt.Sprintf("%s: %d per %v and %d per %v", alg, fast.limit, fast.per, large.limit, large.per)
					var grants []pairGrant
					allow := func(i, n int) {
						r, err := ls[i].AllowN(ctx, "k", n)
						require.NoError(t, err, desc)
						if r.Allowed && n > 0 {
							grants = append(grants, pairGrant{clock.now, n})
						}
					}
					if trace == 0 {
						for range 10 {
							for range fast.limit {
								allow(0, 1)
							}
							clock.Advance(time.Second)
						}
						allow(1, large.limit)
					} else {
						for range 400 {
							n := 1 + rng.IntN(3)
							if rng.IntN(10) == 0 {
								n = large.limit - rng.IntN(fast.limit)
							}
							allow(rng.IntN(2), n)
							clock.Advance(time.Duration(rng.Int64N(int64(fast.per) + 1)))
						}
					}
					periods := []time.Duration{fast.per, large.per, 10 * fast.per, 10 * time.Second}
					if v := pairViolation(grants, periods, envelope(alg, fast, large)); v != "" {
						t.Errorf("%s (per: a window, or one permit's drain): %s", desc, v)
					}
				}
			})
		})
	}
}
