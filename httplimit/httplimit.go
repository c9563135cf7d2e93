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
	"github.com/redlimit/redlimit/internal/nilcheck"
	"github.com/redlimit/redlimit/internal/shadow"
)

// Errors handed to the ErrorHandler and the OnError callback. Each wraps the
// underlying error too: errors.Is(err, context.DeadlineExceeded) works.
var (
	// ErrKey is matched when the KeyFunc failed or returned an empty key, or
	// the limiter refused the key (redlimit.ErrInvalidArgument: a key longer
	// than 1024 bytes); DefaultErrorHandler answers 400 to the latter.
	ErrKey = errors.New("httplimit: no rate limit key for the request")
	// ErrCost is matched when the cost function returned a negative cost.
	ErrCost = errors.New("httplimit: bad request cost")
	// ErrNoDecision is matched when the limiter made no decision: Redis
	// unreachable or too slow, or the request's context ended.
	ErrNoDecision = errors.New("httplimit: rate limiter made no decision")
	// ErrPlan is matched when WithPlans' choose names no plan.
	ErrPlan = errors.New("httplimit: no such plan")
	// ErrNotEnforced is matched, in shadow mode (WithShadow), by every
	// error the OnError callback is told of: the request went through.
	ErrNotEnforced = errors.New("httplimit: shadow mode, not enforced")
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
// ErrNoDecision, 400 Bad Request when it matches ErrMissingKey (the client
// sent no key: 400 rather than 401, since the middleware does not
// authenticate) or redlimit.ErrInvalidArgument (the limiter refused the
// key the request carried: longer than 1024 bytes), and 500 Internal Server Error otherwise, with a short text
// body that does not reveal err.
func DefaultErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, ErrNoDecision):
		http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
		return
	case errors.Is(err, ErrMissingKey):
		http.Error(w, "missing rate limit key", http.StatusBadRequest)
		return
	case errors.Is(err, redlimit.ErrInvalidArgument):
		http.Error(w, "invalid rate limit key", http.StatusBadRequest)
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
	windowSeconds int64 // 0: the limiter's own (see windows)
	legacyHeaders bool
	failClosed    bool
	onError       func(*http.Request, error)
	onDenied      func(r *http.Request, res redlimit.Result, enforced bool)
	shadow        bool
	errorHandler  ErrorHandler
	deniedHandler http.Handler
	timeout       time.Duration
	choose        func(*http.Request) string
	plans         []Plan
	now           func() time.Time // for X-RateLimit-Reset
	refundIf      func(r *http.Request, status int) bool
	keepAlive     time.Duration // WithKeepAlive's; -1: invalid
}

// WithKeyFunc sets how a request's key is found. Default: ClientIP(), the
// address of the connection's peer (RemoteAddr), trusting no proxy header.
func WithKeyFunc(fn KeyFunc) Option {
	return func(c *config) { c.keyFunc = fn }
}

// WithCost sets how many permits a request takes, for limits by weight or
// size. For an upload limit in bytes use BodyCost, which also charges a
// body of unknown length (chunked, ContentLength -1) and cuts it there: a
// cost of max(r.ContentLength, 0) would let chunked uploads through free.
// For a cost known only at the end, take the most it can be and Settle
// the rest. Default: 1.
// A cost of 0 takes nothing and is always allowed, but the response still
// carries the headers. A negative cost stops the request with the
// ErrorHandler (ErrCost). A cost above the limiter's capacity is denied
// with 413 (see DefaultDeniedHandler).
func WithCost(fn func(r *http.Request) int) Option {
	return func(c *config) { c.cost = fn }
}

// WithPolicyName sets the name of the policy in RateLimit-Policy and
// RateLimit. Default: "default". Give each of several middlewares on one
// route its own name: each adds its policy to the lists, and a client tells
// them apart by name. It must be printable ASCII (the
// structured-field string syntax); Middleware panics otherwise.
func WithPolicyName(name string) Option {
	return func(c *config) { c.policyName = name }
}

