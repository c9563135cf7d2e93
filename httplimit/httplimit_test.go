package httplimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/redlimittest"
)

// response is what a client saw of one request.
type response struct {
	status int
	header http.Header
	body   string
}

// sendFunc sends one GET request with the given headers to the handler under
// test.
type sendFunc func(t *testing.T, header http.Header) response

// eachTransport runs fn twice: with the handler called in process on an
// httptest.ResponseRecorder (RemoteAddr 192.0.2.1:1234), and over a real
// connection from a net/http client to a server on 127.0.0.1.
func eachTransport(t *testing.T, h http.Handler, fn func(t *testing.T, send sendFunc)) {
	t.Helper()
	t.Run("recorder", func(t *testing.T) {
		fn(t, func(t *testing.T, header http.Header) response {
			t.Helper()
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			for k, vs := range header {
				req.Header[k] = vs
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return response{status: rec.Code, header: rec.Result().Header, body: rec.Body.String()}
		})
	})
	t.Run("server", func(t *testing.T) {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		require.True(t, strings.HasPrefix(srv.URL, "http://127.0.0.1:"), "test server at %s, want 127.0.0.1", srv.URL)
		fn(t, func(t *testing.T, header http.Header) response {
			t.Helper()
			req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
			require.NoError(t, err)
			for k, vs := range header {
				req.Header[k] = vs
			}
			resp, err := srv.Client().Do(req)
			require.NoError(t, err, "request to the test server")
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err, "read the response body")
			return response{status: resp.StatusCode, header: resp.Header, body: string(body)}
		})
	})
}

// ok is the next handler of every test: it answers 200 "ok" and says
// whether it saw the limiter's Result.
var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if res, found := ResultFromContext(r.Context()); found {
		w.Header().Set("Test-Remaining", strconv.Itoa(res.Remaining))
	}
	io.WriteString(w, "ok")
})

// errorLog collects what WithOnError is told.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) record(_ *http.Request, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

func (l *errorLog) take() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	errs := l.errs
	l.errs = nil
	return errs
}

// step is one request and what its response must be. Header values in want
// are exact; "" means the header must be absent.
type step struct {
	advance time.Duration // move the fake clock first
	header  http.Header
	status  int
	want    map[string]string
	body    string // a substring of the body
}

func runSteps(t *testing.T, env *redlimittest.Env, send sendFunc, steps []step) {
	t.Helper()
	for i, s := range steps {
		env.Advance(s.advance)
		resp := send(t, s.header)
		require.Equal(t, s.status, resp.status, "step %d: status (body %q)", i, resp.body)
		for name, want := range s.want {
			if want == "" {
				assert.Empty(t, resp.header.Values(name), "step %d: header %s must be absent", i, name)
				continue
			}
			assert.Equal(t, want, resp.header.Get(name), "step %d: header %s", i, name)
		}
		assert.Contains(t, resp.body, s.body, "step %d: body", i)
	}
}

