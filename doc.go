// Package redlimit provides rate limiters whose state lives in Redis, so that
// every instance of a service enforces one limit together.
//
// A limiter controls how often events may happen for a key: a user, a client
// address, an API key. Each event takes one or more permits, and the limiter
// grants them or denies them according to its algorithm. Call TryAcquire
// before doing the work:
//
//	err := limiter.TryAcquire(ctx, "user:"+id)
//	switch {
//	case err == nil:
//		// allowed: do the work
//	case errors.Is(err, redlimit.ErrAcquireFailed):
//		// denied: answer 429
//	default:
//		// no decision: Redis failed or ctx ended; fail open or closed
//	}
//
// AllowN takes n permits at once, all or none, and returns the whole Result:
// how many permits remain, how long to wait, when the key is full again.
// Wait and WaitN block until the permits are granted.
//
// Each decision is one Lua script that Redis runs atomically, in one round
// trip. However many goroutines and processes call at once on one key, they
// never get more permits than the algorithm grants a single caller.
//
// # Which limiter
//
//   - [TokenBucket]: bursts up to a capacity, then a steady rate. The usual
//     choice.
//   - [LeakyBucket]: a queue of a capacity that drains at a steady rate. At
//     equal capacity and rate it decides as the token bucket does.
//   - [FixedWindow]: at most a limit per window, counted from the window's
//     first request. The cheapest, but a client can get up to twice the
//     limit across the end of one window and the start of the next.
//   - [SlidingWindow]: at most a limit in any window, counted in buckets of
//     a precision. No burst at a window's edge.
//   - [SlidingLog]: several sliding limits at once ("10 a second and 1000 an
//     hour"); a denial names the limit that denied.
//
// Rates are exact ratios: [PerSecond](3) admits exactly 3 a second over any
// long run.
//
// # Denials
//
// A denial is a decision, not a failure. TryAcquire returns a
// *[ViolationStrategyError], which matches [ErrAcquireFailed] and names the
// limit that denied and how long to wait. AllowN reports it as
// Result.Allowed == false, with a nil error. A denied request consumes
// nothing, so a client that keeps asking while denied recovers exactly as
// fast as one that waits. Result.RetryAfter is the wait after which the same
// request is allowed, if nothing else consumes first; it is [Never] when n is
// above the capacity, because no wait helps. n == 0 reports the state and
// consumes nothing.
//
// # When Redis fails
//
// Any error other than a denial means that no decision was made: Redis is
// unreachable or slow, the ctx ended, or the input was bad
// ([ErrInvalidArgument], [ErrInvalidConfig]). The caller chooses to fail open
// (let the request through) or closed. Give every call a ctx deadline, and
// build the client with [ClientOptions], so that a call returns by its
// deadline even when Redis does not answer.
//
// After repeated Redis failures, a circuit breaker answers at once, with no
// round trip, with an error matching [ErrUnavailable], then lets one call
// probe Redis. Denials, bad input and callers' own short deadlines never open
// it. [WithFallback] gives a limiter an in-process limiter (package inmem)
// that decides while Redis cannot.
//
// # Time and keys
//
// Decisions use the Redis server's clock, read inside the script, so service
// instances with skewed clocks share one timeline. [WithClock] replaces it,
// for tests and simulations; package redlimittest wires a fake clock and an
// in-process Redis for your tests.
//
// The Redis key of a call includes the algorithm and a fingerprint of the
// configuration, so two limiters never share state unless [WithPrefix] says
// they do. A key is 1 to 1024 bytes.
package redlimit
