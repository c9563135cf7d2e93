package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// BreakerState is the state of a circuit breaker.
type BreakerState int32

// The breaker's states. Closed: calls go to Redis. Open: calls fail at once
// until the cooldown has passed. HalfOpen: one probe is allowed through (or
// may be) and every other call fails at once.
const (
	BreakerClosed BreakerState = iota
	BreakerOpen
	BreakerHalfOpen
)

// String names the state: "closed", "open" or "half-open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("BreakerState(%d)", int32(s))
}

// BreakerChange is one state change, as the breaker's OnChange sees it.
type BreakerChange struct {
	From, To BreakerState
	// Err is the Redis error that opened or re-opened the breaker; nil for
	// other changes.
	Err error
	// At is when it changed.
	At time.Time
}

// BreakerConfig tunes a Breaker. The caller has validated it.
type BreakerConfig struct {
	Failures int           // consecutive Redis failures that open it
	Cooldown time.Duration // how long it stays open before a probe
	OnChange func(BreakerChange)
	Now      func() time.Time // nil: time.Now
	// MinDeadline is the shortest ctx deadline whose passing mid-call
	// counts as a failure (see classify), and the least time a round trip
	// gets (see Engine.detach).
	MinDeadline time.Duration
}

// internal states: halfOpenIdle is half-open with no probe in flight (the
// last probe ended saying nothing about Redis: record's neutral, which the
// engine's probes never report, see Engine.probe), so the next call
// probes. Observers see it as BreakerHalfOpen.
const (
	stClosed int32 = iota
	stOpen
	stProbing
	stHalfOpenIdle
)

// Breaker is a circuit breaker over Redis calls: after Failures consecutive
// calls that Redis could not answer, calls fail at once with an
// UnavailableError for Cooldown; then one call probes, and its outcome
// closes or re-opens it. Closed, the cost of a call is one atomic load, and
// one more after a failure. It is safe for concurrent use and may be shared
// by limiters that use the same Redis.
type Breaker struct {
	cfg      BreakerConfig
	state    atomic.Int32
	failures atomic.Int32
	// openUntil is when the cooldown ends, in ns since base on cfg.Now's
	// clock (monotonic with time.Now: a wall clock that jumps neither
	// shortens nor stretches a cooldown);
	// lastErr the Redis error that opened it. Written under mu before
	// state becomes stOpen, read after state reads stOpen.
	openUntil atomic.Int64
	lastErr   atomic.Pointer[error]
	mu        sync.Mutex // serialises state changes and their OnChange calls
	base      time.Time
}

// NewBreaker returns a closed breaker.
func NewBreaker(cfg BreakerConfig) *Breaker {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Breaker{cfg: cfg, base: cfg.Now()}
}

// State returns the breaker's state now: an open breaker whose cooldown has
// passed is still open until a call probes.
func (b *Breaker) State() BreakerState {
	return public(b.state.Load())
}

func public(s int32) BreakerState {
	switch s {
	case stOpen:
		return BreakerOpen
	case stProbing, stHalfOpenIdle:
		return BreakerHalfOpen
	}
	return BreakerClosed
}

// UnavailableError is returned, without a round trip, by a call the open
// breaker answered. It wraps the Redis error that opened the breaker and the
// sentinel the root package gives (errors.Is matches both).
type UnavailableError struct {
	Sentinel error         // redlimit.ErrUnavailable
	Err      error         // the last Redis error
	Wait     time.Duration // until the next probe may go through
}

// Error says that the breaker is open, for how long, and why.
func (e *UnavailableError) Error() string {
	return fmt.Sprintf("Redis unavailable, circuit breaker open for %v more: %v", e.Wait, e.Err)
}

// Unwrap gives errors.Is and errors.As the sentinel and the Redis error.
func (e *UnavailableError) Unwrap() []error { return []error{e.Sentinel, e.Err} }

// RetryAfter is the time until the breaker lets a probe through: the rest
// of its cooldown, or the whole cooldown while a probe is in flight.
func (e *UnavailableError) RetryAfter() time.Duration { return e.Wait }

// admit is called before a round trip. It returns probe == true when this
// call is the half-open breaker's probe, and an UnavailableError when the
// call must fail at once.
func (b *Breaker) admit(sentinel error) (probe bool, err error) {
	s := b.state.Load()
	if s == stClosed {
		return false, nil
	}
	now := b.cfg.Now()
	switch s {
	case stOpen:
		if wait := time.Duration(b.openUntil.Load() - int64(now.Sub(b.base))); wait > 0 {
			return false, b.unavailable(sentinel, wait)
		}
		if b.transition(stOpen, stProbing, nil, now) {
			return true, nil
		}
	case stHalfOpenIdle:
		if b.state.CompareAndSwap(stHalfOpenIdle, stProbing) {
			return true, nil
		}
	}
	// Another call is probing, or just closed or re-opened the breaker:
	// look again once.
	switch b.state.Load() {
	case stClosed:
		return false, nil
	case stOpen:
		if wait := time.Duration(b.openUntil.Load() - int64(now.Sub(b.base))); wait > 0 {
			return false, b.unavailable(sentinel, wait)
		}
	}
	return false, b.unavailable(sentinel, b.cfg.Cooldown)
}