func TestMiddlewareDecisions(t *testing.T) {
	type build func(env *redlimittest.Env) (redlimit.Limiter, error)
	fixedWindow := func(limit int, window time.Duration) build {
		return func(env *redlimittest.Env) (redlimit.Limiter, error) {
			return redlimit.NewFixedWindow(env.Client(), limit, window, env.Options()...)
		}
	}
	tests := []struct {
		name    string
		limiter build
		opts    []Option
		steps   []step
	}{
		{
			name:    "allowed, denied with Retry-After rounded up, allowed again",
			limiter: fixedWindow(2, time.Minute),
			opts:    []Option{WithWindow(time.Minute)},
			steps: []step{
				{status: 200, body: "ok", want: map[string]string{
					"RateLimit-Policy": `"default";q=2;w=60`, "RateLimit": `"default";r=1;t=60`,
					"Retry-After": "", "X-RateLimit-Limit": "", "Test-Remaining": "1",
				}},
				{status: 200, want: map[string]string{"RateLimit": `"default";r=0;t=60`}},
				{status: 429, body: "rate limit exceeded, retry after 60s", want: map[string]string{
					"RateLimit-Policy": `"default";q=2;w=60`, "RateLimit": `"default";r=0;t=60`,
					"Retry-After": "60", "Test-Remaining": "",
				}},
				{advance: 59*time.Second + 500*time.Millisecond, status: 429, want: map[string]string{
					"RateLimit": `"default";r=0;t=1`, "Retry-After": "1",
				}},
				{advance: 500 * time.Millisecond, status: 200, want: map[string]string{
					"RateLimit": `"default";r=1;t=60`, "Retry-After": "",
				}},
			},
		},
		{
			name: "sub-second RetryAfter is one second",
			limiter: func(env *redlimittest.Env) (redlimit.Limiter, error) {
				return redlimit.NewTokenBucket(env.Client(), 1, redlimit.PerSecond(4), env.Options()...)
			},
			steps: []step{
				{status: 200, want: map[string]string{"RateLimit-Policy": `"default";q=1;w=1`, "RateLimit": `"default";r=0;t=1`}},
				{status: 429, want: map[string]string{"Retry-After": "1"}},
				{advance: 250 * time.Millisecond, status: 200},
			},
		},
		{
			name:    "cost above capacity is 413 without Retry-After",
			limiter: fixedWindow(5, time.Minute),
			opts:    []Option{WithCost(func(*http.Request) int { return 6 })},
			steps: []step{
				{status: 413, body: "request exceeds the rate limit", want: map[string]string{
					"Retry-After": "", "RateLimit-Policy": `"default";q=5;w=60`, "RateLimit": `"default";r=5;t=0`,
				}},
			},
		},
		{
			name:    "cost from the request",
			limiter: fixedWindow(10, time.Minute),
			opts: []Option{WithCost(func(r *http.Request) int {
				n, _ := strconv.Atoi(r.Header.Get("Cost"))
				return n
			}), WithQuotaUnit("content-bytes")},
			steps: []step{
				{header: http.Header{"Cost": {"4"}}, status: 200, want: map[string]string{
					"RateLimit-Policy": `"default";q=10;qu="content-bytes";w=60`, "RateLimit": `"default";r=6;t=60`,
				}},
				{header: http.Header{"Cost": {"7"}}, status: 429, want: map[string]string{"RateLimit": `"default";r=6;t=60`, "Retry-After": "60"}},
				{header: http.Header{"Cost": {"6"}}, status: 200, want: map[string]string{"RateLimit": `"default";r=0;t=60`}},
				// Cost 0 takes nothing and reports the state.
				{header: http.Header{"Cost": {"0"}}, status: 200, want: map[string]string{"RateLimit": `"default";r=0;t=60`}},
			},
		},
		{
			name:    "legacy headers and a policy name that needs escaping",
			limiter: fixedWindow(3, 90*time.Second),
			opts: []Option{
				WithLegacyHeaders(), WithPolicyName(`per "ip" \ v1`), WithWindow(1500 * time.Millisecond),
			},
			steps: []step{
				{status: 200, want: map[string]string{
					"RateLimit-Policy":      `"per \"ip\" \\ v1";q=3;w=2`,
					"RateLimit":             `"per \"ip\" \\ v1";r=2;t=90`,
					"X-RateLimit-Limit":     "3",
					"X-RateLimit-Remaining": "2",
					"X-RateLimit-Reset":     strconv.FormatInt(redlimittest.Epoch.Unix()+90, 10),
				}},
				{advance: 100 * time.Millisecond, status: 200, want: map[string]string{
					"X-RateLimit-Remaining": "1",
					// 89.9s after Start+0.1s is Start+90s: not rounded past it.
					"X-RateLimit-Reset": strconv.FormatInt(redlimittest.Epoch.Unix()+90, 10),
				}},
			},
		},
		{
			name:    "custom denied handler sees the Result",
			limiter: fixedWindow(1, time.Second),
			opts: []Option{WithDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				res, found := ResultFromContext(r.Context())
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusTooManyRequests)
				io.WriteString(w, `{"found":`+strconv.FormatBool(found)+`,"retry_ms":`+strconv.FormatInt(res.RetryAfter.Milliseconds(), 10)+`}`)
			}))},
			steps: []step{
				{status: 200},
				{advance: 300 * time.Millisecond, status: 429, body: `{"found":true,"retry_ms":700}`, want: map[string]string{
					"Retry-After": "1", "Content-Type": "application/json",
				}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := redlimittest.New(t)
			l, err := tt.limiter(env)
			require.NoError(t, err)
			// These cases test decisions, not the decision timeout: its
			// 100ms default fails a request open (no headers) when a loaded
			// machine under -race is slower than that.
			h := Middleware(l, append([]Option{withNow(env.Now), WithTimeout(time.Minute)}, tt.opts...)...)(ok)
			eachTransport(t, h, func(t *testing.T, send sendFunc) {
				env.Set(redlimittest.Epoch)
				require.NoError(t, l.Reset(context.Background(), "192.0.2.1"))
				require.NoError(t, l.Reset(context.Background(), "127.0.0.1"))
				runSteps(t, env, send, tt.steps)
			})
		})
	}
}

