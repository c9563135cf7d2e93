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
type TokenBucket struct {
	capacity *big.Rat // C
	rate     *big.Rat // R, tokens per microsecond

	hasState bool     // whether (tokens, lastUS) is set; if not, the bucket is full
	tokens   *big.Rat // τ at lastUS
	lastUS   int64
}

// NewTokenBucket returns a token-bucket model of the given capacity refilled
// with count tokens per perUS microseconds. It panics if capacity < 0,
// count <= 0 or perUS <= 0.
func NewTokenBucket(capacity, count, perUS int64) *TokenBucket {
	if capacity < 0 || count <= 0 || perUS <= 0 {
		panic(fmt.Sprintf("model: invalid token bucket capacity=%d count=%d perUS=%d",
			capacity, count, perUS))
	}
	return &TokenBucket{
		capacity: big.NewRat(capacity, 1),
		rate:     big.NewRat(count, perUS),
	}
}

// Reset fills the bucket and forgets the last update time.
func (m *TokenBucket) Reset() {
	m.hasState, m.tokens, m.lastUS = false, nil, 0
}

// tokensAt returns τ(t) = clamp(τ0 + (t - t0)·R, 0, C), and whether it was
// clamped at 0: for t < t0 (the clock went backwards) tokens are lost, and
// below 0 the bucket reads as empty. Without state the bucket is full.
func (m *TokenBucket) tokensAt(t int64) (*big.Rat, bool) {
	if !m.hasState {
		return new(big.Rat).Set(m.capacity), false
	}
	refill := new(big.Rat).Mul(big.NewRat(t-m.lastUS, 1), m.rate)
	tokens := new(big.Rat).Add(m.tokens, refill)
	return clampRat(tokens, new(big.Rat), m.capacity), tokens.Sign() < 0
}

// Step decides a request for n permits at time nowUS. Like the scripts, it
// stores the token count only when it grants, or when the clock went back
// so far that the bucket read as empty (so that no key stays empty for
// longer than C/R from now): a denial or n == 0 otherwise changes nothing.
func (m *TokenBucket) Step(nowUS int64, n int64) Result {
	t, C := nowUS, m.capacity
	tokens, empty := m.tokensAt(t)
	need := big.NewRat(n, 1)

	res := Result{Limit: floorRat(C)}
	switch {
	case need.Cmp(C) > 0: // n > C
		res.RetryAfterUS = Never
	case n == 0:
		res.Allowed = true
	case tokens.Cmp(need) >= 0:
		res.Allowed = true
		tokens = new(big.Rat).Sub(tokens, need)
	default:
		// ceil((n - τ) / R)
		missing := new(big.Rat).Sub(need, tokens)
		res.RetryAfterUS = ceilRat(missing.Quo(missing, m.rate))
	}

	if (res.Allowed && n > 0) || empty {
		m.hasState, m.tokens, m.lastUS = true, tokens, t
	}

	res.Remaining = floorRat(tokens)
	missing := new(big.Rat).Sub(C, tokens)
	res.ResetAfterUS = ceilRat(missing.Quo(missing, m.rate))
	return res
}

// Clone returns an independent copy of m (its numbers are never changed in
// place, so they are shared).
func (m *TokenBucket) Clone() Model {
	c := *m
	return &c
}
