package redlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redlimit/redlimit"
)

// An LLM budget: take the most a completion can cost up front, then give
// back what it did not use. A retried refund gives nothing more.
func ExampleGrant_Refund() {
	rdb, done := newRedis()
	defer done()
	// 10,000 tokens an hour per tenant.
	budget, err := redlimit.NewFixedWindow(rdb, 10_000, time.Hour, redlimit.WithClock(exampleClock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	const maxTokens = 4000
	r, err := budget.AllowN(ctx, "tenant:acme", maxTokens)
	if err != nil || !r.Allowed {
		fmt.Println("no budget")
		return
	}
	fmt.Println("reserved", r.Grant.N(), "left", r.Remaining)

	used := 1250 // what the completion really cost
	if err := r.Grant.Refund(ctx, maxTokens-used); err != nil {
		fmt.Println("refund failed: the reservation stays used:", err)
	}
	_ = r.Grant.Refund(ctx, maxTokens-used) // a retry after a lost reply gives nothing more

	now, _ := budget.AllowN(ctx, "tenant:acme", 0)
	fmt.Println("left", now.Remaining)
	// Output:
	// reserved 4000 left 6000
	// left 8750
}

// Several limits as one decision: per user, per tenant, and in flight. A
// call is granted by all of them or taken from none.
func ExampleAllowAll() {
	rdb, done := newRedis()
	defer done()
	clock := redlimit.WithClock(exampleClock)
	perUser, _ := redlimit.NewFixedWindow(rdb, 100, time.Minute, clock)
	perTenant, _ := redlimit.NewFixedWindow(rdb, 2, 24*time.Hour, clock)
	inFlight, _ := redlimit.NewConcurrency(rdb, 5, 30*time.Second, clock)
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		r, err := redlimit.AllowAll(ctx, 1,
			redlimit.Part{Limiter: perUser, Key: "user:42"},
			redlimit.Part{Limiter: perTenant, Key: "tenant:acme"},
			redlimit.Part{Limiter: inFlight, Key: "user:42"},
		)
		if err != nil {
			fmt.Println("no decision:", err)
			return
		}
		if !r.Allowed {
			fmt.Printf("%d denied by part %d, retry after %v\n", i, r.Part, r.RetryAfter)
			continue
		}
		fmt.Printf("%d allowed, %d left of part %d\n", i, r.Remaining, r.Part)
		_ = r.Grant.Release(ctx) // the request is done: its place in flight goes back, its permits stay counted
	}
	user, _ := perUser.AllowN(ctx, "user:42", 0)
	fmt.Println("user has", user.Remaining, "left: the denied call took nothing")
	// Output:
	// 1 allowed, 1 left of part 1
	// 2 allowed, 0 left of part 1
	// 3 denied by part 1, retry after 24h0m0s
	// user has 98 left: the denied call took nothing
}
