package redlimit

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/engine"
	"github.com/redlimit/redlimit/internal/nilcheck"
)

// ErrUnavailable is matched (errors.Is) by the error of a call that the
// circuit breaker answered at once, without a round trip, because Redis
// failed repeatedly just before. The error also wraps the Redis error that
// opened the breaker (errors.Is(err, syscall.ECONNREFUSED) and friends
// hold); RetryAfter(err) tells the time until the breaker lets a call
// probe Redis again, and WaitN with WaitOutBreaker waits it out. A Redis
// failure that did not go through an open breaker is returned as it is and
// does not match.
var ErrUnavailable = engine.ErrUnavailable

// The circuit breaker's defaults: see BreakerConfig.
const (
	defaultBreakerFailures    = 5
	defaultBreakerCooldown    = time.Second
	defaultBreakerMinDeadline = engine.DefaultMinDeadline
)

// BreakerConfig tunes a circuit breaker. The zero value gives the defaults.
//
// A failure is a call that Redis could not answer: a network error
// (refused, reset, EOF, i/o timeout), a pool timeout, a ctx deadline that
// passed while waiting for Redis, or an error reply of a server that cannot
// serve now (LOADING, BUSY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN). Not
// failures: OOM and READONLY (such a server still decides denials, which
// need no write), denials, bad input (ErrInvalidArgument, never sent),
// a key holding a value that is not the limiter's (a problem of that key),
// a ctx the caller cancelled, and a ctx already done when the call starts.
//
// A ctx deadline that passes mid-call counts only when it gave the call at
// least MinDeadline: under a paused server or a link that drops packets a
// deadline is the only sign, but a shorter one is the caller's choice (a
// gRPC client's grpc-timeout, a deadline a server derives from a request),
// which a healthy Redis need not meet. No number of callers with short
// deadlines, odd keys or odd n can open the breaker for the others, nor
// keep it from closing.
type BreakerConfig struct {
	// Failures is the number of consecutive failures that open the breaker:
	// any answer from Redis in between starts the count again. Default 5:
	// a lone reset connection (a failover, a restart of a proxy) does not
	// open it, and a busy service reaches 5 within milliseconds of an
	// outage. Negative is ErrInvalidConfig.
	Failures int
	// Cooldown is how long an open breaker answers at once before it lets
	// exactly one call through to probe Redis (every other call keeps
	// failing fast until the probe ends): a success closes the breaker, a
	// failure opens it for another Cooldown. The probe runs on when its
	// caller gives up first (the caller returns at its own deadline or
	// cancel), with the caller's deadline or MinDeadline, whichever is
	// later (none when the caller's ctx has none), so callers with short
	// deadlines cannot keep the breaker from closing. Default 1s: recovery
	// within a second of Redis coming back (go-redis itself re-dials once a
	// second after a run of failed dials), one probe per second per breaker.
	// Negative is ErrInvalidConfig.
	Cooldown time.Duration
	// OnChange, if not nil, is told of every state change, from the
	// goroutine whose call caused it, while the breaker holds its lock:
	// keep it quick and do not call the limiter from it. err is the Redis
	// error that opened the breaker when to is BreakerOpen, nil otherwise.
	// Changes happen during calls: an open breaker becomes half-open when
	// a call after its cooldown probes, not when the cooldown ends.
	OnChange func(from, to BreakerState, err error)
	// MinDeadline is the shortest ctx deadline, counted from the start of
	// the call, whose passing mid-call counts as a failure; a call cut short
	// by a shorter deadline of its own says nothing about Redis and is not
	// counted. Default 20ms: far above what a healthy Redis takes (a script
	// round trip is well under a millisecond on a LAN), far below a
	// service's own deadlines. Raise it on a slow link (above 10× Redis's
	// p99 round trip): it is also the least time a round trip gets (a call
	// with a shorter deadline returns at it while its round trip runs on, so
	// that its connection stays in the pool), and the first probe after an
	// outage dials. While the breaker is closed, calls whose deadlines are
	// all shorter than it leave a paused Redis to the client's ReadTimeout
	// to detect (ClientOptions). Negative is ErrInvalidConfig.
	MinDeadline time.Duration
	// Now is the clock the cooldown is counted on. Default time.Now; a fake
	// clock is for tests. It is not the limiter's WithClock: that one tells
	// decision time, this one tells when to look at Redis again.
	Now func() time.Time
}