func (b *Breaker) unavailable(sentinel error, wait time.Duration) error {
	var last error = errors.New("redis failed")
	if p := b.lastErr.Load(); p != nil {
		last = *p
	}
	return &UnavailableError{Sentinel: sentinel, Err: last, Wait: wait}
}

// outcome is what a finished round trip tells the breaker.
type outcome int

const (
	answered outcome = iota // Redis answered: a decision, or an error about the request
	failed                  // Redis could not answer
	neutral                 // the caller gave up first: says nothing about Redis
)

// record tells the breaker how a round trip admitted by admit ended.
func (b *Breaker) record(probe bool, o outcome, err error) {
	if probe {
		now := b.cfg.Now()
		switch o {
		case answered:
			b.failures.Store(0)
			b.transition(stProbing, stClosed, nil, now)
		case failed:
			b.transition(stProbing, stOpen, err, now)
		default:
			b.state.CompareAndSwap(stProbing, stHalfOpenIdle)
		}
		return
	}
	if b.state.Load() != stClosed {
		return // a call admitted before the breaker opened: its outcome is stale
	}
	switch o {
	case answered:
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
	case failed:
		if int(b.failures.Add(1)) >= b.cfg.Failures {
			b.transition(stClosed, stOpen, err, b.cfg.Now())
		}
	}
}

// transition moves the breaker from one state to another if it is still in
// from, and tells OnChange. It reports whether it moved.
func (b *Breaker) transition(from, to int32, err error, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() != from {
		return false
	}
	if to == stOpen {
		b.lastErr.Store(&err)
		b.openUntil.Store(int64(now.Sub(b.base) + b.cfg.Cooldown))
	}
	if to == stClosed {
		b.failures.Store(0)
	}
	b.state.Store(to)
	if fn := b.cfg.OnChange; fn != nil && public(from) != public(to) {
		change := BreakerChange{From: public(from), To: public(to), At: now}
		if to == stOpen {
			change.Err = err
		}
		fn(change)
	}
	return true
}

// Classify says what a round trip's error tells about Redis: nil is an
// answer; so is an error reply about the request (a foreign value at the
// key, a script error). A caller's ctx cancelled before Redis answered says
// nothing. Everything else is a failure: the network (refused, reset, EOF,
// i/o timeout), the pool (timeout), a deadline that passed while Redis did
// not answer, and the error replies of a server that cannot serve now
// (LOADING, BUSY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN).
func Classify(ctx context.Context, err error) outcome {
	if err == nil {
		return answered
	}
	if errors.Is(err, context.Canceled) || errors.Is(ctx.Err(), context.Canceled) {
		return neutral
	}
	var reply redis.Error
	if errors.As(err, &reply) && !isNetwork(err) {
		msg := reply.Error()
		for _, prefix := range unavailableReplies {
			if strings.HasPrefix(msg, prefix) {
				return failed
			}
		}
		return answered
	}
	return failed
}

// classify is Classify for this breaker, which hears only what shows that
// Redis is unhealthy, never what the caller chose. A call that Classify
// calls failed is neutral instead when its own ctx deadline ended it (the
// deadline had passed when the call returned) and that deadline left the
// call less than MinDeadline when it started: a healthy Redis could not
// have been expected to answer in time, so the failure is the caller's
// (a gRPC client's grpc-timeout of 200µs, a header-derived deadline). Such
// callers, however many, cannot open the breaker for the others. A paused
// Redis or a link that drops replies is still seen, by the calls with
// deadlines of MinDeadline or more, and by calls without a deadline, which
// end at the client's ReadTimeout; a refused or reset connection counts
// whatever the deadline, since it says nothing about the caller.
func (b *Breaker) classify(ctx context.Context, err error, start time.Time) outcome {
	o := Classify(ctx, err)
	if o != failed {
		return o
	}
	deadline, ok := ctx.Deadline()
	if !ok || deadline.Sub(start) >= b.cfg.MinDeadline {
		return o
	}
	if ctx.Err() != nil || !time.Now().Before(deadline) {
		return neutral
	}
	return o
}

// unavailableReplies are the error replies of a server that cannot serve
// any request right now.
// OOM and READONLY are not among them: such a server still decides
// denials and n == 0, which need no write (DESIGN property 10).
var unavailableReplies = []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN"}

