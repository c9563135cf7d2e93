package engine

import (
	"context"
	"errors"
	"fmt"
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
	Err  error         // the last Redis error
	Wait time.Duration // until the next probe may go through
}

// Error says that the breaker is open, for how long, and why.
func (e *UnavailableError) Error() string {
	return fmt.Sprintf("Redis unavailable, circuit breaker open for %v more: %v", e.Wait, e.Err)
}

// Unwrap gives errors.Is and errors.As the sentinel and the Redis error.
func (e *UnavailableError) Unwrap() []error { return []error{ErrUnavailable, e.Err} }

// RetryAfter is the time until the breaker lets a probe through: the rest
// of its cooldown, or the whole cooldown while a probe is in flight.
func (e *UnavailableError) RetryAfter() time.Duration { return e.Wait }

// admit is called before a round trip. It returns probe == true when this
// call is the half-open breaker's probe, and an UnavailableError when the
// call must fail at once.
func (b *Breaker) admit() (probe bool, err error) {
	s := b.state.Load()
	if s == stClosed {
		return false, nil
	}
	now := b.cfg.Now()
	switch s {
	case stOpen:
		if wait := time.Duration(b.openUntil.Load() - int64(now.Sub(b.base))); wait > 0 {
			return false, b.unavailable(wait)
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
			return false, b.unavailable(wait)
		}
	}
	return false, b.unavailable(b.cfg.Cooldown)
}

func (b *Breaker) unavailable(wait time.Duration) error {
	var last error = errors.New("redis failed")
	if p := b.lastErr.Load(); p != nil {
		last = *p
	}
	return &UnavailableError{Err: last, Wait: wait}
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
