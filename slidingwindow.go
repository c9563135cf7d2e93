package redlimit

import (
	"time"

	"github.com/redis/go-redis/v9"
)

var slidingScript = loadScript("sliding.lua")

// SlidingWindow grants at most limit permits in any window, counted in
// buckets of precision aligned to the Unix epoch: a request at time t counts
// the permits in the window/precision buckets ending with the one holding t.
// Unlike a fixed window it never lets 2×limit through across a boundary; the
// precision trades Redis memory (one sorted-set member per nonempty bucket)
// against how smoothly old permits leave the window. The cost of a call
// does not grow with window/precision.
//
// A denied request's RetryAfter is the time until enough old buckets leave
// the window; ResetAfter the time until the newest leaves it. When the
// request is larger than 8 one-permit buckets can free, RetryAfter may be
// longer than that, by less than the window, never shorter.
//
// Sliding windows of other configurations that share a key (WithPrefix)
// are checked too, until their last grant has left their window, but for
// one of the same window and precision, whose limit this one's replaces:
// a plan change keeps what was used (docs/keys.md).
// A sliding log's state at the key is foreign (ErrForeignState).
type SlidingWindow struct {
	limiter
}

// NewSlidingWindow returns a limiter granting at most limit permits in any
// window, counted in buckets of precision. limit must be between 1 and 2^40;
// precision at least 1ms; window a multiple of precision, at most about 203
// days; both in whole microseconds. Bad values are ErrInvalidConfig. Keys are
// redlimit:sw:<config>:<key> unless WithPrefix says otherwise.
func NewSlidingWindow(rdb redis.Scripter, limit int, window, precision time.Duration, opts ...Option) (*SlidingWindow, error) {
	const algorithm = "sliding_window"
	if err := permits(algorithm, "limit", limit); err != nil {
		return nil, err
	}
	size, precisionUS, err := bucketsPerWindow(algorithm, window, precision)
	if err != nil {
		return nil, err
	}
	l, err := newLimiter(rdb, spec{
		algorithm: algorithm,
		code:      "sw",
		limits:    []int{limit},
		windows:   []time.Duration{window},
	}.sliding("w", precisionUS, []int64{size}), opts)
	if err != nil {
		return nil, err
	}
	return &SlidingWindow{l}, nil
}
