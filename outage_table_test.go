package redlimit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/inmem"
	"github.com/redlimit/redlimit/internal/faultproxy"
	"github.com/redlimit/redlimit/internal/redistest"
)

// The outage table: what callers see while a real redis-server is killed,
// paused (SIGSTOP), or behind a proxy that drops every reply, for each way
// of building the limiter. It prints the table README "Failure behaviour"
// shows; run it with
//
//	REDLIMIT_OUTAGE_TABLE=1 go test -run TestOutageTable -v -count=1 .
//
// About 90 seconds. Off by default: it measures, the tests elsewhere check.
const (
	outageDeadline   = 300 * time.Millisecond // every call's ctx deadline
	outageLength     = 1500 * time.Millisecond
	outageGoroutines = 8
	outageInstances  = 4                // the fallback's share is limit / instances
	outageLimit      = 400              // per minute, for the whole service
	outagePace       = time.Millisecond // each goroutine starts a call at most this often
)

// outageSetup is one way of building the limiter.
type outageSetup struct {
	name string
	opts func(addr string) *redis.Options
	// build returns the limiter under test on rdb.
	build func(t *testing.T, rdb *redis.Client) redlimit.Limiter
}

func outageSetups() []outageSetup {
	window := func(t *testing.T, rdb redis.Scripter, opts ...redlimit.Option) redlimit.Limiter {
		l, err := redlimit.NewSlidingWindow(rdb, outageLimit, time.Minute, time.Second, opts...)
		require.NoError(t, err)
		return l
	}
	return []outageSetup{
		{
			name: "plain client, breaker off",
			opts: func(addr string) *redis.Options { return &redis.Options{Addr: addr} },
			build: func(t *testing.T, rdb *redis.Client) redlimit.Limiter {
				return window(t, rdb, redlimit.WithoutBreaker())
			},
		},
		{
			name: "ContextTimeoutEnabled only, breaker off",
			opts: func(addr string) *redis.Options { return &redis.Options{Addr: addr, ContextTimeoutEnabled: true} },
			build: func(t *testing.T, rdb *redis.Client) redlimit.Limiter {
				return window(t, rdb, redlimit.WithoutBreaker())
			},
		},
		{
			name: "recommended client, breaker off",
			opts: redlimit.RecommendedOptions,
			build: func(t *testing.T, rdb *redis.Client) redlimit.Limiter {
				return window(t, rdb, redlimit.WithoutBreaker())
			},
		},
		{
			name: "recommended client, breaker (default)",
			opts: redlimit.RecommendedOptions,
			build: func(t *testing.T, rdb *redis.Client) redlimit.Limiter {
				return window(t, rdb)
			},
		},
		{
			name: "recommended client, breaker, fallback",
			opts: redlimit.RecommendedOptions,
			build: func(t *testing.T, rdb *redis.Client) redlimit.Limiter {
				fb, err := inmem.NewSlidingWindow(inmem.Share(outageLimit, outageInstances), time.Minute, time.Second)
				require.NoError(t, err)
				return window(t, rdb, redlimit.WithFallback(fb))
			},
		},
		{
			name: "recommended client, AutoPipeline, breaker",
			opts: redlimit.RecommendedOptions,
			build: func(t *testing.T, rdb *redis.Client) redlimit.Limiter {
				ap, err := rdb.AutoPipeline()
				require.NoError(t, err)
				return window(t, ap)
			},
		},
	}
}

// outageFault breaks and mends one redis-server (reached through proxy).
type outageFault struct {
	name        string
	viaProxy    bool
	break_, fix func(t *testing.T, srv *redistest.Server, proxy *faultproxy.Proxy)
}

func outageFaults() []outageFault {
	return []outageFault{
		{
			name:   "killed",
			break_: func(t *testing.T, srv *redistest.Server, _ *faultproxy.Proxy) { require.NoError(t, srv.Kill()) },
			fix:    func(t *testing.T, srv *redistest.Server, _ *faultproxy.Proxy) { srv.Restart(t) },
		},
		{
			name: "SIGSTOP",
			break_: func(t *testing.T, srv *redistest.Server, _ *faultproxy.Proxy) {
				require.NoError(t, syscall.Kill(srv.Pid(), syscall.SIGSTOP))
			},
			fix: func(t *testing.T, srv *redistest.Server, _ *faultproxy.Proxy) {
				require.NoError(t, syscall.Kill(srv.Pid(), syscall.SIGCONT))
			},
		},
		{
			name:     "proxy drops replies",
			viaProxy: true,
			break_:   func(_ *testing.T, _ *redistest.Server, p *faultproxy.Proxy) { p.SetDrop(true) },
			fix:      func(_ *testing.T, _ *redistest.Server, p *faultproxy.Proxy) { p.SetDrop(false) },
		},
	}
}