// BreakerState is a circuit breaker's state.
type BreakerState int

// The breaker's states.
const (
	// BreakerClosed: calls go to Redis.
	BreakerClosed BreakerState = iota
	// BreakerOpen: calls fail at once with ErrUnavailable (or go to the
	// fallback) until the cooldown has passed.
	BreakerOpen
	// BreakerHalfOpen: one call probes Redis; every other call fails at once.
	BreakerHalfOpen
)

// String names the state: "closed", "open" or "half-open".
func (s BreakerState) String() string { return engine.BreakerState(s).String() }

// Breaker is a circuit breaker between limiters and Redis. Every limiter
// on a *redis.Client (or any single-server Scripter) has its own by default
// (5 failures, a cooldown of 1s: see BreakerConfig). A limiter on a
// *redis.ClusterClient or *redis.Ring has none unless WithBreaker gives it
// one: its keys live on several servers, and one breaker would fail the
// keys of the live ones with those of a dead one.
//
// WithBreaker gives it this one instead, and limiters that share a Redis
// client may share one Breaker, so that an outage opens them all at once
// and one probe serves them all. Safe for concurrent use. While closed it
// costs a call one atomic load.
type Breaker struct {
	b *engine.Breaker
}

// NewBreaker returns a closed circuit breaker tuned by cfg.
func NewBreaker(cfg BreakerConfig) (*Breaker, error) {
	if cfg.Failures < 0 {
		return nil, engine.Errorf(ErrInvalidConfig, "redlimit: breaker failures %d: must not be negative", cfg.Failures)
	}
	if cfg.Cooldown < 0 {
		return nil, engine.Errorf(ErrInvalidConfig, "redlimit: breaker cooldown %v: must not be negative", cfg.Cooldown)
	}
	if cfg.MinDeadline < 0 {
		return nil, engine.Errorf(ErrInvalidConfig, "redlimit: breaker min deadline %v: must not be negative", cfg.MinDeadline)
	}
	ec := engine.BreakerConfig{Failures: cfg.Failures, Cooldown: cfg.Cooldown, MinDeadline: cfg.MinDeadline, Now: cfg.Now}
	if ec.MinDeadline == 0 {
		ec.MinDeadline = defaultBreakerMinDeadline
	}
	if ec.Failures == 0 {
		ec.Failures = defaultBreakerFailures
	}
	if ec.Cooldown == 0 {
		ec.Cooldown = defaultBreakerCooldown
	}
	if fn := cfg.OnChange; fn != nil {
		ec.OnChange = func(c engine.BreakerChange) {
			fn(BreakerState(c.From), BreakerState(c.To), c.Err)
		}
	}
	return &Breaker{b: engine.NewBreaker(ec)}, nil
}

// State returns the breaker's state. An open breaker whose cooldown has
// passed reads BreakerOpen until a call probes. A nil or zero-value
// Breaker, which no limiter accepts, reads BreakerClosed.
func (b *Breaker) State() BreakerState {
	if b == nil || b.b == nil {
		return BreakerClosed
	}
	return BreakerState(b.b.State())
}

// WithBreaker makes the limiter use b, which other limiters may share. A
// nil b, or one not made by NewBreaker, is ErrInvalidConfig: use
// WithoutBreaker to turn it off. A service that builds limiters at runtime
// (per tenant, per plan) gives them all the one Breaker of their Redis
// client: each limiter would otherwise open its own only after its own
// failures, and probe Redis on its own (see examples/tenants).
func WithBreaker(b *Breaker) Option {
	return func(o *options) { o.outage.breaker, o.outage.breakerSet = b, true }
}

// WithoutBreaker turns the circuit breaker off: every call goes to Redis,
// however often it failed before.
func WithoutBreaker() Option {
	return func(o *options) { o.outage.breaker, o.outage.breakerSet, o.outage.noBreaker = nil, true, true }
}

