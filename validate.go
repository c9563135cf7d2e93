package redlimit

import (
	"time"

	"github.com/redlimit/redlimit/internal/engine"
)

// Validation shared by the constructors: every bound is checked here, in
// int64 so that it holds on 32-bit platforms too, before anything reaches
// Redis.

// Bounds that keep every value a script computes an exact integer in Lua's
// doubles (below 2^53).
const (
	maxPermits = 1 << 40 // limits and capacities
	maxMicros  = 1 << 44 // windows, precisions and rate periods: about 203 days
	maxLevel   = 1 << 52 // capacity × reduced rate period, and reduced rate count, in a bucket's ticks
)

// micros checks a duration for a window, precision or rate period and returns
// it in µs.
func micros(algorithm, field string, d time.Duration) (int64, error) {
	switch {
	case d < time.Millisecond:
		return 0, engine.Errorf(ErrInvalidConfig, "redlimit: %s: %s %v: must be at least 1ms", algorithm, field, d)
	case d%time.Microsecond != 0:
		return 0, engine.Errorf(ErrInvalidConfig, "redlimit: %s: %s %v: must be a whole number of microseconds", algorithm, field, d)
	case d/time.Microsecond > maxMicros:
		return 0, engine.Errorf(ErrInvalidConfig, "redlimit: %s: %s %v: must be at most %v", algorithm, field, d, maxMicros*time.Microsecond)
	}
	return int64(d / time.Microsecond), nil
}

// permits checks a limit or capacity.
func permits(algorithm, field string, n int) error {
	if n < 1 || int64(n) > maxPermits {
		return engine.Errorf(ErrInvalidConfig, "redlimit: %s: %s %d: must be between 1 and %d", algorithm, field, n, int64(maxPermits))
	}
	return nil
}

// bucketsPerWindow checks a window and its precision and returns the window's
// length in buckets and the precision in µs.
func bucketsPerWindow(algorithm string, window, precision time.Duration) (size, precisionUS int64, err error) {
	if precisionUS, err = micros(algorithm, "precision", precision); err != nil {
		return 0, 0, err
	}
	windowUS, err := micros(algorithm, "window", window)
	if err != nil {
		return 0, 0, err
	}
	if windowUS%precisionUS != 0 {
		return 0, 0, engine.Errorf(ErrInvalidConfig, "redlimit: %s: window %v: must be a multiple of the precision %v", algorithm, window, precision)
	}
	return windowUS / precisionUS, precisionUS, nil
}

// sliding completes the spec of a sliding window or log whose strategies
// are s.limits, with window sizes (in buckets of precisionUS) sizes, by
// window ascending: the state format and the script's ARGV (kind, "w" for
// a sliding window or "l" for a sliding log, precision, then limit and size
// of each strategy, and "1" under WithPrefix; scripts/sliding.lua).
func (s spec) sliding(kind string, precisionUS int64, sizes []int64) spec {
	s.format = 8
	s.script = slidingScript
	s.args = []any{kind, precisionUS}
	// Under WithPrefix, other configurations may share the key: the
	// script then keeps each one's strategies in the state.
	s.sharedArgs = []any{1}
	for i, limit := range s.limits {
		s.args = append(s.args, limit, sizes[i])
	}
	return s
}

// bucketArgs checks a bucket's capacity and rate and returns the scripts'
// ARGV: capacity, then the rate as the reduced fraction count/per µs, which
// keeps it exact (PerSecond(3) is 3 per 1,000,000µs, not 1 per 333,333µs).
// full is the time the bucket takes to drain or refill completely, rounded
// up to the microsecond: the Window of its denials.
func bucketArgs(algorithm, field string, capacity int, rate Rate) (args []any, full time.Duration, err error) {
	if err := permits(algorithm, "capacity", capacity); err != nil {
		return nil, 0, err
	}
	if rate.Count < 1 {
		return nil, 0, engine.Errorf(ErrInvalidConfig, "redlimit: %s: %s count %d: must be at least 1", algorithm, field, rate.Count)
	}
	perUS, err := micros(algorithm, field+" period", rate.Per)
	if err != nil {
		return nil, 0, err
	}
	count := int64(rate.Count)
	g := gcd(count, perUS)
	count, perUS = count/g, perUS/g
	if count > maxLevel {
		return nil, 0, engine.Errorf(ErrInvalidConfig, "redlimit: %s: %s %d per %v: too fast for exact arithmetic (at most 2^52 per period once the ratio is reduced)",
			algorithm, field, rate.Count, rate.Per)
	}
	if perUS > maxLevel/int64(capacity) {
		return nil, 0, engine.Errorf(ErrInvalidConfig, "redlimit: %s: capacity %d at %s %d per %v: capacity × period is too large for exact arithmetic (at most 2^52 in units of the reduced rate)",
			algorithm, capacity, field, rate.Count, rate.Per)
	}
	fullUS := (int64(capacity)*perUS + count - 1) / count
	return []any{capacity, perUS, count}, time.Duration(fullUS) * time.Microsecond, nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