func TestMiddlewareErrors(t *testing.T) {
	tests := []struct {
		name     string
		opts     []Option
		redisErr bool // make every Redis command fail
		steps    []step
		wantErr  error // what OnError is told, once per step
	}{
		{
			name:    "missing key header is the client's fault: 400, next not called",
			opts:    []Option{WithKeyFunc(Header("X-API-Key"))},
			steps:   []step{{status: 400, body: "missing rate limit key", want: map[string]string{"RateLimit": "", "RateLimit-Policy": ""}}},
			wantErr: ErrMissingKey,
		},
		{
			name:    "KeyFunc error is 500, next not called",
			opts:    []Option{WithKeyFunc(func(*http.Request) (string, error) { return "", errors.New("broken") })},
			steps:   []step{{status: 500, body: "Internal Server Error", want: map[string]string{"RateLimit": "", "RateLimit-Policy": ""}}},
			wantErr: ErrKey,
		},
		{
			name:    "empty key is 500",
			opts:    []Option{WithKeyFunc(func(*http.Request) (string, error) { return "", nil })},
			steps:   []step{{status: 500}},
			wantErr: ErrKey,
		},
		{
			name:    "negative cost is 500",
			opts:    []Option{WithCost(func(*http.Request) int { return -1 })},
			steps:   []step{{status: 500, want: map[string]string{"RateLimit": ""}}},
			wantErr: ErrCost,
		},
		{
			name:     "Redis failure fails open by default",
			redisErr: true,
			steps:    []step{{status: 200, body: "ok", want: map[string]string{"RateLimit": "", "RateLimit-Policy": "", "Test-Remaining": ""}}},
			wantErr:  ErrNoDecision,
		},
		{
			name:     "Redis failure fails closed with 503",
			opts:     []Option{WithFailClosed()},
			redisErr: true,
			steps:    []step{{status: 503, body: "rate limiter unavailable", want: map[string]string{"RateLimit": "", "Retry-After": ""}}},
			wantErr:  ErrNoDecision,
		},
		{
			name: "custom error handler",
			opts: []Option{WithFailClosed(), WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
				http.Error(w, "custom: "+strconv.FormatBool(errors.Is(err, ErrNoDecision)), http.StatusBadGateway)
			})},
			redisErr: true,
			steps:    []step{{status: 502, body: "custom: true"}},
			wantErr:  ErrNoDecision,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := redlimittest.New(t)
			var observed errorLog
			l, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options(redlimit.WithObserver(func(d redlimit.Decision) {
				observed.record(nil, d.Err)
			}))...)
			require.NoError(t, err)
			if tt.redisErr {
				env.Server().SetError("ERR injected by the test")
			}
			var told errorLog
			h := Middleware(l, append([]Option{WithOnError(told.record)}, tt.opts...)...)(ok)
			eachTransport(t, h, func(t *testing.T, send sendFunc) {
				runSteps(t, env, send, tt.steps)
				errs := told.take()
				require.Len(t, errs, len(tt.steps), "OnError calls: one per request")
				for _, err := range errs {
					assert.ErrorIs(t, err, tt.wantErr)
				}
				decisions := observed.take()
				if tt.redisErr {
					require.Len(t, decisions, len(tt.steps), "the limiter's observer sees every failed call")
					for _, err := range decisions {
						assert.ErrorContains(t, err, "injected by the test", "the observer sees the Redis error")
					}
					for _, err := range errs {
						assert.ErrorContains(t, err, "injected by the test", "OnError sees the Redis error, wrapped")
					}
				} else {
					assert.Empty(t, decisions, "requests without a key or cost never reach the limiter")
				}
			})
		})
	}
}