// outageCall is one call during the outage.
type outageCall struct {
	latency  time.Duration
	err      error
	allowed  bool
	fallback bool
}

// outageRow is what one setup did under one fault.
type outageRow struct {
	fault, setup               string
	calls                      []outageCall
	recovery                   time.Duration // from the fix to the first call Redis decided; -1: none
	fallbackGrants, shareLimit int
}

func TestOutageTable(t *testing.T) {
	if os.Getenv("REDLIMIT_OUTAGE_TABLE") != "1" {
		t.Skip("set REDLIMIT_OUTAGE_TABLE=1 to measure the outage table (about 45s)")
	}
	srv := redistest.Start(t)
	proxy, err := faultproxy.Start(srv.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })

	var rows []outageRow
	for _, fault := range outageFaults() {
		for _, setup := range outageSetups() {
			rows = append(rows, measureOutage(t, srv, proxy, fault, setup))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| fault | limiter | calls | p50 | p99 | max | over deadline+10ms | failed fast (<1ms) | decided by fallback | recovery after fix |\n")
	fmt.Fprintf(&b, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rows {
		lat := make([]time.Duration, len(r.calls))
		over, fast, fb := 0, 0, 0
		for i, c := range r.calls {
			lat[i] = c.latency
			if c.latency > outageDeadline+10*time.Millisecond {
				over++
			}
			if c.err != nil && c.latency < time.Millisecond {
				fast++
			}
			if c.fallback {
				fb++
			}
		}
		slices.Sort(lat)
		fbText := "–"
		if r.shareLimit > 0 {
			fbText = fmt.Sprintf("%d (%d granted, share %d)", fb, r.fallbackGrants, r.shareLimit)
		}
		rec := "none within 4s"
		if r.recovery >= 0 {
			rec = round(r.recovery).String()
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %v | %v | %v | %d | %d | %s | %s |\n", r.fault, r.setup, len(lat),
			round(pct(lat, 50)), round(pct(lat, 99)), round(lat[len(lat)-1]), over, fast, fbText, rec)
	}
	t.Log(b.String())
}

func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= 100*time.Millisecond:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// measureOutage runs outageGoroutines callers for outageLength of fault,
// then mends it and times how long until Redis decides again.
func measureOutage(t *testing.T, srv *redistest.Server, proxy *faultproxy.Proxy, fault outageFault, setup outageSetup) outageRow {
	addr := srv.Addr()
	if fault.viaProxy {
		addr = proxy.Addr()
	}
	rdb := redis.NewClient(setup.opts(addr))
	defer rdb.Close()
	l := setup.build(t, rdb)
	var mu sync.Mutex
	ctx := context.Background()
	key := fmt.Sprintf("outage:%s:%s", fault.name, setup.name)
	_, err := l.Allow(ctx, key)
	require.NoError(t, err, "%s / %s: before the fault", fault.name, setup.name)

	row := outageRow{fault: fault.name, setup: setup.name, recovery: -1}
	if strings.Contains(setup.name, "fallback") {
		row.shareLimit = inmem.Share(outageLimit, outageInstances)
	}
	fault.break_(t, srv, proxy)
	stop := time.Now().Add(outageLength)
	var wg sync.WaitGroup
	for range outageGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				callCtx, cancel := context.WithTimeout(ctx, outageDeadline)
				start := time.Now()
				r, err := l.Allow(callCtx, key)
				took := time.Since(start)
				cancel()
				// A fallback decision is an allowed or denied Result whose
				// Limit is the share.
				c := outageCall{latency: took, err: err, allowed: err == nil && r.Allowed,
					fallback: err == nil && row.shareLimit > 0 && r.Limit == row.shareLimit}
				mu.Lock()
				row.calls = append(row.calls, c)
				mu.Unlock()
				time.Sleep(time.Until(start.Add(outagePace))) // a steady load, not a spin
			}
		}()
	}
	wg.Wait()
	for _, c := range row.calls {
		if c.fallback && c.allowed {
			row.fallbackGrants++
		}
	}
	fault.fix(t, srv, proxy)
	fixed := time.Now()
	for time.Since(fixed) < 4*time.Second {
		callCtx, cancel := context.WithTimeout(ctx, outageDeadline)
		r, err := l.Allow(callCtx, key)
		cancel()
		if err == nil && (row.shareLimit == 0 || r.Limit != row.shareLimit) {
			row.recovery = time.Since(fixed)
			break
		}
		var unavailable interface{ RetryAfter() time.Duration }
		// Polling a real recovery, which the table measures in real time.
		if errors.As(err, &unavailable) {
			time.Sleep(time.Millisecond)
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
	return row
}
