package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

// The round trip: one request's way to Redis and back. run sends it;
// guardedRun puts the circuit breaker in front and ends it at the
// caller's deadline (runWithin, detach). Every decision, refund and Reset
// takes this way; AllowAll's pipelines take the same steps (batch.go).

// roundTrip is how one limiter's requests reach Redis: the client, the
// script, and the breaker in front of them.
type roundTrip struct {
	rdb      redis.Scripter
	proc     processor // rdb, when it can run a prepared command
	sha, src any       // the script's SHA1 and source, boxed once
	script   *redis.Script
	args     []any         // the algorithm's ARGV after now and n
	bound    time.Duration // clientBound(rdb): see runWithin

	breaker     *Breaker
	minDeadline time.Duration // the breaker's MinDeadline, else DefaultMinDeadline
	detachSlots chan struct{} // one per call with a short deadline running on: see guardedRun
	// pipes keeps rdb's Pipeliners between AllowAll batches (batch.go).
	pipes chan *pipe
}

// newRoundTrip returns the round trip of cfg's script on rdb.
func newRoundTrip(rdb redis.Scripter, cfg Config) roundTrip {
	t := roundTrip{
		rdb:         rdb,
		script:      cfg.Script,
		args:        cfg.Args,
		bound:       clientBound(rdb),
		breaker:     cfg.Breaker,
		minDeadline: DefaultMinDeadline,
		detachSlots: make(chan struct{}, maxDetachedCalls),
		pipes:       make(chan *pipe, keptPipes),
	}
	if t.breaker != nil {
		t.minDeadline = t.breaker.cfg.MinDeadline
	}
	if p, ok := rdb.(processor); ok {
		t.proc, t.sha, t.src = p, cfg.Script.Hash(), cfg.Source
	}
	return t
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
// nowArg (see decide); give back permits of a grant, or extend a lease
// (refund: the script's ARGV[2], "-<k>:<token>", "=<k>:<token>" (see
// Config.BareRefunds) or "+<token>" (see Extend)); or, for a reset,
// delete key. All take the same way to Redis: behind the breaker, and
// ended at the ctx's deadline.
type request struct {
	key    string // the Redis key: the limiter's prefix and the caller's key
	nowArg any
	args   []any // Config.ArgsAt's, when the limiter has it
	n      int
	refund string
	reset  bool
	// argv, when its capacity holds the command's arguments, is where
	// scriptCmd writes them: room in an allocation the caller makes anyway
	// (a Lease, AllowAll's parts), which spares the call one of its own.
	argv []any
}

// run sends the script for one request and returns its reply text (none
// for a reset): EVALSHA, and EVAL once when the server answers NOSCRIPT
// (its script cache was flushed, or it is a new node). Nothing else is
// ever re-sent: a call that timed out may have run.
func (t *roundTrip) run(ctx context.Context, req request) (string, error) {
	key, nowArg := req.key, req.nowArg
	var n any = req.n
	if req.refund != "" {
		n = req.refund
	}
	if req.reset {
		return "", resetScript.Run(ctx, t.rdb, []string{key}).Err()
	}
	if t.proc == nil {
		args := make([]any, 2, 2+len(req.args)+len(t.args))
		args[0], args[1] = nowArg, n
		args = append(append(args, req.args...), t.args...)
		v, err := t.script.Run(ctx, t.rdb, []string{key}, args...).Result()
		if err != nil {
			return "", err
		}
		text, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("redlimit: unexpected script reply %T, want a string", v)
		}
		return text, nil
	}
	cmd := t.scriptCmd(ctx, req, false)
	_ = t.proc.Process(ctx, cmd)
	text, err := cmd.Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = t.scriptCmd(ctx, req, true)
		_ = t.proc.Process(ctx, cmd)
		text, err = cmd.Result()
	}
	return text, err
}

// scriptCmd returns the prepared command of a decision or refund request:
// EVALSHA, or EVAL of the script's source when source is set.
func (t *roundTrip) scriptCmd(ctx context.Context, req request, source bool) *redis.StringCmd {
	var n any = req.n
	if req.refund != "" {
		n = req.refund
	}
	const keyPos = 3 // EVALSHA sha numkeys key ...
	args := req.argv
	if need := 6 + len(req.args) + len(t.args); cap(args) < need {
		args = make([]any, 0, need)
	}
	args = args[:6]
	args[0], args[1], args[2], args[3], args[4], args[5] = "evalsha", t.sha, 1, req.key, req.nowArg, n
	if source {
		args[0], args[1] = "eval", t.src
	}
	args = append(append(args, req.args...), t.args...)
	cmd := redis.NewStringCmd(ctx, args...)
	cmd.SetFirstKeyPos(keyPos)
	return cmd
}

