package httplimit

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/leases"
)

// leaser is a limiter whose grants are leases (redlimit.NewConcurrency,
// inmem.NewConcurrency): the middleware holds a request's leases for its
// whole life and releases them when its handler returns, panics, or the
// client goes away (the handler then returns, its context done).
type leaser interface {
	ExtendGrant(ctx context.Context, g redlimit.Grant) (redlimit.Result, error)
}

// WithKeepAlive extends a request's lease every interval while its
// handler runs, for a limiter whose grants are leases (a
// redlimit.Concurrency, alone or a MiddlewareAll part): a request longer
// than the lease period then keeps its place, and one whose process dies
// loses it within a lease period.
// Default: no renewal, so a request that outlives its lease loses its
// place to the next one; choose a lease longer than the longest request,
// or an interval well below the lease (a third of it, say). A failed
// renewal is told to OnError. Middleware panics on an interval that is not
// positive.
func WithKeepAlive(interval time.Duration) Option {
	return func(c *config) {
		c.keepAlive = interval
		if interval <= 0 {
			c.keepAlive = -1
		}
	}
}

// extendFunc renews the leases g holds, as Concurrency.ExtendGrant does:
// the Result's Grant, when not zero, names them from then on.
type extendFunc func(ctx context.Context, g redlimit.Grant) (redlimit.Result, error)

// extendParts returns the extendFunc of a MiddlewareAll grant of the parts
// decided (indexes in h.policies, in AllowAll's order).
func (h *handler) extendParts(decided []int) extendFunc {
	limiters := make([]redlimit.Limiter, len(decided))
	for j, i := range decided {
		limiters[j] = h.policies[i].limiter
	}
	return func(ctx context.Context, g redlimit.Grant) (redlimit.Result, error) {
		return leases.ExtendGroup(ctx, g, limiters)
	}
}

// holding is a request's grant whose leases keepAlive renews until stop.
type holding struct {
	mu       sync.Mutex
	grant    redlimit.Grant
	timer    *time.Timer
	released bool
}

// hold starts renewing the leases of g with extend every keepAlive
// interval, until stop.
func (h *handler) hold(r *http.Request, extend extendFunc, g redlimit.Grant) *holding {
	hd := &holding{grant: g}
	if every := h.cfg.keepAlive; every > 0 {
		renew := func() {
			hd.mu.Lock()
			defer hd.mu.Unlock()
			if hd.released {
				return
			}
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.cfg.timeout)
			res, err := extend(ctx, hd.grant)
			cancel()
			switch {
			case err != nil:
				h.tell(r, fmt.Errorf("httplimit: keeping the request's lease: %w", err))
			case !res.Allowed:
				h.tell(r, fmt.Errorf("httplimit: keeping the request's lease: it lapsed and its place was taken"))
				return
			case res.Grant.N() > 0:
				hd.grant = res.Grant
			}
			hd.timer.Reset(every)
		}
		// Set under the lock that renew takes first: the timer may fire
		// before AfterFunc returns.
		hd.mu.Lock()
		hd.timer = time.AfterFunc(every, renew)
		hd.mu.Unlock()
	}
	return hd
}

// stop ends the renewals and returns the grant as last renewed.
func (hd *holding) stop() redlimit.Grant {
	hd.mu.Lock()
	defer hd.mu.Unlock()
	hd.released = true
	if hd.timer != nil {
		hd.timer.Stop()
	}
	return hd.grant
}
