package redlimit

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/engine"
	"github.com/redlimit/redlimit/internal/nilcheck"
	"github.com/redlimit/redlimit/internal/shadow"
)

// Limiter is implemented by every limiter in this package. All are safe for
// concurrent use.
type Limiter interface {
	// TryAcquire takes one permit for key. It returns nil when allowed, an
	// error matching ErrAcquireFailed (errors.Is) when denied, and any other
	// error when the decision could not be made (Redis unreachable, ctx done,
	// bad key).
	TryAcquire(ctx context.Context, key string) error
	// Allow is AllowN(ctx, key, 1).
	Allow(ctx context.Context, key string) (Result, error)
	// AllowN takes n permits if all n are available, else none. The decision
	// is in Result.Allowed; err is non-nil only when no decision was made.
	// n == 0 reports the current state and consumes nothing.
	AllowN(ctx context.Context, key string, n int) (Result, error)
	// Reset forgets all state of key.
	Reset(ctx context.Context, key string) error
}

// Result is the outcome of one decision.
type Result struct {
	// Allowed reports whether the permits were granted.
	Allowed bool
	// Limit is the capacity or limit of the binding policy: for SlidingLog,
	// the strategy reported (see SlidingLog).
	Limit int
	// Remaining is the number of permits still available right after this
	// decision, rounded down, never negative.
	Remaining int
	// RetryAfter is 0 when allowed. When denied it is how long to wait before
	// the same request is allowed, if nothing else consumes meanwhile, rounded
	// up to the microsecond; Never when n exceeds the capacity.
	RetryAfter time.Duration
	// ResetAfter is the time until key is back in its initial, fully
	// available state, rounded up to the microsecond.
	ResetAfter time.Duration
	// Grant is what this call took, when Allowed with n > 0: Grant.Refund
	// gives permits back. The zero Grant otherwise.
	Grant Grant
	// Part is, for AllowAll, the index of the part this Result describes;
	// 0 otherwise.
	Part int
}

// Grant is what one allowed call took: a small value, safe to copy and
// keep, naming the limiter, the key, the permits and the grant in the
// key's state. Its zero value refers to nothing. Grants are comparable, so
// Results stay comparable with ==.
//
// Grant.Refund(ctx, n) gives back permits the grant took until n of them
// in all have been given back. It is idempotent: the total given back from
// one grant is the largest n any Refund of it asked for, never a sum, so a
// retried refund (after a lost reply, say) gives nothing more, and a
// refund of no more than was already given back is not an error. The key
// is left as it would be had the grant taken n fewer permits, as far as
// the algorithm still counts them: nothing once the fixed window that
// counted them has closed, the sliding bucket holding them has left every
// window, or a bucket has refilled or drained past them; never more, for
// any configuration sharing the key, on any clock. A refund is one round
// trip behind the circuit breaker (it never goes to a fallback: a refund
// that fails leaves the permits used, stricter, never looser), changes
// counts only (never a window's start or a key's TTL), and drops the key's
// cached denials in this process. n <= 0, n above what the grant took, or
// the zero Grant are ErrInvalidArgument, without a round trip.
// docs/refunds.md tells the whole story, with the bounds.
//
// Grant.Release(ctx) ends what the grant holds in flight and keeps what it
// counted: a Concurrency's leases are released, an AllowAll grant releases
// the leases of its parts and keeps their other permits (a request done
// within "100 a minute and 2 in flight" gives back its place in flight,
// not its minute's permit), and any other grant is left as it is.
//
// Grant.N() is the number of permits the grant took; 0 for the zero Grant.
type Grant = engine.Grant

// Never is the RetryAfter of a request that can never be allowed: it asks for
// more permits than the limiter's capacity. It is the largest Duration (like
// x/time/rate's InfDuration), so that code which sleeps RetryAfter fails
// safe instead of spinning.
const Never time.Duration = math.MaxInt64

