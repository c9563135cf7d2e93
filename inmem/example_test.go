package inmem_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/inmem"
	"github.com/redlimit/redlimit/redlimittest"
)

// A token bucket in process: 3 at once, then one every 200ms.
func ExampleNewTokenBucket() {
	now := time.Unix(1_800_000_000, 0)
	l, err := inmem.NewTokenBucket(3, redlimit.PerSecond(5), inmem.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 4 {
		r, _ := l.Allow(ctx, "client-1")
		fmt.Println(r.Allowed, r.Remaining, r.RetryAfter)
	}
	now = now.Add(200 * time.Millisecond)
	r, _ := l.Allow(ctx, "client-1")
	fmt.Println(r.Allowed, r.Remaining, r.RetryAfter)
	// Output:
	// true 2 0s
	// true 1 0s
	// true 0 0s
	// false 0 200ms
	// true 0 0s
}

// The fallback of a limiter shared by 4 instances holds a quarter of the
// limit, so that the service as a whole stays within it while Redis is out.
func ExampleShare() {
	const limit, instances = 1000, 4
	fmt.Println(inmem.Share(limit, instances), inmem.ShareRate(redlimit.PerSecond(10), instances))
	// A fallback for redlimit.NewSlidingWindow(rdb, limit, time.Minute, time.Second):
	fb, _ := inmem.NewSlidingWindow(inmem.Share(limit, instances), time.Minute, time.Second)
	_ = redlimit.WithFallback(fb)
	// Output: 250 {10 4s}
}

// A Redis limiter whose server fails: its in-process fallback, this
// instance's share of the limit, decides every call meanwhile, on the
// limiter's clock.
func Example_fallback() {
	env, err := redlimittest.Run()
	if err != nil {
		panic(err)
	}
	defer env.Close()
	const limit, instances = 8, 4
	fb, err := inmem.NewFixedWindow(inmem.Share(limit, instances), time.Minute)
	if err != nil {
		panic(err)
	}
	l, err := redlimit.NewFixedWindow(env.Client(), limit, time.Minute, env.Options(
		redlimit.WithFallback(fb),
		redlimit.WithObserver(func(d redlimit.Decision) {
			if d.Fallback {
				fmt.Println("fallback decided; cause:", d.Cause)
			}
		}),
	)...)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()

	env.Server().SetError("LOADING Redis is loading the dataset in memory")
	for range 3 {
		r, err := l.Allow(ctx, "client-1")
		fmt.Println(r.Allowed, r.Limit, r.Remaining, r.RetryAfter, err)
	}
	env.Advance(time.Minute) // the fallback reads the limiter's clock
	r, _ := l.Allow(ctx, "client-1")
	fmt.Println(r.Allowed, r.Limit, r.Remaining)
	// Output:
	// fallback decided; cause: redlimit: fixed_window: LOADING Redis is loading the dataset in memory
	// true 2 1 0s <nil>
	// fallback decided; cause: redlimit: fixed_window: LOADING Redis is loading the dataset in memory
	// true 2 0 0s <nil>
	// fallback decided; cause: redlimit: fixed_window: LOADING Redis is loading the dataset in memory
	// false 2 0 1m0s <nil>
	// fallback decided; cause: redlimit: fixed_window: LOADING Redis is loading the dataset in memory
	// true 2 1
}
