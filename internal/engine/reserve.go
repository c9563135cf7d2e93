package engine

import "context"

// What a reservation (the root package's WithReservation) needs of an
// engine: a decision that takes more permits from Redis than its caller
// asked for, and the breaker's state.

// DecideExtra is Decide for a reservation: it asks Redis for n + extra
// permits in one round trip, so that the extra can be handed out in
// process. When Redis leaves the call undecided, the fallback decides n
// alone, as it would the caller's own call: a fallback's grant is never
// held. took is the permits the reply's grant took: n + extra from
// Redis, n from the fallback, 0 when denied. Unlike Decide it tells the
// observer nothing: the caller does, with what the call got.
func (e *Engine) DecideExtra(ctx context.Context, key string, n, extra int) (r Reply, took int, local bool, err error) {
	c, r, local, err := e.begin(ctx, key, n+extra)
	if err != nil || local {
		return r, 0, local, err
	}
	c.fallbackN = n
	text, err := e.guardedRun(ctx, c.request())
	r, err = c.finish(ctx, text, err)
	switch {
	case err != nil || !r.Allowed:
		return r, 0, false, err
	case r.FromFallback:
		return r, n, false, nil
	}
	return r, n + extra, false, nil
}

// BreakerClosed reports whether calls go to Redis now: the engine has no
// breaker, or it is closed. A reservation hands out nothing while it is
// not, so that an outage is decided by the fallback's rules alone.
func (e *Engine) BreakerClosed() bool {
	return e.breaker == nil || e.breaker.state.Load() == stClosed
}