var (
	// ErrAcquireFailed is matched (errors.Is) by every denial TryAcquire and
	// Wait return.
	ErrAcquireFailed = engine.ErrAcquireFailed
	// ErrInvalidConfig is matched by constructor errors: a bad limit, window,
	// precision, rate or option. The message names the field and the value.
	// A zero-value limiter (a TokenBucket, ... declared rather than made by
	// its constructor) returns it from every method, and so do Wait and
	// WaitN given a nil Limiter. A nil *TokenBucket, ... (a constructor's
	// error ignored) panics on its methods, as a nil *rate.Limiter does.
	ErrInvalidConfig = engine.ErrInvalidConfig
	// ErrInvalidArgument is matched by call errors: an empty key or one
	// longer than MaxKeyBytes, n < 0, a nil ctx, or a WithClock clock
	// outside 2001-2112. Such calls never reach Redis.
	ErrInvalidArgument = engine.ErrInvalidArgument
	// ErrForeignState is matched by the error of a call on a key that holds
	// a value this library did not write (another type, another
	// application's data, another algorithm's state). The key is left
	// unchanged; the message names it.
	ErrForeignState = engine.ErrForeignState
)

// ViolationStrategyError is every denial TryAcquire returns, and Wait's when
// it gives up: the limit that denied. It matches ErrAcquireFailed. For a
// SlidingLog it is the strategy whose RetryAfter is longest.
type ViolationStrategyError struct {
	// Limit is the denying limit: a window's limit or a bucket's capacity.
	Limit int
	// Window is the limit's window; for a leaky or token bucket, the time
	// it takes to drain or refill completely (capacity / rate, rounded up to
	// the microsecond). 0 when unknown (Wait's, for a Limiter of another
	// package).
	Window time.Duration
	// RetryAfter is the denial's Result.RetryAfter: Never when the request
	// exceeds Limit.
	RetryAfter time.Duration
}

// Error says which strategy denied and how long to wait.
// A Window of 0 (unknown) is left out rather than shown as "per 0s".
func (e *ViolationStrategyError) Error() string {
	limit := fmt.Sprintf("limit %d", e.Limit)
	if e.Window > 0 {
		limit = fmt.Sprintf("%d per %v", e.Limit, e.Window)
	}
	if e.RetryAfter == Never {
		return fmt.Sprintf("redlimit: rate limit exceeded: %s, request larger than the limit", limit)
	}
	return fmt.Sprintf("redlimit: rate limit exceeded: %s, retry after %v", limit, e.RetryAfter)
}

// Unwrap makes errors.Is(err, ErrAcquireFailed) hold.
func (e *ViolationStrategyError) Unwrap() error { return ErrAcquireFailed }

// MaxKeyBytes is the longest key a call takes, in bytes, not counting the
// prefix: a key is 1 to 1024 bytes, and an empty or longer one is
// ErrInvalidArgument without a round trip, so that a client who chooses
// its key (an API key header, a path) cannot fill Redis with large keys.
const MaxKeyBytes = engine.MaxKeyBytes

// Strategy is one limit of a SlidingLog: at most Limit permits in any Window.
type Strategy struct {
	Limit  int
	Window time.Duration
}

// Rate is Count events per Per. It is an exact ratio: PerSecond(3) admits
// exactly 3 per second over any long run.
type Rate struct {
	Count int
	Per   time.Duration
}

// PerSecond returns the rate of n events per second.
func PerSecond(n int) Rate { return Rate{Count: n, Per: time.Second} }

// PerMinute returns the rate of n events per minute.
func PerMinute(n int) Rate { return Rate{Count: n, Per: time.Minute} }

// PerHour returns the rate of n events per hour.
func PerHour(n int) Rate { return Rate{Count: n, Per: time.Hour} }

// PerDay returns the rate of n events per 24 hours.
func PerDay(n int) Rate { return Rate{Count: n, Per: 24 * time.Hour} }

// Option configures a limiter.
type Option func(*options)

