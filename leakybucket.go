package redlimit

import "github.com/redis/go-redis/v9"

var leakyBucketScript = loadScript("leakybucket.lua", "refunds.lua", "gcra.lua")

// LeakyBucket smooths traffic to a steady rate. Its level starts at 0 and
// drains continuously at the leak rate; a request of n is allowed if level +
// n <= capacity, which then adds n. A denied request's RetryAfter is
// (level + n - capacity) / rate; ResetAfter is the time until the level is
// back to 0. At equal capacity and rate it makes exactly the decisions of a
// TokenBucket: choose by the picture that fits your problem.
//
// Redis holds one string per key: the key's time (the latest time a
// grant's clock read) and the level then, and under WithPrefix the rate
// each part of the level was granted at, so that limiters with other
// rates sharing the key drain each part at its own rate.
type LeakyBucket struct {
	limiter
}

// NewLeakyBucket returns a leaky bucket of capacity permits that drains at
// leak. capacity must be between 1 and 2^40; leak.Count at least 1; and
// leak.Per from 1ms to 2^44 µs (about 203 days), in whole microseconds. With
// g = gcd(leak.Count, leak.Per in µs), capacity × leak.Per / g and
// leak.Count / g must be at most 2^52, so that the arithmetic is exact. Bad
// values are ErrInvalidConfig. Keys are redlimit:lb:<config>:<key>
// unless WithPrefix says otherwise.
func NewLeakyBucket(rdb redis.Scripter, capacity int, leak Rate, opts ...Option) (*LeakyBucket, error) {
	l, err := buildBucket(rdb, spec{
		algorithm: "leaky_bucket",
		code:      "lb",
		format:    5,
		script:    leakyBucketScript,
	}, "leak", capacity, leak, opts)
	if err != nil {
		return nil, err
	}
	return &LeakyBucket{l}, nil
}