// A request whose context has ended (the client hung up, or chose a
// deadline that passed) is decided all the same: a client cannot fail the
// limit open, or skip it, with its own deadline.
func TestMiddlewareContextError(t *testing.T) {
	env := redlimittest.New(t)
	l, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options()...)
	require.NoError(t, err)
	var told errorLog
	h := Middleware(l, WithOnError(told.record))(ok)
	for i, want := range []int{200, 429, 429} {
		ctx, cancel := context.WithCancel(context.Background())
		if i%2 == 1 {
			ctx, cancel = context.WithTimeout(context.Background(), -time.Second)
		}
		cancel()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx))
		assert.Equal(t, want, rec.Code, "request %d, context %v", i, ctx.Err())
	}
	assert.Empty(t, told.take(), "every request was decided")
}

// Clients behind a trusted proxy share nothing: each is limited by the
// address the proxy reports, over a real connection from 127.0.0.1.
func TestMiddlewareTrustedProxy(t *testing.T) {
	env := redlimittest.New(t)
	l, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options()...)
	require.NoError(t, err)
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	h := Middleware(l, WithKeyFunc(ClientIP(loopback)))(ok)
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(xff string) int {
		req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
		require.NoError(t, err)
		if xff != "" {
			req.Header.Set("X-Forwarded-For", xff)
		}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, 200, get("198.51.100.1"), "first client")
	assert.Equal(t, 200, get("198.51.100.2"), "second client, its own limit")
	assert.Equal(t, 429, get("198.51.100.1"), "first client again")
	assert.Equal(t, 429, get("203.0.113.9, 198.51.100.1"), "a spoofed entry left of the proxy's is ignored")
	assert.Equal(t, 200, get(""), "the proxy itself, without the header")
}

func TestMiddlewarePanicsOnProgrammingErrors(t *testing.T) {
	env := redlimittest.New(t)
	l, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options()...)
	require.NoError(t, err)
	tests := []struct {
		name string
		call func()
		want string
	}{
		{"nil limiter", func() { Middleware(nil) }, "nil Limiter"},
		{"nil option", func() { Middleware(l, nil) }, "nil Option"},
		{"nil key func", func() { Middleware(l, WithKeyFunc(nil)) }, "WithKeyFunc(nil)"},
		{"nil cost", func() { Middleware(l, WithCost(nil)) }, "WithCost(nil)"},
		{"nil error handler", func() { Middleware(l, WithErrorHandler(nil)) }, "WithErrorHandler(nil)"},
		{"nil denied handler", func() { Middleware(l, WithDeniedHandler(nil)) }, "WithDeniedHandler(nil)"},
		{"negative window", func() { Middleware(l, WithWindow(-time.Second)) }, "negative window"},
		{"policy name not ASCII", func() { Middleware(l, WithPolicyName("grüße")) }, "printable ASCII"},
		{"quota unit with a newline", func() { Middleware(l, WithQuotaUnit("a\nb")) }, "must be requests, content-bytes or concurrent-requests"},
		{"quota unit not in the draft", func() { Middleware(l, WithQuotaUnit("bytes")) }, `WithQuotaUnit("bytes")`},
		{"negative timeout", func() { Middleware(l, WithTimeout(-time.Second)) }, "must be positive"},
		{"zero timeout", func() { Middleware(l, WithTimeout(0)) }, "must be positive"},
		{"typed nil limiter", func() { Middleware((*redlimit.TokenBucket)(nil)) }, "nil Limiter (*redlimit.TokenBucket)"},
		{"plans without choose", func() { Middleware(l, WithPlans(nil, Plan{Name: "free", Limiter: l})) }, "nil choose"},
		{"plan without limiter", func() { Middleware(l, WithPlans(func(*http.Request) string { return "" }, Plan{Name: "free"})) }, `plan "free": nil Limiter`},
		{"typed nil plan limiter", func() {
			Middleware(l, WithPlans(func(*http.Request) string { return "" }, Plan{Name: "free", Limiter: (*redlimit.FixedWindow)(nil)}))
		}, `plan "free": nil Limiter`},
		{"duplicate plan", func() {
			Middleware(l, WithPlans(func(*http.Request) string { return "" }, Plan{Name: "a", Limiter: l}, Plan{Name: "a", Limiter: l}))
		}, `plan name "a"`},
		{"plan name not ASCII", func() {
			Middleware(l, WithPlans(func(*http.Request) string { return "" }, Plan{Name: "grüße", Limiter: l}))
		}, "printable ASCII"},
		{"nil next handler", func() { Middleware(l)(nil) }, "nil next handler"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				r := recover()
				require.NotNil(t, r, "want a panic")
				assert.Contains(t, r, tt.want)
			}()
			tt.call()
		})
	}
}

