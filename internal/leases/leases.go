// Package leases renews the leases of an AllowAll grant, for the
// middlewares' WithKeepAlive: a group grant's parts are renewed each by
// its own limiter.
package leases

import (
	"context"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/engine"
)

// Extender is a limiter whose grants are leases (redlimit.Concurrency,
// inmem.Concurrency).
type Extender interface {
	ExtendGrant(ctx context.Context, g redlimit.Grant) (redlimit.Result, error)
}

// ExtendGroup extends the leases of g, an AllowAll grant on parts whose
// limiters are limiters (in the parts' order): each part whose limiter is
// an Extender extends its own grant. Granted, the Result's Grant names the
// leases from then on (a lease that lapsed was taken afresh). The first
// part that fails or is denied ends it with its Result and error; the
// parts extended before it keep their places until they lapse.
func ExtendGroup(ctx context.Context, g redlimit.Grant, limiters []redlimit.Limiter) (redlimit.Result, error) {
	grants := engine.GroupGrants(g)
	if len(grants) != len(limiters) {
		return redlimit.Result{}, engine.Errorf(redlimit.ErrInvalidArgument, "redlimit: extending the leases of %v: not an AllowAll grant of %d parts", g, len(limiters))
	}
	for i, l := range limiters {
		e, ok := l.(Extender)
		if !ok {
			continue
		}
		res, err := e.ExtendGrant(ctx, grants[i])
		if err != nil || !res.Allowed {
			return res, err
		}
		if res.Grant.N() > 0 {
			grants[i] = res.Grant
		}
	}
	return redlimit.Result{Allowed: true, Grant: engine.NewGroupGrant(grants, g.N())}, nil
}
