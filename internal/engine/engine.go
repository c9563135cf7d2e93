package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Config is what an algorithm hands the engine.
type Config struct {
	Algorithm string        // name for errors and observers, e.g. "token_bucket"
	Prefix    string        // Redis key = Prefix + key
	Script    *redis.Script // the algorithm's script; ARGV[1] now µs or "", ARGV[2] n, then Args
	Source    string        // the script's source, for EVAL when the server lacks it
	Args      []any         // the algorithm's ARGV after now and n, boxed once
	Policies  int           // how many limits a reply's strategy index may name (1 but for the sliding log)
	Clock     func() time.Time
	DenyCache int // entries; 0 = off
	Capacity  int // the most permits one request can ever get (the smallest limit)
	// Leases marks an algorithm whose grants hold something in flight (a
	// Concurrency's): Grant.Release refunds them.
	Leases bool
	// BareRefunds marks a script that also takes a refund as
	// "=<k>:<token>": it gives back as "-<k>:<token>" does but replies no
	// state (every number 0 but the permits given), and so spares the
	// reads an n == 0 reply needs. A refund goes so when no observer
	// reads that state.
	BareRefunds bool
	Observe     func(Event)
	// Breaker guards the round trips (nil: none); its errors match
	// ErrUnavailable. Fallback, when set, decides a call Redis
	// could not: see fallback.go.
	Breaker  *Breaker
	Fallback func(ctx context.Context, key string, n int) (Reply, error)
	// ArgsAt, when set, gives more ARGV, between n and Args, for a call
	// whose limiter clock (or, without one, the host's) reads now: a
	// calendar window's period boundaries around it.
	ArgsAt func(now time.Time) []any
}

// Event is what the observer is told of one call.
type Event struct {
	Ctx     context.Context // the call's, for markers the observer reads (shadow mode)
	Key     string
	N       int
	Reply   Reply
	Err     error
	Latency time.Duration
	Local   bool
	// Refund reports a grant's refund: N is the refund's n, Reply the
	// key's state after it, as an n == 0 call would see it.
	Refund bool
}

// maxClockUS bounds a WithClock time (2112-02-27): with a window or refill
// time added it stays below 2^53, where Lua's doubles stop being exact
// integers, and so does a sliding key's entry score, 2^52 + 2^44 + a time.
const maxClockUS = 1<<52 - 1<<44

// minClockUS bounds a WithClock time from below, at 2001-09-09: every time a
// script stores then has 16 digits, a shape that other applications' small
// counters and second or millisecond timestamps never have.
const minClockUS = 1_000_000_000_000_000

// CheckClock returns an error matching sentinel when a WithClock time is
// outside what the scripts take (minClockUS to maxClockUS), else nil. The
// clock is wrong, not the call, but it is found at call time, like a bad
// argument; the in-process limiters refuse what the scripts would.
func CheckClock(sentinel error, algorithm string, now time.Time) error {
	if us := now.UnixMicro(); us < minClockUS || us > maxClockUS {
		return Errorf(sentinel, "redlimit: %s: clock reads %v: must be between 2001-09-09 (10^15µs after the Unix epoch) and 2112-02-27 (2^52 - 2^44 µs)", algorithm, now)
	}
	return nil
}

// Engine runs one algorithm's decisions. It is safe for concurrent use.
// Its round trip to Redis is the embedded roundTrip (roundtrip.go); the
// rest is what a decision adds around it.
type Engine struct {
	roundTrip
	algorithm string
	prefix    string
	policies  int // how many limits a reply's strategy may name
	clock     func() time.Time
	cache     *denyCache
	observe   func(Event)
	leases    bool // Config.Leases
	// refundMark starts a refund's ARGV[2]: "=" (Config.BareRefunds, and
	// no observer) or "-".
	refundMark string
	// fallbackFn is Config.Fallback: it decides a call Redis could not.
	fallbackFn func(ctx context.Context, key string, n int) (Reply, error)
	argsAt     func(now time.Time) []any // Config.ArgsAt
}

// DefaultMinDeadline is the least time a round trip gets when the limiter
// has no breaker to say otherwise (BreakerConfig.MinDeadline): see detach.
const DefaultMinDeadline = 20 * time.Millisecond

