package httplimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/engine"
)

// grantingLimiter grants every request (or denies every one, when deny is
// set) with a Grant whose refunds it records, and fails them with failRefund.
type grantingLimiter struct {
	deny       bool
	failRefund error

	mu      sync.Mutex
	refunds []int // the n of each refund, in order
}

func (l *grantingLimiter) AllowN(_ context.Context, key string, n int) (redlimit.Result, error) {
	if l.deny {
		return redlimit.Result{Limit: 1, RetryAfter: 1e9}, nil
	}
	res := redlimit.Result{Allowed: true, Limit: 100, Remaining: 100 - n}
	if n > 0 {
		res.Grant = engine.NewGrant(l, key, n, "t")
	}
	return res, nil
}

func (l *grantingLimiter) Allow(ctx context.Context, key string) (redlimit.Result, error) {
	return l.AllowN(ctx, key, 1)
}

func (l *grantingLimiter) TryAcquire(ctx context.Context, key string) error {
	_, err := l.AllowN(ctx, key, 1)
	return err
}

func (l *grantingLimiter) Reset(context.Context, string) error { return nil }

func (l *grantingLimiter) RefundGrant(_ context.Context, _, _ string, _, n int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refunds = append(l.refunds, n)
	return l.failRefund
}

func (l *grantingLimiter) taken() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.refunds...)
}

func serverErrors(_ *http.Request, status int) bool { return status >= 500 }

func TestRefundIfGivesBackWhatAFailedRequestTook(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    []int
	}{
		{"a 200 counts", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }, nil},
		{"a body without a status is a 200", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) }, nil},
		{"nothing written is a 200", func(w http.ResponseWriter, r *http.Request) {}, nil},
		{"a 503 is given back", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }, []int{3}},
		{"the first status counts", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusBadGateway)
			w.WriteHeader(http.StatusOK)
		}, []int{3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &grantingLimiter{}
			h := Middleware(l, WithCost(func(*http.Request) int { return 3 }), WithRefundIf(serverErrors))(tc.handler)
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
			require.Equal(t, tc.want, l.taken(), "refunds made")
		})
	}
}

func TestRefundIfAPanicCountsAsA500(t *testing.T) {
	l := &grantingLimiter{}
	h := Middleware(l, WithRefundIf(serverErrors))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("handler bug")
	}))
	require.PanicsWithValue(t, "handler bug", func() {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	}, "the handler's panic goes on")
	require.Equal(t, []int{1}, l.taken(), "the panicking request's permit is given back")
}

func TestRefundFailureIsToldToOnError(t *testing.T) {
	l := &grantingLimiter{failRefund: errors.New("redis down")}
	var told []error
	h := Middleware(l, WithRefundIf(serverErrors), WithOnError(func(_ *http.Request, err error) { told = append(told, err) }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) }))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	require.Len(t, told, 1)
	require.ErrorIs(t, told[0], ErrRefund)
}

func TestNestedMiddlewaresGiveBackWhenAnInnerOneDenies(t *testing.T) {
	outer, inner := &grantingLimiter{}, &grantingLimiter{deny: true}
	reached := false
	h := Middleware(outer, WithPolicyName("outer"))(
		Middleware(inner, WithPolicyName("inner"))(
			http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true })))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.False(t, reached)
	require.Equal(t, []int{1}, outer.taken(), "the outer limit is not charged for a request the inner one refused")

	// Both allowing: nothing is given back.
	outer, both := &grantingLimiter{}, &grantingLimiter{}
	h = Middleware(outer)(Middleware(both)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	require.Empty(t, outer.taken())
	require.Empty(t, both.taken())
}

func TestSettleGivesBackWhatARequestDidNotUse(t *testing.T) {
	l := &grantingLimiter{}
	var errs []error
	settle := func(used ...int) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for _, u := range used {
				errs = append(errs, Settle(r.Context(), u))
			}
		})
	}
	cost := WithCost(func(*http.Request) int { return 4000 })

	Middleware(l, cost)(settle(1200, 1200)).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	require.Equal(t, []int{2800, 2800}, l.taken(), "settling asks the grant to have given back 2800 in all, twice: the grant keeps the largest, never a sum")
	require.Equal(t, []error{nil, nil}, errs)

	l.refunds, errs = nil, nil
	Middleware(l, cost)(settle(4000, 5000)).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	require.Empty(t, l.taken(), "a request that used all it took gives nothing back")

	err := Settle(context.Background(), 1)
	require.ErrorIs(t, err, redlimit.ErrInvalidArgument, "a context without a grant")
	Middleware(l, cost)(settle(-1)).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	require.ErrorIs(t, errs[len(errs)-1], redlimit.ErrInvalidArgument, "a negative use")
}
