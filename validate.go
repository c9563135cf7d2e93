package redlimit

import (
	"time"

	"github.com/redlimit/redlimit/internal/engine"
)

// Validation shared by the constructors: every bound is checked here, with
// internal/engine's checks (which the in-process limiters use too), in
// int64 so that it holds on 32-bit platforms too, before anything reaches
// Redis.

// micros checks a duration for a window, precision or rate period and returns
// it in µs.
func micros(algorithm, field string, d time.Duration) (int64, error) {
	return engine.CheckMicros(ErrInvalidConfig, algorithm, field, d)
}

// permits checks a limit or capacity.
func permits(algorithm, field string, n int) error {
	return engine.CheckPermits(ErrInvalidConfig, algorithm, field, n)
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
	s.format = 11
	s.script = slidingScript
	s.bareRefunds = true
	s.args = []any{kind, precisionUS}
	// Under WithPrefix, other configurations may share the key: the
	// script then keeps each one's strategies in the state.
	s.sharedArgs = []any{1}
	for i, limit := range s.limits {
		s.args = append(s.args, limit, sizes[i])
	}
	return s
}
