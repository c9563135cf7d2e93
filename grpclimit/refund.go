package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/leases"
)

// ErrRefund is matched by the error the OnError callback is told of when
// giving back what a call took failed (Redis unreachable, say): the
// permits stay used, which is stricter, never looser.
var ErrRefund = errors.New("grpclimit: refund failed")

// WithRefundIf gives back everything a call took when refund says its
// status code should not count: say, codes.Internal or codes.Unavailable,
// where the failure was the server's. The code is the handler's error's
// (codes.OK when it returned nil); a handler that panics counts as
// codes.Internal, and the panic goes on once the refund is made. The
// refund runs when the handler returns (a stream's, when the stream ends),
// under the decision deadline (WithTimeout), on a context that keeps the
// call's values but not its cancellation, so a client that goes away still
// gets its refund. A refund that fails is told to OnError (ErrRefund).
// With the *All interceptors every part is refunded. Default: no refund.
func WithRefundIf(refund func(code codes.Code) bool) Option {
	return func(c *config) { c.refundIf = refund }
}

// Settle gives back what the call whose context is ctx took beyond used
// permits, for a cost known only at the end (an LLM call's tokens): take
// the most it can cost up front with WithCost, then settle what it did
// cost. It settles the interceptor nearest the handler that granted the
// call (an *All interceptor's: every part). Settling is idempotent: the
// permits given back are the most any Settle (or WithRefundIf's refund)
// asked for, never a sum. used below 0 is an error; used at or above what
// the call took gives nothing back. An error matches ErrRefund, or
// redlimit.ErrInvalidArgument when ctx carries no grant.
func Settle(ctx context.Context, used int) error {
	f, _ := ctx.Value(flightKey{}).(*flight)
	if f == nil || f.innermost == nil {
		return fmt.Errorf("grpclimit: Settle: the call has no grant to settle: %w", redlimit.ErrInvalidArgument)
	}
	if used < 0 {
		return fmt.Errorf("grpclimit: Settle(%d): used must not be negative: %w", used, redlimit.ErrInvalidArgument)
	}
	g := f.innermost.grant
	if used >= g.N() {
		return nil
	}
	if err := g.Refund(context.WithoutCancel(ctx), g.N()-used); err != nil {
		return fmt.Errorf("%w: %w", ErrRefund, err)
	}
	return nil
}

// flightKey is the context key of a call's flight.
type flightKey struct{}

// flight is what the interceptors on one call share: the outermost makes
// it, the others find it in the context.
type flight struct {
	// denied is set by an interceptor that denies the call, so that the
	// interceptors around it, which granted it, give their permits back.
	denied bool
	// innermost is the charge of the interceptor nearest the handler that
	// granted the call, for Settle.
	innermost *charge
}

// charge is one interceptor's grant on a call.
type charge struct {
	grant redlimit.Grant
	// lease is set when the grant is a lease: all of it ends with the
	// call.
	lease bool
	// inFlight is set when some of its parts' grants are leases (the *All
	// interceptors'): those end with the call, the others stay counted.
	inFlight bool
	// stop ends the renewals of WithKeepAlive; nil without them. Until it
	// returns, a renewal may change grant.
	stop func()
}

// leaser is a limiter whose grants are leases (redlimit.NewConcurrency,
// inmem.NewConcurrency): the interceptor holds a call's leases for its
// whole life, a stream's until it ends, and releases them when the handler
// returns, panics, or the client goes away (the handler then returns, its
// context done).
type leaser interface {
	ExtendGrant(ctx context.Context, g redlimit.Grant) (redlimit.Result, error)
}

// WithKeepAlive extends a call's lease every interval while its handler
// runs (a long stream, say), for a limiter whose grants are leases (a
// redlimit.Concurrency, alone or a part of an *All interceptor). Default:
// no renewal, so a call that outlives its lease loses its place; choose a
// lease longer than the longest call, or an interval well below the lease.
// A failed renewal is told to OnError. An interval that is not positive
// panics.
func WithKeepAlive(interval time.Duration) Option {
	return func(c *config) {
		c.keepAlive = interval
		if interval <= 0 {
			c.keepAlive = -1
		}
	}
}

// extendFunc renews the leases g holds, as Concurrency.ExtendGrant does:
// the Result's Grant, when not zero, names them from then on.
type extendFunc func(ctx context.Context, g redlimit.Grant) (redlimit.Result, error)

// extendParts returns the extendFunc of an *All interceptor's grant of
// the parts decided (indexes in lim.parts, in AllowAll's order).
func (lim *limiter) extendParts(decided []int) extendFunc {
	limiters := make([]redlimit.Limiter, len(decided))
	for j, i := range decided {
		limiters[j] = lim.parts[i].Limiter
	}
	return func(ctx context.Context, g redlimit.Grant) (redlimit.Result, error) {
		return leases.ExtendGroup(ctx, g, limiters)
	}
}

// keepAlive renews ch's leases with extend every keepAlive interval until
// the returned stop is called.
func (lim *limiter) keepAlive(ctx context.Context, method string, extend extendFunc, ch *charge) (stop func()) {
	var mu sync.Mutex
	stopped := false
	every := lim.cfg.keepAlive
	// Set under the lock the renewal takes first: the timer may fire
	// before AfterFunc returns.
	mu.Lock()
	defer mu.Unlock()
	var timer *time.Timer
	timer = time.AfterFunc(every, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lim.cfg.timeout)
		res, err := extend(rctx, ch.grant)
		cancel()
		switch {
		case err != nil:
			lim.tell(ctx, method, fmt.Errorf("grpclimit: keeping the call's lease: %w", err))
		case !res.Allowed:
			lim.tell(ctx, method, errors.New("grpclimit: keeping the call's lease: it lapsed and its place was taken"))
			return
		case res.Grant.N() > 0:
			ch.grant = res.Grant
		}
		timer.Reset(every)
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		timer.Stop()
	}
}

// inFlight returns ctx with the call's flight, making it if this is the
// outermost interceptor.
func inFlight(ctx context.Context) (context.Context, *flight) {
	if f, ok := ctx.Value(flightKey{}).(*flight); ok {
		return ctx, f
	}
	f := &flight{}
	return context.WithValue(ctx, flightKey{}, f), f
}

// settleCall gives ch back when an interceptor inside denied the call, or
// when the handler's outcome should not count (WithRefundIf): its error
// err, or a panic when it did not return. Else it releases the leases
// among several parts', and their other permits stay counted.
func (lim *limiter) settleCall(ctx context.Context, method string, f *flight, ch *charge, err error, returned bool) {
	if ch.stop != nil {
		ch.stop()
	}
	refund := ch.lease || f.denied // a lease ends with the call
	if !refund && lim.cfg.refundIf != nil {
		code := status.Code(err)
		if !returned {
			code = codes.Internal
		}
		refund = lim.cfg.refundIf(code)
	}
	if !refund && !ch.inFlight {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lim.cfg.timeout)
	defer cancel()
	if !refund {
		if rerr := ch.grant.Release(rctx); rerr != nil {
			lim.tell(ctx, method, fmt.Errorf("%w: releasing the call's leases: %w", ErrRefund, rerr))
		}
		return
	}
	if rerr := ch.grant.Refund(rctx, ch.grant.N()); rerr != nil {
		lim.tell(ctx, method, fmt.Errorf("%w: %w", ErrRefund, rerr))
	}
}

// contextStream is a ServerStream whose Context is ctx: the stream's, with
// the call's flight.
type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s contextStream) Context() context.Context { return s.ctx }
