package redlimit

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
)

const (
	sharedKeyPairs = 20 // configuration pairs per algorithm
	// Calls per trace at most: miniredis's Lua takes most of the test's
	// time. Checking a configuration alone (the bounds) takes fewer.
	sharedKeyMaxSteps      = 300
	sharedKeyMaxAloneSteps = 120
)

// sharedConfig is one configuration of an algorithm, with what the test
// needs to know of it.
type sharedConfig struct {
	desc string
	make func(rdb redis.Scripter, opts ...Option) (Limiter, error)
	// periods are the windows (every strategy's) or the full-refill time:
	// the interval lengths checked.
	periods []time.Duration
	// pace is the shortest time per permit at the configuration's steady
	// rate; traces step about this fast so that limits bind.
	pace time.Duration
	// most returns the most permits this configuration alone grants in
	// any interval [t, t+T) of T µs, whatever the key's history before t.
	most func(T int64) int64
}

// sharedAlgorithm draws pairs of configurations of one algorithm.
type sharedAlgorithm struct {
	name string
	pair func(rng *rand.Rand) (looser, tighter sharedConfig)
}

// memoMost caches a most function: each bound is a simulation.
func memoMost(most func(T int64) int64) func(T int64) int64 {
	cache := map[int64]int64{}
	return func(T int64) int64 {
		if v, ok := cache[T]; ok {
			return v
		}
		v := most(T)
		cache[T] = v
		return v
	}
}

// greedyMost runs a reference model from a fresh key at fromUS, asking for
// one permit again at once after each grant and at RetryAfter after each
// denial (the model's RetryAfter is exact), and counts the grants in
// [fromUS, fromUS+T). A fresh key is the worst history for the sliding
// algorithms and the buckets (nothing counted, bucket full), and asking at
// the first instant a permit is there is the most any caller can get: for
// buckets that is capacity + floor(rate × (T-1µs)); for the sliding rules,
// the greedy shaper's min-plus closure of min_i L_i·ceil(buckets/N_i) over
// the buckets the interval touches, which bounds every trace.
func greedyMost(m model.Model, fromUS, T int64) int64 {
	granted := int64(0)
	for now := fromUS; now < fromUS+T; {
		r := m.Step(now, 1)
		if r.Allowed {
			granted++
			continue
		}
		if r.RetryAfterUS <= 0 {
			panic(fmt.Sprintf("greedyMost: denied with RetryAfterUS %d", r.RetryAfterUS))
		}
		now += r.RetryAfterUS
	}
	return granted
}

func ceilDiv64(a, b int64) int64 { return (a + b - 1) / b }

func fixedWindowConfig(limit int, window time.Duration) sharedConfig {
	L, W := int64(limit), window.Microseconds()
	return sharedConfig{
		desc: fmt.Sprintf("fixed_window(%d per %v)", limit, window),
		make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewFixedWindow(rdb, limit, window, opts...)
		},
		periods: []time.Duration{window},
		pace:    window / time.Duration(limit),
		// Closed form, since a fresh key is not the worst history: a
		// window opens with a grant, holds at most L and lasts W. Either
		// no window is open at t, and at most ceil(T/W) windows open in
		// [t, t+T); or one opened at s in (t-W, t) with its opening grant
		// outside the interval (at most L-1 inside), and the next ones
		// open from s+W >= t+1, at most ceil((T-1)/W) of them.
		most: func(T int64) int64 {
			return max(L*ceilDiv64(T, W), L-1+L*ceilDiv64(T-1, W))
		},
	}
}

func slidingWindowConfig(limit int, window, precision time.Duration) sharedConfig {
	P := precision.Microseconds()
	return sharedConfig{
		desc: fmt.Sprintf("sliding_window(%d per %v by %v)", limit, window, precision),
		make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingWindow(rdb, limit, window, precision, opts...)
		},
		periods: []time.Duration{window},
		pace:    window / time.Duration(limit),
		// Starting in the last µs of a bucket, an interval touches the
		// most buckets: ceil((T-1)/P) + 1.
		most: memoMost(func(T int64) int64 {
			return greedyMost(model.NewSlidingWindow(int64(limit), window.Microseconds(), P), P-1, T)
		}),
	}
}

