// Package httplimit rate-limits HTTP handlers with any redlimit.Limiter.
//
// Middleware wraps a handler: for each request it finds a key (the client's
// IP address unless WithKeyFunc says otherwise) and a cost (1 unless
// WithCost says otherwise), asks the limiter for that many permits, and
// then:
//
//   - allowed: calls the next handler;
//   - denied: answers 429 Too Many Requests with Retry-After, in whole
//     seconds rounded up, and a short text body;
//   - denied for good, because the cost exceeds the limiter's capacity
//     (Result.RetryAfter == redlimit.Never): answers 413 Content Too Large
//     without Retry-After, since no wait would help and 429 invites a retry;
//   - no key (the KeyFunc failed) or a negative cost: answers 500 through the
//     ErrorHandler;
//   - no decision (Redis unreachable, too slow): calls the next handler
//     (fail open, the default) or answers 503 Service Unavailable through
//     the ErrorHandler (WithFailClosed). Either way the OnError callback is
//     told, and so is the limiter's observer (redlimit.WithObserver).
//
// Every response of a request the limiter decided on carries the
// RateLimit-Policy and RateLimit fields of the IETF draft
// draft-ietf-httpapi-ratelimit-headers, in structured-field syntax:
//
//	RateLimit-Policy: "default";q=100;w=60
//	RateLimit: "default";r=42;t=17
//
// q is Result.Limit, w the window in seconds (WithWindow; left out when not
// set), r is Result.Remaining and t is Result.ResetAfter in seconds, rounded
// up. WithLegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset. The headers are set before the next handler runs, so it
// may change or remove them.
//
// The package uses only the standard library and redlimit.
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redlimit/redlimit"
)

// Errors handed to the ErrorHandler and the OnError callback. Each wraps the
// underlying error too: errors.Is(err, context.DeadlineExceeded) works.
var (
	// ErrKey is matched when the KeyFunc failed or returned an empty key.
	ErrKey = errors.New("httplimit: no rate limit key for the request")
	// ErrCost is matched when the cost function returned a negative cost.
	ErrCost = errors.New("httplimit: bad request cost")
	// ErrNoDecision is matched when the limiter made no decision: Redis
	// unreachable or too slow, or the request's context ended.
	ErrNoDecision = errors.New("httplimit: rate limiter made no decision")
)

// KeyFunc returns the rate limit key of a request: requests with equal keys
// share one limit. An error, or an empty key, stops the request with a
// response from the ErrorHandler (500 by default); it never panics.
type KeyFunc func(r *http.Request) (string, error)

// ErrorHandler writes the response to a request that the middleware stops
// on an error. err matches ErrKey, ErrCost or ErrNoDecision (fail-closed
// only).
type ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)

// DefaultErrorHandler answers 503 Service Unavailable when err matches
// ErrNoDecision and 500 Internal Server Error otherwise, with a short text
// body that does not reveal err.
func DefaultErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, ErrNoDecision) {
		http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
		return
	}
	http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
}

// DefaultDeniedHandler writes the response to a denied request: 429 Too
// Many Requests, or 413 Content Too Large when the request's cost exceeds
// the limiter's capacity (Result.RetryAfter == redlimit.Never), with a short
// text body. The middleware has set the rate limit headers and Retry-After
// already.
func DefaultDeniedHandler(w http.ResponseWriter, r *http.Request) {
	res, _ := ResultFromContext(r.Context())
	if res.RetryAfter == redlimit.Never {
		http.Error(w, "request exceeds the rate limit", http.StatusRequestEntityTooLarge)
		return
	}
	http.Error(w, "rate limit exceeded, retry after "+w.Header().Get("Retry-After")+"s", http.StatusTooManyRequests)
}

// Option configures Middleware.
type Option func(*config)

type config struct {
	keyFunc       KeyFunc
	cost          func(*http.Request) int
	policyName    string
	quotaUnit     string
	windowSeconds int64 // 0: leave w out
	legacyHeaders bool
	failClosed    bool
	onError       func(*http.Request, error)
	errorHandler  ErrorHandler
	deniedHandler http.Handler
	now           func() time.Time // for X-RateLimit-Reset

	// Built once by Middleware: the quoted policy name, and what
	// RateLimit-Policy carries after q.
	quotedName   string
	policyParams string
}

