package redlimit

import "context"

// shadowKey marks a context of ShadowContext.
type shadowKey struct{}

// ShadowContext returns a copy of ctx marked for shadow mode: a call made
// with it decides and counts as any other (the permits are taken), and its
// observer sees Decision.Shadow set, so that metrics can tell the would-be
// denials of a limit not yet enforced from real ones. The limiter itself
// behaves the same; not enforcing a denial is the caller's part, as the
// shadow modes of httplimit and grpclimit do. A nil ctx gives nil, which
// every limiter call refuses (ErrInvalidArgument).
func ShadowContext(ctx context.Context) context.Context {
	if ctx == nil {
		return nil
	}
	return context.WithValue(ctx, shadowKey{}, true)
}

// IsShadow reports whether ctx, or a context it derives from, was marked
// by ShadowContext. A nil ctx is not.
func IsShadow(ctx context.Context) bool {
	if ctx == nil {
		return false
	}
	shadow, _ := ctx.Value(shadowKey{}).(bool)
	return shadow
}