func slidingLogConfig(precision time.Duration, strategies []Strategy) sharedConfig {
	P := precision.Microseconds()
	var limits, windows []int64
	var periods []time.Duration
	var parts []string
	pace := time.Duration(1<<63 - 1)
	for _, s := range strategies {
		limits = append(limits, int64(s.Limit))
		windows = append(windows, s.Window.Microseconds())
		periods = append(periods, s.Window)
		parts = append(parts, fmt.Sprintf("%d per %v", s.Limit, s.Window))
		pace = min(pace, s.Window/time.Duration(s.Limit))
	}
	return sharedConfig{
		desc: fmt.Sprintf("sliding_log(by %v: %s)", precision, strings.Join(parts, ", ")),
		make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingLog(rdb, precision, strategies, opts...)
		},
		periods: periods,
		pace:    pace,
		most: memoMost(func(T int64) int64 {
			return greedyMost(model.NewSlidingLog(P, limits, windows), P-1, T)
		}),
	}
}

// bucketConfig is a leaky or token bucket: both grant capacity at once and
// then rate, and have the same bound.
func bucketConfig(name string, capacity int, rate Rate) sharedConfig {
	C, count, perUS := int64(capacity), int64(rate.Count), rate.Per.Microseconds()
	newLimiter := func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
		return NewTokenBucket(rdb, capacity, rate, opts...)
	}
	newModel := func() model.Model { return model.NewTokenBucket(C, count, perUS) }
	if name == "leaky_bucket" {
		newLimiter = func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewLeakyBucket(rdb, capacity, rate, opts...)
		}
		newModel = func() model.Model { return model.NewLeakyBucket(C, count, perUS) }
	}
	return sharedConfig{
		desc:    fmt.Sprintf("%s(capacity %d, %d per %v)", name, capacity, rate.Count, rate.Per),
		make:    newLimiter,
		periods: []time.Duration{time.Duration(ceilDiv64(C*perUS, count)) * time.Microsecond},
		pace:    rate.Per / time.Duration(rate.Count),
		most:    memoMost(func(T int64) int64 { return greedyMost(newModel(), 0, T) }),
	}
}

// seconds returns a whole number of seconds, plus some milliseconds half the
// time, so that windows and rates are not always round.
func seconds(rng *rand.Rand, n int) time.Duration {
	d := time.Duration(n) * time.Second
	if rng.IntN(2) == 0 {
		d += time.Duration(rng.IntN(1000)) * time.Millisecond
	}
	return d
}