// New returns an engine for cfg. The caller has validated cfg.
func New(rdb redis.Scripter, cfg Config) *Engine {
	e := &Engine{
		roundTrip:  newRoundTrip(rdb, cfg),
		algorithm:  cfg.Algorithm,
		prefix:     cfg.Prefix,
		policies:   max(cfg.Policies, 1),
		clock:      cfg.Clock,
		observe:    cfg.Observe,
		fallbackFn: cfg.Fallback,
		argsAt:     cfg.ArgsAt,
		leases:     cfg.Leases,
		refundMark: "-",
	}
	if cfg.BareRefunds && cfg.Observe == nil {
		e.refundMark = "="
	}
	if cfg.DenyCache > 0 {
		e.cache = newDenyCache(cfg.DenyCache, cfg.Capacity)
	}
	return e
}

// Decide takes n permits for key if all n are available. err is non-nil only
// when no decision was made.
func (e *Engine) Decide(ctx context.Context, key string, n int) (Reply, error) {
	return e.DecideIn(ctx, key, n, nil)
}

// DecideIn is Decide writing the script command's arguments in argv
// (len 0) when its capacity holds them: storage in an allocation the
// caller makes anyway, which spares the call one. The command may still
// use argv after DecideIn returned (a call that runs on past its caller's
// deadline, see detach): the caller must not reuse it.
func (e *Engine) DecideIn(ctx context.Context, key string, n int, argv []any) (Reply, error) {
	if e.observe == nil {
		r, _, err := e.decide(ctx, key, n, argv)
		return r, err
	}
	start := time.Now()
	r, local, err := e.decide(ctx, key, n, argv)
	e.observe(Event{Ctx: ctx, Key: key, N: n, Reply: r, Err: err, Latency: time.Since(start), Local: local})
	return r, err
}

func (e *Engine) decide(ctx context.Context, key string, n int, argv []any) (r Reply, local bool, err error) {
	c, r, local, err := e.begin(ctx, key, n)
	if err != nil || local {
		return r, local, err
	}
	req := c.request()
	req.argv = argv
	text, err := e.guardedRun(ctx, req)
	r, err = c.finish(ctx, text, err)
	return r, false, err
}

// call is one decision under way: checked, past the deny cache, waiting
// for its reply (begin, then finish, around a round trip or a batch's).
type call struct {
	e          *Engine
	key        string
	n          int
	now        time.Time // the limiter's clock, or time.Now with a deny cache
	nowArg     any       // the script's ARGV[1]
	generation uint64    // the deny cache's, at begin
	// fallbackN, when not 0, is what the fallback decides in place of n:
	// the caller's own permits, of a call that asked Redis for more
	// (DecideExtra).
	fallbackN int
}

// begin checks a decision's arguments and asks the deny cache: local is
// true, with the cached denial in r, when it answers.
func (e *Engine) begin(ctx context.Context, key string, n int) (c call, r Reply, local bool, err error) {
	if err := CheckArgs(ErrInvalidArgument, e.algorithm, ctx, key); err != nil {
		return call{}, Reply{}, false, err
	}
	if n < 0 {
		return call{}, Reply{}, false, Errorf(ErrInvalidArgument, "redlimit: %s: n %d: must not be negative", e.algorithm, n)
	}
	now, nowArg, err := e.now()
	if err != nil {
		return call{}, Reply{}, false, err
	}
	c = call{e: e, key: key, n: n, now: now, nowArg: nowArg}
	if e.cache != nil {
		if c.now.IsZero() {
			// Taken before the round trip, so a cached denial runs out no
			// later than the server's would.
			c.now = time.Now()
		}
		if r, ok := e.cache.lookup(key, n, c.now); ok {
			return call{}, r, true, nil
		}
		c.generation = e.cache.begin(key)
	}
	return c, Reply{}, false, nil
}

// request is the round trip c makes.
func (c call) request() request {
	return request{key: c.e.prefix + c.key, nowArg: c.nowArg, n: c.n, args: c.e.argsFor(c.now)}
}

// argsFor returns ArgsAt's ARGV for a call at now (the zero time: the
// host's clock), or nil when the engine has none.
func (e *Engine) argsFor(now time.Time) []any {
	if e.argsAt == nil {
		return nil
	}
	if now.IsZero() {
		now = time.Now()
	}
	return e.argsAt(now)
}

