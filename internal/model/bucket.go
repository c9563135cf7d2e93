package model

import "math/big"

// bucketTimeline is what both bucket models keep: the level of a leaky
// bucket (a token bucket's missing tokens) as the grants that are still
// in it, oldest first, at the key's time, and what refunds gave back.
//
// The level drains continuously at rate R, its oldest permits first (a
// queue): a grant's permits leave once every permit granted before them
// has. A refund takes permits of its grant that are still in the bucket,
// its last ones first; the permits behind them move up. The key's time is
// the latest time a grant's clock read (DESIGN "A key's time"): a call
// decides at max(now, that time), and one whose clock is behind it by
// more than a full drain (C/R) decides at now with the bucket full.
//
// Its memory of refunds is unbounded: it is the exact rule. The scripts
// and inmem keep at most 16 ranges of given-back positions and equal it
// while they need no more (always, for a bucket of at most 15 permits);
// past that they are stricter, never looser (docs/internals.md).
type bucketTimeline struct {
	capacity *big.Rat // C
	rate     *big.Rat // R, permits per microsecond
	fullUS   int64    // ceil(C / R)

	keyUS  int64     // the key's time; the grants are as of then
	grants []inGrant // still in the bucket at keyUS, oldest first
	given  map[int64]int64
	nextID int64
}

// inGrant is what of one grant is still in the bucket.
type inGrant struct {
	id      int64
	permits *big.Rat
}

func newBucketTimeline(capacity, count, perUS int64) bucketTimeline {
	c, r := big.NewRat(capacity, 1), big.NewRat(count, perUS)
	return bucketTimeline{capacity: c, rate: r, fullUS: ceilRat(new(big.Rat).Quo(c, r))}
}

// reset forgets every grant and the key's time.
func (b *bucketTimeline) reset() {
	b.keyUS, b.grants, b.given = 0, nil, nil
}

// at returns the key's time for a call at now (the later of the two),
// whether the clock is gone wrong (behind it by more than C/R), and the
// grants still in the bucket then (a new slice).
func (b *bucketTimeline) at(now int64) (t int64, wrong bool, gs []inGrant) {
	t = now
	if len(b.grants) > 0 && b.keyUS > now {
		t, wrong = b.keyUS, b.keyUS-now > b.fullUS
	}
	drained := new(big.Rat).Mul(big.NewRat(t-b.keyUS, 1), b.rate)
	for _, g := range b.grants {
		switch {
		case drained.Cmp(g.permits) >= 0:
			drained = new(big.Rat).Sub(drained, g.permits)
		case drained.Sign() > 0:
			gs = append(gs, inGrant{g.id, new(big.Rat).Sub(g.permits, drained)})
			drained = new(big.Rat)
		default:
			gs = append(gs, g)
		}
	}
	return t, wrong, gs
}

// step decides n permits at now: whether they fit, the level the call
// sees after (ℓ at the key's time, or C when the clock is gone wrong), and
// the grant's id (0 unless granted with n > 0). Only a grant writes.
func (b *bucketTimeline) step(now, n int64) (allowed bool, level *big.Rat, id int64) {
	t, wrong, gs := b.at(now)
	level = new(big.Rat)
	for _, g := range gs {
		level.Add(level, g.permits)
	}
	if wrong {
		level = new(big.Rat).Set(b.capacity)
	}
	want := new(big.Rat).Add(level, big.NewRat(n, 1))
	if want.Cmp(b.capacity) > 0 {
		return false, level, 0
	}
	if n > 0 {
		b.nextID++
		id = b.nextID
		b.keyUS, b.grants = t, append(gs, inGrant{id, big.NewRat(n, 1)})
		level = want
	}
	return true, level, id
}

// refund gives back permits of grant id until k in all have been, as far
// as they are still in the bucket at the key's time, and returns the
// permits this call took out (possibly a fraction). The key's time does
// not move: what is left is kept as of then. A clock gone wrong gives
// nothing back.
func (b *bucketTimeline) refund(now, id, k int64) (taken *big.Rat) {
	_, wrong, gs := b.at(now)
	taken = new(big.Rat)
	extra := k - b.given[id]
	if wrong || extra <= 0 {
		return taken
	}
	for _, g := range gs {
		if g.id != id {
			continue
		}
		// As of keyUS the grant holds what it holds now plus what drained
		// between: taking from its last permits leaves exactly that.
		taken = minRat(big.NewRat(extra, 1), g.permits)
		for j := range b.grants {
			if b.grants[j].id == id {
				b.grants[j].permits = new(big.Rat).Sub(b.grants[j].permits, taken)
			}
		}
		if b.given == nil {
			b.given = map[int64]int64{}
		}
		b.given[id] = k
	}
	return taken
}

// clone returns a copy that shares nothing mutable with b.
func (b bucketTimeline) clone() bucketTimeline {
	b.grants = append([]inGrant(nil), b.grants...)
	given := make(map[int64]int64, len(b.given))
	for k, v := range b.given {
		given[k] = v
	}
	b.given = given
	return b
}

// minRat returns the smaller of x and y.
func minRat(x, y *big.Rat) *big.Rat {
	if x.Cmp(y) <= 0 {
		return x
	}
	return y
}
