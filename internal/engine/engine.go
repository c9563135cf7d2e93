package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	Observe   func(Event)
	// Breaker guards the round trips (nil: none); Unavailable is the
	// sentinel its errors match. Fallback, when set, decides a call Redis
	// could not: see breaker.go.
	Breaker     *Breaker
	Unavailable error
	Fallback    func(ctx context.Context, key string, n int) (Reply, error)
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
type Engine struct {
	rdb       redis.Scripter
	proc      processor // rdb, when it can run a prepared command
	sha, src  any       // the script's SHA1 and source, boxed once
	algorithm string
	prefix    string
	script    *redis.Script
	args      []any
	argsAt    func(now time.Time) []any
	policies  int
	clock     func() time.Time
	cache     *denyCache
	peerKey   any // newPeerKey(rdb, prefix), boxed once: see tellPeers
	observe   func(Event)
	bound     time.Duration // clientBound(rdb): see runWithin

	breaker             *Breaker
	minDeadline         time.Duration // the breaker's MinDeadline, else DefaultMinDeadline
	detachSlots         chan struct{} // one per call with a short deadline running on: see guardedRun
	unavailableSentinel error
	fallbackFn          func(ctx context.Context, key string, n int) (Reply, error)
}

// DefaultMinDeadline is the least time a round trip gets when the limiter
// has no breaker to say otherwise (BreakerConfig.MinDeadline): see detach.
const DefaultMinDeadline = 20 * time.Millisecond

// New returns an engine for cfg. The caller has validated cfg.
func New(rdb redis.Scripter, cfg Config) *Engine {
	e := &Engine{
		rdb:       rdb,
		algorithm: cfg.Algorithm,
		prefix:    cfg.Prefix,
		script:    cfg.Script,
		args:      cfg.Args,
		argsAt:    cfg.ArgsAt,
		policies:  max(cfg.Policies, 1),
		clock:     cfg.Clock,
		observe:   cfg.Observe,
		bound:     clientBound(rdb),

		breaker:             cfg.Breaker,
		unavailableSentinel: cfg.Unavailable,
		fallbackFn:          cfg.Fallback,
	}
	e.detachSlots = make(chan struct{}, maxDetachedCalls)
	e.minDeadline = DefaultMinDeadline
	if e.breaker != nil {
		e.minDeadline = e.breaker.cfg.MinDeadline
	}
	key := newPeerKey(rdb, cfg.Prefix)
	e.peerKey = key
	if cfg.DenyCache > 0 {
		e.cache = newDenyCache(cfg.DenyCache, cfg.Capacity)
		joinPeers(key, e, e.cache)
	}
	if p, ok := rdb.(processor); ok {
		e.proc, e.sha, e.src = p, cfg.Script.Hash(), cfg.Source
	}
	return e
}

// processor is what *redis.Client, *redis.ClusterClient, *redis.Ring and
// *redis.AutoPipeliner have beyond redis.Scripter. Through it a decision
// sends one prepared EVALSHA and reads its reply as a string: a few
// allocations fewer than redis.Script.Run, which boxes every argument and
// the reply.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// request is what one round trip does: decide n permits for key at
// nowArg (see decide); give back permits of a grant (refund: the script's
// ARGV[2], "-<k>:<token>"); or, for a reset, delete key. All take the same
// way to Redis: behind the breaker, and ended at the ctx's deadline.
type request struct {
	key    string
	nowArg any
	args   []any // ArgsAt's, when the engine has it
	n      int
	refund string
	reset  bool
}

// run sends the script for one request and returns its reply text (none
// for a reset): EVALSHA, and EVAL once when the server answers NOSCRIPT
// (its script cache was flushed, or it is a new node). Nothing else is
// ever re-sent: a call that timed out may have run.
func (e *Engine) run(ctx context.Context, req request) (string, error) {
	key, nowArg := req.key, req.nowArg
	var n any = req.n
	if req.refund != "" {
		n = req.refund
	}
	if req.reset {
		return "", resetScript.Run(ctx, e.rdb, []string{e.prefix + key}).Err()
	}
	if e.proc == nil {
		args := make([]any, 2, 2+len(req.args)+len(e.args))
		args[0], args[1] = nowArg, n
		args = append(append(args, req.args...), e.args...)
		v, err := e.script.Run(ctx, e.rdb, []string{e.prefix + key}, args...).Result()
		if err != nil {
			return "", err
		}
		text, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("redlimit: unexpected script reply %T, want a string", v)
		}
		return text, nil
	}
	const keyPos = 3 // EVALSHA sha numkeys key ...
	args := make([]any, 6, 6+len(req.args)+len(e.args))
	args[0], args[1], args[2], args[3], args[4], args[5] = "evalsha", e.sha, 1, e.prefix+key, nowArg, n
	args = append(append(args, req.args...), e.args...)
	cmd := redis.NewStringCmd(ctx, args...)
	cmd.SetFirstKeyPos(keyPos)
	_ = e.proc.Process(ctx, cmd)
	text, err := cmd.Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", e.src
		cmd = redis.NewStringCmd(ctx, args...)
		cmd.SetFirstKeyPos(keyPos)
		_ = e.proc.Process(ctx, cmd)
		text, err = cmd.Result()
	}
	return text, err
}

