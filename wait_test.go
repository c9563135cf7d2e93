package redlimit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// scriptedLimiter is a Limiter that answers Allow from a script of replies,
// repeating the last one, and counts the calls.
type scriptedLimiter struct {
	mu      sync.Mutex
	replies []scriptedReply
	calls   int
}

type scriptedReply struct {
	result Result
	err    error
}

func (l *scriptedLimiter) AllowN(context.Context, string, int) (Result, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.replies[min(l.calls, len(l.replies)-1)]
	l.calls++
	return r.result, r.err
}

func (l *scriptedLimiter) Allow(ctx context.Context, key string) (Result, error) {
	return l.AllowN(ctx, key, 1)
}

func (l *scriptedLimiter) TryAcquire(ctx context.Context, key string) error {
	r, err := l.Allow(ctx, key)
	if err == nil && !r.Allowed {
		err = ErrAcquireFailed
	}
	return err
}

func (l *scriptedLimiter) Reset(context.Context, string) error { return nil }

func (l *scriptedLimiter) callCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls
}

// realTimeTokenBucket is a token bucket of capacity 1 on miniredis, whose
// TIME is real time: a limiter Wait can really wait for.
func realTimeTokenBucket(t *testing.T, refill Rate) Limiter {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	l, err := NewTokenBucket(rdb, 1, refill)
	require.NoError(t, err)
	return l
}

func TestWaitAllowedAtOnce(t *testing.T) {
	l := realTimeTokenBucket(t, PerMinute(1))
	start := time.Now()
	require.NoError(t, Wait(context.Background(), l, "k"), "a fresh key should be allowed")
	require.Less(t, time.Since(start), 100*time.Millisecond, "an allowed request should not wait")
	r, err := l.Allow(context.Background(), "k")
	require.NoError(t, err)
	require.False(t, r.Allowed, "Wait should have taken the only permit")
}

func TestWaitUntilAllowed(t *testing.T) {
	l := realTimeTokenBucket(t, PerSecond(20)) // one token every 50ms
	ctx := context.Background()
	require.NoError(t, l.TryAcquire(ctx, "k"), "take the only token")
	start := time.Now()
	r, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, r.Allowed, "the bucket is empty")
	require.Positive(t, r.RetryAfter, "a denial says how long to wait")

	require.NoError(t, Wait(ctx, l, "k"), "Wait should return once the token is back")
	waited := time.Since(start)
	// The server's clock and ours are one clock here: the token cannot be
	// back before RetryAfter has passed since the probe.
	require.GreaterOrEqual(t, waited, r.RetryAfter-time.Millisecond, "Wait should not return before RetryAfter")
	require.Less(t, waited, r.RetryAfter+time.Second, "Wait should return soon after RetryAfter")
	r, err = l.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, r.Allowed, "Wait should have taken the token it waited for")
}

func TestWaitRetriesUntilAllowed(t *testing.T) {
	l := &scriptedLimiter{replies: []scriptedReply{
		{result: Result{Limit: 1, RetryAfter: 10 * time.Millisecond}},
		{result: Result{Limit: 1, RetryAfter: 10 * time.Millisecond}},
		{result: Result{Allowed: true, Limit: 1}},
	}}
	start := time.Now()
	require.NoError(t, Wait(context.Background(), l, "k"), "Wait should return nil once allowed")
	require.Equal(t, 3, l.callCount(), "two denials, then the grant")
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond, "Wait should sleep each RetryAfter")
}

func TestWaitCancelled(t *testing.T) {
	l := realTimeTokenBucket(t, PerMinute(1))
	require.NoError(t, l.TryAcquire(context.Background(), "k"), "take the only token: a minute to wait")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	timer := time.AfterFunc(20*time.Millisecond, cancel)
	defer timer.Stop()
	start := time.Now()
	err := Wait(ctx, l, "k")
	require.ErrorIs(t, err, context.Canceled, "Wait should end with the ctx")
	require.False(t, errors.Is(err, ErrAcquireFailed), "a cancelled wait is no denial: %v", err)
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond, "Wait should wait until cancelled")
	require.Less(t, time.Since(start), 10*time.Second, "Wait should return as soon as ctx is cancelled")
}

func TestWaitCancelledBefore(t *testing.T) {
	l := &scriptedLimiter{replies: []scriptedReply{{result: Result{Limit: 1, RetryAfter: time.Hour}}}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, Wait(ctx, l, "k"), context.Canceled, "a cancelled ctx should end Wait at once")
}

func TestWaitDeadlineBeforeRetryAfter(t *testing.T) {
	l := realTimeTokenBucket(t, PerMinute(1))
	require.NoError(t, l.TryAcquire(context.Background(), "k"), "take the only token: a minute to wait")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	err := Wait(ctx, l, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded, "a RetryAfter past the deadline should fail like the deadline")
	require.Less(t, time.Since(start), time.Second, "Wait should return at once, not sleep until the deadline")
	require.NoError(t, ctx.Err(), "Wait returned before the deadline")
}

func TestWaitDeadlineWhileWaiting(t *testing.T) {
	// Each RetryAfter fits before the deadline, but the retries add up.
	l := &scriptedLimiter{replies: []scriptedReply{{result: Result{Limit: 1, RetryAfter: 15 * time.Millisecond}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := Wait(ctx, l, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded, "Wait should give up by the deadline")
	require.Less(t, time.Since(start), time.Second, "Wait should give up by the deadline")
	require.GreaterOrEqual(t, l.callCount(), 2, "Wait should retry while RetryAfter fits")
}

func TestWaitNever(t *testing.T) {
	l := &scriptedLimiter{replies: []scriptedReply{{result: Result{Limit: 0, RetryAfter: Never}}}}
	start := time.Now()
	err := Wait(context.Background(), l, "k")
	require.ErrorIs(t, err, ErrAcquireFailed, "a request that can never be allowed should fail as a denial")
	require.Less(t, time.Since(start), 100*time.Millisecond, "Wait should not wait for Never")
	require.Equal(t, 1, l.callCount(), "one call tells Never")
}

func TestWaitError(t *testing.T) {
	t.Run("returned as is", func(t *testing.T) {
		redisDown := errors.New("redis: connection refused")
		l := &scriptedLimiter{replies: []scriptedReply{{err: redisDown}}}
		err := Wait(context.Background(), l, "k")
		require.Same(t, redisDown, err, "a failure to decide should be returned as is")
		require.Equal(t, 1, l.callCount(), "no retry after an error")
	})
	t.Run("after a denial", func(t *testing.T) {
		redisDown := errors.New("redis: connection refused")
		l := &scriptedLimiter{replies: []scriptedReply{
			{result: Result{Limit: 1, RetryAfter: time.Millisecond}},
			{err: redisDown},
		}}
		require.Same(t, redisDown, Wait(context.Background(), l, "k"), "a failure to decide should be returned as is")
	})
	t.Run("Redis down", func(t *testing.T) {
		l, err := NewTokenBucket(deadRedis(t), 1, PerSecond(1))
		require.NoError(t, err)
		start := time.Now()
		err = Wait(context.Background(), l, "k")
		require.Error(t, err, "Wait with Redis down should fail")
		require.False(t, errors.Is(err, ErrAcquireFailed), "Redis down is no denial: %v", err)
		require.Less(t, time.Since(start), 5*time.Second, "Wait should not retry a failure")
	})
	t.Run("invalid key", func(t *testing.T) {
		l := realTimeTokenBucket(t, PerSecond(1))
		require.ErrorIs(t, Wait(context.Background(), l, ""), ErrInvalidArgument, "an empty key is an invalid argument")
	})
}
