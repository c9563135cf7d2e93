package redlimit

import "github.com/redis/go-redis/v9"

var tokenBucketScript = loadScript("tokenbucket.lua", "refunds.lua", "gcra.lua")

// TokenBucket allows bursts up to its capacity and a steady refill rate
// beyond. It starts full and refills continuously at the refill rate up to
// capacity; a request of n is allowed if n tokens are there, and takes them.
// A denied request's RetryAfter is the time until n tokens are there;
// ResetAfter the time until the bucket is full again.
//
// It is implemented as a leaky bucket of its missing tokens: Redis holds
// one string per key, the key's time (the latest time a grant's clock
// read) and the tokens missing then, and under WithPrefix the rate each
// part of them was taken at, so that limiters with other rates sharing the
// key refill each part at its own rate.
type TokenBucket struct {
	limiter
}

// NewTokenBucket returns a token bucket of capacity tokens refilled at
// refill. capacity must be between 1 and 2^40; refill.Count at least 1; and
// refill.Per from 1ms to 2^44 µs (about 203 days), in whole microseconds. With
// g = gcd(refill.Count, refill.Per in µs), capacity × refill.Per / g and
// refill.Count / g must be at most 2^52, so that the arithmetic is exact. Bad
// values are ErrInvalidConfig. Keys are redlimit:tb:<config>:<key>
// unless WithPrefix says otherwise.
func NewTokenBucket(rdb redis.Scripter, capacity int, refill Rate, opts ...Option) (*TokenBucket, error) {
	l, err := buildBucket(rdb, spec{
		algorithm: "token_bucket",
		code:      "tb",
		format:    5,
		script:    tokenBucketScript,
	}, "refill", capacity, refill, opts)
	if err != nil {
		return nil, err
	}
	return &TokenBucket{l}, nil
}
