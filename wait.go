package redlimit

import (
	"context"
	"fmt"
	"time"
)

// Wait blocks until l allows one permit for key, ctx is done, or the request
// can never be allowed. It returns nil once a permit is taken. When ctx ends
// it returns an error matching ctx.Err(); when ctx has a deadline that the
// next RetryAfter would pass, it returns at once with an error matching
// context.DeadlineExceeded, instead of sleeping in vain; when the request can
// never be allowed (RetryAfter == Never) it returns an error matching
// ErrAcquireFailed. Errors that leave no decision (Redis down) are returned
// as they are. Wait sleeps in real time, even with WithClock.
func Wait(ctx context.Context, l Limiter, key string) error {
	for {
		r, err := l.Allow(ctx, key)
		if err != nil {
			return err
		}
		if r.Allowed {
			return nil
		}
		if r.RetryAfter == Never {
			return fmt.Errorf("redlimit: wait: one permit can never be allowed (limit %d): %w", r.Limit, ErrAcquireFailed)
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < r.RetryAfter {
			return fmt.Errorf("redlimit: wait: retry after %v would pass the deadline: %w", r.RetryAfter, context.DeadlineExceeded)
		}
		timer := time.NewTimer(r.RetryAfter)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("redlimit: wait: %w", ctx.Err())
		case <-timer.C:
		}
	}
}