// WithFallback makes fallback decide every call that Redis, or the link
// to it, left undecided: while the circuit breaker is open, and whenever a
// call fails for any reason but the caller's own. The caller's own are bad
// input (ErrInvalidArgument, never sent), the caller's ctx (cancelled, or
// its deadline passed, before or during the call) and a key holding a
// value this library did not write (ErrForeignState); those return their
// error. Everything else goes to the fallback: a network error, a
// timeout of the client's own, any error reply (LOADING, OOM, READONLY,
// ...), a reply that cannot be read. The call then returns the fallback's
// own Result (or, if the fallback failed too, the Redis error), and
// observers see Decision.Fallback with the Redis error in Decision.Cause,
// even while Redis is otherwise up.
//
// The fallback decides on this limiter's clock: with WithClock, an inmem
// limiter that was not given its own (inmem.WithClock) decides, and its
// grants refund, release and extend, on a view of it on this limiter's
// clock (its OnClock), so that a fake clock moves both. Without WithClock
// it decides on its own clock, time.Now by default.
//
// The fallback is meant to be an in-process limiter of package
// github.com/redlimit/redlimit/inmem, configured as this instance's share
// of the shared limit (see inmem.Share): it decides alone, without the
// other instances, so a share keeps the whole service within the limit
// during the outage. Its state is its own: permits granted by Redis before
// the outage are not known to it, and its grants are not written to Redis
// after. A nil fallback is ErrInvalidConfig.
func WithFallback(fallback Limiter) Option {
	return func(o *options) { o.outage.fallback, o.outage.fallbackSet = fallback, true }
}

// ClientOptions returns the go-redis options recommended for a client that
// limiters use: a client that fails fast, so that the limiter never becomes
// the outage. Edit the result before redis.NewClient (a password, TLS, a
// DB, PoolSize, longer timeouts for a distant Redis); for a Cluster, copy
// the same fields into redis.ClusterOptions. Each setting, and why:
//
//   - ContextTimeoutEnabled: true. go-redis otherwise ignores a ctx
//     deadline while it waits for a reply, and a paused Redis holds the
//     call for ReadTimeout. redlimit then ends the call at the deadline
//     itself, which costs every call whose deadline is sooner than the
//     client's own timeouts a goroutine, 3 allocations and two goroutine
//     switches (BenchmarkCtxWatch measures what that adds to a call); a
//     call abandoned at its deadline holds its connection
//     until ReadTimeout. A ctx without a deadline costs nothing, and a
//     cancellation then ends the call at the client's timeouts.
//   - MaxRetries: -1, no retries. A retried EVALSHA whose first reply was
//     lost has run twice, and can take a second permit.
//   - DialerRetries: 1. go-redis dials 5 times, 100ms apart, by default:
//     against a killed Redis every call would spend its deadline dialing
//     rather than get "connection refused" at once.
//   - DialTimeout: 100ms, ReadTimeout and WriteTimeout: 500ms,
//     PoolTimeout: 500ms (go-redis's defaults are 5s, 5s and 6s). They
//     bound calls made without a ctx deadline; a call with a shorter
//     deadline ends at its deadline.
//
// With these settings a call against a killed Redis fails in under a
// millisecond, and one against a paused Redis within its deadline or
// 500ms, whichever comes first; then the circuit breaker answers at once.
func ClientOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DialerRetries:         1,
		DialTimeout:           100 * time.Millisecond,
		ReadTimeout:           500 * time.Millisecond,
		WriteTimeout:          500 * time.Millisecond,
		PoolTimeout:           500 * time.Millisecond,
	}
}

// outageOptions are the options of this file.
type outageOptions struct {
	breaker     *Breaker
	breakerSet  bool
	noBreaker   bool
	fallback    Limiter
	fallbackSet bool
	logger      *slog.Logger
}

