package redlimit

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// routePair is one algorithm configured twice, as two routes of one service
// would configure it: a strict limit (a login form) and a loose one (an API).
type routePair struct {
	name          string
	strict, loose func(rdb redis.Scripter, opts ...Option) (Limiter, error)
}

var routePairs = []routePair{
	{"fixed_window",
		func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewFixedWindow(rdb, 5, time.Minute, opts...)
		},
		func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewFixedWindow(rdb, 100, time.Second, opts...)
		}},
	{"sliding_window",
		func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingWindow(rdb, 5, time.Minute, time.Second, opts...)
		},
		func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingWindow(rdb, 100, time.Second, 100*time.Millisecond, opts...)
		}},
	{"sliding_log",
		func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingLog(rdb, time.Second, []Strategy{{Limit: 5, Window: time.Minute}}, opts...)
		},
		func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingLog(rdb, 100*time.Millisecond, []Strategy{{Limit: 100, Window: time.Second}}, opts...)
		}},
	{"leaky_bucket",
		func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewLeakyBucket(rdb, 5, PerMinute(1), opts...)
		},
		func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewLeakyBucket(rdb, 100, PerSecond(10), opts...)
		}},
	{"token_bucket",
		func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewTokenBucket(rdb, 5, PerMinute(1), opts...)
		},
		func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewTokenBucket(rdb, 100, PerSecond(10), opts...)
		}},
}

// Two routes limited by client IP with different limits, both with default
// keys, never meet: the strict one grants exactly what it grants alone
// while the loose one is called between every two of its calls. Before
// default keys carried a fingerprint, /login's token bucket admitted 1000 of
// 1000 requests in a second this way.
func TestDefaultKeysIsolateConfigs(t *testing.T) {
	t.Parallel()
	for _, p := range routePairs {
		t.Run(p.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				grants := func(withLoose bool) int {
					clock := newClock()
					strict, err := p.strict(b.rdb, WithClock(clock.Now))
					require.NoError(t, err)
					loose, err := p.loose(b.rdb, WithClock(clock.Now))
					require.NoError(t, err)
					key := "203.0.113.7"
					if !withLoose {
						key = "198.51.100.9" // a client of its own
					}
					require.NotEqual(t, redisKey(strict, key),
						redisKey(loose, key), "two configurations, two keys")
					granted := 0
					for range shortOr(100, 300) { // a request every 200ms: one fake minute (20s under -short)
						if withLoose {
							_, err := loose.Allow(ctx, key)
							require.NoError(t, err)
						}
						r, err := strict.Allow(ctx, key)
						require.NoError(t, err)
						if r.Allowed {
							granted++
						}
						clock.Advance(200 * time.Millisecond)
					}
					return granted
				}
				alone := grants(false)
				require.LessOrEqual(t, alone, 6, "the strict route alone grants about 5 in a minute")
				assert.Equal(t, alone, grants(true), "the loose route on the same client changes nothing")
			})
		})
	}
}

// The fingerprint depends on what a limiter decides, not on how its
// configuration was written, and is stable across releases: a change to it
// starts every user's keys afresh, so it must be a deliberate one.
func TestDefaultKeyFingerprint(t *testing.T) {
	t.Parallel()
	rdb := deadRedis(t, "", 0) // never dialled
	shape := regexp.MustCompile(`^redlimit:(fw|sw|sl|lb|tb):[0-9a-v]{6}:$`)
	prefix := func(l Limiter, err error) string {
		t.Helper()
		require.NoError(t, err)
		p := keyPrefix(l)
		require.Regexp(t, shape, p)
		return p
	}

	tb := prefix(NewTokenBucket(rdb, 10, PerSecond(10)))
	assert.Equal(t, tb, prefix(NewTokenBucket(rdb, 10, Rate{Count: 20, Per: 2 * time.Second})), "one rate written two ways")
	assert.Equal(t, tb, prefix(NewTokenBucket(rdb, 10, PerSecond(10), WithDenyCache(10))), "options that do not decide are not in it")
	assert.NotEqual(t, tb, prefix(NewTokenBucket(rdb, 11, PerSecond(10))), "capacity")
	assert.NotEqual(t, tb, prefix(NewTokenBucket(rdb, 10, PerSecond(11))), "rate")
	assert.NotEqual(t, tb, prefix(NewLeakyBucket(rdb, 10, PerSecond(10))), "algorithm")

	sl := prefix(NewSlidingLog(rdb, time.Second, []Strategy{{3, time.Minute}, {10, time.Hour}}))
	assert.Equal(t, sl, prefix(NewSlidingLog(rdb, time.Second, []Strategy{{10, time.Hour}, {3, time.Minute}})), "strategies in any order")
	assert.NotEqual(t, sl, prefix(NewSlidingLog(rdb, 2*time.Second, []Strategy{{3, time.Minute}, {10, time.Hour}})), "precision")

	// Pinned: these change only with a state format or a fingerprint
	// change, which must be a deliberate, documented one.
	golden := map[string]string{
		"fw": prefix(NewFixedWindow(rdb, 100, time.Minute)),
		"sw": prefix(NewSlidingWindow(rdb, 100, time.Minute, time.Second)),
		"sl": sl,
		"lb": prefix(NewLeakyBucket(rdb, 10, PerSecond(10))),
		"tb": tb,
	}
	for code, p := range golden {
		assert.Equal(t, goldenPrefixes[code], p, "the %s fingerprint moved: every deployed key would start afresh", code)
	}
	assert.Equal(t, "app:k", must(NewFixedWindow(rdb, 1, time.Second, WithPrefix("app:"))).redisKey("k"), "WithPrefix is taken as it is")
}

// goldenPrefixes are the default prefixes of TestDefaultKeyFingerprint's
// configurations in this release.
var goldenPrefixes = map[string]string{
	"fw": "redlimit:fw:u7gl87:", // state format 3: a window lasts its stored length; refunds
	"sw": "redlimit:sw:0nhe7r:", // state format 11: the key's time, refunds, a full key's note
	"sl": "redlimit:sl:qq2krk:", // state format 11
	"lb": "redlimit:lb:h5fkuk:", // state format 5: the key's time, parts by rate, refunds by position
	"tb": "redlimit:tb:p4dc5u:", // state format 5
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
