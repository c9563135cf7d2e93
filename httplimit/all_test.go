package httplimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/inmem"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/redlimittest"
)

// planLimits are the three limits of an API platform's plan: 5 a minute per
// user, 3 a minute per tenant, 2 in flight per user.
type planLimits struct {
	user, tenant redlimit.Limiter
	inFlight     *redlimit.Concurrency
}

func newPlanLimits(t *testing.T) (*redlimittest.Env, planLimits) {
	env := redlimittest.New(t)
	user, err := redlimit.NewFixedWindow(env.Client(), 5, time.Minute, env.Options(redlimit.WithPrefix("user:"))...)
	require.NoError(t, err)
	tenant, err := redlimit.NewFixedWindow(env.Client(), 3, time.Minute, env.Options(redlimit.WithPrefix("tenant:"))...)
	require.NoError(t, err)
	inFlight, err := redlimit.NewConcurrency(env.Client(), 2, time.Minute, env.Options(redlimit.WithPrefix("flight:"))...)
	require.NoError(t, err)
	return env, planLimits{user, tenant, inFlight}
}

// parts returns the plan's parts: the user from X-User, the tenant from
// X-Tenant, in flight per user.
func (pl planLimits) parts() []Part {
	return []Part{
		{Name: "user", Limiter: pl.user, Key: Header("X-User")},
		{Name: "tenant", Limiter: pl.tenant, Key: Header("X-Tenant")},
		{Name: "inflight", Limiter: pl.inFlight, Key: Header("X-User")},
	}
}

// remaining reads what is left of key on l, taking nothing.
func remaining(t *testing.T, l redlimit.Limiter, key string) int {
	t.Helper()
	res, err := l.AllowN(context.Background(), key, 0)
	require.NoError(t, err)
	return res.Remaining
}

// send serves one request from user in tenant ("" leaves the header out).
func send(h http.Handler, user, tenant string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	if user != "" {
		req.Header.Set("X-User", user)
	}
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

const planPolicies = `"user";q=5;w=60, "tenant";q=3;w=60, "inflight";q=2;qu="concurrent-requests"`

// The tenant's limit denies a user who has permits left: 429 names the
// tenant, Retry-After is the tenant's, every policy is listed, and the
// user's permit and place in flight were not taken.
func TestMiddlewareAllTenantDenies(t *testing.T) {
	env, pl := newPlanLimits(t)
	var denied []redlimit.Result
	h := MiddlewareAll(pl.parts(),
		WithOnError(func(_ *http.Request, err error) { t.Errorf("no decision: %v", err) }),
		WithOnDenied(func(_ *http.Request, res redlimit.Result, enforced bool) { denied = append(denied, res) }),
	)(ok)

	for i, user := range []string{"alice", "alice", "bob"} {
		rec := send(h, user, "acme")
		require.Equal(t, http.StatusOK, rec.Code, "request %d: the tenant has 3 a minute", i)
		env.Advance(10 * time.Second)
	}
	rec := send(h, "carol", "acme")
	require.Equal(t, http.StatusTooManyRequests, rec.Code, "the tenant's fourth request")
	assert.Equal(t, planPolicies, rec.Header().Get("RateLimit-Policy"), "every part's policy is listed")
	assert.Equal(t, `"tenant";r=0;t=30`, rec.Header().Get("RateLimit"), "RateLimit reports the part that denied")
	assert.Equal(t, "30", rec.Header().Get("Retry-After"), "the tenant's window closes in 30s")
	require.Len(t, denied, 1)
	assert.Equal(t, 1, denied[0].Part, "OnDenied's Result names the tenant part")

	assert.Equal(t, 5, remaining(t, pl.user, "carol"), "nothing was taken from the user's limit")
	assert.Equal(t, 2, remaining(t, pl.inFlight, "carol"), "the place in flight taken with the denial was given back")
	assert.Equal(t, 3, remaining(t, pl.user, "alice"), "alice's two requests stay counted")
	assert.Equal(t, 2, remaining(t, pl.inFlight, "alice"), "alice's places ended with her requests")

	env.Advance(30 * time.Second)
	assert.Equal(t, http.StatusOK, send(h, "carol", "acme").Code, "the tenant's next window")
}

// A granted request lists every policy and reports the part with the
// fewest permits left; the handler finds that Result.
func TestMiddlewareAllGrantHeaders(t *testing.T) {
	_, pl := newPlanLimits(t)
	var seen redlimit.Result
	h := MiddlewareAll(pl.parts(), WithLegacyHeaders())(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, _ = ResultFromContext(r.Context())
	}))
	for _, tc := range []struct {
		user, rateLimit, legacyRemaining string
		part                             int
	}{
		// user 4, tenant 2, in flight 1 (during the request).
		{"alice", `"inflight";r=1;t=60`, "1", 2},
		// user 4, tenant 1, in flight 1: the first of equals.
		{"bob", `"tenant";r=1;t=60`, "1", 1},
		// user 4, tenant 0, in flight 1.
		{"carol", `"tenant";r=0;t=60`, "0", 1},
	} {
		rec := send(h, tc.user, "acme")
		require.Equal(t, http.StatusOK, rec.Code, tc.user)
		assert.Equal(t, planPolicies, rec.Header().Get("RateLimit-Policy"), tc.user)
		assert.Equal(t, tc.rateLimit, rec.Header().Get("RateLimit"), tc.user)
		assert.Equal(t, tc.legacyRemaining, rec.Header().Get("X-RateLimit-Remaining"), tc.user)
		assert.Equal(t, tc.part, seen.Part, "%s: Result.Part is the reported part's index", tc.user)
	}
}

