package engine

import (
	"context"
	"time"
)

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
