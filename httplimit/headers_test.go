package httplimit

import (
	"net/http"
	"net/http/httptest"
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
	// Every request is decided: a loaded test machine must not fail one open.
	noErrors := WithOnError(func(_ *http.Request, err error) { t.Errorf("no decision: %v", err) })
	h := Middleware(minute, WithPolicyName("minute"), WithWindow(time.Minute), WithLegacyHeaders(), noErrors, WithTimeout(5*time.Second))(
		Middleware(hour, WithPolicyName("hour"), WithWindow(time.Hour), WithLegacyHeaders(), noErrors, WithTimeout(5*time.Second))(ok))

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