// A part in flight holds its place while the handler runs: the user's third
// request at once is denied by it, and takes nothing from the others.
func TestMiddlewareAllHoldsTheLease(t *testing.T) {
	_, pl := newPlanLimits(t)
	inside, proceed := make(chan struct{}, 2), make(chan struct{})
	h := MiddlewareAll(pl.parts())(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			inside <- struct{}{}
			<-proceed
		}
	}))
	done := make(chan int, 2)
	for range 2 {
		go func() {
			req := httptest.NewRequest(http.MethodGet, "/?hold=1", nil)
			req.Header.Set("X-User", "alice")
			req.Header.Set("X-Tenant", "acme")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			done <- rec.Code
		}()
	}
	<-inside
	<-inside
	rec := send(h, "alice", "acme")
	require.Equal(t, http.StatusTooManyRequests, rec.Code, "two in flight: the third waits")
	assert.Equal(t, `"inflight";r=0;t=60`, rec.Header().Get("RateLimit"))
	assert.Equal(t, 3, remaining(t, pl.user, "alice"), "the denied request took no user permit")
	assert.Equal(t, 1, remaining(t, pl.tenant, "acme"), "nor a tenant permit")
	close(proceed)
	require.Equal(t, http.StatusOK, <-done)
	require.Equal(t, http.StatusOK, <-done)
	assert.Equal(t, 2, remaining(t, pl.inFlight, "alice"), "the places ended with the requests")
	assert.Equal(t, 3, remaining(t, pl.user, "alice"), "the rate limits' permits stay counted")
}

// WithRefundIf and Settle give back to every part at once.
func TestMiddlewareAllRefunds(t *testing.T) {
	_, pl := newPlanLimits(t)
	t.Run("refund of a 5xx", func(t *testing.T) {
		h := MiddlewareAll(pl.parts(), WithRefundIf(serverErrors))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}))
		require.Equal(t, http.StatusServiceUnavailable, send(h, "alice", "acme").Code)
		assert.Equal(t, 5, remaining(t, pl.user, "alice"), "the user's permit was given back")
		assert.Equal(t, 3, remaining(t, pl.tenant, "acme"), "the tenant's permit was given back")
		assert.Equal(t, 2, remaining(t, pl.inFlight, "alice"), "the place in flight ended")
	})
	t.Run("settle", func(t *testing.T) {
		h := MiddlewareAll(pl.parts()[:2], WithCost(func(*http.Request) int { return 3 }))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			require.NoError(t, Settle(r.Context(), 1))
		}))
		require.Equal(t, http.StatusOK, send(h, "bob", "globex").Code)
		assert.Equal(t, 4, remaining(t, pl.user, "bob"), "the user's limit kept the 1 permit used")
		assert.Equal(t, 2, remaining(t, pl.tenant, "globex"), "so did the tenant's")
	})
}