// WithWindow sets the w parameter of RateLimit-Policy: the window the
// quota applies to, in seconds, rounded up. Default, and with 0: the
// limiter's own, from its Strategies method (every limiter of package
// redlimit has one, and inmem's SlidingLog): a fixed or sliding window's
// window, a bucket's time to refill or drain completely (capacity / rate),
// and for a SlidingLog the window of the strategy that q (Result.Limit)
// names. w is left out, as the draft allows, for a limiter that does not
// report its strategies, and for a Result whose limit none of them has (a
// SlidingLog's fallback share). Give WithWindow only to advertise another
// window than the limiter's. Middleware panics on a negative window.
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
// Default: left out. Use "content-bytes" with a cost in bytes. Middleware
// panics on any other unit.
func WithQuotaUnit(unit string) Option {
	return func(c *config) { c.quotaUnit = unit }
}

// WithLegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (a Unix time in seconds, rounded up, when the key is
// back to its full quota) to every decided response, for clients that
// predate the draft. With several middlewares on a route they describe
// one limit: on a 429, the one that denied; else the one with the fewest
// permits left, and of equals the one that resets last. Default: off.
func WithLegacyHeaders() Option {
	return func(c *config) { c.legacyHeaders = true }
}

// WithFailClosed makes a request the limiter could not decide on (Redis
// down or slow) fail with the ErrorHandler's response, 503 by default,
// instead of going through. Default: fail open.
func WithFailClosed() Option {
	return func(c *config) { c.failClosed = true }
}

// WithTimeout sets the decision deadline: the longest a request waits for
// the limiter, after which it is treated as undecided (fail open, or 503
// with WithFailClosed). The limiter runs under this deadline alone, on a
// context that keeps the request's values but not its deadline or
// cancellation: a deadline the client chose (a server that passes one
// down, a client that hangs up) never cuts a decision short, so it can
// neither skip the limit by failing it open nor make a healthy Redis look
// failed to the limiter's circuit breaker. Default: 100ms, far above a
// healthy round trip to Redis (well under 1ms on a LAN, a few ms across
// zones) and short enough that an outage adds at most a tenth of a second
// to a request. Middleware panics on a timeout that is not positive.
func WithTimeout(d time.Duration) Option {
	return func(c *config) { c.timeout = d }
}

// Plan is one limit of WithPlans: a limiter, and the policy its responses
// advertise.
type Plan struct {
	// Name is the policy's name in RateLimit-Policy and RateLimit, and
	// what WithPlans' choose returns to pick this plan. Printable ASCII.
	Name string
	// Limiter decides the plan's requests.
	Limiter redlimit.Limiter
	// Window is the plan's w in RateLimit-Policy (see WithWindow); 0,
	// the default, is the limiter's own.
	Window time.Duration
}

// WithPlans decides each request with the limiter of the plan that choose
// names (say, "free" or "paid" from the authenticated account), each plan
// with its own policy headers. The limiter given to Middleware is then not
// used. A name that matches no plan stops the request through the
// ErrorHandler with ErrPlan (500 by default): choose is your code.
// Middleware panics on an empty or duplicate plan name, a nil limiter or a
// nil choose.
func WithPlans(choose func(r *http.Request) string, plans ...Plan) Option {
	return func(c *config) { c.choose, c.plans = choose, plans }
}

// WithOnError sets a callback told of every error the middleware meets:
// KeyFunc failures, bad costs and limiter failures, whether the request then
// fails or, failing open, goes through. It runs on the request's goroutine
// and should be quick. Default: none (the limiter's observer still sees
// limiter failures).
func WithOnError(fn func(r *http.Request, err error)) Option {
	return func(c *config) { c.onError = fn }
}

// WithOnDenied sets a callback told of every denial, with the Result:
// enforced is true when the request is then answered by the denied
// handler, false in shadow mode (WithShadow), where it goes through. It
// runs on the request's goroutine before the response is written, and
// should be quick. Default: none (the limiter's observer still sees every
// decision).
func WithOnDenied(fn func(r *http.Request, res redlimit.Result, enforced bool)) Option {
	return func(c *config) { c.onDenied = fn }
}

