// Package grpclimit rate-limits gRPC servers with any redlimit.Limiter: a
// unary and a stream server interceptor.
//
// For each call the interceptor finds a key (who is limited: the peer's IP
// address unless WithKeyFunc says otherwise, Metadata for an API key) and
// asks the limiter for one permit (WithCost for more), and then:
//
//   - allowed: the handler runs;
//   - denied: the call fails with codes.ResourceExhausted and a
//     google.rpc.RetryInfo detail whose retry_delay is Result.RetryAfter
//     (left out when the request can never be allowed: RetryAfter ==
//     redlimit.Never);
//   - no key (a missing metadata entry), or a key the limiter refuses
//     (longer than 1024 bytes: redlimit.ErrInvalidArgument):
//     codes.InvalidArgument, fail open or not; a KeyFunc failure of
//     another kind: codes.Internal;
//   - no decision (Redis down, slower than the decision deadline, circuit
//     breaker open): the handler runs (fail open, the default), or the call
//     fails with codes.Unavailable (WithFailClosed), with a RetryInfo when
//     the error says how long the limiter stays unavailable. OnError is
//     told either way.
//
// A stream is limited once, when it opens.
//
// # Several parts
//
// UnaryServerInterceptorAll and StreamServerInterceptorAll decide several
// limits, each with its own key (per user, per tenant, in flight), as one
// redlimit.AllowAll: a call is granted by every part or takes nothing from
// any. A denial adds a google.rpc.QuotaFailure detail naming the part that
// denied.
//
// # Deadlines
//
// The limiter runs under the interceptor's own decision deadline
// (WithTimeout, 100ms by default), never the call's: a client's
// grpc-timeout of 200µs neither cuts a decision short (failing the limit
// open) nor makes a healthy Redis look failed to the limiter's circuit
// breaker, and a call whose deadline has passed is decided all the same.
//
// # Refunds
//
// WithRefundIf gives back what a call took when its status code says it
// should not count (codes.Internal, say), Settle lets a handler whose cost
// is known only at the end take the most up front and give back the rest,
// and an interceptor whose inner neighbour denies a call gives back what
// it took: no limit is charged for a refused call. What a call gets back
// is the most any of them asked for, never more than it took.
//
// # Shadow mode
//
// WithShadow decides and counts every call, tells observers
// (Decision.Shadow), OnDenied and OnError as usual, and never fails a
// call: a new limit can be measured before it is enforced.
//
// This package lives in its own module so that redlimit's go.mod stays
// free of gRPC.
package grpclimit