// A part whose Key returns ErrSkip is left out of the decision and the
// headers; any other Key error stops the request with nothing taken.
func TestMiddlewareAllKeys(t *testing.T) {
	_, pl := newPlanLimits(t)
	parts := pl.parts()
	parts[1].Key = func(r *http.Request) (string, error) {
		if tenant := r.Header.Get("X-Tenant"); tenant != "" {
			return tenant, nil
		}
		return "", ErrSkip // a user of no tenant
	}
	h := MiddlewareAll(parts)(ok)

	rec := send(h, "alice", "")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, `"user";q=5;w=60, "inflight";q=2;qu="concurrent-requests"`, rec.Header().Get("RateLimit-Policy"), "the tenant part is not listed")
	assert.Equal(t, 4, remaining(t, pl.user, "alice"))

	rec = send(h, "", "acme")
	require.Equal(t, http.StatusBadRequest, rec.Code, "the user's key is missing")
	assert.Equal(t, 3, remaining(t, pl.tenant, "acme"), "nothing was taken from the tenant")

	skipAll := MiddlewareAll([]Part{{Name: "tenant", Limiter: pl.tenant, Key: parts[1].Key}})(ok)
	rec = send(skipAll, "alice", "")
	require.Equal(t, http.StatusOK, rec.Code, "no part applies: the request goes on")
	assert.Empty(t, rec.Header().Get("RateLimit-Policy"), "and is not described")
}

func TestMiddlewareAllPanicsOnBadSetup(t *testing.T) {
	_, pl := newPlanLimits(t)
	user := Part{Name: "user", Limiter: pl.user}
	for name, build := range map[string]func(){
		"no parts":          func() { MiddlewareAll(nil) },
		"nil limiter":       func() { MiddlewareAll([]Part{{Name: "user"}}) },
		"name used twice":   func() { MiddlewareAll([]Part{user, user}) },
		"empty name":        func() { MiddlewareAll([]Part{{Limiter: pl.user}}) },
		"WithKeyFunc":       func() { MiddlewareAll([]Part{user}, WithKeyFunc(ClientIP())) },
		"WithPolicyName":    func() { MiddlewareAll([]Part{user}, WithPolicyName("x")) },
		"a negative window": func() { MiddlewareAll([]Part{{Name: "user", Limiter: pl.user, Window: -time.Second}}) },
	} {
		assert.Panics(t, build, name)
	}
}

// On a real redis-server the parts go in one pipeline: the tenant's denial
// takes nothing from the user's bucket or place in flight. The buckets
// refill one permit an hour, so the counts do not depend on how long the
// test takes.
func TestMiddlewareAllOnRedisServer(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	user, err := redlimit.NewTokenBucket(client, 5, redlimit.PerHour(1), redlimit.WithPrefix("user:"))
	require.NoError(t, err)
	tenant, err := redlimit.NewTokenBucket(client, 2, redlimit.PerHour(1), redlimit.WithPrefix("tenant:"))
	require.NoError(t, err)
	inFlight, err := redlimit.NewConcurrency(client, 2, time.Minute, redlimit.WithPrefix("flight:"))
	require.NoError(t, err)
	pl := planLimits{user, tenant, inFlight}
	h := MiddlewareAll(pl.parts(), WithTimeout(redlimittest.DecisionDeadline),
		WithOnError(func(_ *http.Request, err error) { t.Errorf("no decision: %v", err) }))(ok)

	require.Equal(t, http.StatusOK, send(h, "alice", "acme").Code)
	require.Equal(t, http.StatusOK, send(h, "bob", "acme").Code)
	rec := send(h, "carol", "acme")
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Regexp(t, `^"tenant";r=0;t=7(200|19\d)$`, rec.Header().Get("RateLimit"), "the tenant refills in 2 hours")
	assert.Regexp(t, `^3(600|59\d)$`, rec.Header().Get("Retry-After"), "the tenant refills a permit an hour")
	assert.Equal(t, 5, remaining(t, pl.user, "carol"), "nothing was taken from the user's bucket")
	assert.Equal(t, 2, remaining(t, pl.inFlight, "carol"), "nor a place in flight")
	assert.Equal(t, 4, remaining(t, pl.user, "alice"))
}

