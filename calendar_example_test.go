package redlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redlimit/redlimit"
)

// A monthly plan of 10,000 requests, billed on the 15th in the customer's
// time zone: the quota resets at midnight of the 15th in New York.
func ExampleNewCalendarWindow() {
	rdb, done := newRedis()
	defer done()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		panic(err) // no zone data: import _ "time/tzdata"
	}
	now := time.Date(2026, 11, 14, 23, 0, 0, 0, ny) // for exact output; services leave WithClock out
	quota, err := redlimit.NewCalendarWindow(rdb, 10_000, redlimit.Monthly(ny, 15),
		redlimit.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()

	r, _ := quota.AllowN(ctx, "customer:42", 9_990)
	fmt.Println(r.Allowed, r.Remaining, "resets in", r.ResetAfter)
	r, _ = quota.AllowN(ctx, "customer:42", 20)
	fmt.Println(r.Allowed, "retry in", r.RetryAfter)

	now = now.Add(time.Hour) // midnight: the 15th begins in New York
	r, _ = quota.AllowN(ctx, "customer:42", 20)
	_, end := quota.Period().Bounds(now)
	fmt.Println(r.Allowed, r.Remaining, "until", end.Format("2006-01-02 15:04 MST"))
	// Output:
	// true 10 resets in 1h0m0s
	// false retry in 1h0m0s
	// true 9980 until 2026-12-15 00:00 EST
}
