package redlimit

import (
	"context"
	"fmt"

	"github.com/redlimit/redlimit/internal/engine"
	"github.com/redlimit/redlimit/internal/nilcheck"
)

// Part is one limit of an AllowAll decision: a limiter and the key it
// limits ("100 a minute per user": a limiter, and the user's key).
type Part struct {
	Limiter Limiter
	Key     string
}

// AllowAll takes n permits from every part, or from none: real admission
// is rarely one limit ("100 a minute per user, 10,000 a day per tenant, 2
// in flight per user"). The parts may be of any algorithms here, on the
// same key or different keys, with deny caches or fallbacks.
//
// The parts on one Redis client are decided in one pipeline, one round
// trip (on a Cluster, one pipeline per node, in parallel); in-process
// parts (package inmem, your own Limiters) are decided first, in order. A
// part whose denial is in its deny cache answers without a round trip,
// and then nothing is sent; a part whose limiter holds permits for its
// key (WithReservation) takes them without a round trip, and its Grant
// refunds into the reservation like any of its grants. A denied call has
// taken nothing when it returns: parts granted before the denial was
// known are refunded, in one more round trip (leases released), so no
// part is charged for a request that was refused; between the grant and
// the refund, others may find those parts stricter, never looser.
//
// Denied, the Result is that of the denying part with the longest
// RetryAfter, and Result.Part is its index. Granted, it is the part with
// the fewest permits Remaining (the first of equals), and Result.Grant
// refunds every part at once. n == 0 reports every part's state and takes
// nothing. A part whose Redis fails follows its limiter's breaker and
// fallback; when a part makes no decision all the same, AllowAll makes
// none: it refunds what the other parts took and returns that part's
// error. When a refund after a denial or a failure fails too, the permits
// stay taken (they lapse as any grant does) and the error says so: a
// denial's Result comes back with that error.
//
// Bad input in any part (no parts, n < 0, a nil Limiter, a bad key) is
// ErrInvalidArgument, before any round trip.
func AllowAll(ctx context.Context, n int, parts ...Part) (Result, error) {
	if err := checkParts(ctx, n, parts); err != nil {
		return Result{}, err
	}
	call := &allowAllCall{}
	slots := call.inline[:0]
	if len(parts) > len(call.inline) {
		slots = make([]allowAllSlot, 0, len(parts))
	}
	slots = slots[:len(parts)]
	group := &call.group
	group.Init(len(parts))
	undo := func() error { return group.Refund(context.WithoutCancel(ctx), n) }
	var batch engine.Batch
	for i, p := range parts {
		rl, ok := p.Limiter.(redisLimiter)
		if !ok {
			continue
		}
		s := &slots[i]
		l := rl.redisCore()
		if l.reserve != nil {
			if res, ok := l.reserve.takeLocal(ctx, p.Key, n); ok {
				res.Part = i
				s.result = res // Allowed: answered from a reservation
				group.Add(res.Grant)
				continue
			}
		}
		l.engine.Begin(ctx, p.Key, n, &s.pending)
		if s.pending.Done() {
			if err := s.pending.Err; err != nil {
				return Result{}, undone(fmt.Errorf("redlimit: AllowAll: part %d: %w", i, err), undo())
			}
			// A cached denial: nothing was taken but from reservations,
			// which take their permits back without a round trip.
			res := l.result(s.pending.Reply, p.Key, n)
			res.Part = i
			return res, undone(nil, undo())
		}
		s.sent = true
		batch.Add(&s.pending)
	}
	for i, p := range parts {
		if slots[i].sent || slots[i].result.Allowed {
			continue
		}
		res, err := p.Limiter.AllowN(ctx, p.Key, n)
		if err != nil {
			return Result{}, undone(fmt.Errorf("redlimit: AllowAll: part %d: %w", i, err), undo())
		}
		res.Part = i
		if !res.Allowed {
			return res, undone(nil, undo())
		}
		slots[i].result = res
		group.Add(res.Grant)
	}
	batch.Send(ctx)
	var failed error
	denied := -1
	for i := range slots {
		s := &slots[i]
		if !s.sent {
			continue
		}
		if s.pending.Err != nil {
			if failed == nil {
				failed = fmt.Errorf("redlimit: AllowAll: part %d: %w", i, s.pending.Err)
			}
			continue
		}
		res := parts[i].Limiter.(redisLimiter).redisCore().result(s.pending.Reply, parts[i].Key, n)
		res.Part = i
		s.result = res
		if res.Allowed {
			group.Add(res.Grant)
		} else if denied < 0 || res.RetryAfter > slots[denied].result.RetryAfter {
			denied = i
		}
	}
	if failed != nil {
		return Result{}, undone(failed, undo())
	}
	if denied >= 0 {
		return slots[denied].result, undone(nil, undo())
	}
	fewest := 0
	for i := range slots {
		if slots[i].result.Remaining < slots[fewest].result.Remaining {
			fewest = i
		}
	}
	res := slots[fewest].result
	res.Grant = Grant{}
	if n > 0 {
		// Every part granted: the same grants, in the parts' order (the
		// middlewares renew a part's leases by its index).
		group.Init(len(parts))
		for i := range slots {
			group.Add(slots[i].result.Grant)
		}
		res.Grant = group.Grant(n)
	}
	return res, nil
}

