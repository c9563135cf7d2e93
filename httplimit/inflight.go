package httplimit

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/redlimit/redlimit"
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
// redlimit.Concurrency): a request longer than the lease period then keeps
// its place, and one whose process dies loses it within a lease period.
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

// holding is a request's lease, renewed by keepAlive until release.
type holding struct {
	mu       sync.Mutex
	grant    redlimit.Grant
	timer    *time.Timer
	released bool
}

// hold starts renewing ch's lease every interval (none when interval is 0)
// and returns what release ends.
func (h *handler) hold(r *http.Request, l leaser, ch *charge) *holding {
	hd := &holding{grant: ch.grant}
	if every := h.cfg.keepAlive; every > 0 {
		renew := func() {
			hd.mu.Lock()
			defer hd.mu.Unlock()
			if hd.released {
				return
			}
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.cfg.timeout)
			res, err := l.ExtendGrant(ctx, hd.grant)
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

// release ends the holding and releases its lease.
func (hd *holding) release(h *handler, r *http.Request) {
	hd.mu.Lock()
	hd.released = true
	if hd.timer != nil {
		hd.timer.Stop()
	}
	g := hd.grant
	hd.mu.Unlock()
	h.refund(r, g, g.N())
}
