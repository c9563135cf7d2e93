package main

import (
	"bufio"
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// roundTrips is a go-redis hook counting round trips: one per command sent
// alone, one per pipeline.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// serverStats is what INFO tells of the work the server did.
type serverStats struct {
	calls      int64 // every command but INFO, those run by scripts included
	scriptCall int64 // EVALSHA and EVAL
	scriptUS   int64 // µs spent in EVALSHA and EVAL
	usedMemory int64
}

func readStats(ctx context.Context, admin *redis.Client) (serverStats, error) {
	var s serverStats
	// One section per INFO: Redis 6.x refuses several in one call.
	var raw strings.Builder
	for _, section := range []string{"commandstats", "memory"} {
		text, err := admin.Info(ctx, section).Result()
		if err != nil {
			return s, fmt.Errorf("INFO %s: %w", section, err)
		}
		raw.WriteString(text)
	}
	sc := bufio.NewScanner(strings.NewReader(raw.String()))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			s.usedMemory, _ = strconv.ParseInt(v, 10, 64)
			continue
		}
		name, fields, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		cmd := strings.TrimPrefix(name, "cmdstat_")
		var calls, usec int64
		for _, kv := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		if cmd == "info" {
			continue
		}
		s.calls += calls
		if cmd == "evalsha" || cmd == "eval" {
			s.scriptCall += calls
			s.scriptUS += usec
		}
	}
	return s, sc.Err()
}

func (s serverStats) sub(o serverStats) serverStats {
	return serverStats{s.calls - o.calls, s.scriptCall - o.scriptCall, s.scriptUS - o.scriptUS, s.usedMemory - o.usedMemory}
}

func (s serverStats) add(o serverStats) serverStats {
	return serverStats{s.calls + o.calls, s.scriptCall + o.scriptCall, s.scriptUS + o.scriptUS, s.usedMemory + o.usedMemory}
}

// sequentialResult is one sequential pass: latency and Go allocations.
type sequentialResult struct {
	ops, errs   int
	allowed     int
	p50, p99    time.Duration
	allocsPerOp float64
	bytesPerOp  float64
}

// latencies is reused across sequential passes so the pass itself allocates nothing.
var latencies = make([]time.Duration, 0, 1<<20)

// sequential runs decide from one goroutine for d and reports the latency
// percentiles and the Go heap allocations per decision.
func sequential(ctx context.Context, decide decider, keys []string, d time.Duration) sequentialResult {
	var r sequentialResult
	lat := latencies[:0]
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	deadline := time.Now().Add(d)
	for i := 0; len(lat) < cap(lat); i++ {
		start := time.Now()
		ok, err := decide(ctx, keys[i%len(keys)])
		end := time.Now()
		lat = append(lat, end.Sub(start))
		if err != nil {
			r.errs++
		} else if ok {
			r.allowed++
		}
		if end.After(deadline) {
			break
		}
	}
	runtime.ReadMemStats(&after)
	r.ops = len(lat)
	r.allocsPerOp = float64(after.Mallocs-before.Mallocs) / float64(r.ops)
	r.bytesPerOp = float64(after.TotalAlloc-before.TotalAlloc) / float64(r.ops)
	slices.Sort(lat)
	r.p50 = lat[len(lat)/2]
	r.p99 = lat[len(lat)*99/100]
	return r
}

// concurrentResult is one pass of many goroutines.
type concurrentResult struct {
	ops, errs, allowed int
	elapsed            time.Duration
	firstErr           error
}

func (r concurrentResult) perSecond() float64 { return float64(r.ops) / r.elapsed.Seconds() }

// concurrent runs decide from g goroutines for d.
func concurrent(ctx context.Context, decide decider, keys []string, g int, d time.Duration) concurrentResult {
	var (
		stop               atomic.Bool
		wg                 sync.WaitGroup
		mu                 sync.Mutex
		r                  concurrentResult
		ready              = make(chan struct{})
		ops, errs, allowed atomic.Int64
	)
	for w := 0; w < g; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			<-ready
			var n, e, a int64
			for i := w * 7919; !stop.Load(); i++ {
				ok, err := decide(ctx, keys[i%len(keys)])
				n++
				if err != nil {
					e++
					mu.Lock()
					if r.firstErr == nil {
						r.firstErr = err
					}
					mu.Unlock()
				} else if ok {
					a++
				}
			}
			ops.Add(n)
			errs.Add(e)
			allowed.Add(a)
		}(w)
	}
	start := time.Now()
	close(ready)
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	r.elapsed = time.Since(start)
	r.ops, r.errs, r.allowed = int(ops.Load()), int(errs.Load()), int(allowed.Load())
	return r
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
