// Command quickstart shows redlimit in a few lines: a token bucket that lets
// a user burst 5 requests and then 2 per second.
//
//	go run ./examples/quickstart
//
// It talks to the Redis at REDIS_ADDR (host:port) when that is set, and to an
// embedded miniredis otherwise, so it runs with nothing but Go installed.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

func main() {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		m, err := miniredis.Run()
		if err != nil {
			log.Fatal(err)
		}
		defer m.Close()
		addr = m.Addr()
		fmt.Println("REDIS_ADDR not set: using an embedded miniredis at", addr)
	}
	// The recommended client: fails fast, never retries a decision.
	rdb := redis.NewClient(redlimit.ClientOptions(addr))
	defer rdb.Close()

	limiter, err := redlimit.NewTokenBucket(rdb, 5, redlimit.PerSecond(2))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	key := fmt.Sprintf("quickstart:%d", time.Now().UnixNano()) // fresh each run
	defer limiter.Reset(ctx, key)

	for i := 1; i <= 8; i++ {
		ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := limiter.TryAcquire(ctx, key)
		cancel()
		switch {
		case err == nil:
			fmt.Printf("request %d: allowed\n", i)
		case errors.Is(err, redlimit.ErrAcquireFailed):
			fmt.Printf("request %d: denied (429)\n", i)
		default:
			// No decision: Redis is unreachable or slow. Fail open or closed.
			log.Fatalf("request %d: no decision: %v", i, err)
		}
	}

	r, err := limiter.Allow(ctx, key)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("one more: allowed=%t remaining=%d retry after %v, full again after %v\n",
		r.Allowed, r.Remaining, r.RetryAfter.Round(time.Millisecond), r.ResetAfter.Round(time.Millisecond))

	fmt.Println("waiting for a permit...")
	if err := redlimit.Wait(ctx, limiter, key); err != nil {
		log.Fatal(err)
	}
	fmt.Println("allowed after waiting")
}
