package redlimit

import (
	"context"
	"fmt"
	"time"

	"github.com/redlimit/redlimit/internal/nilcheck"
)

// Wait is WaitN(ctx, l, key, 1).
func Wait(ctx context.Context, l Limiter, key string) error {
	return WaitN(ctx, l, key, 1)
}

// WaitN blocks until l allows n permits for key, ctx is done, or the request
// can never be allowed, and returns nil once the n permits are taken. When
// ctx ends it returns an error matching ctx.Err(); when ctx has a deadline
// that the next RetryAfter would pass, it returns at once with an error
// matching context.DeadlineExceeded, instead of sleeping in vain; when the
// request can never be allowed (n above the capacity: RetryAfter == Never)
// it returns at once with a *ViolationStrategyError, which matches
// ErrAcquireFailed. Errors that leave no decision (Redis down, n < 0) are
// returned as they are; a nil l (or a nil *TokenBucket, ...) is
// ErrInvalidConfig. WaitN sleeps in real time, even with WithClock:
// it waits for the limiter's state to recover, and a denial's RetryAfter
// says when.
func WaitN(ctx context.Context, l Limiter, key string, n int) error {
	return waitN(ctx, l, key, n, realTimer)
}

// timerFunc starts a timer of d and returns its channel and its stop
// function; tests hand waitN one that does not sleep.
type timerFunc func(d time.Duration) (<-chan time.Time, func() bool)

func realTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

func waitN(ctx context.Context, l Limiter, key string, n int, newTimer timerFunc) error {
	if nilcheck.IsNil(l) {
		name := "Limiter"
		if l != nil {
			name = fmt.Sprintf("%T", l)
		}
		return fmt.Errorf("redlimit: wait: nil %s: pass a limiter made by its constructor (NewTokenBucket, ...) and check the error it returns: %w", name, ErrInvalidConfig)
	}
	for {
		r, err := l.AllowN(ctx, key, n)
		if err != nil {
			return err
		}
		if r.Allowed {
			return nil
		}
		if r.RetryAfter == Never {
			return &ViolationStrategyError{Limit: r.Limit, Window: windowOf(l, r.Limit), RetryAfter: Never}
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < r.RetryAfter {
			return fmt.Errorf("redlimit: wait: retry after %v would pass the deadline: %w", r.RetryAfter, context.DeadlineExceeded)
		}
		fired, stop := newTimer(r.RetryAfter)
		select {
		case <-ctx.Done():
			stop()
			return fmt.Errorf("redlimit: wait: %w", ctx.Err())
		case <-fired:
		}
	}
}

// windowOf returns the window of l's limit of size limit, when l tells it
// through a Strategies method (this package's limiters, inmem's SlidingLog).
// 0 otherwise.
func windowOf(l Limiter, limit int) time.Duration {
	if l, ok := l.(interface{ Strategies() []Strategy }); ok {
		for _, st := range l.Strategies() {
			if st.Limit == limit {
				return st.Window
			}
		}
	}
	return 0
}