type options struct {
	prefix       string
	prefixSet    bool
	clock        func() time.Time
	clockSet     bool
	denyCache    int
	denyCacheSet bool
	observer     func(Decision)
	name         string
	outage       outageOptions // unavailable.go
	// WithReservation's (reservation.go).
	reserveBatch int
	reserveHold  time.Duration
	reserveSet   bool
}

// WithPrefix sets the Redis key prefix: the key of a call is exactly
// prefix + key, and limiters given the same prefix share state on purpose.
// Without it the prefix is redlimit:<algorithm>:<config>:, where algorithm
// is fw, sw, sl, lb, tb, cc (Concurrency) or cw (CalendarWindow) and
// config is a 6-character fingerprint of the configuration, so that two
// limiters that decide differently never meet on a key (docs/keys.md).
func WithPrefix(prefix string) Option {
	return func(o *options) { o.prefix, o.prefixSet = prefix, true }
}

// WithClock makes the limiter decide on now instead of the Redis server's
// TIME: for tests with a fake clock, or for Redis-compatible services that
// refuse TIME in scripts. Every process sharing a key should then use clocks
// that agree, and read between 2001-09-09 and 2112-02-27 (10^15 to
// 2^52 - 2^44 µs after the Unix epoch; a call outside is
// ErrInvalidArgument). A nil clock is ErrInvalidConfig.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.clock, o.clockSet = now, true }
}

// WithDenyCache keeps up to size recent denials in process. While a
// denial's RetryAfter has not passed and the key's Remaining has not
// changed, the same request on that key is denied locally, without a round
// trip (Decision.Local is set), and so is one for more permits than the
// capacity (RetryAfter == Never), with the Result Redis would give: to the
// microsecond under WithClock; without it, with durations counted from when
// Redis's answer came back, never shorter than Redis's. This is exact for
// every algorithm here, since state only recovers with time, except after a
// Reset, a refund, grants, or another configuration's write through another
// limiter (in this process or another): the cached denial then keeps its
// Result of before them until it runs out. A request for more permits than
// the cached denial, though denied too, goes to Redis: only Redis knows its
// longer RetryAfter. An allowed request (even one decided while a denial
// was in flight), a Reset or a refund through this limiter drops the key's
// entry; when full, the oldest stored entry goes. The cache belongs to this
// limiter alone: limiters share nothing in process, so Reset a key through
// the limiter whose cache should forget it. Its memory is bounded by about
// size × 608 bytes whatever the keys' length (keys are copied, so the
// cache never keeps a larger string alive): keys longer than 256 bytes on
// average make it keep fewer entries. size <= 0 is ErrInvalidConfig.
// Default: off.
func WithDenyCache(size int) Option {
	return func(o *options) { o.denyCache, o.denyCacheSet = size, true }
}

// WithObserver makes the limiter call fn after every call, from the calling
// goroutine: for metrics, logs and traces. fn must be safe for concurrent use
// and should be quick. A nil fn observes nothing.
func WithObserver(fn func(Decision)) Option {
	return func(o *options) { o.observer = fn }
}

// WithName names the limiter for observers and metrics: Decision.Limiter
// carries it, so that one observer can tell a service's limiters apart
// ("login", "api", "upload"). Any string; it is neither validated nor part
// of the Redis key. Default "" (unnamed).
func WithName(name string) Option {
	return func(o *options) { o.name = name }
}