// Decide takes n permits for key if all n are available. err is non-nil only
// when no decision was made.
func (e *Engine) Decide(ctx context.Context, key string, n int) (Reply, error) {
	if e.observe == nil {
		r, _, err := e.decide(ctx, key, n)
		return r, err
	}
	start := time.Now()
	r, local, err := e.decide(ctx, key, n)
	e.observe(Event{Ctx: ctx, Key: key, N: n, Reply: r, Err: err, Latency: time.Since(start), Local: local})
	return r, err
}

func (e *Engine) decide(ctx context.Context, key string, n int) (r Reply, local bool, err error) {
	if err := CheckArgs(ErrInvalidArgument, e.algorithm, ctx, key); err != nil {
		return Reply{}, false, err
	}
	if n < 0 {
		return Reply{}, false, Errorf(ErrInvalidArgument, "redlimit: %s: n %d: must not be negative", e.algorithm, n)
	}
	now, nowArg, err := e.now()
	if err != nil {
		return Reply{}, false, err
	}
	var generation uint64
	if e.cache != nil {
		if now.IsZero() {
			// Taken before the round trip, so a cached denial runs out no
			// later than the server's would.
			now = time.Now()
		}
		if r, ok := e.cache.lookup(key, n, now); ok {
			return r, true, nil
		}
		generation = e.cache.begin(key)
	}
	text, err := e.guardedRun(ctx, request{key: key, nowArg: nowArg, n: n, args: e.argsFor(now)})
	if err != nil {
		if r, ok := e.fallback(ctx, key, n, err); ok {
			return r, false, nil
		}
		return Reply{}, false, e.redisError(ctx, key, "", err)
	}
	r, err = ParseReplyText(text)
	if err == nil && r.Strategy >= e.policies {
		err = fmt.Errorf("script reply names strategy %d of %d", r.Strategy, e.policies)
	}
	if err != nil {
		// A reply no decision can be read from: Redis's, like a failure.
		if r, ok := e.fallback(ctx, key, n, err); ok {
			return r, false, nil
		}
		return Reply{}, false, fmt.Errorf("redlimit: %s: %w", e.algorithm, err)
	}
	if e.cache != nil {
		answered := now
		if e.clock == nil {
			answered = time.Now()
		}
		e.cache.store(key, n, r, now, answered, generation)
	}
	if r.Allowed && n > 0 {
		e.tellPeers(key, e.cache) // its own entry went in store
	}
	return r, false, nil
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

// Refund gives back permits of the grant of key that the script named
// token: until k of them in all have been given back (the script keeps
// what each grant gave back, so a retried refund gives nothing more). It
// returns the key's state after it, as an n == 0 call would see it, and
// the permits this call gave back. It reaches Redis as a decision does,
// behind the breaker, but never goes to the fallback: the permits a Redis
// grant took are in Redis, and a refund that could not be made leaves
// them used (stricter, never looser). It drops the key's cached denials
// in this limiter and its peers.
func (e *Engine) Refund(ctx context.Context, key, token string, k int) (Reply, int, error) {
	if err := CheckArgs(ErrInvalidArgument, e.algorithm, ctx, key); err != nil {
		return Reply{}, 0, err
	}
	if !validToken(token) {
		return Reply{}, 0, Errorf(ErrInvalidArgument, "redlimit: %s: refund: the grant carries no token a script made", e.algorithm)
	}
	start := time.Now()
	now, nowArg, err := e.now()
	if err != nil {
		return Reply{}, 0, err
	}
	// Before and after, as around a Reset: a decision in flight across the
	// refund may have read the state before it and must not cache its
	// denial.
	e.tellPeers(key, nil)
	defer e.tellPeers(key, nil)
	text, err := e.guardedRun(ctx, request{key: key, nowArg: nowArg, refund: "-" + strconv.Itoa(k) + ":" + token, args: e.argsFor(now)})
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
	// Before and after the DEL, in this limiter's cache and its peers': a
	// decision in flight across either may have read the old state, and
	// must not cache its denial.
	e.tellPeers(key, nil)
	defer e.tellPeers(key, nil)
	if _, err := e.guardedRun(ctx, request{key: key, reset: true}); err != nil {
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
	ctxErr := ctx.Err()
	if ctxErr == nil && errors.Is(err, os.ErrDeadlineExceeded) {
		// The socket deadline is the ctx's, and may fire a moment before
		// the ctx's own timer marks it done.
		if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
			ctxErr = context.DeadlineExceeded
		}
	}
	if ctxErr != nil && !errors.Is(err, ctxErr) {
		return fmt.Errorf("redlimit: %s: %s%w (%w)", e.algorithm, op, err, ctxErr)
	}
	return fmt.Errorf("redlimit: %s: %s%w", e.algorithm, op, err)
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
