package grpclimit

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/nilcheck"
)

// ErrSkip is what a Part's Key returns (or wraps) when the part does not
// apply to a call: say, the tenant limit of a caller of no tenant. The
// call is decided on the other parts; when every part skips, it goes
// through undecided. Any other error from a Key fails the call as a
// KeyFunc's error does.
var ErrSkip = errors.New("grpclimit: the part does not apply to the call")

// Part is one limit of the *All interceptors: a limiter, how a call's key
// for it is found, and its name.
type Part struct {
	// Name names the part ("user", "tenant") in the QuotaFailure detail
	// of a call it denies: one per part.
	Name string
	// Limiter decides the part: any redlimit.Limiter, a
	// redlimit.Concurrency too, whose lease the call holds until its
	// handler returns (a stream's, until it ends).
	Limiter redlimit.Limiter
	// Key returns the call's key for this part, or ErrSkip when the part
	// does not apply to the call. Default: PeerIP.
	Key KeyFunc
}

// UnaryServerInterceptorAll limits unary calls on every part at once, with
// redlimit.AllowAll: a call is granted only if every part grants, and a
// denied call has taken nothing from any part ("100 a minute per user,
// 10,000 a day per tenant, 2 in flight per user", each part with its own
// key), in one round trip. A denial fails with codes.ResourceExhausted, a
// RetryInfo detail as UnaryServerInterceptor's, and a
// google.rpc.QuotaFailure detail whose violation's subject is the Name of
// the part that denied (of several, the one with the longest RetryAfter);
// OnDenied's Result.Part is its index in parts. A denial stands when
// giving back what other parts took fails (they stay taken until they
// lapse; OnError hears of it, ErrRefund).
//
// Every part is charged the call's cost (WithCost), a Concurrency part
// too. WithRefundIf and Settle give back to every part at once, and a
// Concurrency part's lease is released when the call ends while the other
// parts' permits stay counted (WithKeepAlive renews it). A Key error, an
// empty key or a key a limiter refuses is answered as
// UnaryServerInterceptor answers it; nothing is taken from any part then.
//
// The options are UnaryServerInterceptor's; WithKeyFunc panics (set each
// Part's Key). It panics on no parts, a nil Limiter, an empty or repeated
// Name, or a nil or invalid option.
func UnaryServerInterceptorAll(parts []Part, opts ...Option) grpc.UnaryServerInterceptor {
	return newLimiterAll(parts, opts).unary
}

// StreamServerInterceptorAll limits streams on every part at once, once
// per stream when it opens; see UnaryServerInterceptorAll. It panics
// like UnaryServerInterceptorAll.
func StreamServerInterceptorAll(parts []Part, opts ...Option) grpc.StreamServerInterceptor {
	return newLimiterAll(parts, opts).stream
}

func newLimiterAll(parts []Part, opts []Option) *limiter {
	c := newConfig(nil, opts)
	switch {
	case len(parts) == 0:
		panic("grpclimit: no parts")
	case c.keyFunc != nil:
		panic("grpclimit: WithKeyFunc: set each Part's Key instead")
	}
	lim := &limiter{cfg: c, parts: make([]Part, len(parts))}
	names := make(map[string]bool, len(parts))
	for i, p := range parts {
		switch {
		case p.Name == "" || names[p.Name]:
			panic(fmt.Sprintf("grpclimit: part name %q: empty or used twice", p.Name))
		case nilcheck.IsNil(p.Limiter):
			panic(fmt.Sprintf("grpclimit: part %q: nil Limiter (%T)", p.Name, p.Limiter))
		}
		names[p.Name] = true
		if _, ok := p.Limiter.(leaser); ok {
			lim.leases = true
		}
		if p.Key == nil {
			p.Key = PeerIP
		}
		lim.parts[i] = p
	}
	return lim
}

// partKeys returns the parts that apply to a call, with their keys, and
// the index in lim.parts of each.
func (lim *limiter) partKeys(ctx context.Context, method string) (parts []redlimit.Part, decided []int, err error) {
	parts = make([]redlimit.Part, 0, len(lim.parts))
	decided = make([]int, 0, len(lim.parts))
	for i, p := range lim.parts {
		key, err := p.Key(ctx, method)
		if errors.Is(err, ErrSkip) {
			continue
		}
		if err == nil && key == "" {
			err = errors.New("empty key")
		}
		if err != nil {
			return nil, nil, fmt.Errorf("grpclimit: part %q: %w", p.Name, err)
		}
		parts = append(parts, redlimit.Part{Limiter: p.Limiter, Key: key})
		decided = append(decided, i)
	}
	return parts, decided, nil
}