// isNetwork reports errors that are about the connection even when they
// happen to satisfy redis.Error.
func isNetwork(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// guardedRun is run behind the breaker: it fails at once while the breaker
// is open and tells it how the round trip ended. A ctx already done before
// the call neither reaches Redis nor counts. The breaker's probe, and a
// call whose deadline leaves less than MinDeadline, run detached (see
// detach).
func (e *Engine) guardedRun(ctx context.Context, req request) (string, error) {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return "", doneBeforeCall{err}
	}
	if e.breaker != nil {
		probe, err := e.breaker.admit(e.unavailableSentinel)
		if err != nil {
			return "", err
		}
		if probe {
			// Judged by its own deadline: see detach.
			return e.detach(ctx, start, func(detached context.Context) (string, error) {
				return e.recordedRun(detached, detached, start, req, true)
			})
		}
	}
	if e.short(ctx, start) {
		// A slot to run on, by the caller's deadline; else the call ends
		// there without reaching Redis, as cut at that deadline it would
		// cost a connection.
		select {
		case e.detachSlots <- struct{}{}:
		case <-ctx.Done():
			return "", doneBeforeCall{ctx.Err()}
		}
		// Judged by its caller's deadline, as if it had not run on.
		return e.detach(ctx, start, func(detached context.Context) (string, error) {
			defer func() { <-e.detachSlots }()
			return e.recordedRun(detached, ctx, start, req, false)
		})
	}
	return e.recordedRun(ctx, ctx, start, req, false)
}

// maxDetachedCalls bounds the calls with short deadlines that one engine
// runs on after their callers returned (see detach), so that callers
// cannot pile up goroutines and connections faster than Redis answers. A
// short call that finds all taken waits for one until its deadline.
const maxDetachedCalls = 64

// recordedRun is runWithin on ctx, started at start, and tells the breaker,
// if there is one, how the round trip ended, judged by the deadline of
// judge (see classify).
func (e *Engine) recordedRun(ctx, judge context.Context, start time.Time, req request, probe bool) (string, error) {
	text, err := e.runWithin(ctx, req)
	if e.breaker == nil {
		return text, err
	}
	if err != nil {
		e.breaker.record(probe, e.breaker.classify(judge, err, start), withCtxErr(judge, err))
	} else {
		e.breaker.record(probe, answered, nil)
	}
	return text, err
}

// short reports a ctx whose deadline leaves a call started at start less
// than MinDeadline: less than a healthy Redis is sure to need.
func (e *Engine) short(ctx context.Context, start time.Time) bool {
	deadline, ok := ctx.Deadline()
	return ok && deadline.Sub(start) < e.minDeadline
}

// detach runs a round trip that must end on its own terms, not its
// caller's, in a goroutine of its own, on a ctx with the caller's values
// but not its cancellation, and with the caller's deadline or MinDeadline
// from start, whichever is later (none when the caller's ctx has none).
// The caller waits for it until its own ctx ends; then, like any call
// abandoned at its deadline, its permits may have been taken, never
// reported. Two round trips need this:
//   - the half-open breaker's probe, whose outcome must say whether Redis
//     answers, whoever's call carries it. A probe its caller ended (a short
//     deadline, a cancel) would say nothing, and callers who always end
//     theirs early, calling first after each cooldown, could keep the
//     breaker half-open, failing every other call, for as long as they
//     keep calling;
//   - a call whose deadline is shorter than MinDeadline (a gRPC client's
//     grpc-timeout of 200µs). go-redis drops a connection whose read timed
//     out, as its reply may still come: such callers would make the client
//     dial once per call, thousands of times a second, slowing every other
//     caller. Run on, the call leaves its connection in the pool. Its
//     failures are still judged by its caller's deadline, which a healthy
//     Redis need not meet, so they cannot open the breaker.
func (e *Engine) detach(ctx context.Context, start time.Time, run func(context.Context) (string, error)) (string, error) {
	detached, cancel := context.WithoutCancel(ctx), context.CancelFunc(func() {})
	if deadline, ok := ctx.Deadline(); ok {
		if least := start.Add(e.minDeadline); deadline.Before(least) {
			deadline = least
		}
		detached, cancel = context.WithDeadline(detached, deadline)
	}
	done := make(chan result, 1)
	go func() {
		defer cancel()
		text, err := run(detached)
		done <- result{text, err}
	}()
	return await(ctx, done)
}

// result is a round trip's reply text or error, sent by the goroutine that
// ran it.
type result struct {
	text string
	err  error
}