// sharedAlgorithms draw, for each algorithm, a looser A and a tighter B:
// limits and capacities 1..20, periods of 1s to about 2min, B's periods at
// most 4× A's so that a trace of a few hundred steps spans several of them.
// B changes each of A's settings with probability 1/2, like a deploy that
// turns one knob or several.
var sharedAlgorithms = []sharedAlgorithm{
	{name: "fixed_window", pair: func(rng *rand.Rand) (sharedConfig, sharedConfig) {
		for {
			limitA, windowA := 1+rng.IntN(20), seconds(rng, 1+rng.IntN(30))
			limitB, windowB := limitA, windowA
			if change(rng) {
				limitB = 1 + rng.IntN(limitA)
			}
			if change(rng) {
				windowB += time.Duration(1+rng.Int64N(3*int64(windowA/time.Second))) * time.Second
			}
			if limitA != limitB || windowA != windowB {
				return fixedWindowConfig(limitA, windowA), fixedWindowConfig(limitB, windowB)
			}
		}
	}},
	{name: "sliding_window", pair: func(rng *rand.Rand) (sharedConfig, sharedConfig) {
		for {
			// A coarser precision is looser (an interval of any length
			// touches at least as many windows' worth of it), so A's
			// precision is a multiple of B's.
			precisionB := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}[rng.IntN(3)]
			precisionA := precisionB
			if change(rng) {
				precisionA *= time.Duration(2 + 2*rng.IntN(2))
			}
			windowA := precisionA * time.Duration(1+rng.Int64N(max(1, int64(30*time.Second/precisionA))))
			windowB := windowA
			if change(rng) {
				windowB += precisionB * time.Duration(1+rng.Int64N(int64(3*windowA/precisionB)))
			}
			limitA := 1 + rng.IntN(20)
			limitB := limitA
			if change(rng) {
				limitB = 1 + rng.IntN(limitA)
			}
			if limitA != limitB || windowA != windowB || precisionA != precisionB {
				return slidingWindowConfig(limitA, windowA, precisionA), slidingWindowConfig(limitB, windowB, precisionB)
			}
		}
	}},
	{name: "sliding_log", pair: func(rng *rand.Rand) (sharedConfig, sharedConfig) {
		for {
			precisionB := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}[rng.IntN(3)]
			precisionA := precisionB
			if rng.IntN(4) == 0 {
				precisionA *= 2
			}
			a := randomStrategies(rng, precisionA, 30*time.Second)
			// B keeps or tightens most of A's strategies and may add its own.
			var b []Strategy
			for _, s := range a {
				if rng.IntN(4) == 0 {
					continue
				}
				if change(rng) {
					s.Limit = 1 + rng.IntN(s.Limit)
				}
				if change(rng) {
					s.Window += precisionB * time.Duration(1+rng.Int64N(int64(3*s.Window/precisionB)))
				}
				b = append(b, s)
			}
			if len(b) == 0 || rng.IntN(3) == 0 {
				b = append(b, Strategy{
					Limit:  1 + rng.IntN(20),
					Window: precisionB * time.Duration(1+rng.Int64N(int64(120*time.Second/precisionB))),
				})
			}
			slices.SortFunc(b, func(x, y Strategy) int { return cmp.Compare(x.Window, y.Window) })
			if len(b) > 3 || !validStrategies(b) || !impliesAll(b, a) ||
				(precisionA == precisionB && slices.Equal(a, b)) {
				continue
			}
			return slidingLogConfig(precisionA, a), slidingLogConfig(precisionB, b)
		}
	}},
	{name: "leaky_bucket", pair: func(rng *rand.Rand) (sharedConfig, sharedConfig) {
		return bucketPair(rng, "leaky_bucket")
	}},
	{name: "token_bucket", pair: func(rng *rand.Rand) (sharedConfig, sharedConfig) {
		return bucketPair(rng, "token_bucket")
	}},
}

// randomStrategies draws 1 to 3 valid strategies: windows multiples of
// precision up to about longest, longer windows with larger limits, all
// limits at most 20.
func randomStrategies(rng *rand.Rand, precision, longest time.Duration) []Strategy {
	for {
		var s []Strategy
		for range 1 + rng.IntN(3) {
			s = append(s, Strategy{
				Limit:  1 + rng.IntN(20),
				Window: precision * time.Duration(1+rng.Int64N(max(1, int64(longest/precision)))),
			})
		}
		slices.SortFunc(s, func(x, y Strategy) int { return cmp.Compare(x.Window, y.Window) })
		if validStrategies(s) {
			return s
		}
	}
}

// validStrategies: sorted by window, windows and limits strictly increasing.
func validStrategies(s []Strategy) bool {
	for i := 1; i < len(s); i++ {
		if s[i].Window <= s[i-1].Window || s[i].Limit <= s[i-1].Limit {
			return false
		}
	}
	return true
}

