package redlimit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit"
)

// One key every instance shares, hot enough to put Redis's one core for
// it in the way: a busy key takes its permits 64 at a time and hands them
// out in process, never past the limit. Close gives back what is held
// when the instance stops.
func ExampleWithReservation() {
	rdb, done := newRedis()
	defer done()
	ctx := context.Background()
	global, err := redlimit.NewFixedWindow(rdb, 10_000, time.Minute,
		redlimit.WithReservation(64, 100*time.Millisecond), redlimit.WithClock(exampleClock))
	if err != nil {
		panic(err)
	}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if global.TryAcquire(ctx, "api") == nil {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	fmt.Println("allowed", allowed.Load())

	if err := global.Close(ctx); err != nil { // on shutdown: give back what is held
		fmt.Println("close:", err)
	}
	r, _ := global.AllowN(ctx, "api", 0)
	fmt.Println("left", r.Remaining)
	// Output:
	// allowed 3200
	// left 6800
}