// configure validates the outage options and sets them in cfg. It returns
// the fallback that cfg decides on: WithFallback's, seen on cfg.Clock when
// there is one (clockedFallback), or nil.
func (o outageOptions) configure(algorithm string, rdb redis.Scripter, cfg *engine.Config) (Limiter, error) {
	if o.breakerSet && !o.noBreaker && o.breaker == nil {
		return nil, engine.Errorf(ErrInvalidConfig, "redlimit: %s: WithBreaker(nil): use WithoutBreaker to turn it off", algorithm)
	}
	if o.breaker != nil && o.breaker.b == nil {
		return nil, engine.Errorf(ErrInvalidConfig, "redlimit: %s: WithBreaker: the Breaker is a zero value: make it with NewBreaker", algorithm)
	}
	if o.fallbackSet && nilcheck.IsNil(o.fallback) {
		return nil, engine.Errorf(ErrInvalidConfig, "redlimit: %s: WithFallback(nil)", algorithm)
	}
	multiNode := false
	switch rdb.(type) {
	case *redis.ClusterClient, *redis.Ring:
		multiNode = true
	}
	switch {
	case o.noBreaker:
	case o.breaker != nil:
		cfg.Breaker = o.breaker.b
	case multiNode:
	default:
		b, _ := NewBreaker(BreakerConfig{})
		cfg.Breaker = b.b
	}
	fb := o.fallback
	if on, ok := fb.(clockedFallback); ok && cfg.Clock != nil {
		fb = on.OnClock(cfg.Clock)
	}
	if fb != nil {
		cfg.Fallback = func(ctx context.Context, key string, n int) (engine.Reply, error) {
			r, err := fb.AllowN(ctx, key, n)
			if err != nil {
				return engine.Reply{}, err
			}
			return engine.Reply{
				Allowed:      r.Allowed,
				Remaining:    int64(r.Remaining),
				RetryAfter:   r.RetryAfter,
				ResetAfter:   r.ResetAfter,
				FromFallback: true,
				Limit:        r.Limit,
				Grant:        r.Grant,
			}, nil
		}
	}
	warnIgnoredDeadlines(o.logger, algorithm, rdb)
	return fb, nil
}

// clockedFallback is a fallback that can decide on this limiter's clock:
// inmem's limiters, whose OnClock returns a view of the same keys on now
// (or the limiter itself, when it has a clock of its own). The view's
// grants refund, release and extend on now too.
type clockedFallback interface {
	OnClock(now func() time.Time) Limiter
}

// warnIgnoredDeadlines tells logger, once for this limiter, that its
// go-redis client was built without ContextTimeoutEnabled: such a client
// ignores ctx deadlines while it waits for a reply, and redlimit watches
// each call's deadline itself, in a goroutine of its own (see
// ClientOptions). A nil logger (the default) says nothing: a library does
// not write to a process's logs unless asked.
func warnIgnoredDeadlines(logger *slog.Logger, algorithm string, rdb redis.Scripter) {
	if logger == nil {
		return
	}
	var enabled bool
	switch c := rdb.(type) {
	case *redis.Client:
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		enabled = c.Options().ContextTimeoutEnabled
	default:
		return
	}
	if enabled {
		return
	}
	logger.Warn("redlimit: the Redis client ignores ctx deadlines while waiting for a reply (ContextTimeoutEnabled is false): "+
		"each call with a deadline then runs in a goroutine of its own; build the client from redlimit.ClientOptions",
		"algorithm", algorithm)
}

// WithLogger gives the limiter a logger for the one warning it has: at
// construction, that its go-redis client lacks ContextTimeoutEnabled (see
// ClientOptions). Default: no logger, and the limiter writes nothing, to
// no logger, ever. A nil logger is the default.
func WithLogger(logger *slog.Logger) Option {
	return func(o *options) { o.outage.logger = logger }
}

// fallbackDenial is the error of a TryAcquire the fallback denied: it names
// the fallback's limit, with the window found by that limit among the
// fallback's own strategies when it reports them (inmem.SlidingLog does),
// else among this limiter's (a share keeps the window).
func (l *limiter) fallbackDenial(r Result) error {
	window := l.windows[0]
	if fb, ok := l.fallback.(interface{ Strategies() []Strategy }); ok {
		for _, st := range fb.Strategies() {
			if st.Limit == r.Limit {
				window = st.Window
			}
		}
	} else {
		for i, limit := range l.limits {
			if limit == r.Limit {
				window = l.windows[i]
			}
		}
	}
	return &ViolationStrategyError{Limit: r.Limit, Window: window, RetryAfter: r.RetryAfter}
}