// impliesAll reports whether every strategy of a is implied by one of b (a
// smaller or equal limit over a longer or equal window), so that whatever b
// admits, a admits.
func impliesAll(b, a []Strategy) bool {
	for _, sa := range a {
		if !slices.ContainsFunc(b, func(sb Strategy) bool { return sb.Limit <= sa.Limit && sb.Window >= sa.Window }) {
			return false
		}
	}
	return true
}

func bucketPair(rng *rand.Rand, name string) (sharedConfig, sharedConfig) {
	for {
		capacityA := 1 + rng.IntN(20)
		rateA := Rate{Count: 1 + rng.IntN(20), Per: seconds(rng, 1+rng.IntN(10))}
		capacityB, rateB := capacityA, rateA
		if change(rng) {
			capacityB = 1 + rng.IntN(capacityA)
		}
		// B's rate is at most A's: fewer permits, or a longer period.
		if change(rng) {
			rateB.Count = 1 + rng.IntN(rateA.Count)
		}
		if change(rng) {
			rateB.Per += time.Duration(1+rng.Int64N(3*int64(rateA.Per/time.Millisecond))) * time.Millisecond
		}
		if capacityA != capacityB || rateA != rateB {
			return bucketConfig(name, capacityA, rateA), bucketConfig(name, capacityB, rateB)
		}
	}
}

// change reports whether B changes one of A's settings: half the time.
func change(rng *rand.Rand) bool { return rng.IntN(2) == 0 }

// sharedStep is one call of a trace: advance the clock, then ask limiter
// who (0: A, 1: B) for n permits.
type sharedStep struct {
	advance time.Duration
	who     int
	n       int
}

// sharedDecision is what a call decided, at µs since the trace began.
type sharedDecision struct {
	atUS    int64
	who, n  int
	allowed bool
}

// sharedTrace draws a trace: twice the longest period long (at
// most maxSteps calls), stepping a few times per pace of the
// faster configuration, some steps zero, now and then a long pause. who
// picks the limiter of step i.
func sharedTrace(rng *rand.Rand, a, b sharedConfig, maxSteps int, who func(i int) int) []sharedStep {
	longest := slices.Max(slices.Concat(a.periods, b.periods))
	mean := time.Duration(float64(min(a.pace, b.pace)) * (0.1 + 0.9*rng.Float64()))
	var steps []sharedStep
	for elapsed := time.Duration(0); elapsed < 2*longest && len(steps) < maxSteps; {
		var advance time.Duration
		switch p := rng.IntN(100); {
		case p < 15:
		case p < 96:
			advance = time.Duration(rng.Int64N(int64(2*mean) + 1))
		default:
			advance = time.Duration(rng.Int64N(int64(longest) + 1))
		}
		advance = advance.Truncate(time.Microsecond)
		n := 1
		switch p := rng.IntN(10); {
		case p == 0:
			n = 0
		case p >= 8:
			n = 2 + rng.IntN(2)
		}
		steps = append(steps, sharedStep{advance: advance, who: who(len(steps)), n: n})
		elapsed += advance
	}
	return steps
}

// runShared plays steps on key through limiters (A, B) sharing clock.
func runShared(t *testing.T, b backend, clock *fakeClock, limiters [2]Limiter, key string, steps []sharedStep) []sharedDecision {
	t.Helper()
	ctx := context.Background()
	if b.mini == nil {
		// Real Redis counts TTLs in real time while the fake clock runs
		// ahead; a key keeps a TTL (one without is foreign).
		keepTTL(b.rdb, time.Hour)
	}
	start := clock.now
	decisions := make([]sharedDecision, 0, len(steps))
	for i, s := range steps {
		clock.Advance(s.advance)
		got, err := limiters[s.who].AllowN(ctx, key, s.n)
		require.NoError(t, err, "step %d: %s asks %d at +%v: a shared key must be handled, never rejected",
			i, "AB"[s.who:s.who+1], s.n, clock.now.Sub(start))
		decisions = append(decisions, sharedDecision{atUS: clock.now.Sub(start).Microseconds(), who: s.who, n: s.n, allowed: got.Allowed})
	}
	return decisions
}

