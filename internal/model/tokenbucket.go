package model

import (
	"fmt"
	"math/big"
)

// TokenBucket is the reference model of a token-bucket limiter, in the
// tokens view: the bucket holds τ in [0, C] tokens, starts full, and is
// refilled at R = count/perUS tokens per microsecond; a request for n permits
// is granted iff τ >= n, and then takes n tokens. Arithmetic is exact
// (math/big.Rat).
//
// The missing tokens C - τ are kept as the grants that took them, the
// oldest refilled first, at the key's time (see bucketTimeline): a call
// decides at the later of its clock and that time, as at that time. Only
// a grant or a refund changes the state.
type TokenBucket struct {
	b bucketTimeline
}

var _ Refunder = (*TokenBucket)(nil)

// NewTokenBucket returns a token-bucket model of the given capacity refilled
// with count tokens per perUS microseconds. It panics if capacity < 0,
// count <= 0 or perUS <= 0.
func NewTokenBucket(capacity, count, perUS int64) *TokenBucket {
	if capacity < 0 || count <= 0 || perUS <= 0 {
		panic(fmt.Sprintf("model: invalid token bucket capacity=%d count=%d perUS=%d",
			capacity, count, perUS))
	}
	return &TokenBucket{newBucketTimeline(capacity, count, perUS)}
}

// Reset fills the bucket and forgets the key's time.
func (m *TokenBucket) Reset() { m.b.reset() }

// Step decides a request for n permits at time nowUS: τ = C - ℓ, where
// ℓ is the missing tokens.
func (m *TokenBucket) Step(nowUS int64, n int64) Result {
	C, R := m.b.capacity, m.b.rate
	allowed, missing, id := m.b.step(nowUS, n)
	tokens := new(big.Rat).Sub(C, missing)
	need := big.NewRat(n, 1)
	res := Result{Limit: floorRat(C), Allowed: allowed, GrantID: id}
	switch {
	case need.Cmp(C) > 0: // n > C
		res.RetryAfterUS = Never
	case !allowed:
		// ceil((n - τ) / R)
		short := new(big.Rat).Sub(need, tokens)
		res.RetryAfterUS = ceilRat(short.Quo(short, R))
	}
	res.Remaining = floorRat(tokens)
	res.ResetAfterUS = ceilRat(new(big.Rat).Quo(missing, R))
	return res
}

// Refund gives back tokens of the grant grantID until k of them in all
// have been given back, as far as they have not been refilled; it returns
// the whole tokens this call gave back.
func (m *TokenBucket) Refund(nowUS, grantID, k int64) int64 {
	return floorRat(m.b.refund(nowUS, grantID, k))
}

// Clone returns an independent copy of m.
func (m *TokenBucket) Clone() Model {
	return &TokenBucket{m.b.clone()}
}