// guardedRun is run behind the breaker: it fails at once while the breaker
// is open and tells it how the round trip ended. A ctx already done before
// the call neither reaches Redis nor counts. The breaker's probe, and a
// call whose deadline leaves less than MinDeadline, run detached (see
// detach).
func (t *roundTrip) guardedRun(ctx context.Context, req request) (string, error) {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return "", doneBeforeCall{err}
	}
	if t.breaker != nil {
		probe, err := t.breaker.admit()
		if err != nil {
			return "", err
		}
		if probe {
			// Judged by its own deadline: see detach.
			return t.detach(ctx, start, func(detached context.Context) (string, error) {
				return t.recordedRun(detached, detached, start, req, true)
			})
		}
	}
	if t.short(ctx, start) {
		// A slot to run on, by the caller's deadline; else the call ends
		// there without reaching Redis, as cut at that deadline it would
		// cost a connection.
		select {
		case t.detachSlots <- struct{}{}:
		case <-ctx.Done():
			return "", doneBeforeCall{ctx.Err()}
		}
		// Judged by its caller's deadline, as if it had not run on.
		return t.detach(ctx, start, func(detached context.Context) (string, error) {
			defer func() { <-t.detachSlots }()
			return t.recordedRun(detached, ctx, start, req, false)
		})
	}
	return t.recordedRun(ctx, ctx, start, req, false)
}

// maxDetachedCalls bounds the calls with short deadlines that one engine
// runs on after their callers returned (see detach), so that callers
// cannot pile up goroutines and connections faster than Redis answers. A
// short call that finds all taken waits for one until its deadline.
const maxDetachedCalls = 64

// recordedRun is runWithin on ctx, started at start, and tells the breaker,
// if there is one, how the round trip ended, judged by the deadline of
// judge (see classify).
func (t *roundTrip) recordedRun(ctx, judge context.Context, start time.Time, req request, probe bool) (string, error) {
	text, err := t.runWithin(ctx, req)
	if t.breaker == nil {
		return text, err
	}
	if err != nil {
		t.breaker.record(probe, t.breaker.classify(judge, err, start), withCtxErr(judge, err))
	} else {
		t.breaker.record(probe, answered, nil)
	}
	return text, err
}

// short reports a ctx whose deadline leaves a call started at start less
// than MinDeadline: less than a healthy Redis is sure to need.
func (t *roundTrip) short(ctx context.Context, start time.Time) bool {
	deadline, ok := ctx.Deadline()
	return ok && deadline.Sub(start) < t.minDeadline
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
func (t *roundTrip) detach(ctx context.Context, start time.Time, run func(context.Context) (string, error)) (string, error) {
	detached, cancel := context.WithoutCancel(ctx), context.CancelFunc(func() {})
	if deadline, ok := ctx.Deadline(); ok {
		if least := start.Add(t.minDeadline); deadline.Before(least) {
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
	if ctxErr := callerErr(ctx, err); ctxErr != nil && !errors.Is(err, ctxErr) {
		return fmt.Errorf("%w (%w)", err, ctxErr)
	}
	return err
}

// callerErr returns the caller's part in err, the error of a round trip on
// ctx: ctx's error, or context.DeadlineExceeded for a timeout that came
// with ctx's deadline passed (go-redis turns a ctx deadline into the
// socket's, which may fire a moment before ctx's own timer marks it done);
// nil when the caller had no part in it (a timeout without a ctx deadline
// that passed is the client's own: Redis's).
func callerErr(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
			return context.DeadlineExceeded
		}
	}
	return nil
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
// That goroutine costs a call 3 allocations and two goroutine switches
// (the root package's BenchmarkCtxWatch measures it), so it is spent only
// where it buys something: a ctx
// that can be cancelled but has no deadline (a request's) runs on the
// caller's goroutine, and a cancellation then ends the call at the
// client's timeouts rather than at once.
func (t *roundTrip) runWithin(ctx context.Context, req request) (string, error) {
	deadline, ok := ctx.Deadline()
	if !ok || t.bound == 0 || time.Until(deadline) >= t.bound {
		return t.run(ctx, req)
	}
	done := make(chan result, 1)
	go func() {
		text, err := t.run(ctx, req)
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