// finish reads the outcome of c's round trip, text or err: the script's
// decision, which the deny cache then learns, or the fallback's when Redis
// left the call undecided, or the error.
func (c call) finish(ctx context.Context, text string, err error) (Reply, error) {
	e := c.e
	fallbackN := c.n
	if c.fallbackN != 0 {
		fallbackN = c.fallbackN
	}
	if err != nil {
		if r, ok := e.fallback(ctx, c.key, fallbackN, err); ok {
			return r, nil
		}
		return Reply{}, e.redisError(ctx, c.key, "", err)
	}
	r, err := ParseReplyText(text)
	if err == nil && r.Strategy >= e.policies {
		err = fmt.Errorf("script reply names strategy %d of %d", r.Strategy, e.policies)
	}
	if err != nil {
		// A reply no decision can be read from: Redis's, like a failure.
		if r, ok := e.fallback(ctx, c.key, fallbackN, err); ok {
			return r, nil
		}
		return Reply{}, fmt.Errorf("redlimit: %s: %w", e.algorithm, err)
	}
	if e.cache != nil {
		answered := c.now
		if e.clock == nil {
			answered = time.Now()
		}
		e.cache.store(c.key, c.n, r, c.now, answered, c.generation)
	}
	return r, nil
}

// now reads the limiter's clock: the time and the script's ARGV[1] for it,
// or, without WithClock, the zero time and "" (the script reads the Redis
// server's TIME).
func (e *Engine) now() (time.Time, any, error) {
	if e.clock == nil {
		return time.Time{}, "", nil
	}
	now := e.clock()
	if err := CheckClock(ErrInvalidArgument, e.algorithm, now); err != nil {
		return time.Time{}, nil, err
	}
	// The deny cache counts on the microsecond the script decides on, so
	// that its Results equal the script's to the microsecond.
	us := now.UnixMicro()
	return time.UnixMicro(us), us, nil
}

// Refund gives back permits of the grant of key that the script named
// token: until k of them in all have been given back (the script keeps
// what each grant gave back, so a retried refund gives nothing more). It
// returns the key's state after it, as an n == 0 call would see it, and
// the permits this call gave back. It reaches Redis as a decision does,
// behind the breaker, but never goes to the fallback: the permits a Redis
// grant took are in Redis, and a refund that could not be made leaves
// them used (stricter, never looser). It drops the key's cached denials
// in this limiter.
func (e *Engine) Refund(ctx context.Context, key, token string, k int) (Reply, int, error) {
	req, err := e.refundRequest(ctx, key, token, k)
	if err != nil {
		return Reply{}, 0, err
	}
	start := time.Now()
	// Before and after, as around a Reset: a decision in flight across the
	// refund may have read the state before it and must not cache its
	// denial.
	e.forget(key)
	defer e.forget(key)
	text, err := e.guardedRun(ctx, req)
	return e.refunded(ctx, key, k, start, text, err)
}

// refundRequest checks a refund of k permits of the grant of key named
// token and returns its round trip.
func (e *Engine) refundRequest(ctx context.Context, key, token string, k int) (request, error) {
	if err := CheckArgs(ErrInvalidArgument, e.algorithm, ctx, key); err != nil {
		return request{}, err
	}
	if !validToken(token) {
		return request{}, Errorf(ErrInvalidArgument, "redlimit: %s: refund: the grant carries no token a script made", e.algorithm)
	}
	now, nowArg, err := e.now()
	if err != nil {
		return request{}, err
	}
	return request{key: e.prefix + key, nowArg: nowArg, refund: e.refundMark + strconv.Itoa(k) + ":" + token, args: e.argsFor(now)}, nil
}

// refunded reads the outcome of a refund's round trip, started at start,
// and tells the observer.
func (e *Engine) refunded(ctx context.Context, key string, k int, start time.Time, text string, err error) (Reply, int, error) {
	var r Reply
	given := 0
	if err == nil {
		r, err = ParseReplyText(text)
		if err == nil {
			given, err = strconv.Atoi(r.Token)
			if err != nil || given < 0 || given > k {
				err = fmt.Errorf("malformed refund reply %q", text)
			}
			r.Token = ""
		}
		if err != nil {
			err = fmt.Errorf("redlimit: %s: refund: %w", e.algorithm, err)
		}
	} else {
		err = e.redisError(ctx, key, "refund: ", err)
	}
	if e.observe != nil {
		e.observe(Event{Ctx: ctx, Key: key, N: k, Reply: r, Err: err, Latency: time.Since(start), Refund: true})
	}
	if err != nil {
		return Reply{}, 0, err
	}
	return r, given, nil
}