// sharedViolation is an interval holding more grants than allowed.
type sharedViolation struct {
	T       time.Duration
	fromUS  int64
	granted int64
	byWho   [2]int64
	bound   int64
}

// worstViolation returns, over every interval [t, t+T) with T in periods,
// the one whose grants exceed bound(T) the most, or nil. Starting
// intervals at grants is enough: moving a start forward to the next grant
// loses none.
func worstViolation(decisions []sharedDecision, periods []time.Duration, bound func(T int64) int64) *sharedViolation {
	var grants []sharedDecision
	for _, d := range decisions {
		if d.allowed && d.n > 0 {
			grants = append(grants, d)
		}
	}
	var worst *sharedViolation
	for _, period := range periods {
		T := period.Microseconds()
		limit := bound(T)
		end, sum := 0, int64(0)
		var byWho [2]int64
		for _, g := range grants {
			for end < len(grants) && grants[end].atUS < g.atUS+T {
				sum += int64(grants[end].n)
				byWho[grants[end].who] += int64(grants[end].n)
				end++
			}
			if sum > limit && (worst == nil || sum-limit > worst.granted-worst.bound) {
				worst = &sharedViolation{T: period, fromUS: g.atUS, granted: sum, byWho: byWho, bound: limit}
			}
			sum -= int64(g.n)
			byWho[g.who] -= int64(g.n)
		}
	}
	return worst
}

// describeInterval lists the decisions in v's interval, at most 40.
func describeInterval(decisions []sharedDecision, v *sharedViolation) string {
	var lines []string
	for _, d := range decisions {
		if d.atUS < v.fromUS || d.atUS >= v.fromUS+v.T.Microseconds() {
			continue
		}
		if len(lines) == 40 {
			lines = append(lines, "  ...")
			break
		}
		verdict := "denied"
		if d.allowed {
			verdict = "granted"
		}
		lines = append(lines, fmt.Sprintf("  +%v %s n=%d %s", time.Duration(d.atUS)*time.Microsecond, "AB"[d.who:d.who+1], d.n, verdict))
	}
	return strings.Join(lines, "\n")
}

// sharedKeySeed is the shared-key pair tests' seed: REDLIMIT_SEED, or 1
// (the same pairs in every CI run). The tests print it.
func sharedKeySeed(t *testing.T) uint64 {
	if seed := testseed.FromEnv(t); seed != 0 {
		return seed
	}
	return 1
}

// TestSharedKeyNeverExceedsLooser checks property 8: limiters of one
// algorithm with different configurations sharing a key (WithPrefix) never
// admit more than the looser one alone would. It draws pairs of
// configurations A (looser) and B (tighter), drives both on one key with a
// fake clock, alternating and interleaved, and checks every interval whose
// length is a window or full-refill time of either: the permits granted in
// it stay within the most A alone can grant in such an interval, which is
// max(A alone, B alone). Each pair also runs A alone and B alone against
// their own bounds, which checks the bounds.
//
// "Looser" needs an order: the pairs are drawn so that A grants at least as
// much as B in every interval (a larger limit or capacity, a shorter window,
// a faster rate, a coarser precision; B's strategies imply A's), and the
// test requires it of the generator. Configurations looser each in their own
// way (20 per minute against 1 per second) have no looser one, and
// alternating them can beat both bounds however shared state is read.
//
// This is the first promise of property 8, not the second (reading another
// configuration's state never gives any configuration more permits): B
// regaining permits that A's call dropped from the state stays within A's
// bound and passes here.
//
// Subtests are named by algorithm: -run 'TestSharedKeyNeverExceedsLooser/token_bucket'.
func TestSharedKeyNeverExceedsLooser(t *testing.T) {
	skipShort(t, "random configuration pairs, thousands of calls a backend")
	t.Parallel()
	seed := sharedKeySeed(t)
	t.Logf("seed %d (%s=%d repeats this run)", seed, testseed.Env, seed)
	for ai, alg := range sharedAlgorithms {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				for p := range sharedKeyPairs {
					// The same seed draws the same pairs and traces on
					// every backend.
					rng := rand.New(rand.NewPCG(seed, uint64(ai*sharedKeyPairs+p)))
					cfgA, cfgB := alg.pair(rng)
					t.Run(fmt.Sprintf("pair%02d", p), func(t *testing.T) {
						runSharedPair(t, b, seed, alg.name, p, rng, cfgA, cfgB)
					})
				}
			})
		})
	}
}

