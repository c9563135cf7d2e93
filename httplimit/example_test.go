package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/redlimittest"
)

// newRedis returns an embedded miniredis with a fake clock, so that the
// examples' output is exact. A service passes its own *redis.Client (or
// *redis.ClusterClient) and no clock options.
func newRedis() *redlimittest.Env {
	env, err := redlimittest.Run()
	if err != nil {
		panic(err)
	}
	return env
}

func ExampleMiddleware() {
	env := newRedis()
	defer env.Close()

	// 2 requests per minute per client IP.
	limiter, err := redlimit.NewFixedWindow(env.Client(), 2, time.Minute, env.Options()...)
	if err != nil {
		panic(err)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})
	mux := http.NewServeMux()
	mux.Handle("/", httplimit.Middleware(limiter)(hello))

	for i := 0; i < 3; i++ {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Printf("%d RateLimit-Policy: %s RateLimit: %s Retry-After: %q\n",
			rec.Code, rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit"), rec.Header().Get("Retry-After"))
	}
	// Output:
	// 200 RateLimit-Policy: "default";q=2;w=60 RateLimit: "default";r=1;t=60 Retry-After: ""
	// 200 RateLimit-Policy: "default";q=2;w=60 RateLimit: "default";r=0;t=60 Retry-After: ""
	// 429 RateLimit-Policy: "default";q=2;w=60 RateLimit: "default";r=0;t=60 Retry-After: "60"
}

// Behind a load balancer every connection comes from the balancer: trust
// its network, and the client is read from X-Forwarded-For, right to left.
func ExampleClientIP() {
	key := httplimit.ClientIP(netip.MustParsePrefix("10.0.0.0/8"))

	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "10.0.0.5:41000" // the load balancer
	// The client sent the first entry itself; the balancer appended the
	// address it saw.
	req.Header.Set("X-Forwarded-For", "1.2.3.4, 203.0.113.7")
	fmt.Println(key(req))

	req.RemoteAddr = "198.51.100.1:5000" // not a trusted proxy: headers ignored
	fmt.Println(key(req))
	// Output:
	// 203.0.113.7 <nil>
	// 198.51.100.1 <nil>
}

// An upload limit in bytes: each request costs its Content-Length, and a
// body of unknown length (chunked) costs the stated maximum, 100 KB here.
// A body larger than the whole budget can never pass and is answered 413.
func ExampleBodyCost() {
	env := newRedis()
	defer env.Close()

	// 1 MB per hour per API key, refilled continuously.
	limiter, err := redlimit.NewTokenBucket(env.Client(), 1_000_000, redlimit.PerHour(1_000_000), env.Options()...)
	if err != nil {
		panic(err)
	}
	upload := httplimit.Middleware(limiter,
		httplimit.WithKeyFunc(httplimit.Header("X-API-Key")),
		httplimit.WithCost(httplimit.BodyCost(100_000)),
		httplimit.WithQuotaUnit("content-bytes"),
	)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	send := func(name string, body io.Reader) {
		req := httptest.NewRequest(http.MethodPost, "/upload", body)
		req.Header.Set("X-API-Key", "k-123")
		rec := httptest.NewRecorder()
		upload.ServeHTTP(rec, req)
		fmt.Println(name, rec.Code, rec.Header().Get("RateLimit"))
	}
	send("600 KB", strings.NewReader(strings.Repeat("x", 600_000)))
	send("chunked", struct{ io.Reader }{strings.NewReader("a body of unknown length")})
	send("600 KB", strings.NewReader(strings.Repeat("x", 600_000)))
	send("2 MB", strings.NewReader(strings.Repeat("x", 2_000_000)))
	// Output:
	// 600 KB 200 "default";r=400000;t=2160
	// chunked 200 "default";r=300000;t=2520
	// 600 KB 429 "default";r=300000;t=2520
	// 2 MB 413 "default";r=300000;t=2520
}