// forget drops key's denials from the deny cache, if there is one, after
// a Reset or a refund through this limiter. A deny cache hears only its own
// limiter: grants, refunds and Resets through other limiters, in this
// process or another, stay unseen, and a denial it cached keeps its Result
// of before them until it runs out (stricter, or a RetryAfter that may
// prove short; never a grant).
func (e *Engine) forget(key string) {
	if e.cache != nil {
		e.cache.forget(key)
	}
}

// resetScript deletes one key. redis.Scripter has no DEL, and a script keeps
// Reset on the same one-round-trip, cluster-safe path as the decisions.
var resetScript = redis.NewScript(`return redis.call('DEL', KEYS[1])`)

// Reset forgets all state of key, in Redis and in the deny cache. It
// reaches Redis as a decision does: an open breaker answers at once, and
// the call ends at ctx's deadline.
func (e *Engine) Reset(ctx context.Context, key string) error {
	if err := CheckArgs(ErrInvalidArgument, e.algorithm, ctx, key); err != nil {
		return err
	}
	// Before and after the DEL: a decision in flight across either may have
	// read the old state, and must not cache its denial.
	e.forget(key)
	defer e.forget(key)
	if _, err := e.guardedRun(ctx, request{key: e.prefix + key, reset: true}); err != nil {
		return e.redisError(ctx, key, "reset: ", err)
	}
	return nil
}

// redisError wraps an error from Redis. go-redis turns a ctx deadline into a
// socket deadline, whose error is an i/o timeout; when ctx is done the error
// matches ctx's error too, so errors.Is(err, context.DeadlineExceeded) holds.
// A script's refusal of a foreign value names the key, bounded and quoted.
func (e *Engine) redisError(ctx context.Context, key, op string, err error) error {
	if msg, ok := strings.CutPrefix(err.Error(), foreignPrefix); ok && redis.HasErrorPrefix(err, "NOTOURS") {
		return Errorf(ErrForeignState, "redlimit: %s: %skey %s %s", e.algorithm, op, QuoteKey(e.prefix+key), msg)
	}
	return fmt.Errorf("redlimit: %s: %s%w", e.algorithm, op, withCtxErr(ctx, err))
}

// foreignPrefix starts the error reply of a script that found a value it
// did not write: "NOTOURS holds <what>, ...".
const foreignPrefix = "NOTOURS "

// CheckArgs checks what every call carries, for the Redis limiters and the
// in-process ones alike: a key of 1 to MaxKeyBytes bytes (the prefix is not
// counted), and a ctx. A nil ctx is refused like a bad argument: the
// standard library's rule is never to pass one, and a limiter in front of
// every request must not panic on it. Errors match sentinel.
func CheckArgs(sentinel error, algorithm string, ctx context.Context, key string) error {
	if ctx == nil {
		return Errorf(sentinel, "redlimit: %s: nil context (use context.Background())", algorithm)
	}
	if key == "" {
		return Errorf(sentinel, "redlimit: %s: key is empty", algorithm)
	}
	if len(key) > MaxKeyBytes {
		return Errorf(sentinel, "redlimit: %s: key %s: must be at most %d bytes", algorithm, QuoteKey(key), MaxKeyBytes)
	}
	return nil
}

// MaxKeyBytes is the longest key a call takes. A client who chooses the key
// (an API key header, a path) must not be able to store megabytes in Redis
// per request; 1024 bytes hold any address, token or hash with room to spare.
const MaxKeyBytes = 1024

// QuoteKey returns key for an error message: quoted (a key may hold any
// byte, NUL included) and cut to its first 64 bytes, with its length, so
// that an error never grows with a hostile key.
func QuoteKey(key string) string {
	const most = 64
	if len(key) <= most {
		return fmt.Sprintf("%q", key)
	}
	return fmt.Sprintf("%q… (%d bytes)", key[:most], len(key))
}

// RefundGrant makes Engine the Refunder of the grants its scripts name:
// see Refund.
func (e *Engine) RefundGrant(ctx context.Context, key, token string, took, n int) error {
	_, _, err := e.Refund(ctx, key, token, n)
	return err
}

// ReleaseGrant ends the leases of a grant, for an algorithm whose grants
// are leases (Config.Leases), by refunding all it took; other grants hold
// nothing in flight and are left as they are (see Grant.Release).
func (e *Engine) ReleaseGrant(ctx context.Context, key, token string, took int) error {
	if !e.leases {
		return nil
	}
	return e.RefundGrant(ctx, key, token, took, took)
}
