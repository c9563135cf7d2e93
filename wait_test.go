package redlimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/require"
)

// scriptedLimiter is a Limiter that answers Allow from a script of replies,
// repeating the last one, and counts the calls.
type scriptedLimiter struct {
	mu      sync.Mutex
	replies []scriptedReply
	calls   int
	ns      []int // n of each call
}

type scriptedReply struct {
	result Result
	err    error
}

func (l *scriptedLimiter) AllowN(_ context.Context, _ string, n int) (Result, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.replies[min(l.calls, len(l.replies)-1)]
	l.calls++
	l.ns = append(l.ns, n)
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

// clockedTokenBucket is a token bucket on miniredis and a fake clock, and
// fake timers that move that clock: waitN with timers.newTimer waits for the
// bucket without sleeping.
func clockedTokenBucket(t *testing.T, capacity int, refill Rate) (Limiter, *fakeTimers) {
	t.Helper()
	timers := &fakeTimers{clock: newClock()}
	l, err := NewTokenBucket(newClient(t, miniredis.RunT(t).Addr(), 0), capacity, refill, WithClock(timers.clock.Now))
	require.NoError(t, err)
	return l, timers
}

func TestWaitAllowedAtOnce(t *testing.T) {
	t.Parallel()
	l, timers := clockedTokenBucket(t, 1, PerMinute(1))
	require.NoError(t, waitN(context.Background(), l, "k", 1, timers.newTimer, waitOptions{}), "a fresh key should be allowed")
	require.Empty(t, timers.slept, "an allowed request should not wait")
	r, err := l.Allow(context.Background(), "k")
	require.NoError(t, err)
	require.False(t, r.Allowed, "Wait should have taken the only permit")
}

func TestWaitUntilAllowed(t *testing.T) {
	t.Parallel()
	l, timers := clockedTokenBucket(t, 1, PerSecond(20)) // one token every 50ms
	ctx := context.Background()
	require.NoError(t, l.TryAcquire(ctx, "k"), "take the only token")
	timers.clock.Advance(10 * time.Millisecond)
	r, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, r.Allowed, "the bucket is empty")
	require.Equal(t, 40*time.Millisecond, r.RetryAfter, "a denial says how long to wait")

	require.NoError(t, waitN(ctx, l, "k", 1, timers.newTimer, waitOptions{}), "Wait should return once the token is back")
	require.Equal(t, []time.Duration{r.RetryAfter}, timers.slept, "Wait should wait RetryAfter, once, and then be allowed")
	r, err = l.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, r.Allowed, "Wait should have taken the token it waited for")
}

// fakeTimers is a timerFunc that never sleeps: each timer fires at once
// and its duration is recorded.
type fakeTimers struct {
	mu    sync.Mutex
	slept []time.Duration
	clock *fakeClock // when set, each timer advances it by its duration
}

func (f *fakeTimers) newTimer(d time.Duration) (<-chan time.Time, func() bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slept = append(f.slept, d)
	if f.clock != nil {
		f.clock.Advance(d)
	}
	c := make(chan time.Time, 1)
	c <- time.Time{}
	return c, func() bool { return false }
}

// blockingTimers never fire: a wait on them ends only with its ctx.
func blockingTimer(time.Duration) (<-chan time.Time, func() bool) {
	return nil, func() bool { return true }
}

func TestWaitRetriesUntilAllowed(t *testing.T) {
	t.Parallel()
	l := &scriptedLimiter{replies: []scriptedReply{
		{result: Result{Limit: 5, RetryAfter: 10 * time.Millisecond}},
		{result: Result{Limit: 5, RetryAfter: 7 * time.Millisecond}},
		{result: Result{Allowed: true, Limit: 5}},
	}}
	var timers fakeTimers
	require.NoError(t, waitN(context.Background(), l, "k", 3, timers.newTimer, waitOptions{}), "WaitN should return nil once allowed")
	require.Equal(t, 3, l.callCount(), "two denials, then the grant")
	require.Equal(t, []int{3, 3, 3}, l.ns, "every call asks for all n permits")
	require.Equal(t, []time.Duration{10 * time.Millisecond, 7 * time.Millisecond}, timers.slept, "WaitN should sleep each RetryAfter, exactly")
}