// WithShadow turns on shadow mode, to roll out a new limit safely: every
// request is decided and counted as usual (the permits are taken, the
// limiter's observer sees the decision, with Decision.Shadow set), but
// none is ever stopped. A denial is told to the OnDenied callback with
// enforced false; an error (no key, a bad cost, no decision) is told to
// OnError, matching ErrNotEnforced, and the request goes through whatever
// WithFailClosed says. Responses carry no rate limit headers, so clients
// see no change; the next handler still finds the Result with
// ResultFromContext. Watch the share of shadow decisions that were denied
// (observer: Shadow && !Result.Allowed), per key and route, before turning
// enforcement on: it is the traffic the limit will refuse. Default: off.
func WithShadow() Option {
	return func(c *config) { c.shadow = true }
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
	if nilcheck.IsNil(l) {
		panic(fmt.Sprintf("httplimit: Middleware: nil Limiter (%T): check the error of its constructor", l))
	}
	c := newConfig("Middleware", ClientIP(), "default", opts)
	if c.keyFunc == nil {
		panic("httplimit: WithKeyFunc(nil)")
	}
	h := &handler{cfg: &c}
	if c.choose == nil {
		h.policies = []policy{c.newPolicy(c.policyName, l, c.windowSeconds)}
	} else {
		h.byName = make(map[string]int, len(c.plans))
		for _, p := range c.plans {
			if _, dup := h.byName[p.Name]; dup || p.Name == "" {
				panic(fmt.Sprintf("httplimit: WithPlans: plan name %q: empty or used twice", p.Name))
			}
			if nilcheck.IsNil(p.Limiter) {
				panic(fmt.Sprintf("httplimit: WithPlans: plan %q: nil Limiter (%T)", p.Name, p.Limiter))
			}
			if p.Window < 0 {
				panic(fmt.Sprintf("httplimit: WithPlans: plan %q: negative window", p.Name))
			}
			h.byName[p.Name] = len(h.policies)
			h.policies = append(h.policies, c.newPolicy(p.Name, p.Limiter, ceilSeconds(p.Window)))
		}
	}
	return h.wrap
}

// newConfig applies opts to the defaults, with keyFunc and policyName as
// given, and panics on an invalid option.
func newConfig(caller string, keyFunc KeyFunc, policyName string, opts []Option) config {
	c := config{
		timeout:       defaultTimeout,
		keyFunc:       keyFunc,
		cost:          func(*http.Request) int { return 1 },
		policyName:    policyName,
		errorHandler:  DefaultErrorHandler,
		deniedHandler: http.HandlerFunc(DefaultDeniedHandler),
		now:           time.Now,
	}
	for _, opt := range opts {
		if opt == nil {
			panic("httplimit: " + caller + ": nil Option")
		}
		opt(&c)
	}
	switch {
	case c.cost == nil:
		panic("httplimit: WithCost(nil)")
	case c.errorHandler == nil:
		panic("httplimit: WithErrorHandler(nil)")
	case c.deniedHandler == nil:
		panic("httplimit: WithDeniedHandler(nil)")
	case c.windowSeconds < 0:
		panic("httplimit: WithWindow: negative window")
	case c.timeout <= 0:
		panic(fmt.Sprintf("httplimit: WithTimeout(%v): must be positive", c.timeout))
	case c.plans != nil && c.choose == nil:
		panic("httplimit: WithPlans: nil choose")
	case c.keepAlive < 0:
		panic("httplimit: WithKeepAlive: the interval must be positive")
	}
	switch c.quotaUnit {
	case "", "requests", "content-bytes", "concurrent-requests":
	default:
		panic(fmt.Sprintf("httplimit: WithQuotaUnit(%q): must be requests, content-bytes or concurrent-requests", c.quotaUnit))
	}
	return c
}

// wrap returns a copy of h that calls next.
func (h *handler) wrap(next http.Handler) http.Handler {
	if next == nil {
		panic("httplimit: Middleware: nil next handler")
	}
	hh := *h
	hh.next = next
	return &hh
}

// defaultTimeout is WithTimeout's default.
const defaultTimeout = 100 * time.Millisecond

// policy is a limiter with the header text it advertises, built once.
type policy struct {
	limiter    redlimit.Limiter
	quotedName string
	params     string // what RateLimit-Policy carries after q: qu, a given w
	// windows are the limiter's own w parameters, by limit, when no
	// window was given and the limiter reports its strategies.
	windows []limitWindow
	// limit is the q of its first strategy (0: it reports none), for
	// MiddlewareAll's parts that a Result does not describe.
	limit int
	key   KeyFunc // MiddlewareAll's part's
	lease bool    // the limiter's grants are leases
}

