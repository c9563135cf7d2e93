package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/nilcheck"
	"github.com/redlimit/redlimit/internal/shadow"
)

// ErrSkip is what a Part's Key returns (or wraps) when the part does not
// apply to a request: say, the tenant limit of a request that belongs to no
// tenant. The request is decided on the other parts; when every part
// skips, it goes through undecided, with no rate limit headers. Any other
// error from a Key stops the request as a KeyFunc's error does.
var ErrSkip = errors.New("httplimit: the part does not apply to the request")

// Part is one limit of MiddlewareAll: a limiter, how a request's key for
// it is found, and the policy its responses advertise.
type Part struct {
	// Name is the part's policy name in RateLimit-Policy and RateLimit
	// ("user", "tenant"): printable ASCII, one per part.
	Name string
	// Limiter decides the part: any redlimit.Limiter, a
	// redlimit.Concurrency too, whose lease the request holds until its
	// handler ends.
	Limiter redlimit.Limiter
	// Key returns the request's key for this part, or ErrSkip when the
	// part does not apply to the request. Default: ClientIP(), as
	// Middleware's.
	Key KeyFunc
	// Window is the part's w in RateLimit-Policy (see WithWindow); 0, the
	// default, is the limiter's own.
	Window time.Duration
}

// MiddlewareAll returns a middleware that decides each request on every
// part at once, with redlimit.AllowAll: it is granted only if every part
// grants, and a denied request has taken nothing from any part ("100 a
// minute per user, 10,000 a day per tenant, 2 in flight per user", each
// part with its own key). Two Middlewares nested one in the other decide
// one after the other, in two round trips; MiddlewareAll's parts go in
// one.
//
// Every part is charged the request's cost (WithCost), a Concurrency part
// too: keep a budget by size in a Middleware of its own. The headers list
// the policy of every part that applies (RateLimit-Policy, q from the
// limiter's first strategy for a part the Result does not describe; a
// part whose limiter reports no Strategies only when it does), and
// RateLimit reports one part: on a denial the part that denied (of
// several, the one with the longest RetryAfter, which Retry-After
// follows), else the part with the fewest permits left.
// ResultFromContext's and OnDenied's Result.Part is that part's index in
// parts. A denial stands when giving back what other parts took fails
// (they stay taken until they lapse; OnError hears of it, ErrRefund).
// WithRefundIf and Settle give back to every part at once, and a
// Concurrency part's lease is released when the handler ends while the
// other parts' permits stay counted; WithKeepAlive renews it.
//
// The options are Middleware's, but WithKeyFunc, WithPolicyName and
// WithWindow, which a Part sets, and WithPlans panic. A Key error, an
// empty key or a key a limiter refuses is answered as Middleware answers
// it; nothing is taken from any part then. It panics, when called, on no
// parts, a nil Limiter, an empty, repeated or non-ASCII Name, a negative
// Window, or a nil or invalid option.
func MiddlewareAll(parts []Part, opts ...Option) func(http.Handler) http.Handler {
	c := newConfig("MiddlewareAll", nil, "", opts)
	switch {
	case len(parts) == 0:
		panic("httplimit: MiddlewareAll: no parts")
	case c.keyFunc != nil:
		panic("httplimit: MiddlewareAll: WithKeyFunc: set each Part's Key instead")
	case c.policyName != "":
		panic("httplimit: MiddlewareAll: WithPolicyName: set each Part's Name instead")
	case c.windowSeconds != 0:
		panic("httplimit: MiddlewareAll: WithWindow: set each Part's Window instead")
	case c.plans != nil || c.choose != nil:
		panic("httplimit: MiddlewareAll: WithPlans: not with parts")
	}
	h := &handler{cfg: &c, all: true}
	names := make(map[string]bool, len(parts))
	for _, p := range parts {
		switch {
		case p.Name == "" || names[p.Name]:
			panic(fmt.Sprintf("httplimit: MiddlewareAll: part name %q: empty or used twice", p.Name))
		case nilcheck.IsNil(p.Limiter):
			panic(fmt.Sprintf("httplimit: MiddlewareAll: part %q: nil Limiter (%T)", p.Name, p.Limiter))
		case p.Window < 0:
			panic(fmt.Sprintf("httplimit: MiddlewareAll: part %q: negative window", p.Name))
		}
		names[p.Name] = true
		pol := c.newPolicy(p.Name, p.Limiter, ceilSeconds(p.Window))
		pol.key = p.Key
		if pol.key == nil {
			pol.key = ClientIP()
		}
		h.policies = append(h.policies, pol)
	}
	return h.wrap
}

// serveAll is ServeHTTP for MiddlewareAll: it finds each part's key, and
// decides the parts that apply with one AllowAll.
func (h *handler) serveAll(w http.ResponseWriter, r *http.Request) {
	c := h.cfg
	parts := make([]redlimit.Part, 0, len(h.policies))
	decided := make([]int, 0, len(h.policies))
	for i := range h.policies {
		p := &h.policies[i]
		key, err := p.key(r)
		if errors.Is(err, ErrSkip) {
			continue
		}
		if err == nil && key == "" {
			err = errors.New("empty key")
		}
		if err != nil {
			h.fail(w, r, fmt.Errorf("%w: part %s: %w", ErrKey, p.quotedName, err))
			return
		}
		parts = append(parts, redlimit.Part{Limiter: p.limiter, Key: key})
		decided = append(decided, i)
	}
	cost := c.cost(r)
	if cost < 0 {
		h.fail(w, r, fmt.Errorf("%w: %d is negative", ErrCost, cost))
		return
	}
	tellServer(w, r)
	if len(parts) == 0 {
		h.next.ServeHTTP(w, r) // no limit applies
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), c.timeout)
	defer cancel()
	if c.shadow {
		ctx = shadow.With(ctx)
	}
	res, err := redlimit.AllowAll(ctx, cost, parts...)
	if err != nil && res != (redlimit.Result{}) {
		// Denied, and giving back what the other parts took failed: they
		// stay taken until they lapse, stricter; the denial stands.
		h.tell(r, fmt.Errorf("%w: %w", ErrRefund, err))
		err = nil
	}
	if err == nil {
		res.Part = decided[res.Part]
	}
	h.answer(w, r, res, err, nil, decided)
}

// setAllHeaders adds the policy of every part decided to RateLimit-Policy,
// and the part res describes to RateLimit (and to the legacy headers).
func (h *handler) setAllHeaders(header http.Header, res redlimit.Result, decided []int) {
	for _, i := range decided {
		p := &h.policies[i]
		switch {
		case i == res.Part:
			appendListMember(header, "RateLimit-Policy", p.policyItem(res.Limit))
		case p.limit > 0:
			appendListMember(header, "RateLimit-Policy", p.policyItem(p.limit))
		}
	}
	h.policies[res.Part].setRateLimit(header, res, h.cfg)
}