// Decision is what an observer sees of one call.
type Decision struct {
	// Algorithm is "fixed_window", "sliding_window", "sliding_log",
	// "leaky_bucket", "token_bucket", "concurrency" or "calendar_window".
	Algorithm string
	// Key is the caller's key, without prefix.
	Key string
	// N is the number of permits asked for.
	N int
	// Result is the decision; zero when Err is set.
	Result Result
	// Err is nil unless no decision was made.
	Err error
	// Latency is the time the call took, round trip included.
	Latency time.Duration
	// Local reports a call answered without a round trip of its own: a
	// denial by the deny cache, or a grant from permits a reservation
	// holds (WithReservation).
	Local bool
	// Fallback reports a call that Redis could not decide and the
	// WithFallback limiter did: Result is the fallback's own, Err is nil.
	Fallback bool
	// Cause is, with Fallback, the Redis error that sent the call to the
	// fallback (ErrUnavailable's while the circuit breaker is open); nil
	// otherwise.
	Cause error
	// Shadow reports a call of a middleware in shadow mode
	// (httplimit.WithShadow, grpclimit.WithShadow): decided and counted,
	// never enforced.
	Shadow bool
	// Refund reports a Grant's refund rather than a decision: N is the
	// refund's n (the permits to have given back in all), Result the key's
	// state right after it (as n == 0 would report it), Err its error.
	Refund bool
	// Limiter is the limiter's WithName name ("" when unnamed).
	Limiter string
}

// limiter is the part every algorithm shares: it turns engine replies into
// Results. Algorithms embed it and add only validation and their ARGV; its
// methods are theirs. A limiter that no constructor made (a zero
// FixedWindow, TokenBucket, ...) returns ErrInvalidConfig from every
// method. A nil *FixedWindow, *TokenBucket, ... is a programming error, as
// a nil *rate.Limiter is in golang.org/x/time/rate: its methods panic.
type limiter struct {
	engine *engine.Engine
	// limits and windows hold the Limit and Window of each strategy, by the
	// index a script reports; one entry for every algorithm but SlidingLog.
	limits  []int
	windows []time.Duration
	// fallback is WithFallback's limiter, on this limiter's clock (see
	// outageOptions.configure), or nil.
	fallback Limiter
	// prefix is the Redis key prefix: WithPrefix's, or the default.
	prefix string
	// reserve is WithReservation's, or nil (reservation.go).
	reserve *reserver
	// capacity is the most permits one request can ever get.
	capacity int
	// algorithm, name and observer tell observers of the calls a
	// reservation answers (the engine tells of the others).
	algorithm, name string
	observer        func(Decision)
}

// spec is what an algorithm's constructor hands newLimiter.
type spec struct {
	algorithm string
	code      string // in the default key: fw, sw, sl, lb, tb, cc or cw
	format    int    // version of the state's layout in Redis, see defaultPrefix
	script    script
	args      []any
	// argsAt gives ARGV before args for a call at a time (see
	// engine.Config.ArgsAt), and config what argsAt derives them from, in
	// the fingerprint alone; both nil but for the calendar window.
	argsAt func(now time.Time) []any
	config []any
	// sharedArgs follow args when the limiter has a WithPrefix prefix, and
	// may share its keys with other configurations; not in the fingerprint.
	sharedArgs []any
	limits     []int
	windows    []time.Duration // Window of each limit, for ViolationStrategyError
	leases     bool            // grants hold something in flight: Grant.Release refunds them
	// bareRefunds: the script takes refunds that reply no state
	// (engine.Config.BareRefunds).
	bareRefunds bool
}

// defaultPrefix is the key prefix of a limiter without WithPrefix:
// redlimit:<code>:<config>:, where config is a fingerprint of the algorithm,
// its state format and its normalised configuration (the script's ARGV,
// which is the same for every way of writing one configuration: rates
// reduced, strategies sorted). Two limiters share keys by default only when
// they decide alike, in every process and release; a deploy that changes a
// limit, or a release that changes a state format, starts every key afresh.
// FNV-1a over text, in base 32: stable, short, and never a { or }.
func defaultPrefix(s spec) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s|%d", s.code, s.format)
	for _, a := range s.args {
		fmt.Fprintf(h, "|%v", a)
	}
	for _, a := range s.config {
		fmt.Fprintf(h, "|%v", a)
	}
	// 30 bits: two given configurations meet with odds of one in a billion.
	// Each character is a byte of every key, and two fewer move some key
	// lengths down an allocator size class (8 or 16 bytes in Redis).
	return "redlimit:" + s.code + ":" + base32(h.Sum64(), 6) + ":"
}

