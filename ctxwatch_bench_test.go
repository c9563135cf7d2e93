package redlimit

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkCtxWatch measures a decision on clients with and without
// ContextTimeoutEnabled, with the ctx a service passes: a request's
// (cancellable, no deadline), one with a distant deadline, and one with a
// deadline of 50ms made per call (its own allocations included). Without the option
// redlimit watches the ctx itself (engine.runWithin). p50-ns is the median
// call, sequential, on the shared real redis-server.
//
//	go test -run '^$' -bench CtxWatch -benchtime 20000x
func BenchmarkCtxWatch(b *testing.B) {
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	withDeadline, cancel2 := context.WithTimeout(context.Background(), time.Hour)
	defer cancel2()
	for _, client := range []struct {
		name    string
		enabled bool
	}{{"ContextTimeoutEnabled", true}, {"without_option", false}} {
		for _, c := range []struct {
			name string
			ctx  context.Context // nil: a ctx with a 50ms deadline per call
		}{{"background", context.Background()}, {"cancellable", cancellable}, {"deadline_1h", withDeadline}, {"deadline_50ms", nil}} {
			b.Run(client.name+"/"+c.name, func(b *testing.B) {
				rdb := redis.NewClient(&redis.Options{Addr: benchClient(b).Options().Addr, ContextTimeoutEnabled: client.enabled})
				b.Cleanup(func() { rdb.Close() })
				l, err := NewFixedWindow(rdb, 1_000_000_000, time.Minute, WithPrefix("bench:ctxwatch:"))
				if err != nil {
					b.Fatal(err)
				}
				latencies := make([]time.Duration, 0, b.N)
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					ctx, cancel := c.ctx, context.CancelFunc(nil)
					start := time.Now()
					if ctx == nil {
						ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
					}
					if _, err := l.AllowN(ctx, benchKeys[i%len(benchKeys)], 1); err != nil {
						b.Fatal(err)
					}
					latencies = append(latencies, time.Since(start))
					if cancel != nil {
						cancel()
					}
				}
				slices.Sort(latencies)
				b.ReportMetric(float64(latencies[len(latencies)/2].Nanoseconds()), "p50-ns")
			})
		}
	}
}
