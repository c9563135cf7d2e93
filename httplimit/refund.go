package httplimit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/redlimit/redlimit"
)

// ErrRefund is matched by the error the OnError callback is told of when
// giving back what a request took failed (Redis unreachable, say): the
// permits stay used, which is stricter, never looser.
var ErrRefund = errors.New("httplimit: refund failed")

// WithRefundIf gives back everything a request took when refund says its
// response should not count: say, a 5xx, where the failure was the
// server's and not the client's (func(_ *http.Request, status int) bool {
// return status >= 500 }). status is the one the handler wrote (200 when
// it wrote a body first, or nothing at all); a handler that panics counts
// as 500, and the panic goes on once the refund is made. The refund runs
// after the handler returns, under the decision deadline (WithTimeout), on
// a context that keeps the request's values but not its cancellation, so
// a client that hangs up still gets its refund. A refund that fails is
// told to OnError (ErrRefund) and leaves the permits used. With
// MiddlewareAll every part is refunded. Default: no refund.
func WithRefundIf(refund func(r *http.Request, status int) bool) Option {
	return func(c *config) { c.refundIf = refund }
}

// Settle gives back what the request whose context is ctx took beyond
// used permits, for a cost known only at the end (an LLM call's tokens, a
// response's bytes): take the most it can cost up front with WithCost,
// then settle what it did cost. It settles the middleware nearest the
// handler that granted the request (MiddlewareAll's: every part).
// Settling is idempotent: the permits given back are the most any Settle
// (or WithRefundIf's refund) asked for, never a sum, so settling twice, or
// settling and then refunding on a 5xx, never gives back more than the
// request took. used below 0 is an error;
// used at or above what the request took gives nothing back. An error
// matches ErrRefund, or redlimit.ErrInvalidArgument when ctx carries no
// grant (no middleware granted this request, or its cost was 0).
func Settle(ctx context.Context, used int) error {
	f, _ := ctx.Value(flightKey{}).(*flight)
	if f == nil || f.innermost == nil {
		return fmt.Errorf("httplimit: Settle: the request has no grant to settle: %w", redlimit.ErrInvalidArgument)
	}
	if used < 0 {
		return fmt.Errorf("httplimit: Settle(%d): used must not be negative: %w", used, redlimit.ErrInvalidArgument)
	}
	g := f.innermost.grant
	if used >= g.N() {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.innermost.timeout)
	defer cancel()
	if err := g.Refund(rctx, g.N()-used); err != nil {
		return fmt.Errorf("%w: %w", ErrRefund, err)
	}
	return nil
}

// flightKey is the context key of a request's flight.
type flightKey struct{}

// flight is what the middlewares on one request share: the outermost
// makes it, the others find it in the context.
type flight struct {
	// denied is set by a middleware that denies the request, so that the
	// middlewares around it, which granted it, give their permits back: no
	// limit is charged for a request that was refused.
	denied bool
	// innermost is the grant of the middleware nearest the handler that
	// granted the request, for Settle.
	innermost *charge
}

// charge is one middleware's grant on a request.
type charge struct {
	grant   redlimit.Grant
	timeout time.Duration // the middleware's decision deadline
	// extend renews the grant's leases (WithKeepAlive); nil when it holds
	// none or none is to be renewed.
	extend extendFunc
	// lease is set when the grant is a lease: all of it ends with the
	// request.
	lease bool
	// inFlight is set when some of its parts' grants are leases
	// (MiddlewareAll's): those end with the request, the others stay
	// counted.
	inFlight bool
}

// serveCharged calls the next handler for a request granted with ch, and
// gives ch back when a middleware inside denied the request, or when the
// response says it should not count (WithRefundIf), or, for a lease, when
// the handler ends; the leases among several parts' (MiddlewareAll) are
// released then, and the other parts' permits stay counted. A panic counts
// as a 500, and goes on after the refund.
func (h *handler) serveCharged(w http.ResponseWriter, r *http.Request, f *flight, ch *charge) {
	refundIf := h.cfg.refundIf
	var rec *statusWriter
	if refundIf != nil {
		rec = &statusWriter{ResponseWriter: w}
		w = rec
	}
	var hd *holding
	if ch.extend != nil {
		hd = h.hold(r, ch.extend, ch.grant)
	}
	returned := false
	defer func() {
		g := ch.grant
		if hd != nil {
			g = hd.stop()
		}
		switch {
		case ch.lease || f.denied:
			h.refund(r, g, g.N()) // a lease ends with the request
		case refundIf != nil && refundIf(r, rec.answered(returned)):
			h.refund(r, g, g.N())
		case ch.inFlight:
			h.release(r, g)
		}
	}()
	h.next.ServeHTTP(w, r)
	returned = true
}

// refund gives back n permits of g, under the decision deadline, telling
// OnError of a failure.
func (h *handler) refund(r *http.Request, g redlimit.Grant, n int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.cfg.timeout)
	defer cancel()
	if err := g.Refund(ctx, n); err != nil {
		h.tell(r, fmt.Errorf("%w: %w", ErrRefund, err))
	}
}

// release ends the leases g holds and keeps its other permits counted,
// under the decision deadline, telling OnError of a failure.
func (h *handler) release(r *http.Request, g redlimit.Grant) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.cfg.timeout)
	defer cancel()
	if err := g.Release(ctx); err != nil {
		h.tell(r, fmt.Errorf("%w: releasing the request's leases: %w", ErrRefund, err))
	}
}

// answered returns the status the handler answered with: 200 when it wrote
// nothing (net/http's answer), 500 when it did not return (a panic).
func (w *statusWriter) answered(returned bool) int {
	switch {
	case !returned:
		return http.StatusInternalServerError
	case w.status == 0:
		return http.StatusOK
	}
	return w.status
}

// statusWriter records the status a handler answers with, for
// WithRefundIf. It passes everything else on, and Unwrap gives
// http.ResponseController the writer it wraps.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush flushes the writer it wraps, if that can.
func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hijacks the connection of the writer it wraps, if that can.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// Unwrap returns the writer it wraps, for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
