package model

import (
	"fmt"
	"math/big"
)

// LeakyBucket is the reference model of a leaky-bucket limiter, in the level
// view: the bucket holds a level ℓ in [0, C] that leaks at R = count/perUS
// permits per microsecond; a request for n permits is granted iff ℓ + n <= C,
// and then raises the level by n. Arithmetic is exact (math/big.Rat).
type LeakyBucket struct {
	capacity *big.Rat // C
	rate     *big.Rat // R, permits per microsecond

	hasState bool     // whether (level, lastUS) is set; if not, the level is 0
	level    *big.Rat // ℓ at lastUS
	lastUS   int64
}

// NewLeakyBucket returns a leaky-bucket model of the given capacity leaking
// count permits per perUS microseconds. It panics if capacity < 0,
// count <= 0 or perUS <= 0.
func NewLeakyBucket(capacity, count, perUS int64) *LeakyBucket {
	if capacity < 0 || count <= 0 || perUS <= 0 {
		panic(fmt.Sprintf("model: invalid leaky bucket capacity=%d count=%d perUS=%d",
			capacity, count, perUS))
	}
	return &LeakyBucket{
		capacity: big.NewRat(capacity, 1),
		rate:     big.NewRat(count, perUS),
	}
}

// Reset empties the bucket and forgets the last update time.
func (m *LeakyBucket) Reset() {
	m.hasState, m.level, m.lastUS = false, nil, 0
}

// levelAt returns ℓ(t) = clamp(ℓ0 - (t - t0)·R, 0, C), and whether it was
// clamped at C: for t < t0 (the clock went backwards) the level rises, and
// above C it reads as full. Without state the level is 0.
func (m *LeakyBucket) levelAt(t int64) (*big.Rat, bool) {
	if !m.hasState {
		return new(big.Rat), false
	}
	leaked := new(big.Rat).Mul(big.NewRat(t-m.lastUS, 1), m.rate)
	level := new(big.Rat).Sub(m.level, leaked)
	return clampRat(level, new(big.Rat), m.capacity), level.Cmp(m.capacity) > 0
}

// Step decides a request for n permits at time nowUS. Like the scripts, it
// stores the level only when it grants, or when the clock went back so far
// that the level read as full (so that no key stays full for longer than
// C/R from now): a denial or n == 0 otherwise changes nothing.
func (m *LeakyBucket) Step(nowUS int64, n int64) Result {
	t, C := nowUS, m.capacity
	level, full := m.levelAt(t)
	want := new(big.Rat).Add(level, big.NewRat(n, 1)) // ℓ + n

	res := Result{Limit: floorRat(C)}
	switch {
	case big.NewRat(n, 1).Cmp(C) > 0: // n > C
		res.RetryAfterUS = Never
	case n == 0:
		res.Allowed = true
	case want.Cmp(C) <= 0:
		res.Allowed = true
		level = want
	default:
		// ceil((ℓ + n - C) / R)
		over := new(big.Rat).Sub(want, C)
		res.RetryAfterUS = ceilRat(over.Quo(over, m.rate))
	}

	if (res.Allowed && n > 0) || full {
		m.hasState, m.level, m.lastUS = true, level, t
	}

	res.Remaining = floorRat(new(big.Rat).Sub(C, level))
	res.ResetAfterUS = ceilRat(new(big.Rat).Quo(level, m.rate))
	return res
}

// Clone returns an independent copy of m (its numbers are never changed in
// place, so they are shared).
func (m *LeakyBucket) Clone() Model {
	c := *m
	return &c
}
