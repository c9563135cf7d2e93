package httplimit

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/redlimittest"
)

// Two middlewares on one route each add their policy to the RateLimit and
// RateLimit-Policy lists: the client sees both limits. The outer one takes
// its permit before the inner one decides, also when the inner one denies.
func TestChainedMiddlewaresListEveryPolicy(t *testing.T) {
	env := redlimittest.New(t)
	minute, err := redlimit.NewFixedWindow(env.Client(), 5, time.Minute, env.Options()...)
	require.NoError(t, err)
	hour, err := redlimit.NewFixedWindow(env.Client(), 100, time.Hour, env.Options()...)
	require.NoError(t, err)
	// Every request is decided, however loaded the machine: redlimittest's
	// client outlasts the middleware's deadline.
	noErrors := WithOnError(func(_ *http.Request, err error) { t.Errorf("no decision: %v", err) })
	h := Middleware(minute, WithPolicyName("minute"), WithLegacyHeaders(), noErrors)(
		Middleware(hour, WithPolicyName("hour"), WithLegacyHeaders(), noErrors)(ok))

	type want struct {
		status            int
		policy, rateLimit string
		legacyRemaining   string
	}
	steps := []want{
		{200, `"minute";q=5;w=60, "hour";q=100;w=3600`, `"minute";r=4;t=60, "hour";r=99;t=3600`, "4"},
		{200, `"minute";q=5;w=60, "hour";q=100;w=3600`, `"minute";r=3;t=60, "hour";r=98;t=3600`, "3"},
		{200, `"minute";q=5;w=60, "hour";q=100;w=3600`, `"minute";r=2;t=60, "hour";r=97;t=3600`, "2"},
		{200, `"minute";q=5;w=60, "hour";q=100;w=3600`, `"minute";r=1;t=60, "hour";r=96;t=3600`, "1"},
		{200, `"minute";q=5;w=60, "hour";q=100;w=3600`, `"minute";r=0;t=60, "hour";r=95;t=3600`, "0"},
		// The outer limit denies: the inner one is never asked.
		{429, `"minute";q=5;w=60`, `"minute";r=0;t=60`, "0"},
	}
	eachTransport(t, h, func(t *testing.T, send sendFunc) {
		for i, w := range steps {
			got := send(t, nil)
			assert.Equal(t, w.status, got.status, "request %d", i)
			assert.Equal(t, w.policy, got.header.Get("RateLimit-Policy"), "request %d", i)
			assert.Equal(t, w.rateLimit, got.header.Get("RateLimit"), "request %d", i)
			assert.Len(t, got.header.Values("RateLimit"), 1, "one line: clients that read the first line see every policy")
			assert.Equal(t, w.legacyRemaining, got.header.Get("X-RateLimit-Remaining"), "request %d: the limit with the fewest left", i)
		}
		env.Advance(time.Hour)
	})

	// The inner limit denies: the outer one has taken its permit already.
	inner, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options(redlimit.WithPrefix("inner:"))...)
	require.NoError(t, err)
	outer, err := redlimit.NewFixedWindow(env.Client(), 100, time.Hour, env.Options(redlimit.WithPrefix("outer:"))...)
	require.NoError(t, err)
	h = Middleware(outer, WithPolicyName("hour"))(Middleware(inner, WithPolicyName("minute"))(ok))
	for i, w := range []struct {
		status    int
		rateLimit string
	}{
		{200, `"hour";r=99;t=3600, "minute";r=0;t=60`},
		{429, `"hour";r=98;t=3600, "minute";r=0;t=60`},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		assert.Equal(t, w.status, rec.Code, "request %d", i)
		assert.Equal(t, w.rateLimit, rec.Header().Get("RateLimit"), "request %d", i)
	}
}