// A denial stands when giving back what the other parts took fails: the
// request is refused, never failed open, and OnError hears of the refund.
// A part whose limiter reports no strategies is listed only when RateLimit
// describes it.
func TestMiddlewareAllDenialWhoseRefundFails(t *testing.T) {
	user := &grantingLimiter{failRefund: errors.New("redis down")}
	var errs errorLog
	h := MiddlewareAll([]Part{
		{Name: "user", Limiter: user},
		{Name: "tenant", Limiter: &grantingLimiter{deny: true}},
	}, WithOnError(errs.record))(ok)
	rec := send(h, "", "")
	require.Equal(t, http.StatusTooManyRequests, rec.Code, "the tenant denied")
	assert.Equal(t, `"tenant";q=1`, rec.Header().Get("RateLimit-Policy"))
	assert.Equal(t, `"tenant";r=0;t=0`, rec.Header().Get("RateLimit"))
	assert.Equal(t, "1", rec.Header().Get("Retry-After"))
	assert.Equal(t, []int{1}, user.taken(), "the user's permit was asked back")
	told := errs.take()
	require.Len(t, told, 1)
	assert.ErrorIs(t, told[0], ErrRefund, "OnError hears that the refund failed")
}

// WithKeepAlive renews the lease of a part in flight, and of that part
// only: on the fake clock three lease periods pass while the request runs,
// each after a renewal, and the place is still held. The in-process part
// after it is decided before the Redis part, so this also finds the lease
// among the group's grants by its part.
func TestMiddlewareAllKeepAlive(t *testing.T) {
	env := redlimittest.New(t)
	var renewed atomic.Int64
	count := redlimit.WithObserver(func(d redlimit.Decision) {
		if d.Result.Allowed && d.N > 0 && !d.Refund {
			renewed.Add(1) // the grant, then each renewal
		}
	})
	inFlight, err := redlimit.NewConcurrency(env.Client(), 1, time.Minute, env.Options(count)...)
	require.NoError(t, err)
	user, err := inmem.NewFixedWindow(100, time.Hour, inmem.WithClock(env.Now))
	require.NoError(t, err)
	var errs errorLog
	inside, proceed := make(chan struct{}), make(chan struct{})
	h := MiddlewareAll([]Part{
		{Name: "inflight", Limiter: inFlight, Key: Header("X-User")},
		{Name: "user", Limiter: user, Key: Header("X-User")},
	}, WithKeepAlive(time.Millisecond), WithOnError(errs.record))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			close(inside)
			<-proceed
		}
	}))
	done := make(chan int)
	go func() {
		req := httptest.NewRequest(http.MethodGet, "/?hold=1", nil)
		req.Header.Set("X-User", "alice")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		done <- rec.Code
	}()
	<-inside
	// A renewal seen after a step may have read the clock before it: steps
	// of a third of the lease leave it a third to spare.
	for range 9 {
		seen := renewed.Load()
		require.Eventually(t, func() bool { return renewed.Load() > seen }, 10*time.Second, time.Millisecond, "a renewal")
		env.Advance(20 * time.Second)
	}
	require.Equal(t, http.StatusTooManyRequests, send(h, "alice", "").Code, "three lease periods later the renewed lease still holds the place")
	assert.Equal(t, 99, remaining(t, user, "alice"), "the renewals and the denial took nothing from the user part")
	close(proceed)
	require.Equal(t, http.StatusOK, <-done)
	assert.Equal(t, 1, remaining(t, inFlight, "alice"), "the renewed lease ended with the request")
	assert.Equal(t, 99, remaining(t, user, "alice"), "the user part's permit stays counted")
	assert.Empty(t, errs.take(), "every renewal and the release went through")
}

// In shadow mode a denial by one part lets the request through without
// headers, and OnDenied hears which part would have denied it.
func TestMiddlewareAllShadow(t *testing.T) {
	_, pl := newPlanLimits(t)
	var denied []redlimit.Result
	var enforcedAny bool
	h := MiddlewareAll(pl.parts()[:2], WithShadow(),
		WithOnDenied(func(_ *http.Request, res redlimit.Result, enforced bool) {
			denied = append(denied, res)
			enforcedAny = enforcedAny || enforced
		}))(ok)
	for i, user := range []string{"alice", "bob", "carol", "dave"} {
		rec := send(h, user, "acme")
		require.Equal(t, http.StatusOK, rec.Code, "request %d goes through", i)
		assert.Empty(t, rec.Header().Get("RateLimit"), "request %d: clients see no change", i)
	}
	require.Len(t, denied, 1, "the tenant's fourth request would have been denied")
	assert.Equal(t, 1, denied[0].Part, "by the tenant part")
	assert.False(t, enforcedAny)
	assert.Equal(t, 5, remaining(t, pl.user, "dave"), "the would-be denial took nothing from the user part")
}
