// Package inmem holds in-process rate limiters of redlimit's algorithms:
// FixedWindow, SlidingWindow, SlidingLog, LeakyBucket, TokenBucket,
// Concurrency and CalendarWindow. Each decides exactly as the Redis limiter of the same
// configuration does: the same Results, to the microsecond, for the same
// calls at the same times, tested against the same reference models. The
// one difference: where a sliding script reports a RetryAfter longer than
// the truth to keep its work bounded (a denial whose exact RetryAfter lies
// more than 8 buckets into the window), these report the exact one, and a
// sliding log names the strategy whose exact RetryAfter is the longest.
// What they lack is sharing: their state lives in this process alone.
// Their grants refund as the Redis limiters' do (redlimit.Grant).
//
// # Alone or as a fallback
//
// Use them on their own where one process is the whole service, or in
// tests. Or give one to a Redis limiter with redlimit.WithFallback: it
// then decides every call that Redis, or the link to it, left undecided:
// while the circuit breaker is open, and for any error of the round trip
// (refused, reset, timed out by the client, an error reply such as LOADING,
// OOM or READONLY, a reply that cannot be read). Only what the caller
// caused is not decided there: bad input, the caller's own ctx (cancelled,
// or its deadline passed), and a key holding a value redlimit did not
// write. The caller gets the fallback's Result as if Redis had decided;
// observers see Decision.Fallback, and the Redis error in Decision.Cause.
//
// A fallback decides for this instance alone, without the others and
// without what Redis granted before the outage, so give it this instance's
// share of the shared limit (Share, ShareRate): with every instance on its
// fallback, the service as a whole stays within the limit.
//
//	const limit, instances = 1000, 4 // per minute, for the whole service
//	fb, _ := inmem.NewSlidingWindow(inmem.Share(limit, instances), time.Minute, time.Second)
//	l, _ := redlimit.NewSlidingWindow(rdb, limit, time.Minute, time.Second, redlimit.WithFallback(fb))
//
// # Keys
//
// Every limiter is safe for concurrent use and holds at most WithMaxKeys
// keys (DefaultMaxKeys: 100,000). A key that a grant leaves in use is
// kept until it is back to its initial state and room is needed. Room is
// made from a small sample of keys, at a bounded cost per call: keys back
// in their initial state go first, then the key nearest to it, the one
// with the smallest share of its limit in use. A key whose permits are
// spent goes last, so a client cannot buy its denied key back by sending
// requests for new keys (only by filling the store with keys it spends to
// their limits: keep WithMaxKeys well above the keys in use). A key is 1
// to redlimit.MaxKeyBytes bytes, as for the Redis limiters; an empty or
// longer one is ErrInvalidArgument.
//
// # Clocks
//
// A limiter decides on the clock WithClock gives it, else on time.Now.
// OnClock returns a view of a limiter on another clock: the same keys, so
// that a grant through either counts for both, decided on that clock, and
// grants that refund (and leases that release and extend) on it too. A
// limiter given its own clock keeps it: its view is itself. As the
// fallback of a Redis limiter built with redlimit.WithClock, a limiter
// decides through its view on that limiter's clock, so advancing a fake
// clock refills both alike.
//
// Time going backwards never panics, never grants extra permits, and never
// locks a key out for longer than its configuration allows: as with the
// scripts, a call that only looks (n == 0) or is denied changes nothing, so
// a key that ran out of permits is still out of them if the clock goes back
// into that time. (A sliding key keeps its own time, which stands still at
// its last grant while the clock is behind it: a call then moves that time,
// never the counts.) A clock that reads before 2001-09-09 or after
// 2112-02-27 is ErrInvalidArgument, as it is for the Redis limiters.
package inmem
