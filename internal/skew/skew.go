// Package skew checks DESIGN's bound for callers whose clocks disagree
// ("A key's time"): callers whose clocks are at most S apart get, in any
// interval of real time, at most what the configuration grants in that
// interval lengthened by S. The tests of the scripts and of the
// in-process limiters run the same random traces through it.
package skew

import (
	"fmt"
	"math/rand/v2"
	"sort"
)

// Allowance returns the most a configuration grants a single caller in any
// interval of d µs (d >= 0), whatever the timing of its requests.
type Allowance func(d int64) int64

// FixedWindow is the allowance of limit per window (µs): each window opens
// at least a window after the one before, so an interval of d holds the
// openings of at most d/window + 1 windows, and the end of one opened
// before it, whose opening grant (at least one permit) is outside it.
func FixedWindow(limit, windowUS int64) Allowance {
	return func(d int64) int64 { return limit*(d/windowUS+2) - 1 }
}

// Sliding is the allowance of a sliding log of precision p (µs) whose
// strategies hold limits[i] in sizes[i] buckets: an interval of d meets at
// most d/p + 1 buckets, and every run of sizes[i] buckets holds at most
// limits[i]; the strictest strategy binds.
func Sliding(p int64, limits, sizes []int64) Allowance {
	return func(d int64) int64 {
		buckets := d/p + 1
		most := int64(-1)
		for i, l := range limits {
			a := l * ((buckets + sizes[i] - 1) / sizes[i])
			if most < 0 || a < most {
				most = a
			}
		}
		return most
	}
}

// Bucket is the allowance of a leaky or token bucket of capacity that
// drains or refills count permits per perUS µs: the burst, and the rate
// after.
func Bucket(capacity, count, perUS int64) Allowance {
	return func(d int64) int64 { return capacity + d*count/perUS }
}

// Call is one step of a trace: at real time RealUS, a caller whose clock
// reads ClockUS (RealUS plus its skew) asks for N permits.
type Call struct {
	RealUS, ClockUS int64
	N               int
}

// Trace draws calls on one key by len(skews) callers, whose clocks read
// real time plus their skew (µs, each in [0, S]), in a random order:
// calls at most stepUS apart in real time (now and then a pause of up to
// pauseUS), asking for 1 to maxN permits. Real time starts at startUS.
func Trace(rng *rand.Rand, calls int, startUS int64, skews []int64, stepUS, pauseUS int64, maxN int) []Call {
	out := make([]Call, 0, calls)
	real := startUS
	for range calls {
		if rng.IntN(40) == 0 {
			real += rng.Int64N(pauseUS + 1)
		} else {
			real += rng.Int64N(stepUS + 1)
		}
		skew := skews[rng.IntN(len(skews))]
		out = append(out, Call{RealUS: real, ClockUS: real + skew, N: 1 + rng.IntN(maxN)})
	}
	return out
}

// Skews returns k clock skews in [0, most] µs, the first 0 and the last
// most, so that the callers' clocks are exactly most apart.
func Skews(rng *rand.Rand, k int, most int64) []int64 {
	s := make([]int64, k)
	for i := 1; i < k-1; i++ {
		s[i] = rng.Int64N(most + 1)
	}
	s[k-1] = most
	rng.Shuffle(k, func(i, j int) { s[i], s[j] = s[j], s[i] })
	return s
}

// Grant is a granted call: when (real time, µs) and how many permits.
type Grant struct {
	RealUS int64
	N      int64
}

// Check returns an error describing the first interval of real time in
// which grants exceed allow of that interval lengthened by spreadUS (the
// most the callers' clocks are apart), or nil.
func Check(grants []Grant, spreadUS int64, allow Allowance) error {
	g := append([]Grant(nil), grants...)
	sort.SliceStable(g, func(i, j int) bool { return g[i].RealUS < g[j].RealUS })
	for i := range g {
		var sum int64
		for j := i; j < len(g); j++ {
			sum += g[j].N
			d := g[j].RealUS - g[i].RealUS
			if most := allow(d + spreadUS); sum > most {
				return fmt.Errorf("%d permits granted in %dµs of real time (from %d to %d), where clocks %dµs apart may get at most %d (the allowance of %dµs)",
					sum, d, g[i].RealUS, g[j].RealUS, spreadUS, most, d+spreadUS)
			}
		}
	}
	return nil
}
