// Command prometheus exports redlimit decisions as Prometheus metrics,
// from redlimit.WithObserver: decisions counted by limiter (its WithName
// name), algorithm, outcome (allowed, denied, error) and source (Redis, the
// in-process deny cache, or the WithFallback limiter while Redis could not
// decide), and their latency as a histogram per limiter and source.
//
//	cd examples/prometheus && go run .            # serves http://127.0.0.1:2112/metrics
//	cd examples/prometheus && go run . -once      # prints the metrics once and exits
//
// It runs five named limiters, one per algorithm, against some generated
// traffic, on the Redis at REDIS_ADDR when that is set and on an embedded
// miniredis otherwise (with -once, the miniredis also goes down for a
// moment, so that errors and fallback decisions show). This directory is
// its own Go module, so that redlimit itself does not depend on the
// Prometheus client.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/inmem"
)

// Metrics turns redlimit decisions into Prometheus metrics. Its Observe
// method is the observer: pass redlimit.WithObserver(m.Observe) to every
// limiter, and name each with redlimit.WithName. Keys are not a label:
// their number is unbounded.
type Metrics struct {
	decisions *prometheus.CounterVec
	latency   *prometheus.HistogramVec
}

// NewMetrics registers the metrics with reg:
//
//	redlimit_decisions_total{limiter, algorithm, outcome="allowed"|"denied"|"error", source}
//	redlimit_decision_duration_seconds{limiter, algorithm, source="redis"|"deny_cache"|"fallback"}
//
// Watch source="fallback": it counts the decisions made in process because
// Redis could not make them, each instance alone with its share of the
// limit.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "redlimit",
			Name:      "decisions_total",
			Help:      "Rate limit calls by limiter, algorithm, outcome (allowed, denied, or error: no decision) and source (redis, deny_cache, fallback).",
		}, []string{"limiter", "algorithm", "outcome", "source"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "redlimit",
			Name:      "decision_duration_seconds",
			Help:      "Time a rate limit call took, by limiter, algorithm and who answered: Redis, the in-process deny cache, or the fallback.",
			// From a deny-cache hit (about a microsecond) to a slow round trip.
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12),
		}, []string{"limiter", "algorithm", "source"}),
	}
	reg.MustRegister(m.decisions, m.latency)
	return m
}

// Observe records one decision. It is safe for concurrent use, as
// WithObserver requires.
func (m *Metrics) Observe(d redlimit.Decision) {
	outcome := "allowed"
	switch {
	case d.Err != nil:
		outcome = "error"
	case !d.Result.Allowed:
		outcome = "denied"
	}
	source := "redis"
	switch {
	case d.Fallback:
		source = "fallback"
	case d.Local:
		source = "deny_cache"
	}
	m.decisions.WithLabelValues(d.Limiter, d.Algorithm, outcome, source).Inc()
	m.latency.WithLabelValues(d.Limiter, d.Algorithm, source).Observe(d.Latency.Seconds())
}

func main() {
	addr := flag.String("addr", "127.0.0.1:2112", "serve /metrics on this address")
	once := flag.Bool("once", false, "generate some traffic, print the redlimit metrics and exit")
	flag.Parse()

	var mr *miniredis.Miniredis
	redisAddr := os.Getenv("REDIS_ADDR")
	if redisAddr == "" {
		var err error
		mr, err = miniredis.Run()
		if err != nil {
			log.Fatal(err)
		}
		defer mr.Close()
		redisAddr = mr.Addr()
		log.Println("REDIS_ADDR not set: using an embedded miniredis at", redisAddr)
	}
	rdb := redis.NewClient(redlimit.ClientOptions(redisAddr))
	defer rdb.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	metrics := NewMetrics(reg)
	limiters, err := newLimiters(rdb, redlimit.WithObserver(metrics.Observe))
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))

	if *once {
		traffic(context.Background(), limiters, 300, "client")
		if mr != nil {
			// A short outage: outcome="error", and source="fallback" for
			// the limiter that has one. New clients: the deny cache would
			// answer the known ones' repeated denials without Redis.
			mr.Close()
			traffic(context.Background(), limiters, 2, "newcomer")
			if err := mr.Restart(); err != nil {
				log.Fatal(err)
			}
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		printRedlimitLines(rec.Body.String())
		return
	}

	go func() {
		for {
			traffic(context.Background(), limiters, 50, "client")
			time.Sleep(time.Second)
		}
	}()
	log.Printf("serving http://%s/metrics", *addr)
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

// newLimiters returns five named limiters, one of each algorithm, all at
// about 10 requests per second, with opts. "feed" has a deny cache (see
// source="deny_cache") and an in-process fallback (source="fallback"), and
// turns its breaker off so that every call of the demo's outage reaches
// the fallback through a failed round trip.
func newLimiters(rdb redis.Scripter, opts ...redlimit.Option) ([]redlimit.Limiter, error) {
	named := func(name string, more ...redlimit.Option) []redlimit.Option {
		return append(append([]redlimit.Option{redlimit.WithName(name)}, opts...), more...)
	}
	fallback, err := inmem.NewTokenBucket(inmem.Share(10, 2), inmem.ShareRate(redlimit.PerSecond(10), 2))
	if err != nil {
		return nil, err
	}
	var limiters []redlimit.Limiter
	for _, build := range []func() (redlimit.Limiter, error){
		func() (redlimit.Limiter, error) {
			return redlimit.NewFixedWindow(rdb, 10, time.Second, named("login")...)
		},
		func() (redlimit.Limiter, error) {
			return redlimit.NewSlidingWindow(rdb, 10, time.Second, 100*time.Millisecond, named("search")...)
		},
		func() (redlimit.Limiter, error) {
			return redlimit.NewSlidingLog(rdb, 100*time.Millisecond, []redlimit.Strategy{
				{Limit: 10, Window: time.Second}, {Limit: 300, Window: time.Minute},
			}, named("api")...)
		},
		func() (redlimit.Limiter, error) {
			return redlimit.NewLeakyBucket(rdb, 10, redlimit.PerSecond(10), named("upload")...)
		},
		func() (redlimit.Limiter, error) {
			return redlimit.NewTokenBucket(rdb, 10, redlimit.PerSecond(10),
				named("feed", redlimit.WithDenyCache(1024), redlimit.WithFallback(fallback), redlimit.WithoutBreaker())...)
		},
	} {
		l, err := build()
		if err != nil {
			return nil, err
		}
		limiters = append(limiters, l)
	}
	return limiters, nil
}

// traffic sends n requests from a few clients, named who:0, who:1 and
// who:2, to every limiter, as fast as it can: most are denied.
func traffic(ctx context.Context, limiters []redlimit.Limiter, n int, who string) {
	for i := range n {
		key := fmt.Sprintf("%s:%d", who, i%3)
		for _, l := range limiters {
			ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			l.TryAcquire(ctx, key) // the observer sees the outcome
			cancel()
		}
	}
}

// printRedlimitLines prints the samples of the redlimit_ metrics, without
// the histogram buckets.
func printRedlimitLines(exposition string) {
	sc := bufio.NewScanner(strings.NewReader(exposition))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "redlimit_") && !strings.Contains(line, "_bucket{") {
			fmt.Println(line)
		}
	}
}
