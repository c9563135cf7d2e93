package engine

import "time"

// Bounds that keep every value a script computes an exact integer in Lua's
// doubles (below 2^53). The Redis limiters and the in-process ones check
// configurations with the functions below, so that both accept the same.
const (
	MaxPermits = 1 << 40 // limits and capacities
	MaxMicros  = 1 << 44 // windows, precisions and rate periods: about 203 days
	MaxLevel   = 1 << 52 // a bucket's ticks: capacity × reduced rate period, and reduced rate count
)

// CheckMicros checks a duration for a window, precision or rate period and
// returns it in µs. An error matches sentinel and names algorithm and field.
func CheckMicros(sentinel error, algorithm, field string, d time.Duration) (int64, error) {
	switch {
	case d < time.Millisecond:
		return 0, Errorf(sentinel, "redlimit: %s: %s %v: must be at least 1ms", algorithm, field, d)
	case d%time.Microsecond != 0:
		return 0, Errorf(sentinel, "redlimit: %s: %s %v: must be a whole number of microseconds", algorithm, field, d)
	case d/time.Microsecond > MaxMicros:
		return 0, Errorf(sentinel, "redlimit: %s: %s %v: must be at most %v", algorithm, field, d, MaxMicros*time.Microsecond)
	}
	return int64(d / time.Microsecond), nil
}

// CheckPermits checks a limit or capacity.
func CheckPermits(sentinel error, algorithm, field string, n int) error {
	if n < 1 || int64(n) > MaxPermits {
		return Errorf(sentinel, "redlimit: %s: %s %d: must be between 1 and %d", algorithm, field, n, int64(MaxPermits))
	}
	return nil
}

// CheckBucket checks a bucket's capacity and its rate, count permits per
// per (field names the rate), and returns the rate as the reduced fraction
// count/perUS µs, which keeps it exact (3 per second is 3 per 1,000,000µs,
// not 1 per 333,333µs): a permit is perUS ticks and count ticks drain a
// µs, so both the reduced count and capacity × perUS must be at most
// MaxLevel.
func CheckBucket(sentinel error, algorithm, field string, capacity, count int, per time.Duration) (countR, perUS int64, err error) {
	if err := CheckPermits(sentinel, algorithm, "capacity", capacity); err != nil {
		return 0, 0, err
	}
	if count < 1 {
		return 0, 0, Errorf(sentinel, "redlimit: %s: %s count %d: must be at least 1", algorithm, field, count)
	}
	if perUS, err = CheckMicros(sentinel, algorithm, field+" period", per); err != nil {
		return 0, 0, err
	}
	g := gcd(int64(count), perUS)
	countR, perUS = int64(count)/g, perUS/g
	if countR > MaxLevel {
		return 0, 0, Errorf(sentinel, "redlimit: %s: %s %d per %v: too fast for exact arithmetic (at most 2^52 per period once the ratio is reduced)",
			algorithm, field, count, per)
	}
	if perUS > MaxLevel/int64(capacity) {
		return 0, 0, Errorf(sentinel, "redlimit: %s: capacity %d at %s %d per %v: capacity × period is too large for exact arithmetic (at most 2^52 in units of the reduced rate)",
			algorithm, capacity, field, count, per)
	}
	return countR, perUS, nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
