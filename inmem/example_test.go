package inmem_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/inmem"
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