func TestCeilSeconds(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want int64
	}{
		{-time.Second, 0}, {0, 0}, {time.Microsecond, 1}, {time.Second, 1},
		{time.Second + time.Microsecond, 2}, {90 * time.Second, 90},
		{time.Duration(1<<63 - 1), (1<<63-1)/int64(time.Second) + 1},
	} {
		assert.Equal(t, tt.want, ceilSeconds(tt.d), "ceilSeconds(%v)", tt.d)
	}
}

// withNow sets the clock of X-RateLimit-Reset, so that tests with a fake
// limiter clock get exact values.
func withNow(now func() time.Time) Option {
	return func(c *config) { c.now = now }
}

// slowLimiter blocks until the call's context ends, like a client waiting
// on a Redis that does not answer, and reports the context's deadline and
// how long it waited.
type slowLimiter struct {
	redlimit.Limiter
	deadline chan time.Time
	waited   chan time.Duration
}

func newSlowLimiter() slowLimiter {
	return slowLimiter{deadline: make(chan time.Time, 1), waited: make(chan time.Duration, 1)}
}

func (s slowLimiter) AllowN(ctx context.Context, key string, n int) (redlimit.Result, error) {
	start := time.Now()
	deadline, _ := ctx.Deadline()
	s.deadline <- deadline
	<-ctx.Done()
	s.waited <- time.Since(start)
	return redlimit.Result{}, ctx.Err()
}

// A Redis that does not answer holds a request no longer than the decision
// deadline, and the request's own deadline, shorter or already passed, plays
// no part: the limiter always gets the whole deadline. The limiter's context
// is checked by its deadline, which the middleware sets when it starts: how
// long the limiter then waits also counts the time before it was called
// (under -race, milliseconds), and cannot show the whole timeout.
func TestMiddlewareTimeout(t *testing.T) {
	tests := []struct {
		name     string
		opts     []Option
		deadline time.Duration // the request's own; 0 = none, < 0 = already passed
		want     time.Duration
	}{
		{name: "default 100ms", want: defaultTimeout},
		{name: "WithTimeout", opts: []Option{WithTimeout(30 * time.Millisecond)}, want: 30 * time.Millisecond},
		{name: "the request's shorter deadline is ignored", deadline: time.Microsecond, want: defaultTimeout},
		{name: "a deadline already passed is ignored", deadline: -time.Second, want: defaultTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newSlowLimiter()
			h := Middleware(l, append([]Option{WithFailClosed()}, tt.opts...)...)(ok)
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			if tt.deadline != 0 {
				ctx, cancel := context.WithTimeout(req.Context(), tt.deadline)
				defer cancel()
				req = req.WithContext(ctx)
			}
			begin := time.Now()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			end := time.Now()
			assert.Equal(t, 503, rec.Code)
			deadline := <-l.deadline
			// Set while ServeHTTP ran, the whole timeout from then.
			assert.False(t, deadline.Before(begin.Add(tt.want)), "the limiter gets the whole timeout: deadline %v after the request came", deadline.Sub(begin))
			assert.False(t, deadline.After(end.Add(tt.want)), "and no more: deadline %v after the request came", deadline.Sub(begin))
			// Generous: only a missing timeout (the test would hang) or a
			// much longer one must fail here, not a slow machine.
			waited := <-l.waited
			assert.Less(t, waited, tt.want+time.Second, "the limiter is cut off at the timeout")
			assert.GreaterOrEqual(t, waited, tt.want/2, "the limiter is not cut off by the request's deadline")
		})
	}
}

// unavailableError is what a limiter with an open circuit breaker returns:
// it knows how long it expects to stay unavailable.
type unavailableError struct{ cooldown time.Duration }

func (e unavailableError) Error() string             { return "unavailable" }
func (e unavailableError) Unwrap() error             { return redlimit.ErrUnavailable }
func (e unavailableError) RetryAfter() time.Duration { return e.cooldown }

type failingLimiter struct {
	redlimit.Limiter
	err error
}

func (f failingLimiter) AllowN(context.Context, string, int) (redlimit.Result, error) {
	return redlimit.Result{}, f.err
}