// base32 writes the low 5×n bits of sum in n base-32 digits, lowest first:
// letters and digits only.
func base32(sum uint64, n int) string {
	const digits = "0123456789abcdefghijklmnopqrstuv"
	out := make([]byte, n)
	for i := range out {
		out[i] = digits[sum&31]
		sum >>= 5
	}
	return string(out)
}

func newLimiter(rdb redis.Scripter, s spec, opts []Option) (limiter, error) {
	if nilcheck.IsNil(rdb) {
		return limiter{}, engine.Errorf(ErrInvalidConfig, "redlimit: %s: Redis client is nil", s.algorithm)
	}
	var o options
	for _, opt := range opts {
		if opt == nil {
			return limiter{}, engine.Errorf(ErrInvalidConfig, "redlimit: %s: nil Option", s.algorithm)
		}
		opt(&o)
	}
	if o.clockSet && o.clock == nil {
		return limiter{}, engine.Errorf(ErrInvalidConfig, "redlimit: %s: WithClock(nil)", s.algorithm)
	}
	if o.denyCacheSet && o.denyCache <= 0 {
		return limiter{}, engine.Errorf(ErrInvalidConfig, "redlimit: %s: deny cache size %d: must be positive", s.algorithm, o.denyCache)
	}
	prefix, args := defaultPrefix(s), s.args
	if o.prefixSet {
		prefix = o.prefix
		args = append(slices.Clip(args), s.sharedArgs...)
	}
	l := limiter{limits: s.limits, windows: s.windows, prefix: prefix,
		capacity: slices.Min(s.limits), algorithm: s.algorithm, name: o.name, observer: o.observer}
	var rule reserveRule
	if o.reserveSet {
		var err error
		if rule, err = reserveRuleOf(s); err != nil {
			return limiter{}, err
		}
		if o.reserveBatch < 2 {
			return limiter{}, engine.Errorf(ErrInvalidConfig, "redlimit: %s: WithReservation batch %d: must be at least 2", s.algorithm, o.reserveBatch)
		}
		if o.reserveHold < time.Millisecond {
			return limiter{}, engine.Errorf(ErrInvalidConfig, "redlimit: %s: WithReservation hold %v: must be at least 1ms", s.algorithm, o.reserveHold)
		}
	}
	cfg := engine.Config{
		Algorithm:   s.algorithm,
		Prefix:      prefix,
		Script:      s.script.Script,
		Source:      s.script.source,
		Args:        args,
		ArgsAt:      s.argsAt,
		Policies:    len(s.limits),
		Clock:       o.clock,
		DenyCache:   o.denyCache,
		Capacity:    slices.Min(s.limits),
		Leases:      s.leases,
		BareRefunds: s.bareRefunds,
	}
	fallback, err := o.outage.configure(s.algorithm, rdb, &cfg)
	if err != nil {
		return limiter{}, err
	}
	l.fallback = fallback
	if fn := o.observer; fn != nil {
		cfg.Observe = func(ev engine.Event) {
			d := Decision{Algorithm: s.algorithm, Key: ev.Key, N: ev.N, Err: ev.Err, Latency: ev.Latency, Local: ev.Local, Fallback: ev.Reply.FromFallback, Cause: ev.Reply.Cause, Shadow: shadow.Is(ev.Ctx), Refund: ev.Refund, Limiter: o.name}
			if ev.Err == nil {
				d.Result = l.result(ev.Reply, ev.Key, ev.N)
			}
			fn(d)
		}
	}
	l.engine = engine.New(rdb, cfg)
	if o.reserveSet {
		l.reserve = newReserver(nil, o.reserveBatch, o.reserveHold, rule, o.clock)
		core := l // what the reserver decides through: the same engine
		l.reserve.l = &core
	}
	return l, nil
}