// allowAllCall is what an AllowAll call allocates, at once for up to four
// parts: their slots, the batch threaded through them, and the group of
// their grants, which the Result's Grant keeps (and with it the slots).
type allowAllCall struct {
	group  engine.GrantGroup
	inline [4]allowAllSlot
}

// allowAllSlot is one part of an AllowAll call: its decision, sent in the
// batch when the part is a Redis limiter's, and its Result.
type allowAllSlot struct {
	pending engine.Pending
	sent    bool
	result  Result
}

// redisLimiter is implemented by every limiter of this package (through
// the limiter they embed): AllowAll sends their decisions as one batch.
type redisLimiter interface {
	redisCore() *limiter
}

// redisCore returns l, for AllowAll.
func (l *limiter) redisCore() *limiter { return l }

// checkParts checks AllowAll's arguments before any round trip.
func checkParts(ctx context.Context, n int, parts []Part) error {
	if ctx == nil {
		return engine.Errorf(ErrInvalidArgument, "redlimit: AllowAll: nil context (use context.Background())")
	}
	if len(parts) == 0 {
		return engine.Errorf(ErrInvalidArgument, "redlimit: AllowAll: no parts")
	}
	if n < 0 {
		return engine.Errorf(ErrInvalidArgument, "redlimit: AllowAll: n %d: must not be negative", n)
	}
	for i, p := range parts {
		if nilcheck.IsNil(p.Limiter) {
			return engine.Errorf(ErrInvalidArgument, "redlimit: AllowAll: part %d: nil Limiter", i)
		}
		if err := engine.CheckArgs(ErrInvalidArgument, "AllowAll", ctx, p.Key); err != nil {
			return fmt.Errorf("redlimit: AllowAll: part %d: %w", i, err)
		}
		if rl, ok := p.Limiter.(redisLimiter); ok {
			if err := rl.redisCore().built(); err != nil {
				return fmt.Errorf("redlimit: AllowAll: part %d: %w", i, err)
			}
		}
	}
	return nil
}

// undone returns err (nil for a denial) joined with the failure of the
// refunds that undid the other parts' grants, if any.
func undone(err, refundErr error) error {
	if refundErr == nil {
		return err
	}
	refundErr = fmt.Errorf("redlimit: AllowAll: giving back what the other parts took failed; those permits stay taken until they lapse: %w", refundErr)
	if err == nil {
		return refundErr
	}
	return fmt.Errorf("%w; %w", err, refundErr)
}
