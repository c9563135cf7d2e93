package redlimit

import (
	"fmt"

	"github.com/redis/go-redis/v9"
)

var tokenBucketScript = loadScript("common.lua", "gcra.lua", "tokenbucket.lua")

// TokenBucket allows bursts up to its capacity and a steady refill rate
// beyond. It starts full and refills continuously at the refill rate up to
// capacity; a request of n is allowed if n tokens are there, and takes them.
// A denied request's RetryAfter is the time until n tokens are there;
// ResetAfter the time until the bucket is full again.
//
// It is implemented as GCRA: Redis holds one number per key, the time the
// bucket will be full.
type TokenBucket struct {
	limiter
}

// NewTokenBucket returns a token bucket of capacity tokens refilled at
// refill. capacity must be between 1 and 2^40; refill.Count at least 1 and
// refill.Per at least 1ms, in whole microseconds; and capacity × refill.Per /
// gcd(refill.Count, refill.Per in µs) at most 2^52, so that the arithmetic is
// exact. Bad values are ErrInvalidConfig. Keys are prefixed "redlimit:tb:"
// unless WithPrefix says otherwise.
func NewTokenBucket(rdb redis.Scripter, capacity int, refill Rate, opts ...Option) (*TokenBucket, error) {
	args, err := bucketArgs("token_bucket", "refill", capacity, refill)
	if err != nil {
		return nil, err
	}
	l, err := newLimiter(rdb, spec{
		algorithm: "token_bucket",
		prefix:    "redlimit:tb:",
		script:    tokenBucketScript,
		args:      args,
		limits:    []int{capacity},
	}, opts)
	if err != nil {
		return nil, err
	}
	return &TokenBucket{l}, nil
}

// bucketArgs checks a bucket's capacity and rate and returns the scripts'
// ARGV: capacity, then the rate as the reduced fraction count/per µs, which
// keeps it exact (PerSecond(3) is 3 per 1,000,000µs, not 1 per 333,333µs).
func bucketArgs(algorithm, field string, capacity int, rate Rate) ([]any, error) {
	if err := permits(algorithm, "capacity", capacity); err != nil {
		return nil, err
	}
	if rate.Count < 1 {
		return nil, fmt.Errorf("redlimit: %s: %s count %d: must be at least 1: %w", algorithm, field, rate.Count, ErrInvalidConfig)
	}
	perUS, err := micros(algorithm, field+" period", rate.Per)
	if err != nil {
		return nil, err
	}
	count := int64(rate.Count)
	g := gcd(count, perUS)
	count, perUS = count/g, perUS/g
	if perUS > maxLevel/int64(capacity) {
		return nil, fmt.Errorf("redlimit: %s: capacity %d at %s %d per %v: capacity × period is too large for exact arithmetic (at most 2^52 in units of the reduced rate): %w",
			algorithm, capacity, field, rate.Count, rate.Per, ErrInvalidConfig)
	}
	return []any{capacity, perUS, count}, nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
