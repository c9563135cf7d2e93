package inmem

import (
	"context"
	"fmt"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/engine"
)

// Share returns one instance's share of a limit shared by instances: limit
// / instances, rounded down, at least 1. The shares of all instances add up
// to at most the limit (unless the limit is smaller than instances, where
// each gets 1).
func Share(limit, instances int) int {
	if instances < 1 {
		return limit
	}
	return max(1, limit/instances)
}

// ShareRate returns one instance's share of a rate shared by instances:
// the same count over instances times the period, an exact ratio. With
// Share(capacity, instances) it makes a bucket whose refill or drain time
// is the shared bucket's.
func ShareRate(rate redlimit.Rate, instances int) redlimit.Rate {
	if instances < 1 {
		return rate
	}
	return redlimit.Rate{Count: rate.Count, Per: rate.Per * time.Duration(instances)}
}

func newOptions(algorithm string, opts []Option) (options, error) {
	o := options{maxKeys: DefaultMaxKeys}
	for _, opt := range opts {
		if opt == nil {
			return o, fmt.Errorf("redlimit: inmem %s: nil Option: %w", algorithm, redlimit.ErrInvalidConfig)
		}
		opt(&o)
		if o.maxKeys == -1 && o.now == nil {
			return o, fmt.Errorf("redlimit: inmem %s: WithClock(nil): %w", algorithm, redlimit.ErrInvalidConfig)
		}
	}
	if o.maxKeys < 1 {
		return o, fmt.Errorf("redlimit: inmem %s: max keys %d: must be at least 1: %w", algorithm, o.maxKeys, redlimit.ErrInvalidConfig)
	}
	return o, nil
}

// micros and permits check a configuration with the Redis limiters' own
// bounds, so that both accept the same.
func micros(algorithm, field string, d time.Duration) (int64, error) {
	return engine.CheckMicros(redlimit.ErrInvalidConfig, "inmem "+algorithm, field, d)
}

func permits(algorithm, field string, n int) error {
	return engine.CheckPermits(redlimit.ErrInvalidConfig, "inmem "+algorithm, field, n)
}

// checkCall rejects what the Redis limiters reject before a round trip.
func checkCall(ctx context.Context, algorithm, key string, n int) error {
	if err := engine.CheckArgs(redlimit.ErrInvalidArgument, "inmem "+algorithm, ctx, key); err != nil {
		return err
	}
	if n < 0 {
		return fmt.Errorf("redlimit: inmem %s: n %d: must not be negative: %w", algorithm, n, redlimit.ErrInvalidArgument)
	}
	return nil
}

// microsDuration turns µs into a Duration; -1 is Never.
func microsDuration(v int64) time.Duration {
	if v < 0 {
		return redlimit.Never
	}
	return time.Duration(v) * time.Microsecond
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func ceilDiv(a, b int64) int64 { return -floorDiv(-a, b) }

// tryAcquire is TryAcquire for every limiter here.
func tryAcquire(ctx context.Context, l redlimit.Limiter, key string, window func(redlimit.Result) time.Duration) error {
	r, err := l.AllowN(ctx, key, 1)
	if err != nil {
		return err
	}
	if r.Allowed {
		return nil
	}
	return &redlimit.ViolationStrategyError{Limit: r.Limit, Window: window(r), RetryAfter: r.RetryAfter}
}
