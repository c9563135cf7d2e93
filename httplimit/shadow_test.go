package httplimit

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/redlimittest"
)

// denialLog records what OnDenied is told.
type denialLog struct {
	mu       sync.Mutex
	enforced []bool
}

func (l *denialLog) record(_ *http.Request, _ redlimit.Result, enforced bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.enforced = append(l.enforced, enforced)
}

// In shadow mode every request goes through and is counted: the observer
// sees each decision marked Shadow, OnDenied hears of the denials as not
// enforced, and the client sees no rate limit headers. Without it the same
// limiter denies, and OnDenied hears of enforced denials.
func TestMiddlewareShadow(t *testing.T) {
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
		var denied denialLog
		var told errorLog
		opts := []Option{WithOnDenied(denied.record), WithOnError(told.record), WithFailClosed()}
		if shadow {
			opts = append(opts, WithShadow())
		}
		h := Middleware(l, opts...)(ok)
		var codes []int
		for range 3 {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			codes = append(codes, rec.Code)
			if shadow {
				assert.Empty(t, rec.Header().Get("RateLimit"), "shadow mode shows clients nothing")
				assert.Empty(t, rec.Header().Get("Retry-After"), "shadow mode shows clients nothing")
				assert.NotEmpty(t, rec.Header().Get("Test-Remaining"), "the handler finds the Result")
			}
		}
		if shadow {
			assert.Equal(t, []int{200, 200, 200}, codes, "shadow mode never denies")
			assert.Equal(t, []bool{false, false}, denied.enforced, "OnDenied hears of each denial, not enforced")
		} else {
			assert.Equal(t, []int{200, 429, 429}, codes)
			assert.Equal(t, []bool{true, true}, denied.enforced)
		}
		require.Len(t, decisions, 3)
		for i, d := range decisions {
			assert.Equal(t, shadow, d.Shadow, "decision %d: Decision.Shadow", i)
			assert.Equal(t, i == 0, d.Result.Allowed, "decision %d: counted as usual", i)
		}
		assert.Empty(t, told.take())
	}
}

// In shadow mode no error stops a request, with WithFailClosed too; OnError
// hears of each, marked ErrNotEnforced.
func TestMiddlewareShadowErrors(t *testing.T) {
	tests := []struct {
		name    string
		limiter redlimit.Limiter
		opts    []Option
		match   error
	}{
		{"no decision", failingLimiter{err: errors.New("connection refused")}, nil, ErrNoDecision},
		{"missing key", failingLimiter{}, []Option{WithKeyFunc(Header("X-API-Key"))}, ErrMissingKey},
		{"bad cost", failingLimiter{}, []Option{WithCost(func(*http.Request) int { return -1 })}, ErrCost},
		{"key refused", failingLimiter{err: redlimit.ErrInvalidArgument}, nil, redlimit.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var told errorLog
			h := Middleware(tt.limiter, append(tt.opts, WithShadow(), WithFailClosed(), WithOnError(told.record))...)(ok)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			assert.Equal(t, 200, rec.Code, "the request goes through")
			errs := told.take()
			require.Len(t, errs, 1)
			assert.ErrorIs(t, errs[0], ErrNotEnforced)
			assert.ErrorIs(t, errs[0], tt.match)
		})
	}
}