func TestWaitNTakesNPermits(t *testing.T) {
	t.Parallel()
	l, _ := clockedTokenBucket(t, 5, PerMinute(1))
	ctx := context.Background()
	require.NoError(t, WaitN(ctx, l, "k", 4), "4 of 5 tokens are there")
	r, err := l.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	require.Equal(t, 1, r.Remaining, "WaitN should have taken 4 tokens")
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	require.ErrorIs(t, WaitN(ctx, l, "k", 2), context.DeadlineExceeded, "2 tokens take a minute: past the deadline")
	var violation *ViolationStrategyError
	err = WaitN(context.Background(), l, "k", 6)
	require.ErrorAs(t, err, &violation, "6 of capacity 5 can never be allowed")
	require.Equal(t, Never, violation.RetryAfter)
	require.ErrorIs(t, WaitN(context.Background(), l, "k", -1), ErrInvalidArgument)
}

func TestWaitCancelled(t *testing.T) {
	t.Parallel()
	l := &scriptedLimiter{replies: []scriptedReply{{result: Result{Limit: 1, RetryAfter: time.Minute}}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- waitN(ctx, l, "k", 1, blockingTimer, waitOptions{}) }()
	cancel()
	err := <-done
	require.ErrorIs(t, err, context.Canceled, "Wait should end with the ctx")
	require.False(t, errors.Is(err, ErrAcquireFailed), "a cancelled wait is no denial: %v", err)
}

func TestWaitCancelledBefore(t *testing.T) {
	t.Parallel()
	l := &scriptedLimiter{replies: []scriptedReply{{result: Result{Limit: 1, RetryAfter: time.Hour}}}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, Wait(ctx, l, "k"), context.Canceled, "a cancelled ctx should end Wait at once")
}

func TestWaitDeadlineBeforeRetryAfter(t *testing.T) {
	t.Parallel()
	l, _ := clockedTokenBucket(t, 1, PerMinute(1))
	require.NoError(t, l.TryAcquire(context.Background(), "k"), "take the only token: a minute to wait")
	// The minute's wait passes the deadline, which is far enough that
	// returning before it, however slow the machine, means at once.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	err := Wait(ctx, l, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded, "a RetryAfter past the deadline should fail like the deadline")
	require.NoError(t, ctx.Err(), "Wait should return at once, not sleep until the deadline")
}

func TestWaitDeadlineWhileWaiting(t *testing.T) {
	t.Parallel()
	// The RetryAfter fits before the deadline, but the deadline comes
	// while Wait sleeps.
	l := &scriptedLimiter{replies: []scriptedReply{{result: Result{Limit: 1, RetryAfter: time.Millisecond}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := waitN(ctx, l, "k", 1, blockingTimer, waitOptions{})
	require.ErrorIs(t, err, context.DeadlineExceeded, "Wait should give up by the deadline")
	require.Equal(t, 1, l.callCount(), "one call, then the sleep the deadline ended")
}

func TestWaitNever(t *testing.T) {
	t.Parallel()
	l := &scriptedLimiter{replies: []scriptedReply{{result: Result{Limit: 2, RetryAfter: Never}}}}
	var timers fakeTimers
	err := waitN(context.Background(), l, "k", 3, timers.newTimer, waitOptions{})
	require.ErrorIs(t, err, ErrAcquireFailed, "a request that can never be allowed should fail as a denial")
	var violation *ViolationStrategyError
	require.ErrorAs(t, err, &violation, "Wait's denial is typed like TryAcquire's")
	require.Equal(t, 2, violation.Limit)
	require.Empty(t, timers.slept, "Wait should not wait for Never")
	require.Equal(t, 1, l.callCount(), "one call tells Never")
}

func TestWaitError(t *testing.T) {
	t.Parallel()
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
		var timers fakeTimers
		require.Same(t, redisDown, waitN(context.Background(), l, "k", 1, timers.newTimer, waitOptions{}), "a failure to decide should be returned as is")
	})
	t.Run("Redis down", func(t *testing.T) {
		l, err := NewTokenBucket(deadRedis(t, "", 0), 1, PerSecond(1))
		require.NoError(t, err)
		start := time.Now()
		err = Wait(context.Background(), l, "k")
		require.Error(t, err, "Wait with Redis down should fail")
		require.False(t, errors.Is(err, ErrAcquireFailed), "Redis down is no denial: %v", err)
		require.Less(t, time.Since(start), 5*time.Second, "Wait should not retry a failure")
	})
	t.Run("invalid key", func(t *testing.T) {
		l, _ := clockedTokenBucket(t, 1, PerSecond(1))
		require.ErrorIs(t, Wait(context.Background(), l, ""), ErrInvalidArgument, "an empty key is an invalid argument")
	})
}

// openBreaker is the error of a call an open circuit breaker answered.
type openBreaker struct{ wait time.Duration }

func (e openBreaker) Error() string             { return "breaker open" }
func (e openBreaker) Unwrap() error             { return ErrUnavailable }
func (e openBreaker) RetryAfter() time.Duration { return e.wait }

// WaitOutBreaker sleeps an open breaker's RetryAfter and asks again; a
// failed probe is asked again once, which the re-opened breaker answers.
// Without it, ErrUnavailable comes back at once.
func TestWaitOutBreaker(t *testing.T) {
	t.Parallel()
	probeFailed := errors.New("redis: connection refused")
	l := &scriptedLimiter{replies: []scriptedReply{
		{err: openBreaker{300 * time.Millisecond}},
		{err: probeFailed}, // this call was the probe
		{err: openBreaker{time.Second}},
		{result: Result{Limit: 5, RetryAfter: 10 * time.Millisecond}},
		{result: Result{Allowed: true, Limit: 5}},
	}}
	var timers fakeTimers
	require.NoError(t, waitN(context.Background(), l, "k", 1, timers.newTimer, waitOptions{outage: true}))
	require.Equal(t, []time.Duration{300 * time.Millisecond, time.Second, 10 * time.Millisecond}, timers.slept,
		"the breaker's cooldowns, then the denial's RetryAfter")
	require.Equal(t, 5, l.callCount())

	t.Run("off by default", func(t *testing.T) {
		l := &scriptedLimiter{replies: []scriptedReply{{err: openBreaker{time.Second}}}}
		err := Wait(context.Background(), l, "k")
		require.ErrorIs(t, err, ErrUnavailable)
		require.Equal(t, 1, l.callCount())
	})
	t.Run("two Redis errors in a row", func(t *testing.T) {
		l := &scriptedLimiter{replies: []scriptedReply{{err: probeFailed}}}
		var timers fakeTimers
		err := waitN(context.Background(), l, "k", 1, timers.newTimer, waitOptions{outage: true})
		require.Same(t, probeFailed, err, "a limiter without a breaker: no spinning")
		require.Equal(t, 2, l.callCount())
		require.Empty(t, timers.slept)
	})
	t.Run("the caller's errors", func(t *testing.T) {
		for _, bad := range []error{ErrInvalidArgument, ErrForeignState, ErrInvalidConfig} {
			l := &scriptedLimiter{replies: []scriptedReply{{err: bad}}}
			err := WaitN(context.Background(), l, "k", 1, WaitOutBreaker())
			require.ErrorIs(t, err, bad)
			require.Equal(t, 1, l.callCount(), "%v is not asked again", bad)
		}
	})
	t.Run("past the deadline", func(t *testing.T) {
		l := &scriptedLimiter{replies: []scriptedReply{{err: openBreaker{time.Hour}}}}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
		defer cancel()
		err := WaitN(ctx, l, "k", 1, WaitOutBreaker())
		require.ErrorIs(t, err, ErrUnavailable)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NoError(t, ctx.Err(), "returned at once")
	})
	t.Run("cancelled while waiting", func(t *testing.T) {
		l := &scriptedLimiter{replies: []scriptedReply{{err: openBreaker{time.Second}}}}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- waitN(ctx, l, "k", 1, blockingTimer, waitOptions{outage: true}) }()
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})
}

// RetryAfter reads a denial's wait and an open breaker's, from the errors
// the limiters return.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	d, ok := RetryAfter(&ViolationStrategyError{Limit: 1, Window: time.Second, RetryAfter: 300 * time.Millisecond})
	require.True(t, ok)
	require.Equal(t, 300*time.Millisecond, d)
	d, ok = RetryAfter(fmt.Errorf("wrapped: %w", &ViolationStrategyError{Limit: 1, RetryAfter: Never}))
	require.True(t, ok)
	require.Equal(t, Never, d)
	for _, err := range []error{nil, errors.New("redis: connection refused"), ErrUnavailable, ErrInvalidArgument} {
		_, ok := RetryAfter(err)
		require.False(t, ok, "%v tells no wait", err)
	}

	// A real breaker, on a fake clock: opened by a dead Redis, it answers
	// with the rest of its cooldown.
	clock := newClock()
	breaker, err := NewBreaker(BreakerConfig{Failures: 1, Cooldown: 10 * time.Second, Now: clock.Now})
	require.NoError(t, err)
	l, err := NewTokenBucket(deadRedis(t, "", 0), 1, PerSecond(1), WithBreaker(breaker))
	require.NoError(t, err)
	ctx := context.Background()
	require.Error(t, l.TryAcquire(ctx, "k"), "Redis is down")
	clock.Advance(4 * time.Second)
	err = l.TryAcquire(ctx, "k")
	require.ErrorIs(t, err, ErrUnavailable)
	d, ok = RetryAfter(err)
	require.True(t, ok, "an open breaker tells when it probes: %v", err)
	require.Equal(t, 6*time.Second, d)
}
