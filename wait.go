package redlimit

import (
	"context"
	"errors"
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
// returned as they are, an open circuit breaker's ErrUnavailable included,
// unless WaitOutBreaker says to wait it out. A nil l (or a nil
// *TokenBucket, ...) is ErrInvalidConfig. WaitN sleeps in real time, even
// with WithClock: it waits for the limiter's state to recover, and a
// denial's RetryAfter says when.
func WaitN(ctx context.Context, l Limiter, key string, n int, opts ...WaitOption) error {
	var o waitOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return waitN(ctx, l, key, n, realTimer, o)
}

// WaitOption configures WaitN.
type WaitOption func(*waitOptions)

type waitOptions struct {
	outage bool // WaitOutBreaker
}

// WaitOutBreaker makes WaitN wait while Redis is unavailable instead of
// returning at once: an error matching ErrUnavailable (the circuit
// breaker is open) is slept off for its RetryAfter (see RetryAfter), under
// the same ctx rules as a denial (a wait past ctx's deadline returns at
// once, with an error matching both ErrUnavailable and
// context.DeadlineExceeded), and the permits are asked for again. The call
// that probes Redis after the cooldown may fail with the Redis error
// itself, which re-opens the breaker: WaitN then asks once more, which the
// breaker answers with its next cooldown. Any other error is returned as
// it is: bad input, a foreign value at the key, and a second Redis failure
// in a row (a limiter without a breaker). With a fallback (WithFallback)
// there is nothing to wait out: the fallback decides.
//
// Use it for work that can wait for Redis rather than run unthrottled
// (a queue's jobs, a batch): WaitN(ctx, l, key, 1, WaitOutBreaker()).
// Give ctx a deadline or a cancel, or an outage holds the caller for as
// long as it lasts.
func WaitOutBreaker() WaitOption {
	return func(o *waitOptions) { o.outage = true }
}

// timerFunc starts a timer of d and returns its channel and its stop
// function; tests hand waitN one that does not sleep.
type timerFunc func(d time.Duration) (<-chan time.Time, func() bool)

func realTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

func waitN(ctx context.Context, l Limiter, key string, n int, newTimer timerFunc, o waitOptions) error {
	if nilcheck.IsNil(l) {
		name := "Limiter"
		if l != nil {
			name = fmt.Sprintf("%T", l)
		}
		return fmt.Errorf("redlimit: wait: nil %s: pass a limiter made by its constructor (NewTokenBucket, ...) and check the error it returns: %w", name, ErrInvalidConfig)
	}
	askedAgain := false // after a Redis error, under WaitOutBreaker
	for {
		r, err := l.AllowN(ctx, key, n)
		var wait time.Duration
		switch {
		case err != nil && o.outage && errors.Is(err, ErrUnavailable):
			wait, _ = RetryAfter(err)
			askedAgain = false
			if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
				return fmt.Errorf("redlimit: wait: Redis unavailable past the deadline: %w (%w)", err, context.DeadlineExceeded)
			}
		case err != nil && o.outage && !askedAgain && redisFailure(ctx, err):
			askedAgain = true
			continue
		case err != nil:
			return err
		case r.Allowed:
			return nil
		case r.RetryAfter == Never:
			return &ViolationStrategyError{Limit: r.Limit, Window: windowOf(l, r.Limit), RetryAfter: Never}
		default:
			wait = r.RetryAfter
			if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
				return fmt.Errorf("redlimit: wait: retry after %v would pass the deadline: %w", wait, context.DeadlineExceeded)
			}
		}
		fired, stop := newTimer(wait)
		select {
		case <-ctx.Done():
			stop()
			return fmt.Errorf("redlimit: wait: %w", ctx.Err())
		case <-fired:
		}
	}
}

// redisFailure reports an error of a call that Redis, or the link to it,
// left undecided: not the caller's input, ctx or key.
func redisFailure(ctx context.Context, err error) bool {
	return ctx.Err() == nil && !errors.Is(err, ErrInvalidArgument) && !errors.Is(err, ErrInvalidConfig) &&
		!errors.Is(err, ErrForeignState)
}

// RetryAfter returns how long the caller whose call returned err should
// wait before asking again, when err tells it: a denial's RetryAfter (a
// *ViolationStrategyError from TryAcquire or Wait; Never when no wait
// helps), or, for an error matching ErrUnavailable, the time until the
// circuit breaker lets a call probe Redis again. ok is false for nil and
// for every other error. Middlewares use it for Retry-After.
func RetryAfter(err error) (d time.Duration, ok bool) {
	if denial, isDenial := errors.AsType[*ViolationStrategyError](err); isDenial {
		return denial.RetryAfter, true
	}
	if errors.Is(err, ErrUnavailable) {
		if hint, has := errors.AsType[interface {
			error
			RetryAfter() time.Duration
		}](err); has {
			return hint.RetryAfter(), true
		}
	}
	return 0, false
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
