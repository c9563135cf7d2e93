package grpclimit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/redlimittest"
)

// In shadow mode every call runs and is counted: the observer sees each
// decision marked Shadow, OnDenied hears of the denials as not enforced.
// Without it the same limiter denies, and OnDenied hears of enforced ones.
func TestShadow(t *testing.T) {
	for _, shadow := range []bool{true, false} {
		env := redlimittest.New(t)
		var mu sync.Mutex
		var decisions []redlimit.Decision
		l, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options(redlimit.WithObserver(func(d redlimit.Decision) {
			mu.Lock()
			defer mu.Unlock()
			decisions = append(decisions, d)
		}))...)
		require.NoError(t, err)
		var enforced []bool
		opts := []Option{WithKeyFunc(Metadata("x-client")), WithFailClosed(), WithOnDenied(func(_ context.Context, _ string, _ redlimit.Result, e bool) {
			enforced = append(enforced, e)
		})}
		if shadow {
			opts = append(opts, WithShadow())
		}
		interceptor := UnaryServerInterceptor(l, opts...)
		var got []codes.Code
		for range 3 {
			got = append(got, status.Code(call(interceptor, "c", 0)))
		}
		if shadow {
			assert.Equal(t, []codes.Code{codes.OK, codes.OK, codes.OK}, got, "shadow mode never denies")
			assert.Equal(t, []bool{false, false}, enforced)
		} else {
			assert.Equal(t, []codes.Code{codes.OK, codes.ResourceExhausted, codes.ResourceExhausted}, got)
			assert.Equal(t, []bool{true, true}, enforced)
		}
		require.Len(t, decisions, 3)
		for i, d := range decisions {
			assert.Equal(t, shadow, d.Shadow, "decision %d: Decision.Shadow", i)
			assert.Equal(t, i == 0, d.Result.Allowed, "decision %d: counted as usual", i)
		}
	}
}

// In shadow mode no error stops a call, with WithFailClosed too; OnError
// hears of each, marked ErrNotEnforced.
func TestShadowErrors(t *testing.T) {
	for name, tt := range map[string]struct {
		limiter redlimit.Limiter
		key     KeyFunc
	}{
		"no decision": {failing{err: errors.New("connection refused")}, Metadata("x-client")},
		"missing key": {failing{}, Metadata("x-api-key")},
		"key refused": {failing{err: redlimit.ErrInvalidArgument}, Metadata("x-client")},
	} {
		t.Run(name, func(t *testing.T) {
			var told []error
			interceptor := UnaryServerInterceptor(tt.limiter, WithKeyFunc(tt.key), WithShadow(), WithFailClosed(),
				WithOnError(func(_ context.Context, _ string, err error) { told = append(told, err) }))
			assert.NoError(t, call(interceptor, "c", 0), "the call goes on")
			require.Len(t, told, 1)
			assert.ErrorIs(t, told[0], ErrNotEnforced)
		})
	}
}
