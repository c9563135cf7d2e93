package redlimit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// newRedis returns a client of an embedded miniredis, so that the examples
// run anywhere; a service passes its own *redis.Client or *redis.ClusterClient.
func newRedis() (*redis.Client, func()) {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	o := redlimit.ClientOptions(m.Addr())
	// The recommended client fails fast against a Redis that does not
	// answer; an example run on a machine busy with other work waits
	// rather than print an error.
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = time.Minute, time.Minute, time.Minute, time.Minute
	rdb := redis.NewClient(o)
	return rdb, func() { rdb.Close(); m.Close() }
}

// A fixed clock makes the examples' output exact; services leave it out and
// share the Redis server's clock.
var exampleNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func exampleClock() time.Time { return exampleNow }

func ExampleLimiter_tryAcquire() {
	rdb, done := newRedis()
	defer done()
	limiter, err := redlimit.NewTokenBucket(rdb, 2, redlimit.PerSecond(1), redlimit.WithClock(exampleClock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		err := limiter.TryAcquire(ctx, "user:42")
		switch {
		case err == nil:
			fmt.Println(i, "allowed")
		case errors.Is(err, redlimit.ErrAcquireFailed):
			fmt.Println(i, "denied")
		default:
			fmt.Println(i, "no decision:", err) // Redis down: fail open or closed
		}
	}
	// Output:
	// 1 allowed
	// 2 allowed
	// 3 denied
}

func ExampleLimiter_allowN() {
	rdb, done := newRedis()
	defer done()
	// 10 units of upload per minute, in buckets of one second.
	limiter, err := redlimit.NewSlidingWindow(rdb, 10, time.Minute, time.Second, redlimit.WithClock(exampleClock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, n := range []int{4, 4, 4, 0, 11} {
		r, err := limiter.AllowN(ctx, "upload:alice", n)
		if err != nil {
			panic(err)
		}
		retry := r.RetryAfter.String()
		if r.RetryAfter == redlimit.Never {
			retry = "Never" // more than the limit: no wait helps
		}
		fmt.Printf("n=%d allowed=%t remaining=%d retry=%s reset=%v\n", n, r.Allowed, r.Remaining, retry, r.ResetAfter)
	}
	// Output:
	// n=4 allowed=true remaining=6 retry=0s reset=1m0s
	// n=4 allowed=true remaining=2 retry=0s reset=1m0s
	// n=4 allowed=false remaining=2 retry=1m0s reset=1m0s
	// n=0 allowed=true remaining=2 retry=0s reset=1m0s
	// n=11 allowed=false remaining=2 retry=Never reset=1m0s
}

func ExampleViolationStrategyError() {
	rdb, done := newRedis()
	defer done()
	limiter, err := redlimit.NewSlidingLog(rdb, time.Second, []redlimit.Strategy{
		{Limit: 2, Window: time.Second},
		{Limit: 100, Window: time.Hour},
	}, redlimit.WithClock(exampleClock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		err := limiter.TryAcquire(ctx, "api:bob")
		var violation *redlimit.ViolationStrategyError
		if errors.As(err, &violation) {
			fmt.Printf("%d denied by %d per %v, retry after %v\n", i, violation.Limit, violation.Window, violation.RetryAfter)
			continue
		}
		if err != nil {
			panic(err)
		}
		fmt.Println(i, "allowed")
	}
	// Output:
	// 1 allowed
	// 2 allowed
	// 3 denied by 2 per 1s, retry after 1s
}

func ExampleWait() {
	rdb, done := newRedis()
	defer done()
	// Wait sleeps in real time. A clock that runs from a fixed start keeps
	// the example's buckets where they are on every run; a service leaves
	// WithClock out.
	start := time.Now()
	clock := func() time.Time { return exampleNow.Add(time.Since(start)) }
	// One job at a time, 50 a second.
	limiter, err := redlimit.NewLeakyBucket(rdb, 1, redlimit.PerSecond(50), redlimit.WithClock(clock))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 1; i <= 3; i++ {
		if err := redlimit.Wait(ctx, limiter, "jobs"); err != nil {
			panic(err)
		}
		fmt.Println("job", i)
	}
	fmt.Println("the 2nd and 3rd waited 20ms each:", time.Since(start) >= 40*time.Millisecond)

	// Two permits never fit a bucket of one: WaitN returns at once.
	err = redlimit.WaitN(ctx, limiter, "jobs", 2)
	fmt.Println("2 at once:", errors.Is(err, redlimit.ErrAcquireFailed))
	// Output:
	// job 1
	// job 2
	// job 3
	// the 2nd and 3rd waited 20ms each: true
	// 2 at once: true
}
