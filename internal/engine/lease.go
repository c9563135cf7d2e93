package engine

import (
	"context"
	"fmt"
	"time"
)

// GrantParts returns what g names: the Refunder that made it, its key and
// its token. A function, not a method, so that redlimit.Grant (an alias of
// Grant) does not export it; the limiters whose grants are leases read
// them to extend a grant.
func GrantParts(g Grant) (src Refunder, key, token string) {
	return g.src, g.key, g.token
}

// Extend gives the n leases of the grant of key that the script named
// token another lease period, in one round trip: the script's ARGV[2] is
// "+<token>", and its reply a decision's, whose token names the grant's
// leases from now on (the same, or a new grant in place of one whose
// leases lapsed). It goes behind the breaker but never to the fallback:
// the leases are in Redis, and one that could not be extended lapses,
// stricter, never looser. An allowed reply drops the key's cached denials,
// as a grant does.
func (e *Engine) Extend(ctx context.Context, key, token string, n int) (Reply, error) {
	if err := CheckArgs(ErrInvalidArgument, e.algorithm, ctx, key); err != nil {
		return Reply{}, err
	}
	if !validToken(token) {
		return Reply{}, Errorf(ErrInvalidArgument, "redlimit: %s: extend: the grant carries no token a script made", e.algorithm)
	}
	start := time.Now()
	_, nowArg, err := e.now()
	if err != nil {
		return Reply{}, err
	}
	text, err := e.guardedRun(ctx, request{key: e.prefix + key, nowArg: nowArg, refund: "+" + token})
	var r Reply
	if err == nil {
		r, err = ParseReplyText(text)
		if err == nil && r.Allowed && r.Token == "" {
			err = fmt.Errorf("extend reply %q carries no token", text)
		}
		if err != nil {
			err = fmt.Errorf("redlimit: %s: extend: %w", e.algorithm, err)
		}
	} else {
		err = e.redisError(ctx, key, "extend: ", err)
	}
	if err == nil && r.Allowed {
		e.forget(key)
	}
	if e.observe != nil {
		e.observe(Event{Ctx: ctx, Key: key, N: n, Reply: r, Err: err, Latency: time.Since(start)})
	}
	if err != nil {
		return Reply{}, err
	}
	return r, nil
}
