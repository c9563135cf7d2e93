package engine

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// redisFailure reports whether err, the error of a call that reached for
// Redis, left the call undecided because of Redis or the link to it, so
// that the fallback decides it: every error but the caller's own. The
// caller's own are its ctx, done before the call or during it (cancelled,
// or its deadline passed while Redis had not answered: the caller chose
// that deadline), and a foreign value at the key (a problem of that key,
// which another limiter must not paper over). Bad input never gets here.
func redisFailure(ctx context.Context, err error) bool {
	var early doneBeforeCall
	if errors.As(err, &early) || callerErr(ctx, err) != nil || errors.Is(err, context.Canceled) {
		return false
	}
	return !redis.HasErrorPrefix(err, "NOTOURS")
}

// fallback lets Config.Fallback decide a call that Redis, or the link to
// it, left undecided (redisFailure): the breaker was open, the round trip
// failed, or the server refused it. It reports false, and the caller
// returns err, when there is no fallback, when err is the caller's own (its
// ctx, a foreign value at the key), or when the fallback failed too. The
// Reply's Cause is the Redis error, as the caller would have seen it.
func (e *Engine) fallback(ctx context.Context, key string, n int, err error) (Reply, bool) {
	if e.fallbackFn == nil || !redisFailure(ctx, err) {
		return Reply{}, false
	}
	r, fbErr := e.fallbackFn(ctx, key, n)
	if fbErr != nil {
		return Reply{}, false
	}
	r.Cause = e.redisError(ctx, key, "", err)
	return r, true
}
