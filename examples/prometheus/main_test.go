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
		{Algorithm: "token_bucket", Result: redlimit.Result{Allowed: true}, Latency: time.Millisecond},
		{Algorithm: "token_bucket", Result: redlimit.Result{Allowed: false}, Latency: time.Millisecond},
		{Algorithm: "token_bucket", Result: redlimit.Result{Allowed: false}, Latency: time.Microsecond, Local: true},
		{Algorithm: "fixed_window", Err: errors.New("redis down"), Latency: 50 * time.Millisecond},
	} {
		m.Observe(d)
	}
	for _, c := range []struct {
		algorithm, outcome string
		want               float64
	}{
		{"token_bucket", "allowed", 1},
		{"token_bucket", "denied", 2},
		{"token_bucket", "error", 0},
		{"fixed_window", "error", 1},
	} {
		got := testutil.ToFloat64(m.decisions.WithLabelValues(c.algorithm, c.outcome))
		if got != c.want {
			t.Errorf("decisions_total{algorithm=%q,outcome=%q} = %v, want %v", c.algorithm, c.outcome, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.latency); n != 3 {
		t.Errorf("latency series: %d, want 3 (token_bucket redis and deny_cache, fixed_window redis)", n)
	}
}
