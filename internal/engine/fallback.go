package engine

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisFailure reports whether err, the error of a call that reached for
// Redis, left the call undecided because of Redis or the link to it, so
// that the fallback decides it: every error but the caller's own. The
// caller's own are its ctx, done before the call or during it (cancelled,
// or its deadline passed while Redis had not answered: the caller chose
// that deadline), and a foreign value at the key (a problem of that key,
// which another limiter must not paper over). Bad input never gets here.
func redisFailure(ctx context.Context, err error) bool {
	var early doneBeforeCall
	if errors.As(err, &early) || ctx.Err() != nil {
		return false
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		// The socket deadline is the ctx's, and may fire a moment before
		// the ctx's own timer marks it done. Without a ctx deadline that
		// passed, the timeout is the client's own (ReadTimeout): Redis's.
		if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
			return false
		}
	}
	return !redis.HasErrorPrefix(err, "NOTOURS")
}

// limiterNow is the ctx key of the limiter's clock reading for its
// fallback.
type limiterNow struct{}

// WithLimiterNow returns ctx carrying now, the reading of the limiter's
// clock (WithClock) at the call the fallback decides: an in-process
// limiter without a clock of its own decides on it (LimiterNow).
func WithLimiterNow(ctx context.Context, now time.Time) context.Context {
	return context.WithValue(ctx, limiterNow{}, now)
}

// LimiterNow returns the reading WithLimiterNow put in ctx.
func LimiterNow(ctx context.Context) (time.Time, bool) {
	now, ok := ctx.Value(limiterNow{}).(time.Time)
	return now, ok
}