// result is the Result of a reply to n permits on key: the fallback's own,
// or the script's, with the Grant its token names.
func (l *limiter) result(r engine.Reply, key string, n int) Result {
	if r.FromFallback {
		return Result{Allowed: r.Allowed, Limit: r.Limit, Remaining: int(r.Remaining), RetryAfter: r.RetryAfter, ResetAfter: r.ResetAfter, Grant: r.Grant}
	}
	res := Result{
		Allowed:    r.Allowed,
		Limit:      l.limits[r.Strategy],
		Remaining:  int(r.Remaining),
		RetryAfter: r.RetryAfter,
		ResetAfter: r.ResetAfter,
	}
	if r.Allowed && n > 0 && r.Token != "" {
		res.Grant = engine.NewGrant(l.engine, key, n, r.Token)
	}
	return res
}

// TryAcquire takes one permit for key. It returns nil when allowed, a
// *ViolationStrategyError naming the limit that denied when denied (it
// matches ErrAcquireFailed), and any other error when no decision was made
// (Redis unreachable, ctx done, a key that is empty or longer than
// MaxKeyBytes).
func (l *limiter) TryAcquire(ctx context.Context, key string) error {
	if err := l.built(); err != nil {
		return err
	}
	if l.reserve != nil {
		res, r, err := l.reserve.allowN(ctx, key, 1)
		switch {
		case err != nil:
			return err
		case res.Allowed:
			return nil
		case r.FromFallback:
			return l.fallbackDenial(res)
		}
		return &ViolationStrategyError{Limit: l.limits[r.Strategy], Window: l.windows[r.Strategy], RetryAfter: r.RetryAfter}
	}
	r, err := l.engine.Decide(ctx, key, 1)
	if err != nil {
		return err
	}
	if r.Allowed {
		return nil
	}
	if r.FromFallback {
		return l.fallbackDenial(l.result(r, key, 1)) // unavailable.go
	}
	return &ViolationStrategyError{Limit: l.limits[r.Strategy], Window: l.windows[r.Strategy], RetryAfter: r.RetryAfter}
}

// decideReply is AllowN without a reservation: one round trip (or the
// deny cache, or the fallback), with the engine's reply.
func (l *limiter) decideReply(ctx context.Context, key string, n int) (Result, engine.Reply, error) {
	r, err := l.engine.Decide(ctx, key, n)
	if err != nil {
		return Result{}, engine.Reply{}, err
	}
	return l.result(r, key, n), r, nil
}

// tell tells the observer, if any, of a call a reservation decided,
// started at start: local when answered without a round trip of its own;
// r is the fallback's reply when it decided.
func (l *limiter) tell(ctx context.Context, key string, n int, res Result, err error, start time.Time, local bool, r engine.Reply) {
	if l.observer == nil {
		return
	}
	l.observer(Decision{Algorithm: l.algorithm, Key: key, N: n, Result: res, Err: err, Latency: time.Since(start), Local: local,
		Fallback: r.FromFallback, Cause: r.Cause, Shadow: ctx != nil && shadow.Is(ctx), Limiter: l.name})
}

// tellLocal tells the observer of a call answered from held permits.
func (l *limiter) tellLocal(ctx context.Context, key string, n int, res Result, start time.Time) {
	l.tell(ctx, key, n, res, nil, start, true, engine.Reply{})
}

// tellRefund tells the observer of a refund into held permits: n is the
// refund's, res the reservation's state.
func (l *limiter) tellRefund(ctx context.Context, key string, n int, res Result) {
	if l.observer == nil {
		return
	}
	l.observer(Decision{Algorithm: l.algorithm, Key: key, N: n, Result: res, Local: true, Refund: true, Shadow: shadow.Is(ctx), Limiter: l.name})
}

// built returns an error for a limiter that no constructor made: a zero
// FixedWindow, TokenBucket, ... has no Redis client to ask.
func (l *limiter) built() error {
	if l.engine == nil {
		return engine.Errorf(ErrInvalidConfig, "redlimit: limiter is a zero value: make it with its constructor (NewFixedWindow, NewSlidingWindow, NewSlidingLog, NewLeakyBucket, NewTokenBucket, NewConcurrency or NewCalendarWindow)")
	}
	return nil
}

