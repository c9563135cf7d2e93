package redlimit

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/engine"
)

// The two buckets are one algorithm seen from two sides (GCRA: one stored
// time per key, scripts/gcra.lua): a leaky bucket's level is what a token
// bucket lacks of being full. Their constructors differ only in names and
// in the script's reply, so they share everything else here.

// buildBucket checks a bucket's capacity and rate (field names the rate in
// errors: "leak" or "refill") and completes s, which names the algorithm,
// its code, its state format and its script, into a limiter.
func buildBucket(rdb redis.Scripter, s spec, field string, capacity int, rate Rate, opts []Option) (limiter, error) {
	args, full, err := bucketArgs(s.algorithm, field, capacity, rate)
	if err != nil {
		return limiter{}, err
	}
	s.args = args
	// With a WithPrefix prefix the rate and capacity are stored, so that
	// configurations sharing a key read each other's level at the rate
	// that wrote it (see scripts/gcra.lua).
	s.sharedArgs = []any{1}
	s.limits = []int{capacity}
	s.windows = []time.Duration{full}
	return newLimiter(rdb, s, opts)
}

// bucketArgs checks a bucket's capacity and rate and returns the scripts'
// ARGV: capacity, then the rate as the reduced fraction count/per µs, which
// keeps it exact (PerSecond(3) is 3 per 1,000,000µs, not 1 per 333,333µs).
// full is the time the bucket takes to drain or refill completely, rounded
// up to the microsecond: the Window of its denials.
func bucketArgs(algorithm, field string, capacity int, rate Rate) (args []any, full time.Duration, err error) {
	count, perUS, err := engine.CheckBucket(ErrInvalidConfig, algorithm, field, capacity, rate.Count, rate.Per)
	if err != nil {
		return nil, 0, err
	}
	fullUS := (int64(capacity)*perUS + count - 1) / count
	return []any{capacity, perUS, count}, time.Duration(fullUS) * time.Microsecond, nil
}