// limitWindow is the w parameter of a limit of the limiter.
type limitWindow struct {
	limit int
	param string // ";w=<seconds>"
}

// newPolicy checks a policy's name and builds its header text; it panics on
// a name that is not printable ASCII.
func (c *config) newPolicy(name string, l redlimit.Limiter, windowSeconds int64) policy {
	quoted, err := sfString(name)
	if err != nil {
		panic(fmt.Sprintf("httplimit: policy name %q: %v", name, err))
	}
	p := policy{limiter: l, quotedName: quoted}
	_, p.lease = l.(leaser)
	unit := c.quotaUnit
	if p.lease && unit == "" {
		unit = "concurrent-requests" // what a lease counts
	}
	if unit != "" {
		p.params += `;qu="` + unit + `"`
	}
	if windowSeconds > 0 {
		p.params += ";w=" + strconv.FormatInt(windowSeconds, 10)
	}
	if l, ok := l.(interface{ Strategies() []redlimit.Strategy }); ok {
		for i, s := range l.Strategies() {
			if i == 0 {
				p.limit = s.Limit
			}
			if w := ceilSeconds(s.Window); w > 0 && windowSeconds == 0 {
				p.windows = append(p.windows, limitWindow{s.Limit, ";w=" + strconv.FormatInt(w, 10)})
			}
		}
	}
	return p
}

// leaser returns p's limiter when its grants are leases; nothing for a nil
// p (MiddlewareAll's).
func (p *policy) leaser() (leaser, bool) {
	if p == nil || !p.lease {
		return nil, false
	}
	l, ok := p.limiter.(leaser)
	return l, ok
}

// windowParam returns the w parameter of a Result of limit limit, when the
// limiter tells it: the window of its strategy of that limit, or of its
// only strategy (a fallback's share keeps the window).
func (p *policy) windowParam(limit int) string {
	if len(p.windows) == 1 {
		return p.windows[0].param
	}
	for _, w := range p.windows {
		if w.limit == limit {
			return w.param
		}
	}
	return ""
}

type handler struct {
	cfg      *config
	policies []policy       // one, one per plan, or one per part
	byName   map[string]int // plan name -> index in policies; nil without plans
	all      bool           // MiddlewareAll's: policies are its parts
	next     http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.all {
		h.serveAll(w, r)
		return
	}
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
	tellServer(w, r)
	p := &h.policies[0]
	if h.byName != nil {
		name := c.choose(r)
		i, ok := h.byName[name]
		if !ok {
			h.fail(w, r, fmt.Errorf("%w: %q", ErrPlan, boundQuote(name)))
			return
		}
		p = &h.policies[i]
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), c.timeout)
	defer cancel()
	if c.shadow {
		ctx = shadow.With(ctx)
	}
	res, err := p.limiter.AllowN(ctx, key, cost)
	h.answer(w, r, res, err, p, nil)
}