// Failing closed, the 503 says when to come back if the limiter knows.
func TestMiddlewareFailClosedRetryAfter(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		{"cooldown rounded up", fmt.Errorf("redlimit: token_bucket: %w", unavailableError{1500 * time.Millisecond}), "2"},
		{"no hint", errors.New("connection refused"), ""},
		{"zero hint", unavailableError{0}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := Middleware(failingLimiter{err: tt.err}, WithFailClosed())(ok)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			assert.Equal(t, 503, rec.Code)
			assert.Equal(t, tt.want, rec.Header().Get("Retry-After"))
		})
	}
	t.Run("failing open sets no Retry-After", func(t *testing.T) {
		h := Middleware(failingLimiter{err: unavailableError{time.Second}})(ok)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		assert.Equal(t, 200, rec.Code)
		assert.Empty(t, rec.Header().Get("Retry-After"))
	})
}

// Per-plan limits: each request is decided by its plan's limiter and
// carries its plan's policy.
func TestMiddlewarePlans(t *testing.T) {
	env := redlimittest.New(t)
	free, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options(redlimit.WithPrefix("free:"))...)
	require.NoError(t, err)
	paid, err := redlimit.NewFixedWindow(env.Client(), 3, time.Minute, env.Options(redlimit.WithPrefix("paid:"))...)
	require.NoError(t, err)
	h := Middleware(free,
		WithKeyFunc(Header("X-API-Key")),
		WithPlans(func(r *http.Request) string { return r.Header.Get("X-Plan") },
			Plan{Name: "free", Limiter: free, Window: time.Minute},
			Plan{Name: "paid", Limiter: paid, Window: time.Minute}),
	)(ok)
	hdr := func(key, plan string) http.Header {
		return http.Header{"X-Api-Key": {key}, "X-Plan": {plan}}
	}
	eachTransport(t, h, func(t *testing.T, send sendFunc) {
		env.Advance(time.Hour) // a fresh window for each transport
		runSteps(t, env, send, []step{
			{header: hdr("a", "free"), status: 200, want: map[string]string{"RateLimit-Policy": `"free";q=1;w=60`, "RateLimit": `"free";r=0;t=60`}},
			{header: hdr("a", "free"), status: 429, want: map[string]string{"RateLimit-Policy": `"free";q=1;w=60`}},
			{header: hdr("b", "paid"), status: 200, want: map[string]string{"RateLimit-Policy": `"paid";q=3;w=60`, "RateLimit": `"paid";r=2;t=60`}},
			{header: hdr("b", "paid"), status: 200, want: map[string]string{"RateLimit": `"paid";r=1;t=60`}},
			{header: hdr("c", "gold"), status: 500, want: map[string]string{"RateLimit": ""}},
		})
	})
}

// keyLimit refuses keys longer than 1024 bytes as the redlimit limiters do:
// ErrInvalidArgument, without a decision.
type keyLimit struct{ redlimit.Limiter }

func (k keyLimit) AllowN(ctx context.Context, key string, n int) (redlimit.Result, error) {
	if len(key) > 1024 {
		return redlimit.Result{}, fmt.Errorf("%w: key of %d bytes: at most 1024", redlimit.ErrInvalidArgument, len(key))
	}
	return k.Limiter.AllowN(ctx, key, n)
}

// A megabyte X-API-Key is the client's error: 400, with fail open or
// closed, never a request let through and never 500 or 503.
func TestMiddlewareLongKeyIsBadRequest(t *testing.T) {
	env := redlimittest.New(t)
	fw, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options()...)
	require.NoError(t, err)
	for _, failClosed := range []bool{false, true} {
		var told errorLog
		opts := []Option{WithKeyFunc(Header("X-API-Key")), WithOnError(told.record)}
		if failClosed {
			opts = append(opts, WithFailClosed())
		}
		h := Middleware(keyLimit{fw}, opts...)(ok)
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-API-Key", strings.Repeat("k", 1<<20))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		assert.Equal(t, http.StatusBadRequest, rec.Code, "fail closed %v: body %q", failClosed, rec.Body.String())
		errs := told.take()
		require.Len(t, errs, 1, "OnError is told")
		assert.ErrorIs(t, errs[0], redlimit.ErrInvalidArgument)
		assert.ErrorIs(t, errs[0], ErrKey)
	}
}
