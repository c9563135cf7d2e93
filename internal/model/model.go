// Package model holds plain, deliberately unoptimised reference models of the
// rate-limiting algorithms offered by redlimit: fixed window, sliding window,
// sliding log, leaky bucket and token bucket.
//
// The models are the oracle in differential tests against the Lua scripts, so
// they are written straight from the specification, favouring clarity over
// speed: maps of buckets walked in loops, and exact rational arithmetic
// (math/big.Rat) for the continuous buckets. They do not mimic any storage
// encoding.
//
// All times are int64 Unix microseconds and are never negative. Every model
// has Step(nowUS, n), which decides a request for n >= 0 permits at time
// nowUS, and Reset, which forgets all state. Models are not safe for
// concurrent use.
package model

import (
	"fmt"
	"math/big"
	"sort"
)

// Never is the RetryAfterUS reported when a request can never be allowed,
// because it asks for more permits than the capacity.
const Never = -1

// Result is the outcome of one Step.
type Result struct {
	// Allowed reports whether the request was granted (and its permits
	// consumed).
	Allowed bool
	// Limit is the capacity/limit of the reported policy.
	Limit int64
	// Remaining is the number of permits still available right after this
	// decision, rounded down, never negative.
	Remaining int64
	// RetryAfterUS is, for a denied request, the number of microseconds
	// (rounded up) until the same request would be allowed if nothing else
	// consumes permits meanwhile; Never when n exceeds the capacity; 0 when
	// the request was allowed.
	RetryAfterUS int64
	// ResetAfterUS is the number of microseconds (rounded up) until the key
	// is back in its initial, fully available state.
	ResetAfterUS int64
	// Strategy is, for SlidingLog only, the index of the reported strategy;
	// it is 0 for every other model.
	Strategy int
	// GrantID names, for a granted request with n > 0, the grant, for
	// Refund; 0 otherwise.
	GrantID int64
}

// Model is implemented by every reference model in this package.
type Model interface {
	// Step decides a request for n >= 0 permits at time nowUS (Unix
	// microseconds) and updates the state accordingly.
	Step(nowUS int64, n int64) Result
	// Reset forgets all state, returning the model to its initial state.
	Reset()
	// Clone returns an independent copy: stepping the copy shows what a
	// call would decide without changing the model.
	Clone() Model
}

// StepStored steps m as the scripts and the in-process limiters keep their
// state, which Step alone does not for the fixed window and the buckets.
// They write only a grant, or a clamp when the clock went back, so a call
// that finds the key back in its initial state without granting leaves it
// as it was: should the clock go back into the time it was in use, what it
// held counts again ("n == 0 changes nothing", DESIGN property 10). Step
// takes that call's time as the state's instead. The sliding models keep
// their state as the sliding scripts do, so for them StepStored is Step.
func StepStored(m Model, nowUS, n int64) Result {
	switch m.(type) {
	case *SlidingWindow, *SlidingLog:
		return m.Step(nowUS, n)
	}
	r := m.Clone().Step(nowUS, n)
	if (r.Allowed && n > 0) || r.ResetAfterUS != 0 {
		return m.Step(nowUS, n)
	}
	return r
}

// Refunder is implemented by the models that take refunds (DESIGN "Grants
// and refunds"): Refund gives back permits of the grant named grantID at
// time nowUS until k of them in all have been given back (the largest k
// any Refund of it asked for, never a sum), as far as the algorithm still
// counts them, and returns how many this call gave back.
type Refunder interface {
	Refund(nowUS, grantID, k int64) (given int64)
}

var (
	_ Model = (*FixedWindow)(nil)
	_ Model = (*SlidingWindow)(nil)
	_ Model = (*SlidingLog)(nil)
	_ Model = (*LeakyBucket)(nil)
	_ Model = (*TokenBucket)(nil)

	_ Refunder = (*SlidingWindow)(nil)
	_ Refunder = (*SlidingLog)(nil)
)

// floorDiv returns floor(a / b) for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// floorRat returns floor(x); it panics if the result does not fit an int64.
func floorRat(x *big.Rat) int64 {
	// big.Int.Div is Euclidean division; with the (always positive)
	// denominator as divisor that is exactly the floor.
	q := new(big.Int).Div(x.Num(), x.Denom())
	if !q.IsInt64() {
		panic(fmt.Sprintf("model: %s does not fit in int64", q))
	}
	return q.Int64()
}

// ceilRat returns ceil(x) = -floor(-x); it panics if the result does not fit
// an int64.
func ceilRat(x *big.Rat) int64 {
	return -floorRat(new(big.Rat).Neg(x))
}

// buckets maps a bucket index (floor(t / P), i.e. buckets aligned to the Unix
// epoch) to the number of permits granted in that bucket. Empty buckets are
// never stored.
type buckets map[int64]int64

// indices returns the stored bucket indices in ascending order (oldest
// first).
func (bs buckets) indices() []int64 {
	idx := make([]int64, 0, len(bs))
	for k := range bs {
		idx = append(idx, k)
	}
	sort.Slice(idx, func(i, j int) bool { return idx[i] < idx[j] })
	return idx
}

// sum returns the permits in the window of nb buckets ending at bucket b,
// i.e. in the buckets with index in (b - nb, b].
func (bs buckets) sum(b, nb int64) int64 {
	total := int64(0)
	for k, c := range bs {
		if k > b-nb && k <= b {
			total += c
		}
	}
	return total
}

// retryAfter returns how long a request at time t (in bucket b) must wait
// until excess permits have left the window of nb buckets of length p: walk
// the in-window buckets from oldest to newest accumulating their counts
// until the sum reaches excess, at bucket k; bucket k leaves the window when
// the bucket index reaches k + nb, i.e. at time (k + nb) * p.
func (bs buckets) retryAfter(b, nb, p, t, excess int64) int64 {
	acc := int64(0)
	for _, k := range bs.indices() {
		if k <= b-nb || k > b {
			continue
		}
		acc += bs[k]
		if acc >= excess {
			return (k+nb)*p - t
		}
	}
	panic("model: excess exceeds the permits in the window")
}

// resetAfter returns the time from t until every stored bucket has left a
// window of nb buckets of length p: (newest index + nb) * p - t, or 0 if
// there are no buckets.
func (bs buckets) resetAfter(nb, p, t int64) int64 {
	if len(bs) == 0 {
		return 0
	}
	idx := bs.indices()
	newest := idx[len(idx)-1]
	return max(0, (newest+nb)*p-t)
}

// clone returns a copy of bs.
func (bs buckets) clone() buckets {
	c := make(buckets, len(bs))
	for k, v := range bs {
		c[k] = v
	}
	return c
}