// WithKeyFunc sets how a request's key is found. Default: ClientIP(), the
// address of the connection's peer (RemoteAddr), trusting no proxy header.
func WithKeyFunc(fn KeyFunc) Option {
	return func(c *config) { c.keyFunc = fn }
}

// WithCost sets how many permits a request takes, for limits by weight or
// size (say, max(r.ContentLength, 0) for an upload limit in bytes; an
// unknown length is -1). Default: 1.
// A cost of 0 takes nothing and is always allowed, but the response still
// carries the headers. A negative cost stops the request with the
// ErrorHandler (ErrCost). A cost above the limiter's capacity is denied
// with 413 (see DefaultDeniedHandler).
func WithCost(fn func(r *http.Request) int) Option {
	return func(c *config) { c.cost = fn }
}

// WithPolicyName sets the name of the policy in RateLimit-Policy and
// RateLimit. Default: "default". It must be printable ASCII (the
// structured-field string syntax); Middleware panics otherwise.
func WithPolicyName(name string) Option {
	return func(c *config) { c.policyName = name }
}

// WithWindow sets the w parameter of RateLimit-Policy: the window the
// quota applies to, in seconds, rounded up. Pass the limiter's window (a
// fixed or sliding window), or for a bucket the time it takes to refill
// from empty (capacity / rate). For a SlidingLog, whose q follows the
// binding strategy, leave it out. Default, and with 0: w is left out, as
// the draft allows, since a Limiter does not report its window. Middleware
// panics on a negative window.
func WithWindow(window time.Duration) Option {
	return func(c *config) {
		c.windowSeconds = ceilSeconds(window)
		if window < 0 {
			c.windowSeconds = -1
		}
	}
}

// WithQuotaUnit sets the qu parameter of RateLimit-Policy: "requests" (the
// draft's default, left out), "content-bytes" or "concurrent-requests".
// Default: left out. Use "content-bytes" with a cost in bytes.
func WithQuotaUnit(unit string) Option {
	return func(c *config) { c.quotaUnit = unit }
}

// WithLegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (a Unix time in seconds, rounded up, when the key is
// back to its full quota) to every decided response, for clients that
// predate the draft. Default: off.
func WithLegacyHeaders() Option {
	return func(c *config) { c.legacyHeaders = true }
}

// WithFailClosed makes a request the limiter could not decide on (Redis
// down or slow) fail with the ErrorHandler's response, 503 by default,
// instead of going through. Default: fail open.
func WithFailClosed() Option {
	return func(c *config) { c.failClosed = true }
}

// WithOnError sets a callback told of every error the middleware meets:
// KeyFunc failures, bad costs and limiter failures, whether the request then
// fails or, failing open, goes through. It runs on the request's goroutine
// and should be quick. Default: none (the limiter's observer still sees
// limiter failures).
func WithOnError(fn func(r *http.Request, err error)) Option {
	return func(c *config) { c.onError = fn }
}

// WithErrorHandler sets the ErrorHandler. Default: DefaultErrorHandler.
func WithErrorHandler(h ErrorHandler) Option {
	return func(c *config) { c.errorHandler = h }
}

// WithDeniedHandler sets the handler that answers denied requests, say with
// a JSON body. ResultFromContext(r.Context()) gives it the Result; the rate
// limit headers and Retry-After are already set. It should answer 429, or
// 413 when Result.RetryAfter == redlimit.Never. Default:
// DefaultDeniedHandler.
func WithDeniedHandler(h http.Handler) Option {
	return func(c *config) { c.deniedHandler = h }
}

type resultKey struct{}

// ResultFromContext returns the limiter's Result for the request whose
// context is ctx, as the next handler and the denied handler see it. ok is
// false when the middleware made no decision (failing open).
func ResultFromContext(ctx context.Context) (res redlimit.Result, ok bool) {
	res, ok = ctx.Value(resultKey{}).(redlimit.Result)
	return res, ok
}

