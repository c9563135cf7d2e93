// Command http serves a small API rate-limited with redlimit/httplimit:
//
//	GET  /hello   5 requests at once, then 1 per second, per client IP
//	POST /upload  1 MB per minute per API key (X-API-Key), counted in bytes
//
//	go run ./examples/http                 # serves on 127.0.0.1:8080
//	curl -i localhost:8080/hello           # RateLimit-Policy, RateLimit, then 429 + Retry-After
//	go run ./examples/http -demo           # serves on a free port, sends a few requests itself, and exits
//
// It talks to the Redis at REDIS_ADDR (host:port) when that is set, and to an
// embedded miniredis otherwise. Behind a reverse proxy, set TRUSTED_PROXIES
// to its networks (comma-separated CIDRs, e.g. 10.0.0.0/8) so that clients
// are told apart by X-Forwarded-For; no header is trusted otherwise.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen on this address (-demo: a free port unless given)")
	demo := flag.Bool("demo", false, "send a few requests to the server, print the answers and exit")
	flag.Parse()
	if *demo && !flagSet("addr") {
		// The demo talks only to itself: any free port does, and 8080 may
		// be taken.
		*addr = "127.0.0.1:0"
	}
	if err := run(*addr, *demo); err != nil {
		slog.Error("http example", "err", err)
		os.Exit(1)
	}
}

// flagSet reports whether the named flag was given on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func run(addr string, demo bool) error {
	redisAddr := os.Getenv("REDIS_ADDR")
	if redisAddr == "" {
		m, err := miniredis.Run()
		if err != nil {
			return err
		}
		defer m.Close()
		redisAddr = m.Addr()
		slog.Info("REDIS_ADDR not set: using an embedded miniredis", "addr", redisAddr)
	}
	// The recommended client fails fast: a slow Redis must not hold
	// requests for a long ReadTimeout; each decision gets 50ms below.
	rdb := redis.NewClient(redlimit.ClientOptions(redisAddr))
	defer rdb.Close()

	trusted, err := parsePrefixes(os.Getenv("TRUSTED_PROXIES"))
	if err != nil {
		return err
	}
	api, err := newAPI(rdb, trusted, 50*time.Millisecond)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	fmt.Printf("serving on http://%s\n", ln.Addr())

	if demo {
		err = runDemo("http://" + ln.Addr().String())
	} else {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		<-ctx.Done()
		stop()
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(err, srv.Shutdown(shutdown))
}

// newAPI returns the API's handler: each route with its own limiter and
// middleware. decide bounds each rate limit decision: a slow Redis costs a
// request at most that much before it fails open.
func newAPI(rdb redis.Scripter, trusted []netip.Prefix, decide time.Duration) (http.Handler, error) {
	timeout := httplimit.WithTimeout(decide)
	logErrors := httplimit.WithOnError(func(r *http.Request, err error) {
		// When Redis fails, requests go on (fail open); someone should
		// still know.
		slog.Warn("rate limiting", "path", r.URL.Path, "err", err)
	})
	// A missing API key is the client's fault: 401, not the default 500.
	askForKey := httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
		if errors.Is(err, httplimit.ErrMissingKey) {
			http.Error(w, "X-API-Key required", http.StatusUnauthorized)
			return
		}
		httplimit.DefaultErrorHandler(w, r, err)
	})

	hello, err := redlimit.NewTokenBucket(rdb, 5, redlimit.PerSecond(1), redlimit.WithPrefix("api:hello:"))
	if err != nil {
		return nil, err
	}
	uploads, err := redlimit.NewSlidingWindow(rdb, 1<<20, time.Minute, time.Second, redlimit.WithPrefix("api:upload:"))
	if err != nil {
		return nil, err
	}

	mux := http.NewServeMux()
	mux.Handle("GET /hello", httplimit.Middleware(hello,
		httplimit.WithKeyFunc(httplimit.ClientIP(trusted...)),
		httplimit.WithPolicyName("hello"),
		httplimit.WithLegacyHeaders(),
		timeout,
		logErrors,
	)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	mux.Handle("POST /upload", httplimit.Middleware(uploads,
		httplimit.WithKeyFunc(httplimit.Header("X-API-Key")),
		askForKey,
		httplimit.WithCost(httplimit.BodyCost(1<<20)), // a chunked body is charged the 1 MB it may send
		httplimit.WithPolicyName("upload"),
		httplimit.WithQuotaUnit("content-bytes"),
		timeout,
		logErrors,
	)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "stored %d bytes\n", n)
	})))
	return mux, nil
}

func parsePrefixes(list string) ([]netip.Prefix, error) {
	var prefixes []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("TRUSTED_PROXIES: %w", err)
		}
		prefixes = append(prefixes, p)
	}
	return prefixes, nil
}

// runDemo sends requests to the API and prints what came back.
func runDemo(base string) error {
	client := &http.Client{Timeout: 5 * time.Second}
	show := func(req *http.Request) error {
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Printf("%s %s -> %d  RateLimit: %s  Retry-After: %q  %s\n", req.Method, req.URL.Path, resp.StatusCode,
			resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After"), strings.TrimSpace(string(body)))
		return nil
	}
	for range 6 {
		req, _ := http.NewRequest(http.MethodGet, base+"/hello", nil)
		if err := show(req); err != nil {
			return err
		}
	}
	for _, size := range []int{700_000, 700_000, 2 << 20} {
		req, _ := http.NewRequest(http.MethodPost, base+"/upload", strings.NewReader(strings.Repeat("x", size)))
		req.Header.Set("X-API-Key", "demo-key")
		if err := show(req); err != nil {
			return err
		}
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/upload", strings.NewReader("no key"))
	return show(req)
}