// await returns the result sent on done, or ctx's error when ctx ends
// first (the result, if one comes, is dropped).
func await(ctx context.Context, done <-chan result) (string, error) {
	select {
	case r := <-done:
		return r.text, r.err
	case <-ctx.Done():
		select {
		case r := <-done: // both were ready: a decision made is reported
			return r.text, r.err
		default:
			return "", ctx.Err()
		}
	}
}

// withCtxErr is err as the caller sees it: matching ctx's error too when
// ctx ended during the round trip (go-redis reports a ctx deadline as the
// socket's i/o timeout), so that the breaker's later errors match it too.
func withCtxErr(ctx context.Context, err error) error {
	ctxErr := ctx.Err()
	if ctxErr == nil && errors.Is(err, os.ErrDeadlineExceeded) {
		if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
			ctxErr = context.DeadlineExceeded
		}
	}
	if ctxErr != nil && !errors.Is(err, ctxErr) {
		return fmt.Errorf("%w (%w)", err, ctxErr)
	}
	return err
}

// fallback lets Config.Fallback decide a call that Redis, or the link to
// it, left undecided (redisFailure): the breaker was open, the round trip
// failed, or the server refused it. It reports false, and the caller
// returns err, when there is no fallback, when err is the caller's own (its
// ctx, a foreign value at the key), or when the fallback failed too. The
// Reply's Cause is the Redis error, as the caller would have seen it.
func (e *Engine) fallback(ctx context.Context, key string, n int, err error) (Reply, bool) {
	if e.fallbackFn == nil || !redisFailure(ctx, err) {
		return Reply{}, false
	}
	r, fbErr := e.fallbackFn(ctx, key, n)
	if fbErr != nil {
		return Reply{}, false
	}
	r.Cause = e.redisError(ctx, key, "", err)
	return r, true
}

// doneBeforeCall is the error of a call whose ctx was done before it
// started: it never reached Redis, and neither the breaker nor the fallback
// hears of it.
type doneBeforeCall struct{ error }

func (d doneBeforeCall) Unwrap() error { return d.error }

// runWithin is run, returning by ctx's deadline even if the client would
// not. Two clients do not end a call at its ctx's deadline: go-redis's
// AutoPipeliner (a queued command waits for Redis: a 300ms call on a paused
// Redis took 0.5-1.5s), and a client without ContextTimeoutEnabled (it
// waits for ReadTimeout: 5s measured). For them, and only when ctx has a
// deadline that the client's own timeouts could pass (see clientBound), the
// round trip runs in a goroutine of its own and is abandoned at the
// deadline; its reply, if one comes, is dropped, like a reply after a
// socket timeout (the permits may have been taken, never reported), and
// the goroutine holds its connection until the client gives up. The open
// breaker keeps such goroutines few: they pile up only until it opens.
//
// That goroutine costs a call 3 allocations and two goroutine switches,
// which doubled the median call in the root package's BenchmarkCtxWatch,
// so it is spent only where it buys something: a ctx
// that can be cancelled but has no deadline (a request's) runs on the
// caller's goroutine, and a cancellation then ends the call at the
// client's timeouts rather than at once.
func (e *Engine) runWithin(ctx context.Context, req request) (string, error) {
	deadline, ok := ctx.Deadline()
	if !ok || e.bound == 0 || time.Until(deadline) >= e.bound {
		return e.run(ctx, req)
	}
	done := make(chan result, 1)
	go func() {
		text, err := e.run(ctx, req)
		done <- result{text, err}
	}()
	return await(ctx, done)
}

// clientBound returns how long rdb may hold a call whatever its ctx's
// deadline: 0 for a client that ends a call at its ctx's deadline
// (ContextTimeoutEnabled), else the longest a call can take on the
// client's own timeouts (every try's write and read, for EVALSHA and the
// EVAL after a NOSCRIPT, with the backoffs between tries), and
// math.MaxInt64 when that has no bound (an AutoPipeliner, a cluster that
// may redirect, a ReadTimeout of -1 or -2).
func clientBound(rdb redis.Scripter) time.Duration {
	const unbounded = time.Duration(math.MaxInt64)
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options() // go-redis has filled in its defaults
		if o.ContextTimeoutEnabled {
			return 0
		}
		if o.ReadTimeout <= 0 || o.WriteTimeout <= 0 {
			return unbounded
		}
		tries := time.Duration(max(o.MaxRetries, 0) + 1)
		return 2 * tries * (o.WriteTimeout + o.ReadTimeout + max(o.MaxRetryBackoff, 0))
	case *redis.ClusterClient:
		if c.Options().ContextTimeoutEnabled {
			return 0
		}
	case *redis.Ring:
		if c.Options().ContextTimeoutEnabled {
			return 0
		}
	case *redis.AutoPipeliner:
	default:
		return 0
	}
	return unbounded
}
