// Package shadow marks the contexts of calls made in shadow mode, by the
// middlewares (httplimit.WithShadow, grpclimit.WithShadow), so that the
// limiter's observer sees Decision.Shadow.
package shadow

import "context"

// key marks a context of With.
type key struct{}

// With returns a copy of ctx marked for shadow mode: a call made with it
// decides and counts as any other (the permits are taken); not enforcing
// a denial is the caller's part. A nil ctx gives nil, which every limiter
// call refuses (ErrInvalidArgument).
func With(ctx context.Context) context.Context {
	if ctx == nil {
		return nil
	}
	return context.WithValue(ctx, key{}, true)
}

// Is reports whether ctx, or a context it derives from, was marked by
// With. A nil ctx is not.
func Is(ctx context.Context) bool {
	if ctx == nil {
		return false
	}
	marked, _ := ctx.Value(key{}).(bool)
	return marked
}
