package redlimit

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	redistest.Shutdown()
	os.Exit(code)
}

// backend is a Redis server a script test runs on.
type backend struct {
	name string
	rdb  *redis.Client
	mini *miniredis.Miniredis // nil on a real server
}

// forEachBackend runs fn on a fresh miniredis and on a real redis-server
// (shared by the test binary; skipped, or failed when
// REDLIMIT_REQUIRE_REDIS=1, when redis-server is not on PATH). Every script
// behaviour is checked on both.
func forEachBackend(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { rdb.Close() })
		fn(t, backend{name: "miniredis", rdb: rdb, mini: m})
	})
	t.Run("redis", func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
		t.Cleanup(func() { rdb.Close() })
		require.NoError(t, rdb.FlushDB(context.Background()).Err(), "flush the shared test server")
		fn(t, backend{name: "redis", rdb: rdb})
	})
}

// fakeClock is a settable clock for WithClock.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time          { return c.now }
func (c *fakeClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

// epoch is a round Unix time, a multiple of every precision the tests use,
// so that bucket boundaries fall where the tables say.
var epoch = time.Unix(1_800_000_000, 0)

// algorithm builds a limiter of one kind for the table tests.
type algorithm struct {
	name string
	make func(rdb redis.Scripter, opts ...Option) (Limiter, error)
}

// keyPrefix returns l's Redis key prefix: WithPrefix's, or the default
// redlimit:<algorithm>:<config>:.
func keyPrefix(l Limiter) string {
	return l.(interface{ RedisKey(string) string }).RedisKey("")
}
