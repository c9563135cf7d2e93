package redlimittest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// Epoch is the time an Env's clock reads before it is advanced: a whole
// second, so that windows and buckets aligned to the Unix epoch start with it.
var Epoch = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

// Env is a miniredis server, a client of it and a fake clock. Its methods are
// safe for concurrent use.
type Env struct {
	server *miniredis.Miniredis
	client *redis.Client

	mu  sync.Mutex
	now time.Time
}

// New starts an Env for one test: its clock reads Epoch, and tb.Cleanup
// closes it when the test ends. New calls tb.Fatal if miniredis cannot
// listen on a local port.
func New(tb testing.TB) *Env {
	tb.Helper()
	env, err := Run()
	if err != nil {
		tb.Fatalf("redlimittest: %v", err)
	}
	tb.Cleanup(env.Close)
	return env
}

// Run starts an Env outside a test (an Example, a simulation); the caller
// closes it. Its clock reads Epoch.
func Run() (*Env, error) {
	server := miniredis.NewMiniRedis()
	if err := server.Start(); err != nil {
		return nil, fmt.Errorf("start miniredis: %w", err)
	}
	// Also the clock of the TIME command, for limiters built without
	// Options().
	server.SetTime(Epoch)
	client := redis.NewClient(&redis.Options{
		Addr:                  server.Addr(),
		ContextTimeoutEnabled: true,
		// A test that stops the server wants the error now, not after
		// go-redis has retried the command or the dial.
		MaxRetries:    -1,
		DialerRetries: 1,
	})
	client.AddHook(patience{})
	return &Env{server: server, client: client, now: Epoch}, nil
}

// DecisionDeadline is the least time an Env's client gives a command,
// whatever its ctx's deadline. Middlewares decide under a short deadline
// of their own (httplimit and grpclimit: 100ms, after which a request
// goes through undecided): a loaded CI machine can take longer than that
// for a round trip to miniredis, and a test that expects 429 would see 200.
// Under an Env, a command whose ctx has a shorter deadline runs on until
// DecisionDeadline has passed, so that the decision comes back and the
// test sees what the limit decides, however busy the machine. A call
// whose ctx is done before it starts still fails at once: the limiter
// checks that itself.
const DecisionDeadline = 10 * time.Second

// patience gives every command at least DecisionDeadline.
type patience struct{}

func (patience) DialHook(next redis.DialHook) redis.DialHook { return next }

func (patience) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		ctx, cancel := patient(ctx)
		defer cancel()
		return next(ctx, cmd)
	}
}

func (patience) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		ctx, cancel := patient(ctx)
		defer cancel()
		return next(ctx, cmds)
	}
}

// patient returns ctx, or, when ctx's deadline leaves less than
// DecisionDeadline, a ctx with its values and DecisionDeadline from now.
func patient(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok || time.Until(deadline) >= DecisionDeadline {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), DecisionDeadline)
}

// Close closes the client and stops the server.
func (e *Env) Close() {
	e.client.Close()
	e.server.Close()
}

// Client returns the go-redis client of the Env's server: pass it to the
// limiter constructors. It gives every command at least DecisionDeadline,
// whatever a shorter ctx deadline says, and does not retry failed
// commands.
func (e *Env) Client() *redis.Client { return e.client }

// Server returns the miniredis server, for tests of the no-decision path:
// Server().SetError("...") makes every command fail until SetError(""), and
// Server().Close() takes it down for good.
func (e *Env) Server() *miniredis.Miniredis { return e.server }

// Options returns redlimit.WithClock(e.Now) followed by opts: the options
// every limiter of the test should be built with. The deny cache, if
// enabled, then reads the fake clock too.
func (e *Env) Options(opts ...redlimit.Option) []redlimit.Option {
	return append([]redlimit.Option{redlimit.WithClock(e.Now)}, opts...)
}

// Now returns the fake clock's time. Its method value e.Now is a clock for
// redlimit.WithClock.
func (e *Env) Now() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.now
}

// Advance moves the clock forward by d, and the server's clock with it, so
// that keys whose TTL runs out within d expire, as they would on a real
// server. A negative d moves the clock back (redlimit copes with that: no
// extra permits are granted) and leaves the server's TTLs alone.
func (e *Env) Advance(d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.advanceLocked(d)
}

// Set moves the clock to t, forward or back, as Advance(t.Sub(e.Now())).
func (e *Env) Set(t time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.advanceLocked(t.Sub(e.now))
}

func (e *Env) advanceLocked(d time.Duration) {
	e.now = e.now.Add(d)
	e.server.SetTime(e.now)
	if d > 0 {
		e.server.FastForward(d)
	}
}
