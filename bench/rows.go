package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	redisrate "github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/throttled/throttled/v2"
	goredisstore "github.com/throttled/throttled/v2/store/goredisstore.v9"
	ulule "github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/redlimit/redlimit"
)

// decider makes one decision for key: allowed or denied, or an error when no
// decision was made.
type decider func(ctx context.Context, key string) (bool, error)

// limit is what a row limits to: limit permits per period on each key.
type limit struct {
	count     int
	per       time.Duration
	denyCache int              // redlimit only: WithDenyCache size, 0 = off
	clock     func() time.Time // redlimit only: WithClock, nil = server TIME
	batch     int              // redlimit only: WithReservation's batch, 0 = off
	hold      time.Duration    // redlimit only: WithReservation's hold
}

// contender is one library (or ceiling) the bench compares.
type contender struct {
	name      string // row name
	kind      string // "redlimit", "peer", "ceiling" or "floor" (floors.go)
	algorithm string // redlimit algorithm, or the peer's
	// build returns a decider on client c (a *redis.Client or a
	// *redis.AutoPipeliner) for lim, or an error when c does not fit.
	build func(c redis.Scripter, lim limit) (decider, error)
}

// returnOne is the ceiling every one-script limiter is measured against:
// EVALSHA of a script that does nothing.
var returnOne = redis.NewScript("return 1")

var ceilings = []contender{
	{name: "ceiling PING", kind: "ceiling", algorithm: "ping", build: func(c redis.Scripter, _ limit) (decider, error) {
		p, ok := c.(interface {
			Ping(context.Context) *redis.StatusCmd
		})
		if !ok {
			return nil, fmt.Errorf("%T has no Ping", c)
		}
		return func(ctx context.Context, _ string) (bool, error) { return true, p.Ping(ctx).Err() }, nil
	}},
	{name: "ceiling EVALSHA return 1", kind: "ceiling", algorithm: "return1", build: func(c redis.Scripter, _ limit) (decider, error) {
		return func(ctx context.Context, key string) (bool, error) {
			return true, returnOne.Run(ctx, c, []string{key}).Err()
		}, nil
	}},
}

// redlimitConstructors build each of redlimit's five limiters for lim.count
// per lim.per.
var redlimitConstructors = []struct {
	algorithm string
	build     func(c redis.Scripter, lim limit, opts []redlimit.Option) (redlimit.Limiter, error)
}{
	{"fixed_window", func(c redis.Scripter, lim limit, opts []redlimit.Option) (redlimit.Limiter, error) {
		return redlimit.NewFixedWindow(c, lim.count, lim.per, opts...)
	}},
	{"sliding_window", func(c redis.Scripter, lim limit, opts []redlimit.Option) (redlimit.Limiter, error) {
		return redlimit.NewSlidingWindow(c, lim.count, lim.per, lim.per/10, opts...)
	}},
	{"sliding_log", func(c redis.Scripter, lim limit, opts []redlimit.Option) (redlimit.Limiter, error) {
		return redlimit.NewSlidingLog(c, lim.per/10, []redlimit.Strategy{
			{Limit: lim.count, Window: lim.per},
			{Limit: 10 * lim.count, Window: 10 * lim.per},
		}, opts...)
	}},
	{"leaky_bucket", func(c redis.Scripter, lim limit, opts []redlimit.Option) (redlimit.Limiter, error) {
		return redlimit.NewLeakyBucket(c, lim.count, redlimit.Rate{Count: lim.count, Per: lim.per}, opts...)
	}},
	{"token_bucket", func(c redis.Scripter, lim limit, opts []redlimit.Option) (redlimit.Limiter, error) {
		return redlimit.NewTokenBucket(c, lim.count, redlimit.Rate{Count: lim.count, Per: lim.per}, opts...)
	}},
}

