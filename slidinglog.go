package redlimit

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

var slidingLogScript = loadScript("common.lua", "buckets.lua", "slidinglog.lua")

// SlidingLog enforces several sliding-window limits at once (say 10 per
// second and 500 per hour) over one shared set of buckets of precision, in
// one atomic call. A request is allowed only if every strategy allows it.
//
// Results report one strategy. When denied: the strategy whose RetryAfter is
// longest (Limit and RetryAfter are its own); TryAcquire's error is then a
// *ViolationStrategyError naming it. Remaining is always the fewest permits
// left over all strategies, and when allowed Limit is that strategy's limit.
// ResetAfter is the longest over all strategies. A request for more permits
// than the smallest limit is denied with RetryAfter == Never.
type SlidingLog struct {
	limiter
	strategies []Strategy // by window, ascending
}

// NewSlidingLog returns a limiter enforcing every strategy at once, counted
// in buckets of precision. There must be at least one strategy; each limit
// between 1 and 2^40, each window a multiple of precision (at least 1ms,
// whole microseconds, at most about 203 days). No two windows may be equal,
// and a longer window must carry a larger limit, else the shorter one could
// never bind. Bad values are ErrInvalidConfig. The strategies may come in any
// order. Keys are prefixed "redlimit:sl:" unless WithPrefix says otherwise.
func NewSlidingLog(rdb redis.Scripter, precision time.Duration, strategies []Strategy, opts ...Option) (*SlidingLog, error) {
	const algorithm = "sliding_log"
	if len(strategies) == 0 {
		return nil, fmt.Errorf("redlimit: %s: no strategies: %w", algorithm, ErrInvalidConfig)
	}
	sorted := slices.Clone(strategies)
	slices.SortStableFunc(sorted, func(a, b Strategy) int { return cmp.Compare(a.Window, b.Window) })
	var precisionUS int64
	args := make([]any, 1, 1+2*len(sorted))
	limits := make([]int, len(sorted))
	for i, s := range sorted {
		if err := permits(algorithm, fmt.Sprintf("strategy %d per %v: limit", s.Limit, s.Window), s.Limit); err != nil {
			return nil, err
		}
		size, p, err := bucketsPerWindow(algorithm, s.Window, precision)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			prev := sorted[i-1]
			if s.Window == prev.Window {
				return nil, fmt.Errorf("redlimit: %s: two strategies with window %v: %w", algorithm, s.Window, ErrInvalidConfig)
			}
			if s.Limit <= prev.Limit {
				return nil, fmt.Errorf("redlimit: %s: strategy %d per %v: a longer window than %d per %v needs a larger limit, else that one never binds: %w",
					algorithm, s.Limit, s.Window, prev.Limit, prev.Window, ErrInvalidConfig)
			}
		}
		precisionUS = p
		args = append(args, s.Limit, size)
		limits[i] = s.Limit
	}
	args[0] = precisionUS
	l, err := newLimiter(rdb, spec{
		algorithm: algorithm,
		prefix:    "redlimit:sl:",
		script:    slidingLogScript,
		args:      args,
		limits:    limits,
	}, opts)
	if err != nil {
		return nil, err
	}
	return &SlidingLog{limiter: l, strategies: sorted}, nil
}

// TryAcquire takes one permit for key. It returns nil when allowed, a
// *ViolationStrategyError naming the strategy with the longest RetryAfter
// when denied (it matches ErrAcquireFailed), and any other error when no
// decision was made.
func (s *SlidingLog) TryAcquire(ctx context.Context, key string) error {
	r, err := s.engine.Decide(ctx, key, 1)
	if err != nil {
		return err
	}
	if r.Allowed {
		return nil
	}
	if res, ok := r.Fallback.(Result); ok {
		return s.fallbackDenial(res) // unavailable.go
	}
	st := s.strategies[r.Strategy]
	return &ViolationStrategyError{Limit: st.Limit, Window: st.Window, RetryAfter: r.RetryAfter}
}