// runSharedPair checks one pair: A alone and B alone (a check of the
// bounds themselves), then A and B alternating and interleaved on one key.
func runSharedPair(t *testing.T, b backend, seed uint64, algName string, pair int, rng *rand.Rand, cfgA, cfgB sharedConfig) {
	periods := slices.Compact(slices.Sorted(slices.Values(slices.Concat(cfgA.periods, cfgB.periods))))
	for _, period := range periods {
		T := period.Microseconds()
		require.GreaterOrEqual(t, cfgA.most(T), cfgB.most(T),
			"generator: A = %s must be looser than B = %s in every interval of %v", cfgA.desc, cfgB.desc, period)
	}
	clock := &fakeClock{}
	var limiters [2]Limiter
	for i, cfg := range []sharedConfig{cfgA, cfgB} {
		l, err := cfg.make(b.rdb, WithPrefix("p8:"), WithClock(clock.Now))
		require.NoError(t, err, "%s", cfg.desc)
		limiters[i] = l
	}
	first := rng.IntN(2)
	traces := []struct {
		name     string
		maxSteps int
		who      func(i int) int
		bound    func(T int64) int64
		what     string
	}{
		{"A_alone", sharedKeyMaxAloneSteps, func(int) int { return 0 }, cfgA.most, "A alone"},
		{"B_alone", sharedKeyMaxAloneSteps, func(int) int { return 1 }, cfgB.most, "B alone"},
		{"alternate", sharedKeyMaxSteps, func(i int) int { return (first + i) % 2 }, cfgA.most, "A (looser) alone"},
		{"interleave", sharedKeyMaxSteps, func(int) int { return rng.IntN(2) }, cfgA.most, "A (looser) alone"},
	}
	for _, tr := range traces {
		// Drawn outside t.Run so that a -run filter changes no trace. A
		// start off the round epoch puts bucket edges anywhere in it.
		start := epoch.Add(time.Duration(rng.Int64N(int64(10 * time.Second))).Truncate(time.Microsecond))
		steps := sharedTrace(rng, cfgA, cfgB, tr.maxSteps, tr.who)
		key := fmt.Sprintf("%s:%d:%s", algName, pair, tr.name)
		t.Run(tr.name, func(t *testing.T) {
			clock.now = start
			decisions := runShared(t, b, clock, limiters, key, steps)
			if v := worstViolation(decisions, periods, tr.bound); v != nil {
				t.Errorf("%s on %s, seed %d (%s=%d), pair %d, trace %s (%d calls from %v):\n"+
					"A = %s (looser)\nB = %s\n"+
					"interval [+%v, +%v) of %v granted %d permits (A %d, B %d), more than %s grants in any interval of %v: %d (A alone %d, B alone %d)\n"+
					"decisions in the interval:\n%s",
					algName, b.name, seed, testseed.Env, seed, pair, tr.name, len(steps), start.Format(time.RFC3339Nano),
					cfgA.desc, cfgB.desc,
					time.Duration(v.fromUS)*time.Microsecond, time.Duration(v.fromUS)*time.Microsecond+v.T, v.T,
					v.granted, v.byWho[0], v.byWho[1], tr.what, v.T, v.bound, cfgA.most(v.T.Microseconds()), cfgB.most(v.T.Microseconds()),
					describeInterval(decisions, v))
			}
		})
	}
}