// newRedlimitLimiter builds redlimit's limiter for algorithm on c.
func newRedlimitLimiter(algorithm string, c redis.Scripter, lim limit) (redlimit.Limiter, error) {
	var opts []redlimit.Option
	if lim.denyCache > 0 {
		opts = append(opts, redlimit.WithDenyCache(lim.denyCache))
	}
	if lim.clock != nil {
		opts = append(opts, redlimit.WithClock(lim.clock))
	}
	if lim.batch > 0 {
		opts = append(opts, redlimit.WithReservation(lim.batch, lim.hold))
	}
	for _, rc := range redlimitConstructors {
		if rc.algorithm == algorithm {
			return rc.build(c, lim, opts)
		}
	}
	return nil, fmt.Errorf("bench: no redlimit algorithm %q", algorithm)
}

// reservedSuffix names the rows of limiters with WithReservation.
const reservedSuffix = " +reservation 64"

// redlimitContenders returns one contender per redlimit algorithm; suffix
// names a variant (" +deny cache").
func redlimitContenders(suffix string) []contender {
	var out []contender
	for _, rc := range redlimitConstructors {
		algorithm := rc.algorithm
		out = append(out, contender{
			name: "redlimit " + algorithm + suffix, kind: "redlimit", algorithm: algorithm,
			build: func(c redis.Scripter, lim limit) (decider, error) {
				l, err := newRedlimitLimiter(algorithm, c, lim)
				if err != nil {
					return nil, err
				}
				return tryAcquire(l), nil
			},
		})
	}
	return out
}

// tryAcquire is the decider of every redlimit row: TryAcquire, a denial
// being no error.
func tryAcquire(l redlimit.Limiter) decider {
	return func(ctx context.Context, key string) (bool, error) {
		err := l.TryAcquire(ctx, key)
		if err == nil {
			return true, nil
		}
		if errors.Is(err, redlimit.ErrAcquireFailed) {
			return false, nil
		}
		return false, err
	}
}

// peers are the libraries people would otherwise pick. mennanov/limiters is
// not among them: the Go module proxy refuses to serve it (403), see
// BENCHMARKS.md.
var peers = []contender{
	{name: "go-redis/redis_rate v10", kind: "peer", algorithm: "gcra", build: func(c redis.Scripter, lim limit) (decider, error) {
		rdb, ok := c.(interface {
			redis.Scripter
			Del(context.Context, ...string) *redis.IntCmd
		})
		if !ok {
			return nil, fmt.Errorf("%T does not fit redis_rate", c)
		}
		l := redisrate.NewLimiter(rdb)
		rate := redisrate.Limit{Rate: lim.count, Burst: lim.count, Period: lim.per}
		return func(ctx context.Context, key string) (bool, error) {
			r, err := l.Allow(ctx, key, rate)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		}, nil
	}},
	{name: "ulule/limiter v3 (redis store)", kind: "peer", algorithm: "fixed_window", build: func(c redis.Scripter, lim limit) (decider, error) {
		rdb, ok := c.(ulredis.Client)
		if !ok {
			return nil, fmt.Errorf("%T does not fit ulule/limiter's redis store", c)
		}
		store, err := ulredis.NewStoreWithOptions(rdb, ulule.StoreOptions{Prefix: "ulule"})
		if err != nil {
			return nil, err
		}
		l := ulule.New(store, ulule.Rate{Period: lim.per, Limit: int64(lim.count)})
		return func(ctx context.Context, key string) (bool, error) {
			r, err := l.Get(ctx, key)
			if err != nil {
				return false, err
			}
			return !r.Reached, nil
		}, nil
	}},
	{name: "throttled/throttled v2 (goredisstore.v9)", kind: "peer", algorithm: "gcra", build: func(c redis.Scripter, lim limit) (decider, error) {
		rdb, ok := c.(*redis.Client)
		if !ok {
			return nil, fmt.Errorf("%T does not fit throttled's go-redis store", c)
		}
		store, err := goredisstore.NewCtx(rdb, "throttled:")
		if err != nil {
			return nil, err
		}
		l, err := throttled.NewGCRARateLimiterCtx(store, throttled.RateQuota{
			MaxRate: throttled.PerDuration(lim.count, lim.per), MaxBurst: lim.count - 1,
		})
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, key string) (bool, error) {
			limited, _, err := l.RateLimitCtx(ctx, key, 1)
			if err != nil {
				return false, err
			}
			return !limited, nil
		}, nil
	}},
}