// Middleware returns a middleware that rate-limits requests with l; see the
// package documentation for what it answers when. It panics, when called,
// if l or an option is nil or an option's value is invalid: these are
// programming errors, caught at start-up. Nothing a request carries makes it
// panic.
func Middleware(l redlimit.Limiter, opts ...Option) func(http.Handler) http.Handler {
	if l == nil {
		panic("httplimit: Middleware: nil Limiter")
	}
	c := config{
		keyFunc:       ClientIP(),
		cost:          func(*http.Request) int { return 1 },
		policyName:    "default",
		errorHandler:  DefaultErrorHandler,
		deniedHandler: http.HandlerFunc(DefaultDeniedHandler),
		now:           time.Now,
	}
	for _, opt := range opts {
		if opt == nil {
			panic("httplimit: Middleware: nil Option")
		}
		opt(&c)
	}
	switch {
	case c.keyFunc == nil:
		panic("httplimit: WithKeyFunc(nil)")
	case c.cost == nil:
		panic("httplimit: WithCost(nil)")
	case c.errorHandler == nil:
		panic("httplimit: WithErrorHandler(nil)")
	case c.deniedHandler == nil:
		panic("httplimit: WithDeniedHandler(nil)")
	case c.windowSeconds < 0:
		panic("httplimit: WithWindow: negative window")
	}
	var err error
	if c.quotedName, err = sfString(c.policyName); err != nil {
		panic(fmt.Sprintf("httplimit: WithPolicyName(%q): %v", c.policyName, err))
	}
	if c.quotaUnit != "" {
		unit, err := sfString(c.quotaUnit)
		if err != nil {
			panic(fmt.Sprintf("httplimit: WithQuotaUnit(%q): %v", c.quotaUnit, err))
		}
		c.policyParams += ";qu=" + unit
	}
	if c.windowSeconds > 0 {
		c.policyParams += ";w=" + strconv.FormatInt(c.windowSeconds, 10)
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("httplimit: Middleware: nil next handler")
		}
		return &handler{cfg: &c, limiter: l, next: next}
	}
}

type handler struct {
	cfg     *config
	limiter redlimit.Limiter
	next    http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := h.cfg
	key, err := c.keyFunc(r)
	if err == nil && key == "" {
		err = errors.New("empty key")
	}
	if err != nil {
		h.fail(w, r, fmt.Errorf("%w: %w", ErrKey, err))
		return
	}
	cost := c.cost(r)
	if cost < 0 {
		h.fail(w, r, fmt.Errorf("%w: %d is negative", ErrCost, cost))
		return
	}
	res, err := h.limiter.AllowN(r.Context(), key, cost)
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrNoDecision, err)
		if c.failClosed {
			h.fail(w, r, err)
			return
		}
		if c.onError != nil {
			c.onError(r, err)
		}
		h.next.ServeHTTP(w, r)
		return
	}
	c.setHeaders(w.Header(), res)
	r = r.WithContext(context.WithValue(r.Context(), resultKey{}, res))
	if res.Allowed {
		h.next.ServeHTTP(w, r)
		return
	}
	if res.RetryAfter != redlimit.Never {
		w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(res.RetryAfter), 10))
	}
	c.deniedHandler.ServeHTTP(w, r)
}

// fail stops the request on err.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	if h.cfg.onError != nil {
		h.cfg.onError(r, err)
	}
	h.cfg.errorHandler(w, r, err)
}

func (c *config) setHeaders(header http.Header, res redlimit.Result) {
	// q follows Result.Limit, which for a SlidingLog is the binding strategy's.
	header.Set("RateLimit-Policy", c.quotedName+";q="+strconv.Itoa(res.Limit)+c.policyParams)
	header.Set("RateLimit", c.quotedName+";r="+strconv.Itoa(res.Remaining)+";t="+strconv.FormatInt(ceilSeconds(res.ResetAfter), 10))
	if c.legacyHeaders {
		header.Set("X-RateLimit-Limit", strconv.Itoa(res.Limit))
		header.Set("X-RateLimit-Remaining", strconv.Itoa(res.Remaining))
		resetAt := c.now().Add(res.ResetAfter)
		unix := resetAt.Unix()
		if resetAt.After(time.Unix(unix, 0)) {
			unix++
		}
		header.Set("X-RateLimit-Reset", strconv.FormatInt(unix, 10))
	}
}

// ceilSeconds returns d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// sfString returns s as a structured-field string (RFC 8941 §3.3.3):
// printable ASCII in quotes, with \ and " escaped.
func sfString(s string) (string, error) {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch < 0x20 || ch > 0x7e {
			return "", fmt.Errorf("byte %#x at %d: must be printable ASCII", ch, i)
		}
		if ch == '"' || ch == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(ch)
	}
	b.WriteByte('"')
	return b.String(), nil
}
