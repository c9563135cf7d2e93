package model

import (
	"fmt"
	"math/big"
)

// LeakyBucket is the reference model of a leaky-bucket limiter, in the level
// view: the bucket holds a level ℓ in [0, C] that leaks at R = count/perUS
// permits per microsecond; a request for n permits is granted iff ℓ + n <= C,
// and then raises the level by n. Arithmetic is exact (math/big.Rat).
//
// The level is kept as the grants still in it, oldest leaking first, at
// the key's time (see bucketTimeline): a call decides at the later of its
// clock and that time, as at that time. Only a grant or a refund
// changes the state.
type LeakyBucket struct {
	b bucketTimeline
}

var _ Refunder = (*LeakyBucket)(nil)

// NewLeakyBucket returns a leaky-bucket model of the given capacity leaking
// count permits per perUS microseconds. It panics if capacity < 0,
// count <= 0 or perUS <= 0.
func NewLeakyBucket(capacity, count, perUS int64) *LeakyBucket {
	if capacity < 0 || count <= 0 || perUS <= 0 {
		panic(fmt.Sprintf("model: invalid leaky bucket capacity=%d count=%d perUS=%d",
			capacity, count, perUS))
	}
	return &LeakyBucket{newBucketTimeline(capacity, count, perUS)}
}

// Reset empties the bucket and forgets the key's time.
func (m *LeakyBucket) Reset() { m.b.reset() }

// Step decides a request for n permits at time nowUS.
func (m *LeakyBucket) Step(nowUS int64, n int64) Result {
	C, R := m.b.capacity, m.b.rate
	allowed, level, id := m.b.step(nowUS, n)
	res := Result{Limit: floorRat(C), Allowed: allowed, GrantID: id}
	switch {
	case big.NewRat(n, 1).Cmp(C) > 0: // n > C
		res.RetryAfterUS = Never
	case !allowed:
		// ceil((ℓ + n - C) / R)
		over := new(big.Rat).Sub(new(big.Rat).Add(level, big.NewRat(n, 1)), C)
		res.RetryAfterUS = ceilRat(over.Quo(over, R))
	}
	res.Remaining = floorRat(new(big.Rat).Sub(C, level))
	res.ResetAfterUS = ceilRat(new(big.Rat).Quo(level, R))
	return res
}

// Refund gives back permits of the grant grantID until k of them in all
// have been given back, as far as they are still in the bucket; it returns
// the whole permits this call gave back.
func (m *LeakyBucket) Refund(nowUS, grantID, k int64) int64 {
	return floorRat(m.b.refund(nowUS, grantID, k))
}

// Clone returns an independent copy of m.
func (m *LeakyBucket) Clone() Model {
	return &LeakyBucket{m.b.clone()}
}
