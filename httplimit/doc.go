// Package httplimit rate-limits HTTP handlers with any redlimit.Limiter.
//
// Middleware wraps a handler. For each request it finds a key (who is
// limited: the client's IP address unless WithKeyFunc says otherwise) and
// a cost (how many permits the request takes: 1 unless WithCost says
// otherwise), asks the limiter for that many permits, and then:
//
//   - allowed: calls the next handler, which finds the Result with
//     ResultFromContext;
//   - denied: answers 429 Too Many Requests with Retry-After, in whole
//     seconds rounded up, and a short text body (WithDeniedHandler for
//     another answer; WithOnDenied to be told);
//   - denied for good, because the cost exceeds the limiter's capacity
//     (Result.RetryAfter == redlimit.Never): answers 413 Content Too Large
//     without Retry-After, since no wait would help and 429 invites a retry;
//   - the request lacks its key (Header's header is missing), or carries a
//     key the limiter refuses (longer than 1024 bytes:
//     redlimit.ErrInvalidArgument): answers 400 Bad Request through the
//     ErrorHandler, fail open or not;
//   - no key otherwise (the KeyFunc failed) or a negative cost: answers 500
//     through the ErrorHandler;
//   - no decision (Redis unreachable, slower than the decision deadline,
//     the limiter's circuit breaker open): calls the next handler (fail
//     open, the default) or answers 503 Service Unavailable through the
//     ErrorHandler (WithFailClosed), with Retry-After when the error says
//     how long the limiter expects to stay unavailable. Either way the
//     OnError callback is told, and so is the limiter's observer
//     (redlimit.WithObserver).
//
// # Keys
//
// ClientIP, the default, keys by the connection's peer and reads no
// header, since any client can send one. Behind reverse proxies, say which
// proxies to trust and which header they write (ClientIP with prefixes for
// X-Forwarded-For, ClientIPBehind for Forwarded or X-Real-IP): the header
// is read only from a trusted peer, right to left, and the key is the
// address the nearest trusted proxy saw. What a client wrote itself, well
// formed or not, is never believed. Header keys by a header such as an API
// key; any func(*http.Request) (string, error) will do.
//
// # Deadlines
//
// A decision waits at most the decision deadline (WithTimeout, 100ms by
// default), so a slow or unreachable Redis never holds a request longer.
// The limiter runs under that deadline alone: the request's own deadline
// and cancellation, which a client may choose, play no part, so a client
// can neither skip its limit by hanging up nor make a healthy Redis look
// failed to the limiter's circuit breaker. go-redis honours a deadline
// while reading a reply only when the client is built with
// ContextTimeoutEnabled: true.
//
// # Headers
//
// Every response of a request the limiter decided on carries the
// RateLimit-Policy and RateLimit fields of the IETF draft
// draft-ietf-httpapi-ratelimit-headers, in structured-field syntax, as
// revision -09 defines them (the fields and parameters used here, q, qu, w,
// r and t, are unchanged from -08 to -10):
//
//	RateLimit-Policy: "default";q=100;w=60
//	RateLimit: "default";r=42;t=17
//
// q is Result.Limit, w the window in seconds (the limiter's own, from its
// Strategies method, or WithWindow's), r is Result.Remaining and t is Result.ResetAfter in seconds, rounded
// up. Both fields are lists: each middleware adds its policy to them, so
// two middlewares on one route (give each its own WithPolicyName) show
// both limits. The outer middleware takes its permit before the inner one
// decides, and gives it back when the inner one denies: no limit is
// charged for a request that was refused. WithLegacyHeaders adds
// X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset, for the
// limit with the fewest permits left. The headers are set before the next
// handler runs, so it may change or remove them.
//
// # Several parts
//
// MiddlewareAll decides several limits, each with its own key ("100 a
// minute per user, 10,000 a day per tenant, 2 in flight per user"), as one
// redlimit.AllowAll: a request is granted by every part or takes nothing
// from any, in one round trip. RateLimit-Policy lists every part's
// policy, RateLimit and Retry-After report the part that denied, and
// ResultFromContext's Result.Part is its index.
//
// # Cost
//
// WithCost makes a limiter a budget of anything a request carries; with
// BodyCost it is a byte budget, which charges a body of unknown length
// (chunked) a stated maximum and cuts the body there.
//
// # Refunds
//
// WithRefundIf gives back what a request took when its response says it
// should not count (a 5xx: the server failed, not the client), and Settle
// lets a handler whose cost is known only at the end (an LLM call's
// tokens) take the most it can cost up front, with WithCost, and give
// back what it did not use. Both are idempotent: what a request gets back
// is the most any of them asked for, never more than it took.
//
// # Shadow mode
//
// WithShadow rolls a new limit out safely: requests are decided and
// counted as usual, and observers (Decision.Shadow) and OnDenied hear of
// every decision, but no request is ever stopped and clients see no rate
// limit headers. Turn enforcement on once the would-be denials are the
// ones you meant.
//
// The package uses only the standard library and redlimit.
package httplimit