// The legacy headers, single values, describe the limit a client must wait
// for: on a 429, the limit that denied; of two with equally few permits
// left, the one that resets last.
func TestLegacyHeadersDescribeTheLimitThatBinds(t *testing.T) {
	env := redlimittest.New(t)
	outer, err := redlimit.NewFixedWindow(env.Client(), 3, 10*time.Second, env.Options(redlimit.WithPrefix("outer:"))...)
	require.NoError(t, err)
	inner, err := redlimit.NewFixedWindow(env.Client(), 2, time.Hour, env.Options(redlimit.WithPrefix("inner:"))...)
	require.NoError(t, err)
	h := Middleware(outer, WithLegacyHeaders(), withNow(env.Now))(Middleware(inner, WithLegacyHeaders(), withNow(env.Now))(ok))
	hourFromNow := strconv.FormatInt(env.Now().Add(time.Hour).Unix(), 10)
	for i, w := range []struct {
		status           int
		limit, remaining string
	}{
		{200, "2", "1"}, // outer 2 left, inner 1
		{200, "2", "0"}, // outer 1 left, inner 0
		{429, "2", "0"}, // outer 0 left, inner 0 and denies
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		require.Equal(t, w.status, rec.Code, "request %d", i)
		assert.Equal(t, w.limit, rec.Header().Get("X-RateLimit-Limit"), "request %d: the inner limit binds", i)
		assert.Equal(t, w.remaining, rec.Header().Get("X-RateLimit-Remaining"), "request %d", i)
		assert.Equal(t, hourFromNow, rec.Header().Get("X-RateLimit-Reset"), "request %d: the inner limit's reset", i)
	}

	// Both allow with none left: the one that resets last binds.
	env.Advance(time.Hour)
	first, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options(redlimit.WithPrefix("first:"))...)
	require.NoError(t, err)
	second, err := redlimit.NewFixedWindow(env.Client(), 1, time.Hour, env.Options(redlimit.WithPrefix("second:"))...)
	require.NoError(t, err)
	h = Middleware(first, WithLegacyHeaders(), withNow(env.Now))(Middleware(second, WithLegacyHeaders(), withNow(env.Now))(ok))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, "0", rec.Header().Get("X-RateLimit-Remaining"))
	assert.Equal(t, strconv.FormatInt(env.Now().Add(time.Hour).Unix(), 10), rec.Header().Get("X-RateLimit-Reset"), "the hour's reset, not the minute's")
}

// Without WithWindow, w is the limiter's own window: a bucket's time to
// refill, a SlidingLog's window of the strategy q names, a plan's
// limiter's. WithWindow overrides it; a limiter that reports no strategies
// gets no w.
func TestPolicyWindowFromTheLimiter(t *testing.T) {
	env := redlimittest.New(t)
	bucket, err := redlimit.NewTokenBucket(env.Client(), 10, redlimit.PerSecond(4), env.Options()...)
	require.NoError(t, err)
	log, err := redlimit.NewSlidingLog(env.Client(), time.Second,
		[]redlimit.Strategy{{Limit: 2, Window: 10 * time.Second}, {Limit: 3, Window: time.Hour}}, env.Options()...)
	require.NoError(t, err)
	policy := func(h http.Handler) string {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		return rec.Header().Get("RateLimit-Policy")
	}

	assert.Equal(t, `"default";q=10;w=3`, policy(Middleware(bucket)(ok)), "10 at 4/s refill in 2.5s, rounded up")
	assert.Equal(t, `"default";q=10;w=60`, policy(Middleware(bucket, WithWindow(time.Minute))(ok)), "WithWindow overrides")
	assert.Equal(t, `"default";q=10`, policy(Middleware(keyLimit{bucket})(ok)), "a limiter that reports no strategies")

	logged := Middleware(log)(ok)
	assert.Equal(t, `"default";q=2;w=10`, policy(logged), "q and w of the strategy with the fewest left")
	assert.Equal(t, `"default";q=2;w=10`, policy(logged))
	env.Advance(10 * time.Second)
	assert.Equal(t, `"default";q=3;w=3600`, policy(logged), "the hour's strategy binds: its q and its w")

	planned := Middleware(bucket, WithPlans(func(*http.Request) string { return "log" },
		Plan{Name: "log", Limiter: log}))(ok)
	env.Advance(time.Hour)
	assert.Equal(t, `"log";q=2;w=10`, policy(planned), "a plan without Window: its limiter's")
}
