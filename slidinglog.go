package redlimit

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/engine"
)

// SlidingLog enforces several sliding-window limits at once (say 10 per
// second and 500 per hour) over one shared set of buckets of precision, in
// one atomic call. A request is allowed only if every strategy allows it.
//
// Results report one strategy. When denied: the strategy whose RetryAfter is
// longest (Limit and RetryAfter are its own); TryAcquire's error is then a
// *ViolationStrategyError naming it. Remaining is always the fewest permits
// left over all strategies, and when allowed Limit is that strategy's limit.
// ResetAfter is the longest over all strategies. A request for more permits
// than the smallest limit is denied with RetryAfter == Never. Strategies of
// other sliding logs sharing the key (WithPrefix) bind too, as for
// SlidingWindow, and count in Remaining, but for those of a log that
// differs from this one only in its limits (the same precision and
// windows), whose limits this one's replace. A denial whose longest
// RetryAfter is theirs reports this log's strategy with the fewest permits
// left, with that RetryAfter.
type SlidingLog struct {
	limiter
}

// NewSlidingLog returns a limiter enforcing every strategy at once, counted
// in buckets of precision. There must be at least one strategy; each limit
// between 1 and 2^40, each window a multiple of precision (at least 1ms,
// whole microseconds, at most about 203 days). No two windows may be equal,
// and a longer window must carry a larger limit, else the shorter one could
// never bind. Bad values are ErrInvalidConfig. The strategies may come in any
// order. Keys are
// redlimit:sl:<config>:<key> unless WithPrefix says otherwise.
func NewSlidingLog(rdb redis.Scripter, precision time.Duration, strategies []Strategy, opts ...Option) (*SlidingLog, error) {
	const algorithm = "sliding_log"
	if len(strategies) == 0 {
		return nil, engine.Errorf(ErrInvalidConfig, "redlimit: %s: no strategies", algorithm)
	}
	sorted := slices.Clone(strategies)
	slices.SortStableFunc(sorted, func(a, b Strategy) int { return cmp.Compare(a.Window, b.Window) })
	var precisionUS int64
	sizes := make([]int64, len(sorted))
	limits := make([]int, len(sorted))
	windows := make([]time.Duration, len(sorted))
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
				return nil, engine.Errorf(ErrInvalidConfig, "redlimit: %s: two strategies with window %v", algorithm, s.Window)
			}
			if s.Limit <= prev.Limit {
				return nil, engine.Errorf(ErrInvalidConfig, "redlimit: %s: strategy %d per %v: a longer window than %d per %v needs a larger limit, else that one never binds",
					algorithm, s.Limit, s.Window, prev.Limit, prev.Window)
			}
		}
		precisionUS = p
		sizes[i] = size
		limits[i], windows[i] = s.Limit, s.Window
	}
	l, err := newLimiter(rdb, spec{
		algorithm: algorithm,
		code:      "sl",
		limits:    limits,
		windows:   windows,
	}.sliding("l", precisionUS, sizes), opts)
	if err != nil {
		return nil, err
	}
	return &SlidingLog{limiter: l}, nil
}