// Two limits on one route, a burst limit and an hourly one: each
// middleware adds its policy to the RateLimit lists, so the client sees
// both.
func ExampleWithPolicyName() {
	env := newRedis()
	defer env.Close()

	perMinute, err := redlimit.NewFixedWindow(env.Client(), 5, time.Minute, env.Options()...)
	if err != nil {
		panic(err)
	}
	perHour, err := redlimit.NewFixedWindow(env.Client(), 100, time.Hour, env.Options()...)
	if err != nil {
		panic(err)
	}
	h := httplimit.Middleware(perMinute, httplimit.WithPolicyName("minute"))(
		httplimit.Middleware(perHour, httplimit.WithPolicyName("hour"))(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Println("RateLimit-Policy:", rec.Header().Get("RateLimit-Policy"))
	fmt.Println("RateLimit:", rec.Header().Get("RateLimit"))
	// Output:
	// RateLimit-Policy: "minute";q=5;w=60, "hour";q=100;w=3600
	// RateLimit: "minute";r=4;t=60, "hour";r=99;t=3600
}

// Shadow mode: a new limit of 2 per minute is decided and counted, the
// observer and OnDenied hear of each would-be denial, and every request
// still gets through. Count decisions with Shadow set and Allowed false:
// they are what enforcing the limit would refuse.
func ExampleWithShadow() {
	env := newRedis()
	defer env.Close()

	var wouldDeny int
	limiter, err := redlimit.NewFixedWindow(env.Client(), 2, time.Minute, env.Options(
		redlimit.WithObserver(func(d redlimit.Decision) {
			if d.Shadow && d.Err == nil && !d.Result.Allowed {
				wouldDeny++ // a metric: redlimit_decisions_total{shadow="true",allowed="false"}
			}
		}))...)
	if err != nil {
		panic(err)
	}
	h := httplimit.Middleware(limiter,
		httplimit.WithShadow(),
		httplimit.WithOnDenied(func(r *http.Request, res redlimit.Result, enforced bool) {
			fmt.Println("denied, enforced:", enforced)
		}),
	)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	for range 3 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Println(rec.Code)
	}
	fmt.Println("would have denied:", wouldDeny)
	// Output:
	// 200
	// 200
	// denied, enforced: false
	// 200
	// would have denied: 1
}

// Without Redis, requests go through (fail open) unless WithFailClosed asks
// for 503. Either way WithOnError hears of it.
func ExampleWithFailClosed() {
	env := newRedis()
	defer env.Close()
	limiter, err := redlimit.NewTokenBucket(env.Client(), 10, redlimit.PerSecond(10), env.Options()...)
	if err != nil {
		panic(err)
	}
	logError := httplimit.WithOnError(func(r *http.Request, err error) {
		fmt.Println("told: no decision:", errors.Is(err, httplimit.ErrNoDecision))
	})
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	open := httplimit.Middleware(limiter, logError)(ok)
	closed := httplimit.Middleware(limiter, logError, httplimit.WithFailClosed())(ok)

	env.Server().SetError("ERR simulated outage")
	for _, h := range []http.Handler{open, closed} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Println(rec.Code)
	}
	// Output:
	// told: no decision: true
	// 200
	// told: no decision: true
	// 503
}

// A plan of three limits decided as one: 3 requests a minute per user, 4
// a minute per tenant, 1 in flight per user. A request is granted by every
// part or takes nothing from any: the tenant's denial below costs bob
// nothing, and names the tenant.
func ExampleMiddlewareAll() {
	env := newRedis()
	defer env.Close()

	perUser, err := redlimit.NewFixedWindow(env.Client(), 3, time.Minute, env.Options(redlimit.WithPrefix("user:"))...)
	if err != nil {
		panic(err)
	}
	perTenant, err := redlimit.NewFixedWindow(env.Client(), 4, time.Minute, env.Options(redlimit.WithPrefix("tenant:"))...)
	if err != nil {
		panic(err)
	}
	inFlight, err := redlimit.NewConcurrency(env.Client(), 1, time.Minute, env.Options(redlimit.WithPrefix("flight:"))...)
	if err != nil {
		panic(err)
	}
	mw := httplimit.MiddlewareAll([]httplimit.Part{
		{Name: "user", Limiter: perUser, Key: httplimit.Header("X-User")},
		{Name: "tenant", Limiter: perTenant, Key: httplimit.Header("X-Tenant")},
		{Name: "inflight", Limiter: inFlight, Key: httplimit.Header("X-User")},
	})
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	for _, user := range []string{"alice", "alice", "alice", "alice", "bob", "bob"} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-User", user)
		req.Header.Set("X-Tenant", "acme")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Printf("%s %d RateLimit: %s\n", user, rec.Code, rec.Header().Get("RateLimit"))
	}
	left, _ := perUser.AllowN(context.Background(), "bob", 0)
	fmt.Println("bob's permits left:", left.Remaining)
	// Output:
	// alice 200 RateLimit: "inflight";r=0;t=60
	// alice 200 RateLimit: "inflight";r=0;t=60
	// alice 200 RateLimit: "user";r=0;t=60
	// alice 429 RateLimit: "user";r=0;t=60
	// bob 200 RateLimit: "tenant";r=0;t=60
	// bob 429 RateLimit: "tenant";r=0;t=60
	// bob's permits left: 2
}
