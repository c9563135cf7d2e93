package main

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/redlimit/redlimit"
)

func TestMetricsObserve(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	for _, d := range []redlimit.Decision{
		{Limiter: "api", Algorithm: "token_bucket", Result: redlimit.Result{Allowed: true}, Latency: time.Millisecond},
		{Limiter: "api", Algorithm: "token_bucket", Result: redlimit.Result{Allowed: false}, Latency: time.Millisecond},
		{Limiter: "api", Algorithm: "token_bucket", Result: redlimit.Result{Allowed: false}, Latency: time.Microsecond, Local: true},
		{Limiter: "api", Algorithm: "token_bucket", Result: redlimit.Result{Allowed: true}, Latency: time.Microsecond, Fallback: true},
		{Limiter: "login", Algorithm: "token_bucket", Result: redlimit.Result{Allowed: true}, Latency: time.Millisecond},
		{Limiter: "login", Algorithm: "fixed_window", Err: errors.New("redis down"), Latency: 50 * time.Millisecond},
	} {
		m.Observe(d)
	}
	for _, c := range []struct {
		limiter, algorithm, outcome, source string
		want                                float64
	}{
		{"api", "token_bucket", "allowed", "redis", 1},
		{"api", "token_bucket", "denied", "redis", 1},
		{"api", "token_bucket", "denied", "deny_cache", 1},
		{"api", "token_bucket", "allowed", "fallback", 1},
		{"login", "token_bucket", "allowed", "redis", 1},
		{"api", "token_bucket", "error", "redis", 0},
		{"login", "fixed_window", "error", "redis", 1},
	} {
		got := testutil.ToFloat64(m.decisions.WithLabelValues(c.limiter, c.algorithm, c.outcome, c.source))
		if got != c.want {
			t.Errorf("decisions_total{limiter=%q,algorithm=%q,outcome=%q,source=%q} = %v, want %v", c.limiter, c.algorithm, c.outcome, c.source, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.latency); n != 5 {
		t.Errorf("latency series: %d, want 5 (api: redis, deny_cache, fallback; login: token_bucket and fixed_window from redis)", n)
	}
}