// answer answers a request decided with res, or not decided (err): by p,
// or by MiddlewareAll's parts decided (indexes in h.policies, in the order
// AllowAll had them; res.Part is one of them).
func (h *handler) answer(w http.ResponseWriter, r *http.Request, res redlimit.Result, err error, p *policy, decided []int) {
	c := h.cfg
	if errors.Is(err, redlimit.ErrInvalidArgument) {
		// A key the limiter refuses (longer than 1024 bytes, say) is the
		// client's input: never a reason to fail open.
		h.fail(w, r, fmt.Errorf("%w: %w", ErrKey, err))
		return
	}
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrNoDecision, err)
		if c.failClosed && !c.shadow {
			if wait, ok := redlimit.RetryAfter(err); ok && wait > 0 {
				w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(wait), 10))
			}
			h.fail(w, r, err)
			return
		}
		h.tell(r, err)
		h.next.ServeHTTP(w, r)
		return
	}
	rctx := context.WithValue(r.Context(), resultKey{}, res)
	f, _ := rctx.Value(flightKey{}).(*flight)
	if f == nil {
		f = &flight{}
		rctx = context.WithValue(rctx, flightKey{}, f)
	}
	r = r.WithContext(rctx)
	if !c.shadow {
		if p != nil {
			p.setHeaders(w.Header(), res, c)
		} else {
			h.setAllHeaders(w.Header(), res, decided)
		}
	}
	if res.Allowed || c.shadow {
		if !res.Allowed && c.onDenied != nil {
			c.onDenied(r, res, false)
		}
		if res.Grant.N() == 0 {
			h.next.ServeHTTP(w, r)
			return
		}
		ch := &charge{grant: res.Grant, timeout: c.timeout}
		if l, ok := p.leaser(); ok {
			ch.lease = true
			if c.keepAlive > 0 {
				ch.extend = l.ExtendGrant
			}
		}
		for _, i := range decided {
			ch.inFlight = ch.inFlight || h.policies[i].lease
		}
		if ch.inFlight && c.keepAlive > 0 {
			ch.extend = h.extendParts(decided)
		}
		f.innermost = ch
		h.serveCharged(w, r, f, ch)
		return
	}
	// The middlewares around this one granted the request: they give
	// their permits back (serveCharged).
	f.denied = true
	if c.onDenied != nil {
		c.onDenied(r, res, true)
	}
	if res.RetryAfter != redlimit.Never {
		w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(res.RetryAfter), 10))
	}
	c.deniedHandler.ServeHTTP(w, r)
}

// fail stops the request on err; in shadow mode it lets it through.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	h.tell(r, err)
	if h.cfg.shadow {
		h.next.ServeHTTP(w, r)
		return
	}
	h.cfg.errorHandler(w, r, err)
}

// tell hands err to the OnError callback, marked ErrNotEnforced in shadow
// mode.
func (h *handler) tell(r *http.Request, err error) {
	if h.cfg.onError == nil {
		return
	}
	if h.cfg.shadow {
		err = fmt.Errorf("%w: %w", ErrNotEnforced, err)
	}
	h.cfg.onError(r, err)
}

// setHeaders adds the policy to the RateLimit-Policy and RateLimit lists,
// after what an outer middleware put there, so that a client sees every
// limit on the route. The legacy headers, single values, show the limit a
// client must wait for: on a denial, this one (an outer one allowed);
// else the one with the fewest permits left, and of equals the one that
// resets last.
func (p *policy) setHeaders(header http.Header, res redlimit.Result, c *config) {
	// q follows Result.Limit, which for a SlidingLog is the binding strategy's.
	appendListMember(header, "RateLimit-Policy", p.policyItem(res.Limit))
	p.setRateLimit(header, res, c)
}

// policyItem returns the policy's member of RateLimit-Policy, for a limit
// of q.
func (p *policy) policyItem(q int) string {
	return p.quotedName + ";q=" + strconv.Itoa(q) + p.params + p.windowParam(q)
}

// setRateLimit adds res to the RateLimit list, and sets the legacy headers
// to it when they are on and it binds longer than what they hold.
func (p *policy) setRateLimit(header http.Header, res redlimit.Result, c *config) {
	appendListMember(header, "RateLimit", p.quotedName+";r="+strconv.Itoa(res.Remaining)+";t="+strconv.FormatInt(ceilSeconds(res.ResetAfter), 10))
	if !c.legacyHeaders {
		return
	}
	resetAt := c.now().Add(res.ResetAfter)
	reset := resetAt.Unix()
	if resetAt.After(time.Unix(reset, 0)) {
		reset++
	}
	if prev, err := strconv.Atoi(header.Get("X-RateLimit-Remaining")); err == nil && res.Allowed {
		prevReset, _ := strconv.ParseInt(header.Get("X-RateLimit-Reset"), 10, 64)
		if prev < res.Remaining || prev == res.Remaining && prevReset >= reset {
			return // an outer limit binds longer
		}
	}
	header.Set("X-RateLimit-Limit", strconv.Itoa(res.Limit))
	header.Set("X-RateLimit-Remaining", strconv.Itoa(res.Remaining))
	header.Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
}

// appendListMember adds member to the structured-field list in header
// name, on its one line.
func appendListMember(header http.Header, name, member string) {
	if prev := header.Get(name); prev != "" {
		member = prev + ", " + member
	}
	header.Set(name, member)
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
