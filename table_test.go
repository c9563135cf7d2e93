package redlimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// step is one call of a table test: at `at` after epoch, ask for n permits
// and expect this Result.
type step struct {
	at        time.Duration
	n         int
	allowed   bool
	limit     int
	remaining int
	retry     time.Duration
	reset     time.Duration
}

func (s step) String() string {
	return fmt.Sprintf("at %v n=%d", s.at, s.n)
}

// runSteps plays steps against a limiter built by mk on every backend.
func runSteps(t *testing.T, mk func(rdb redis.Scripter, opts ...Option) (Limiter, error), steps []step) {
	t.Helper()
	forEachBackend(t, func(t *testing.T, b backend) {
		clock := newClock()
		l, err := mk(b.rdb, WithClock(clock.Now))
		require.NoError(t, err)
		ctx := context.Background()
		for i, s := range steps {
			clock.now = epoch.Add(s.at)
			got, err := l.AllowN(ctx, "table", s.n)
			require.NoError(t, err, "step %d (%v)", i, s)
			want := Result{Allowed: s.allowed, Limit: s.limit, Remaining: s.remaining, RetryAfter: s.retry, ResetAfter: s.reset}
			require.Equal(t, want, withoutGrant(got), "step %d (%v)", i, s)
		}
	})
}

func TestFixedWindowTable(t *testing.T) {
	t.Parallel()
	runSteps(t, func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
		return NewFixedWindow(rdb, 3, time.Second, opts...)
	}, []step{
		{at: 0, n: 1, allowed: true, limit: 3, remaining: 2, reset: time.Second},
		{at: 0, n: 0, allowed: true, limit: 3, remaining: 2, reset: time.Second},
		{at: 100 * ms, n: 2, allowed: true, limit: 3, remaining: 0, reset: 900 * ms},
		{at: 200 * ms, n: 1, limit: 3, retry: 800 * ms, reset: 800 * ms},
		{at: time.Second - us, n: 1, limit: 3, retry: us, reset: us},
		// The window is [start, start+W): at start+W a new one opens.
		{at: time.Second, n: 1, allowed: true, limit: 3, remaining: 2, reset: time.Second},
		{at: time.Second, n: 4, limit: 3, remaining: 2, retry: Never, reset: time.Second},
		{at: 1500 * ms, n: 2, allowed: true, limit: 3, remaining: 0, reset: 500 * ms},
		{at: 1900 * ms, n: 1, limit: 3, retry: 100 * ms, reset: 100 * ms},
		{at: 2 * time.Second, n: 1, allowed: true, limit: 3, remaining: 2, reset: time.Second},
		// n == 0 and a denial open no window: the next window starts at 5.5s.
		{at: 5 * time.Second, n: 0, allowed: true, limit: 3, remaining: 3},
		{at: 5 * time.Second, n: 4, limit: 3, remaining: 3, retry: Never},
		{at: 5500 * ms, n: 1, allowed: true, limit: 3, remaining: 2, reset: time.Second},
		{at: 6400 * ms, n: 2, allowed: true, limit: 3, remaining: 0, reset: 100 * ms},
		{at: 6500 * ms, n: 3, allowed: true, limit: 3, remaining: 0, reset: time.Second},
	})
}

func TestSlidingWindowTable(t *testing.T) {
	t.Parallel()
	// Buckets of 100ms aligned to the Unix epoch (epoch is a multiple of 100ms).
	runSteps(t, func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
		return NewSlidingWindow(rdb, 3, time.Second, 100*ms, opts...)
	}, []step{
		{at: 50 * ms, n: 1, allowed: true, limit: 3, remaining: 2, reset: 950 * ms},
		{at: 150 * ms, n: 2, allowed: true, limit: 3, remaining: 0, reset: 950 * ms},
		// Bucket 0 leaves the window when bucket 10 begins, at 1000ms.
		{at: 999 * ms, n: 1, limit: 3, retry: ms, reset: 101 * ms},
		{at: 1000 * ms, n: 1, allowed: true, limit: 3, remaining: 0, reset: time.Second},
		{at: 1000 * ms, n: 1, limit: 3, retry: 100 * ms, reset: time.Second},
		{at: 1050 * ms, n: 2, limit: 3, retry: 50 * ms, reset: 950 * ms},
		{at: 1100 * ms, n: 2, allowed: true, limit: 3, remaining: 0, reset: time.Second},
		{at: 1100 * ms, n: 4, limit: 3, retry: Never, reset: time.Second},
		{at: 1100 * ms, n: 0, allowed: true, limit: 3, remaining: 0, reset: time.Second},
		{at: 5 * time.Second, n: 0, allowed: true, limit: 3, remaining: 3},
	})
}

func TestSlidingLogTable(t *testing.T) {
	t.Parallel()
	runSteps(t, func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
		return NewSlidingLog(rdb, 100*ms, []Strategy{{Limit: 3, Window: 10 * time.Second}, {Limit: 2, Window: time.Second}}, opts...)
	}, []step{
		// Allowed: the strategy with the fewest permits left is reported.
		{at: 0, n: 1, allowed: true, limit: 2, remaining: 1, reset: 10 * time.Second},
		{at: 100 * ms, n: 1, allowed: true, limit: 2, remaining: 0, reset: 10 * time.Second},
		{at: 200 * ms, n: 1, limit: 2, retry: 800 * ms, reset: 9900 * ms},
		{at: 1000 * ms, n: 1, allowed: true, limit: 2, remaining: 0, reset: 10 * time.Second},
		// Only the 10s strategy denies: bucket 0 leaves it at 10s.
		{at: 1100 * ms, n: 1, limit: 3, retry: 8900 * ms, reset: 9900 * ms},
		// Both deny: 1s would wait 850ms, 10s 8.95s; the longer is reported.
		{at: 1150 * ms, n: 2, limit: 3, retry: 8950 * ms, reset: 9850 * ms},
		// More than the smallest limit can never be allowed.
		{at: 1150 * ms, n: 3, limit: 2, retry: Never, reset: 9850 * ms},
		{at: 1150 * ms, n: 0, allowed: true, limit: 3, remaining: 0, reset: 9850 * ms},
		{at: 20 * time.Second, n: 0, allowed: true, limit: 2, remaining: 2},
	})
}

// bucketSteps hold for both buckets at capacity 3 and 3 per second: the
// leaky bucket's level is the token bucket's missing tokens.
var bucketSteps = []step{
	{at: 0, n: 3, allowed: true, limit: 3, remaining: 0, reset: time.Second},
	// One permit drains in 1/3s: 333333.3µs, reported rounded up.
	{at: 0, n: 1, limit: 3, retry: 333334 * us, reset: time.Second},
	{at: 0, n: 4, limit: 3, retry: Never, reset: time.Second},
	{at: 333333 * us, n: 1, limit: 3, retry: us, reset: 666667 * us},
	{at: 333334 * us, n: 1, allowed: true, limit: 3, remaining: 0, reset: time.Second},
	{at: 2 * time.Second, n: 0, allowed: true, limit: 3, remaining: 3},
	{at: 2 * time.Second, n: 2, allowed: true, limit: 3, remaining: 1, reset: 666667 * us},
}

func TestLeakyBucketTable(t *testing.T) {
	t.Parallel()
	runSteps(t, func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
		return NewLeakyBucket(rdb, 3, PerSecond(3), opts...)
	}, bucketSteps)
}

func TestTokenBucketTable(t *testing.T) {
	t.Parallel()
	runSteps(t, func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
		return NewTokenBucket(rdb, 3, PerSecond(3), opts...)
	}, bucketSteps)
}