// redisKey returns the Redis key that holds key's state: the limiter's
// prefix (WithPrefix's, or the default redlimit:<algorithm>:<config>:)
// followed by key. The tests read state through it.
func (l *limiter) redisKey(key string) string { return l.prefix + key }

// Strategies returns the limits the limiter enforces, by window ascending:
// one for every algorithm but SlidingLog, whose strategies they are. A
// bucket's Window is the time it takes to drain or refill completely
// (capacity / rate, rounded up to the microsecond), its Limit the
// capacity. Package httplimit reads it for the w of RateLimit-Policy, and
// Wait for the Window of its denials. nil for a limiter that no
// constructor made.
func (l *limiter) Strategies() []Strategy {
	out := make([]Strategy, len(l.limits))
	for i, limit := range l.limits {
		out[i] = Strategy{Limit: limit, Window: l.windows[i]}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// Allow is AllowN(ctx, key, 1).
func (l *limiter) Allow(ctx context.Context, key string) (Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN takes n permits for key if all n are available, else none. The
// decision is in Result.Allowed; err is non-nil only when no decision was
// made: Redis failed, ctx ended, or the arguments are invalid (a key that
// is empty or longer than MaxKeyBytes, or n < 0: ErrInvalidArgument,
// without a round trip). n == 0 reports the
// current state and consumes nothing. n above the capacity is denied with
// RetryAfter == Never.
func (l *limiter) AllowN(ctx context.Context, key string, n int) (Result, error) {
	if err := l.built(); err != nil {
		return Result{}, err
	}
	if l.reserve != nil {
		res, _, err := l.reserve.allowN(ctx, key, n)
		return res, err
	}
	r, err := l.engine.Decide(ctx, key, n)
	if err != nil {
		return Result{}, err
	}
	return l.result(r, key, n), nil
}

// Reset forgets all state of key, in Redis and in this limiter's deny cache.
// A key that is empty or longer than MaxKeyBytes is ErrInvalidArgument.
func (l *limiter) Reset(ctx context.Context, key string) error {
	if err := l.built(); err != nil {
		return err
	}
	if l.reserve != nil && ctx != nil {
		l.reserve.forget(key)
	}
	return l.engine.Reset(ctx, key)
}

// Close returns every permit the limiter's reservations hold
// (WithReservation) at once, in one round trip per Redis client (per 256
// keys), and stops reserving: later calls are decided one by one, as
// without the option, and Grants handed out before refund to Redis. Call
// it when the process stops taking requests (a deploy), so that other
// processes get the permits back now rather than after the hold. It
// returns the refunds' errors, if any (those permits then stay used until
// Redis no longer counts them). Without WithReservation it has nothing to
// return and returns nil. Safe to call more than once.
func (l *limiter) Close(ctx context.Context) error {
	if err := l.built(); err != nil {
		return err
	}
	if ctx == nil {
		return engine.Errorf(ErrInvalidArgument, "redlimit: %s: Close: nil context (use context.Background())", l.algorithm)
	}
	if l.reserve == nil {
		return nil
	}
	return l.reserve.close(ctx)
}

//go:embed scripts/*.lua
var scriptFiles embed.FS

// script is one algorithm's Lua, with its source kept for EVAL.
type script struct {
	*redis.Script
	source string
}

// loadScript joins the named files of scripts/ into one script: shared
// helpers first, the algorithm's body last.
//
// The script stays a plain EVAL script: no "#!lua" shebang, no flags. Redis
// 6.x cannot compile a shebang line, and on 7+ a shebang script without
// flags is refused outright when the server is out of memory, where a plain
// script still runs its reads, so denials are still decided (property 10).
func loadScript(names ...string) script {
	var src []byte
	for _, name := range names {
		b, err := scriptFiles.ReadFile("scripts/" + name)
		if err != nil {
			panic("redlimit: missing embedded script: " + err.Error()) // a build error, never input
		}
		src = append(append(src, b...), '\n')
	}
	return script{Script: redis.NewScript(string(src)), source: string(src)}
}
