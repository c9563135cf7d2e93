package httplimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/redlimittest"
)

// newInFlight returns a limiter of one request in flight per key.
func newInFlight(t *testing.T) *redlimit.Concurrency {
	env := redlimittest.New(t)
	l, err := redlimit.NewConcurrency(env.Client(), 1, time.Minute, env.Options()...)
	require.NoError(t, err)
	return l
}

// serve sends one request to h, in process, and returns its status.
func serveOnce(h http.Handler) int {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	return rec.Code
}

func TestInFlightLeaseLastsTheRequest(t *testing.T) {
	l := newInFlight(t)
	inside := make(chan struct{})
	proceed := make(chan struct{})
	h := Middleware(l)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			close(inside)
			<-proceed
		}
		w.Header().Set("X-Policy", w.Header().Get("RateLimit-Policy"))
	}))
	done := make(chan int)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/?hold=1", nil))
		require.Contains(t, rec.Header().Get("X-Policy"), `qu="concurrent-requests"`, "a lease limiter announces its unit")
		done <- rec.Code
	}()
	<-inside
	require.Equal(t, http.StatusTooManyRequests, serveOnce(h), "one request in flight: the second waits")
	close(proceed)
	require.Equal(t, http.StatusOK, <-done)
	require.Equal(t, http.StatusOK, serveOnce(h), "the lease went with the request")
}

func TestInFlightLeaseReleasedOnPanic(t *testing.T) {
	l := newInFlight(t)
	h := Middleware(l)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("bug") }))
	require.Panics(t, func() { serveOnce(h) })
	ok := Middleware(l)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	require.Equal(t, http.StatusOK, serveOnce(ok), "the panicking request's lease was released")
}

func TestInFlightLeaseReleasedWhenTheClientGoesAway(t *testing.T) {
	l := newInFlight(t)
	inside := make(chan struct{})
	ended := make(chan struct{})
	srv := httptest.NewServer(Middleware(l)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hang" {
			close(inside)
			<-r.Context().Done() // the handler sees its client go
			close(ended)
		}
	})))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/hang", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-inside
	cancel()
	<-ended
	require.Eventually(t, func() bool {
		resp, err := http.Get(srv.URL + "/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 5*time.Millisecond, "the lease of a request whose client went away is released")
}

// WithKeepAlive renews a long request's lease: on the fake clock, three
// lease periods pass while the request runs, each after a renewal, and the
// place is still held.
func TestInFlightKeepAlive(t *testing.T) {
	env := redlimittest.New(t)
	var allowed atomic.Int64
	count := redlimit.WithObserver(func(d redlimit.Decision) {
		if d.Result.Allowed && d.N > 0 && !d.Refund {
			allowed.Add(1) // the grant, then each renewal
		}
	})
	l, err := redlimit.NewConcurrency(env.Client(), 1, time.Minute, env.Options(count)...)
	require.NoError(t, err)
	inside, proceed := make(chan struct{}), make(chan struct{})
	h := Middleware(l, WithKeepAlive(time.Millisecond))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			close(inside)
			<-proceed
		}
	}))
	go func() {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/?hold=1", nil))
	}()
	<-inside
	// A renewal seen after a step may have read the clock before it: steps
	// of a third of the lease leave it a third to spare.
	for range 9 {
		seen := allowed.Load()
		require.Eventually(t, func() bool { return allowed.Load() > seen }, 10*time.Second, time.Millisecond, "a renewal")
		env.Advance(20 * time.Second)
	}
	require.Equal(t, http.StatusTooManyRequests, serveOnce(h), "three lease periods later the renewed lease still holds the place")
	close(proceed)
	require.Eventually(t, func() bool { return serveOnce(h) == http.StatusOK }, 10*time.Second, time.Millisecond)
}
