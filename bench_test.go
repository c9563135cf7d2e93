package redlimit

// Benchmarks on a real redis-server only (internal/redistest starts one, or
// the benchmarks skip without redis-server on PATH). miniredis is never used
// for timing: its Lua is gopher-lua running in the test process, so its
// figures say nothing about Redis. For side-by-side figures against other
// libraries, and Redis-side costs, run the bench/ program (BENCHMARKS.md).
//
//	go test -run '^$' -bench . -benchtime 2s

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/redistest"
)

// benchKeys are the 1,000 keys of the "allow" workload, built once so that
// the loop builds no strings of its own.
var benchKeys = func() []string {
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench:%04d", i)
	}
	return keys
}()

// benchClient returns a client of the shared real redis-server, with a
// connection per goroutine of the parallel benchmarks.
func benchClient(b *testing.B) *redis.Client {
	b.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: 64})
	b.Cleanup(func() { rdb.Close() })
	return rdb
}

// benchDecisions measures one decision per op: sequentially, and from 64
// goroutines. decide reports an error only when no decision was made.
func benchDecisions(b *testing.B, keys []string, decide func(ctx context.Context, key string) error) {
	ctx := context.Background()
	for i := 0; i < 100; i++ { // load the script, open connections
		if err := decide(ctx, keys[i%len(keys)]); err != nil {
			b.Fatalf("warm-up decision: %v", err)
		}
	}
	b.Run("seq", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if err := decide(ctx, keys[i%len(keys)]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel64", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0))) // 64 goroutines, as in bench/
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				if err := decide(ctx, keys[i%len(keys)]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// tryAcquire turns a denial into success: the benchmarks time decisions,
// allowed or not.
func tryAcquire(l Limiter) func(ctx context.Context, key string) error {
	return func(ctx context.Context, key string) error {
		if err := l.TryAcquire(ctx, key); err != nil && !errors.Is(err, ErrAcquireFailed) {
			return err
		}
		return nil
	}
}

// benchLimiter measures algorithm name at 1,000,000 per minute per key (the
// bench program's "allow" workload: nearly every decision writes).
func benchLimiter(b *testing.B, name string, opts ...Option) {
	for _, alg := range algorithms {
		if alg.name == name {
			l, err := alg.new(benchClient(b), 1_000_000, time.Minute, append([]Option{WithPrefix("bench:" + name + ":")}, opts...)...)
			if err != nil {
				b.Fatal(err)
			}
			benchDecisions(b, benchKeys, tryAcquire(l))
			return
		}
	}
	b.Fatalf("no algorithm %s", name)
}

func BenchmarkFixedWindow(b *testing.B)   { benchLimiter(b, "fixed_window") }
func BenchmarkSlidingWindow(b *testing.B) { benchLimiter(b, "sliding_window") }
func BenchmarkSlidingLog(b *testing.B)    { benchLimiter(b, "sliding_log") }
func BenchmarkLeakyBucket(b *testing.B)   { benchLimiter(b, "leaky_bucket") }
func BenchmarkTokenBucket(b *testing.B)   { benchLimiter(b, "token_bucket") }

// BenchmarkTokenBucketHotDenyCache is the "hot" workload: 100/s on one key,
// nearly every request denied, most of them by the deny cache in process.
func BenchmarkTokenBucketHotDenyCache(b *testing.B) {
	l, err := NewTokenBucket(benchClient(b), 100, PerSecond(100), WithPrefix("bench:hot:"), WithDenyCache(1024))
	if err != nil {
		b.Fatal(err)
	}
	benchDecisions(b, []string{"hot"}, tryAcquire(l))
}

// returnOne is the floor of any limiter that runs one script per decision.
var returnOne = redis.NewScript("return 1")

// BenchmarkCeilingReturnOne is EVALSHA of a script that returns 1, with one
// key: what one round trip through a script costs, with nothing decided.
func BenchmarkCeilingReturnOne(b *testing.B) {
	rdb := benchClient(b)
	benchDecisions(b, benchKeys, func(ctx context.Context, key string) error {
		return returnOne.Run(ctx, rdb, []string{key}).Err()
	})
}

// BenchmarkCeilingPing is one PING: a round trip with no script at all.
func BenchmarkCeilingPing(b *testing.B) {
	rdb := benchClient(b)
	benchDecisions(b, benchKeys, func(ctx context.Context, _ string) error {
		return rdb.Ping(ctx).Err()
	})
}

// BenchmarkAllowAll3Parts is the bench program's "AllowAll 3 parts" row:
// a fixed window and a token bucket on the user's key and a sliding window
// on the tenant's (ten users a tenant), all granted, in one round trip.
func BenchmarkAllowAll3Parts(b *testing.B) {
	rdb := benchClient(b)
	var parts [3]Limiter
	for i, name := range []string{"fixed_window", "sliding_window", "token_bucket"} {
		for _, alg := range algorithms {
			if alg.name == name {
				l, err := alg.new(rdb, 1_000_000, time.Minute, WithPrefix("bench:allowall:"+name+":"))
				if err != nil {
					b.Fatal(err)
				}
				parts[i] = l
			}
		}
	}
	benchDecisions(b, benchKeys, func(ctx context.Context, key string) error {
		_, err := AllowAll(ctx, 1,
			Part{Limiter: parts[0], Key: key},
			Part{Limiter: parts[1], Key: key[:len(key)-1]},
			Part{Limiter: parts[2], Key: key})
		return err
	})
}

// BenchmarkConcurrencyAcquire takes a lease of a second on one of 100 keys
// and leaves it to lapse: the bench program's "concurrency Acquire, leases
// lapse" row.
func BenchmarkConcurrencyAcquire(b *testing.B) {
	c, err := NewConcurrency(benchClient(b), MaxConcurrencyLimit, time.Second, WithPrefix("bench:cc:"))
	if err != nil {
		b.Fatal(err)
	}
	benchDecisions(b, benchKeys[:100], func(ctx context.Context, key string) error {
		_, err := c.Acquire(ctx, key)
		if errors.Is(err, ErrAcquireFailed) {
			return nil
		}
		return err
	})
}
