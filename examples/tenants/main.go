// Command tenants shows per-tenant limits loaded at runtime: each tenant's
// plan (its limit) comes from configuration that can change while the
// service runs, limiters are built on demand and cached by configuration,
// not by tenant, and every limiter on the Redis client shares one circuit
// breaker, so that an outage opens them all at once and one probe serves
// them all.
//
//	go run ./examples/tenants
//
// It talks to the Redis at REDIS_ADDR (host:port) when that is set, and to an
// embedded miniredis otherwise, so it runs with nothing but Go installed.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// Plan is a tenant's limit: Requests per Window.
type Plan struct {
	Requests int
	Window   time.Duration
}

// Limiters builds and caches one limiter per Plan. Building a limiter
// makes no round trip and costs about as much as one decision, so a cache
// is there to keep one breaker's view and the allocations down, not for
// correctness: any number of tenants on one plan share its limiter (the
// tenant is the key), and a tenant whose plan changes simply gets the
// other limiter on its next request.
type Limiters struct {
	rdb     redis.Scripter
	breaker *redlimit.Breaker
	opts    []redlimit.Option

	mu     sync.Mutex
	byPlan map[Plan]redlimit.Limiter
}

// maxPlans bounds the cache when plans are custom per tenant: past it the
// cache starts again (the limiters hold no state; Redis does).
const maxPlans = 1000

// NewLimiters returns a cache of limiters on rdb that all share breaker.
// Every limiter has the key prefix "tenants:", so that the configurations
// share each tenant's count: after an upgrade from 5 to 20 per minute a
// tenant who used 5 gets 15 more, not 20 (limits that differ only in
// their number share the count exactly).
func NewLimiters(rdb redis.Scripter, breaker *redlimit.Breaker, opts ...redlimit.Option) *Limiters {
	return &Limiters{rdb: rdb, breaker: breaker, opts: opts, byPlan: map[Plan]redlimit.Limiter{}}
}

// For returns the limiter of plan, building it on first use.
func (c *Limiters) For(plan Plan) (redlimit.Limiter, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.byPlan[plan]; ok {
		return l, nil
	}
	opts := append([]redlimit.Option{
		redlimit.WithPrefix("tenants:"),
		redlimit.WithBreaker(c.breaker),
		redlimit.WithName(fmt.Sprintf("tenant_%d_per_%v", plan.Requests, plan.Window)),
	}, c.opts...)
	l, err := redlimit.NewFixedWindow(c.rdb, plan.Requests, plan.Window, opts...)
	if err != nil {
		return nil, err
	}
	if len(c.byPlan) >= maxPlans {
		clear(c.byPlan)
	}
	c.byPlan[plan] = l
	return l, nil
}

// Size is the number of cached limiters.
func (c *Limiters) Size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byPlan)
}

// Plans is the runtime configuration: tenant to plan. A service reloads it
// from its database or a config file; here it is a map behind a lock.
type Plans struct {
	mu     sync.RWMutex
	plans  map[string]Plan
	before Plan // for tenants not listed
}

// Get returns tenant's plan.
func (p *Plans) Get(tenant string) Plan {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if plan, ok := p.plans[tenant]; ok {
		return plan
	}
	return p.before
}

// Set changes tenant's plan, at runtime.
func (p *Plans) Set(tenant string, plan Plan) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.plans[tenant] = plan
}

// Allow decides one request of tenant on its current plan.
func Allow(ctx context.Context, limiters *Limiters, plans *Plans, tenant string) error {
	l, err := limiters.For(plans.Get(tenant))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	return l.TryAcquire(ctx, tenant)
}

var (
	free = Plan{Requests: 5, Window: time.Minute}
	pro  = Plan{Requests: 20, Window: time.Minute}
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
	rdb := redis.NewClient(redlimit.ClientOptions(addr))
	defer rdb.Close()
	if err := run(os.Stdout, rdb, fmt.Sprint(time.Now().UnixNano())); err != nil {
		log.Fatal(err)
	}
}

// run shows two tenants on the free plan, one of them upgraded at runtime.
// suffix makes the tenants fresh on each run.
func run(out io.Writer, rdb redis.Scripter, suffix string) error {
	// One breaker for every limiter on this client.
	breaker, err := redlimit.NewBreaker(redlimit.BreakerConfig{})
	if err != nil {
		return err
	}
	limiters := NewLimiters(rdb, breaker)
	plans := &Plans{plans: map[string]Plan{}, before: free}
	acme, globex := "acme-"+suffix, "globex-"+suffix

	ctx := context.Background()
	burst := func(tenant string, n int) error {
		allowed := 0
		for range n {
			err := Allow(ctx, limiters, plans, tenant)
			switch {
			case err == nil:
				allowed++
			case errors.Is(err, redlimit.ErrAcquireFailed):
			default:
				return err // no decision: fail open or closed
			}
		}
		plan := plans.Get(tenant)
		fmt.Fprintf(out, "%s (%d per %v): %d of %d allowed\n", tenant[:len(tenant)-len(suffix)-1], plan.Requests, plan.Window, allowed, n)
		return nil
	}
	defer func() {
		for _, plan := range []Plan{free, pro} {
			if l, err := limiters.For(plan); err == nil {
				l.Reset(ctx, acme)
				l.Reset(ctx, globex)
			}
		}
	}()
	if err := burst(acme, 8); err != nil {
		return err
	}
	if err := burst(globex, 8); err != nil {
		return err
	}
	plans.Set(acme, pro) // acme upgrades: it keeps the 5 it used
	if err := burst(acme, 20); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d limiters cached for 2 tenants on 2 plans, one breaker: %v\n", limiters.Size(), breaker.State())
	return nil
}
