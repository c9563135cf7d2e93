package redlimit

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit/internal/engine"
)

// WithReservation takes the permits of a busy key from Redis in batches of
// up to batch, in one round trip, and hands them out in process for up to
// hold; what is left then is refunded. One key is one Redis shard: a
// global limit or a big tenant puts every decision of every instance on
// one core, and this takes all but about one in batch of them off it.
//
// A key is busy when a call on it arrives while another call on it, from
// this limiter, is at Redis, and stays busy while permits it reserved may
// still be handed out. A busy key's calls wait for the call in flight to
// come back, if none came back in this busy spell, so that Redis's reply
// sizes the batch; then one asks Redis for its own n plus
// a batch sized to the demand seen since the previous one (at least 1,
// at most batch - n, never more than the Remaining Redis last reported),
// and calls that arrive meanwhile wait for that round trip instead of
// making their own, so a busy key costs one round trip at a time. A
// bucket is reserved from only while at least min(hold, 1ms) of refill
// away from full: a permit taken early from a bucket about to be full
// would cost the refill it stops. A key that is not busy costs what it
// costs without the option: one round trip per call, nothing held. A
// call the held permits cannot cover (n above them: Redis is asked for
// n, plus a batch when busy; n == 0; a batch Redis denied: n alone; the
// breaker not closed) goes to Redis as without the option. At most 4,096
// keys of a limiter hold permits at once; a busy key beyond them is
// decided call by call.
//
// The bounds, for every process on the key:
//   - the limit is never exceeded: every permit handed out was granted by
//     Redis first, and is handed out only while Redis still counts it as
//     it did (within the fixed or calendar window that counted it, within
//     the sliding bucket that counted it, and for a bucket only while the
//     bucket, had it the held permits back, would not be full), so what is
//     handed out is what the limiter would have granted call by call;
//   - other processes find the key stricter by at most the permits this
//     limiter holds on it, at most batch - 1, for at most hold after Redis
//     granted them: then, or when Redis would no longer count them, they
//     are refunded (on the next call on the key, or by the limiter's one
//     timer, armed only while something is held: no goroutine per key),
//     and Close refunds them at once. A Reset from another process is
//     not seen: held permits may then be handed out on the fresh key
//     until the hold passes.
//
// A call answered from held permits is Allowed and tells observers
// Decision.Local; its Result's Limit, Remaining and ResetAfter are those
// Redis gave the batch (Remaining the least Redis reported on the key
// since, which counts every held permit as used; ResetAfter counted down
// from the batch's reply), and its Grant refunds
// into the reservation while it holds, else to Redis through the batch's
// grant: exactly once, never more than it took. docs/reservations.md tells
// the whole story.
//
// While the circuit breaker is not closed nothing held is handed out:
// calls get ErrUnavailable or the WithFallback limiter's decision, as
// without the option, and a batch never comes from the fallback.
//
// batch below 2, or hold below 1ms, is ErrInvalidConfig; so is the option
// on a Concurrency, whose permits are leases held by requests, not counts
// to hand out. Default: off.
func WithReservation(batch int, hold time.Duration) Option {
	return func(o *options) {
		o.reserveBatch, o.reserveHold, o.reserveSet = batch, hold, true
	}
}

// maxReservedKeys bounds the keys of one limiter holding permits at once,
// so that a client who chooses keys cannot make a process hold permits on
// (and remember) more: a busy key beyond it is decided call by call.
const maxReservedKeys = 4096

// reserveShards is how many locks the keys of a reserver are spread over.
const reserveShards = 32

// sweepTimeout bounds the timer's refunds of reservations whose hold
// passed: they are best effort, and a Redis that does not answer must not
// hold the timer.
const sweepTimeout = time.Second

// refundChunk is the most refunds one pipeline of the sweep carries.
const refundChunk = 256

// reserveKind is how long an algorithm's Redis still counts a permit as
// it did when it granted it.
type reserveKind int

const (
	// untilReset: until the window that counted it closes, at ResetAfter
	// (fixed and calendar windows).
	untilReset reserveKind = iota + 1
	// untilBucketEnds: until the bucket of precision that counted it ends
	// (sliding window and log).
	untilBucketEnds
	// untilFull: while the bucket, had it every held permit back, would
	// not be full (a token bucket) or empty (a leaky bucket): taken early,
	// a permit then costs no refill (leaky and token bucket).
	untilFull
)

// reserveRule is what a reservation needs of an algorithm.
type reserveRule struct {
	kind reserveKind
	// untilBucketEnds: the precision and the longest window, µs.
	precisionUS, longestUS int64
	// untilFull: a permit drains or refills in perUS/count µs.
	perUS, count int64
}

// reserveRuleOf returns the rule of the algorithm s describes, or an error
// for one whose permits cannot be handed out by a reservation.
func reserveRuleOf(s spec) (reserveRule, error) {
	switch s.code {
	case "fw", "cw":
		return reserveRule{kind: untilReset}, nil
	case "sw", "sl":
		// ARGV: kind, precision µs, then limit and size per strategy.
		longest := int64(0)
		for _, w := range s.windows {
			longest = max(longest, w.Microseconds())
		}
		return reserveRule{kind: untilBucketEnds, precisionUS: toInt64(s.args[1]), longestUS: longest}, nil
	case "lb", "tb":
		// ARGV: capacity, per µs, count.
		return reserveRule{kind: untilFull, perUS: toInt64(s.args[1]), count: toInt64(s.args[2])}, nil
	}
	return reserveRule{}, engine.Errorf(ErrInvalidConfig, "redlimit: %s: WithReservation: its permits are leases that requests hold and release, not counts a process can take ahead and hand out", s.algorithm)
}

// toInt64 reads an integer ARGV.
func toInt64(v any) int64 {
	switch x := v.(type) {
	case int:
		return int64(x)
	case int64:
		return x
	}
	panic(fmt.Sprintf("redlimit: ARGV %v (%T) is not an integer", v, v)) // a build error, never input
}

// until returns when a batch granted after start, with reply r, may no
// longer hand out its permits while held of them are still not handed out
// (before hold is counted).
func (rule reserveRule) until(start time.Time, r engine.Reply, held int) time.Time {
	switch rule.kind {
	case untilReset:
		return start.Add(r.ResetAfter)
	case untilBucketEnds:
		// The bucket that counted the grant ends within the precision of
		// start on the limiter's clock; and the reply tells the same on
		// the key's: ResetAfter is when that bucket leaves the longest
		// window, a longest window after it began. The earlier of the two.
		startUS := start.UnixMicro()
		end := start.Add(time.Duration(rule.precisionUS-startUS%rule.precisionUS) * time.Microsecond)
		if byReset := start.Add(r.ResetAfter - time.Duration(rule.longestUS-rule.precisionUS)*time.Microsecond); byReset.Before(end) {
			end = byReset
		}
		return end
	case untilFull:
		// ResetAfter is when the bucket would be full (empty) with every
		// held permit counted, rounded up to the µs; held fewer make it
		// sooner by the time they take, rounded up. Until then, exclusive:
		// a µs less than the truth at most.
		hi, lo := bits.Mul64(uint64(held), uint64(rule.perUS))
		if hi >= uint64(rule.count) {
			return start
		}
		q, rem := bits.Div64(hi, lo, uint64(rule.count))
		if rem != 0 {
			q++
		}
		if q > uint64(r.ResetAfter/time.Microsecond) {
			return start
		}
		return start.Add(r.ResetAfter - time.Duration(q)*time.Microsecond)
	}
	return start
}

// minHandOut is the least time a bucket's batch must be able to hand
// out its permits, had it handed out none: see roomFor.
const minHandOut = time.Millisecond

// roomFor reports whether a batch may be taken from a key whose last
// reply said it is back in its initial state at reset, at now. A bucket's batch hands out only while the bucket, had it
// the held permits back, would not be full: taken from a bucket about to
// be full, its permits would cost the refill they stop, and could only be
// handed out as fast as it comes. So a bucket is reserved from only when
// it is at least min(hold, minHandOut) of refill away from full: then a
// batch hands out for that long whatever the pace of the calls. A bucket
// that stays full (calls slower than its rate) is decided call by call,
// as without the option.
func (rule reserveRule) roomFor(reset, now time.Time, hold time.Duration) bool {
	if rule.kind != untilFull {
		return true
	}
	return reset.Sub(now) >= min(hold, minHandOut)
}

// resetOf is when reply's ResetAfter ends, counted from answered (under
// WithClock, from now on the limiter's clock).
func (rs *reserver) resetOf(reply engine.Reply, answered time.Time) time.Time {
	if rs.clock != nil {
		return rs.now().Add(reply.ResetAfter)
	}
	return answered.Add(reply.ResetAfter)
}

// counts reports whether Redis may still count the held permits of a
// batch granted after start at now: else refunding them gives nothing,
// and is not sent.
func (rule reserveRule) counts(start time.Time, r engine.Reply, now time.Time) bool {
	return rule.kind != untilReset || now.Before(start.Add(r.ResetAfter))
}

// reserver is a limiter's reservations: per key, the permits it holds,
// the decisions in flight, and the demand seen.
type reserver struct {
	l      *limiter
	batch  int
	hold   time.Duration
	rule   reserveRule
	clock  func() time.Time // WithClock's, or nil
	seed   maphash.Seed
	shards [reserveShards]reserveShard
	live   atomic.Int64 // batches handing out, on every key
	closed atomic.Bool

	sweepMu sync.Mutex // one sweep (or Close) at a time
	timerMu sync.Mutex
	timer   *time.Timer
	armedAt time.Time // when the timer fires, on now's clock; zero: not armed

	pendingMu sync.Mutex
	pending   []*batch // retired, with permits to give back
}

type reserveShard struct {
	mu sync.Mutex
	m  map[string]*reservation
	// free keeps reservations tidy forgot, for keys to come: a key that
	// is not busy then costs no allocation.
	free []*reservation
}

// reserveFree is the most reservations a shard keeps for reuse.
const reserveFree = 8

// newReservation returns an empty reservation. The shard's lock is held.
func (sh *reserveShard) newReservation() *reservation {
	if n := len(sh.free); n > 0 {
		r := sh.free[n-1]
		sh.free = sh.free[:n-1]
		return r
	}
	return &reservation{lastRemaining: -1}
}

// reservation is one key's: what is in flight, what is held, the demand.
// Its fields are guarded by its shard's lock.
type reservation struct {
	inflight int     // calls of this limiter at Redis on the key
	refill   *refill // the batch on its way, if any
	b        *batch  // the batch handing out, if any
	asked    int     // permits asked since the last batch was asked for
	// lastRemaining is the Remaining of Redis's last reply on the key, -1
	// before one: a batch never asks for more. lastReset is when that
	// reply's ResetAfter ends (zero before one): a bucket is full then.
	lastRemaining int64
	lastReset     time.Time
	// replied, made by a busy call that found nothing known of the key,
	// is closed by the next call of this limiter to come back from Redis
	// on it: that call waits for a reply to size a batch from, rather
	// than go to Redis alone as well.
	replied chan struct{}
	waiting int  // calls waiting on replied
	came    bool // a call came back in this busy spell, with a reply or not
}

// refill is a batch on its way: calls that arrive meanwhile claim its
// extra permits and wait for it.
type refill struct {
	extra, claimed int
	done           chan struct{}
	b              *batch // once done: the batch, or nil when none came
}

// batch is the permits one round trip took for a key.
type batch struct {
	rs    *reserver
	key   string
	grant Grant // Redis's, of took permits
	took  int
	reply engine.Reply
	// start is read before the round trip: the permits are handed out on
	// its time, never later than Redis counts them. resetAt is when the
	// reply's ResetAfter ends, counted from when the reply came back
	// (under WithClock, from start: the limiter's clock is the key's).
	start, resetAt time.Time
	// Guarded by the shard's lock:
	held int // permits not handed out, not claimed
	// remaining and resetAt (above) are the least Remaining and the
	// latest reset Redis reported on the key since the batch: its own, or
	// a later call's of this limiter (learn).
	remaining int64
	claimed   int  // permits claimed by waiting calls, not handed out yet
	retired   bool // hands out nothing more
	returned  int  // permits to give back through grant, in all
}

func newReserver(l *limiter, batch int, hold time.Duration, rule reserveRule, clock func() time.Time) *reserver {
	rs := &reserver{batch: batch, hold: hold, rule: rule, clock: clock, seed: maphash.MakeSeed()}
	for i := range rs.shards {
		rs.shards[i].m = make(map[string]*reservation)
	}
	rs.l = l
	return rs
}

// now reads the limiter's clock (WithClock's, to the µs as the scripts
// read it), or the host's.
func (rs *reserver) now() time.Time {
	if rs.clock != nil {
		return time.UnixMicro(rs.clock().UnixMicro())
	}
	return time.Now()
}

func (rs *reserver) shard(key string) *reserveShard {
	return &rs.shards[maphash.String(rs.seed, key)%reserveShards]
}

// allowN is AllowN with the reservation: from held permits when it can,
// else from Redis, with a batch when the key is busy. reply is the
// engine's when Redis (or the fallback) decided the call alone, as every
// denial is; zero for a grant from a batch.
func (rs *reserver) allowN(ctx context.Context, key string, n int) (res Result, reply engine.Reply, err error) {
	l := rs.l
	if n <= 0 || ctx == nil || key == "" || len(key) > MaxKeyBytes {
		return l.decideReply(ctx, key, n)
	}
	var start time.Time // for observers' Latency
	if l.observer != nil {
		start = time.Now()
	}
	sh := rs.shard(key)
	alone := false  // the batch was denied: ask for n alone
	waited := false // for a reply or a batch: the key is busy
	replyWaited := false
	for pass := 0; ; pass++ {
		if rs.closed.Load() || !l.engine.BreakerClosed() {
			// Also after waiting for a batch that failed: an open
			// breaker's rules, not what is held, decide.
			if replyWaited {
				sh.mu.Lock()
				if r := sh.m[key]; r != nil {
					r.waiting--
					rs.tidy(sh, key, r)
				}
				sh.mu.Unlock()
			}
			return l.decideReply(ctx, key, n)
		}
		sh.mu.Lock()
		r := sh.m[key]
		if r == nil {
			r = sh.newReservation()
			sh.m[key] = r
		}
		if pass == 0 {
			r.asked += n
		}
		if replyWaited {
			r.waiting--
			replyWaited = false
		}
		if b := r.b; b != nil {
			now := rs.now()
			if b.take(n, now) {
				res := b.result(b.handOut(n), now)
				sh.mu.Unlock()
				l.tellLocal(ctx, key, n, res, start)
				return res, engine.Reply{}, nil
			}
			if !now.Before(b.until(b.held + b.claimed)) {
				rs.retire(b, now)
				r.b = nil
			}
		}
		if f := r.refill; f != nil && !alone {
			if f.extra-f.claimed >= n {
				f.claimed += n
				sh.mu.Unlock()
				res, ok, err := rs.await(ctx, sh, key, n, f, start)
				if ok || err != nil {
					return res, engine.Reply{}, err
				}
				waited = true
				continue // no batch came: decide again
			}
			// More demand than the batch on its way: wait for it, then
			// ask for the next, sized to the demand seen meanwhile,
			// rather than each going to Redis.
			sh.mu.Unlock()
			select {
			case <-f.done:
				waited = true
				continue
			case <-ctx.Done():
				err := fmt.Errorf("redlimit: %s: waiting for a reservation's batch: %w", l.algorithm, ctx.Err())
				l.tell(ctx, key, n, Result{}, err, start, false, engine.Reply{})
				return Result{}, engine.Reply{}, err
			}
		}
		// Busy: another call in flight, or a batch that may still hand
		// out. A batch is sized from Redis's last reply in this busy
		// spell: until a call comes back, a busy call waits for one (a
		// call that came back without a reply sizes no batch).
		extra := 0
		busy := r.inflight > 0 || r.b != nil || r.waiting > 0 || waited
		if busy && !r.came && r.inflight > 0 && !alone {
			if r.replied == nil {
				r.replied = make(chan struct{})
			}
			replied := r.replied
			r.waiting++
			sh.mu.Unlock()
			select {
			case <-replied:
				// Still counted as waiting until the next pass holds the
				// lock: the key stays known, and busy, meanwhile.
				waited, replyWaited = true, true
				continue
			case <-ctx.Done():
				sh.mu.Lock()
				r.waiting--
				rs.tidy(sh, key, r)
				sh.mu.Unlock()
				err := fmt.Errorf("redlimit: %s: waiting for a reply on a busy key: %w", l.algorithm, ctx.Err())
				l.tell(ctx, key, n, Result{}, err, start, false, engine.Reply{})
				return Result{}, engine.Reply{}, err
			}
		}
		if busy && r.lastRemaining >= 0 && r.refill == nil && !alone && (r.b != nil || rs.live.Load() < maxReservedKeys) &&
			rs.rule.roomFor(r.lastReset, rs.now(), rs.hold) {
			extra = min(rs.batch-n, l.capacity-n, max(r.asked, 1), int(min(r.lastRemaining, int64(rs.batch)))-n)
		}
		if extra <= 0 {
			r.inflight++
			sh.mu.Unlock()
			res, reply, err := l.decideReply(ctx, key, n)
			answered := time.Now()
			sh.mu.Lock()
			r.inflight--
			r.came = true
			if r.replied != nil {
				close(r.replied)
				r.replied = nil
			}
			if err == nil && !reply.FromFallback {
				r.lastRemaining = reply.Remaining
				r.lastReset = rs.resetOf(reply, answered)
				if r.b != nil {
					r.b.learn(reply, answered, rs.now())
				}
			}
			rs.tidy(sh, key, r)
			sh.mu.Unlock()
			return res, reply, err
		}
		f := &refill{extra: extra, done: make(chan struct{})}
		r.refill, r.asked = f, 0
		r.inflight++
		sh.mu.Unlock()
		res, reply, denied, err := rs.fill(ctx, sh, key, n, r, f, start)
		if !denied {
			return res, reply, err
		}
		alone = true
	}
}

// fill asks Redis for n permits and f's extra, as the call that found key
// busy, and makes a batch of the extra. denied reports a batch Redis
// denied: the caller then asks for n alone, which Redis may grant.
func (rs *reserver) fill(ctx context.Context, sh *reserveShard, key string, n int, r *reservation, f *refill, start time.Time) (res Result, reply engine.Reply, denied bool, err error) {
	l := rs.l
	began := rs.now()
	got, took, _, err := l.engine.DecideExtra(ctx, key, n, f.extra)
	answered := time.Now()
	now := rs.now()
	sh.mu.Lock()
	r.inflight--
	r.refill = nil
	r.came = true
	if r.replied != nil {
		close(r.replied)
		r.replied = nil
	}
	var b *batch
	switch {
	case err != nil:
	case took == n+f.extra:
		b = &batch{rs: rs, key: key, grant: engine.NewGrant(l.engine, key, took, got.Token), took: took, reply: got, start: began}
		b.remaining = got.Remaining
		b.resetAt = answered.Add(got.ResetAfter)
		if rs.clock != nil {
			b.resetAt = began.Add(got.ResetAfter)
		}
		r.lastReset = b.resetAt
		b.held, b.claimed = f.extra-f.claimed, f.claimed
		if r.b != nil {
			rs.retire(r.b, now)
		}
		r.b = b
		rs.live.Add(1)
		r.lastRemaining = got.Remaining
		if rs.closed.Load() {
			rs.retire(b, now)
			r.b = nil
		} else {
			rs.arm(b.start.Add(rs.hold))
		}
	case !got.FromFallback:
		r.lastRemaining = got.Remaining
		r.lastReset = rs.resetOf(got, answered)
	}
	f.b = b
	close(f.done)
	rs.tidy(sh, key, r)
	if b != nil {
		res = b.result(b.handOut(n), now)
	}
	sh.mu.Unlock()
	switch {
	case err != nil:
		l.tell(ctx, key, n, Result{}, err, start, false, engine.Reply{})
		return Result{}, engine.Reply{}, false, err
	case b != nil:
		// The caller's own permits were granted with the batch, as a
		// call of its own would have been: no hand-out to time.
		l.tell(ctx, key, n, res, nil, start, false, engine.Reply{})
		return res, engine.Reply{}, false, nil
	case got.FromFallback:
		res := l.result(got, key, n)
		l.tell(ctx, key, n, res, nil, start, false, got)
		return res, got, false, nil
	}
	return Result{}, engine.Reply{}, true, nil
}

// await waits for f, a batch on its way of which the caller claimed n
// permits. ok reports a Result from it; false with a nil error means no
// batch came (denied, failed, or too late to hand out): the caller
// decides as a new call.
func (rs *reserver) await(ctx context.Context, sh *reserveShard, key string, n int, f *refill, start time.Time) (res Result, ok bool, err error) {
	l := rs.l
	select {
	case <-f.done:
	case <-ctx.Done():
		sh.mu.Lock()
		select {
		case <-f.done:
			sh.mu.Unlock()
		default:
			f.claimed -= n
			sh.mu.Unlock()
			err := fmt.Errorf("redlimit: %s: waiting for a reservation's batch: %w", l.algorithm, ctx.Err())
			l.tell(ctx, key, n, Result{}, err, start, false, engine.Reply{})
			return Result{}, false, err
		}
	}
	b := f.b
	if b == nil {
		return Result{}, false, nil
	}
	now := rs.now()
	sh.mu.Lock()
	inTime := now.Before(b.until(b.held + b.claimed))
	b.claimed -= n
	if !inTime {
		switch {
		case !b.retired:
			b.held += n // refunded with the rest, on the next call or sweep
		case rs.rule.counts(b.start, b.reply, now):
			b.returned += n
			rs.queue(b)
		}
	}
	if inTime {
		res = b.result(b.handOut(n), now)
	}
	sh.mu.Unlock()
	if !inTime {
		return Result{}, false, nil
	}
	l.tellLocal(ctx, key, n, res, start)
	return res, true, nil
}

// take takes n held permits at now if b holds them and may still hand
// them out. The shard's lock is held.
func (b *batch) take(n int, now time.Time) bool {
	if b.retired || b.held < n || !now.Before(b.until(b.held+b.claimed)) {
		return false
	}
	b.held -= n
	return true
}

// until is when b may no longer hand out its permits while held of them
// are not handed out: after hold, or when Redis would no longer count
// them as it did.
func (b *batch) until(held int) time.Time {
	t := b.start.Add(b.rs.hold)
	if u := b.rs.rule.until(b.start, b.reply, held); u.Before(t) {
		return u
	}
	return t
}

// learn makes b's Results no looser than a later reply of Redis on its
// key, which came back at answered (now on the limiter's clock). The
// shard's lock is held.
func (b *batch) learn(r engine.Reply, answered, now time.Time) {
	b.remaining = min(b.remaining, r.Remaining)
	at := answered.Add(r.ResetAfter)
	if b.rs.clock != nil {
		at = now.Add(r.ResetAfter)
	}
	if at.After(b.resetAt) {
		b.resetAt = at
	}
}

// handOut returns the Grant of n permits handed out from b.
func (b *batch) handOut(n int) Grant {
	return engine.NewGrant(&localGrant{b: b, n: n}, b.key, n, "")
}

// result is the Result of a call given grant from b at now. The shard's
// lock is held.
func (b *batch) result(grant Grant, now time.Time) Result {
	reset := max(b.resetAt.Sub(now), 0)
	if rem := reset % time.Microsecond; rem != 0 {
		reset += time.Microsecond - rem
	}
	return Result{
		Allowed:    true,
		Limit:      b.rs.l.limits[b.reply.Strategy],
		Remaining:  int(b.remaining),
		ResetAfter: reset,
		Grant:      grant,
	}
}

// localGrant is the Refunder of permits handed out from a batch.
type localGrant struct {
	b *batch
	n int
	// Guarded by the batch's shard lock: the permits given back in all,
	// and whether some went to Redis (a retried refund sends again).
	given   int
	toRedis bool
}

// RefundGrant gives back permits of g until n in all have been: into the
// batch, to be handed out again, while it may hand them out; else to
// Redis, through the batch's grant.
func (g *localGrant) RefundGrant(ctx context.Context, key, _ string, _, n int) error {
	b := g.b
	rs := b.rs
	sh := rs.shard(key)
	now := rs.now()
	sh.mu.Lock()
	delta := n - g.given
	if delta <= 0 && !g.toRedis {
		sh.mu.Unlock()
		return nil
	}
	if delta > 0 {
		g.given = n
		if !b.retired && !rs.closed.Load() && b.held+b.claimed+delta < rs.batch && now.Before(b.until(b.held+b.claimed+delta)) {
			b.held += delta
			res := b.result(Grant{}, now)
			sh.mu.Unlock()
			rs.l.tellRefund(ctx, key, n, res)
			return nil
		}
		b.returned += delta
		g.toRedis = true
	}
	total := b.returned
	sh.mu.Unlock()
	return b.grant.Refund(ctx, total)
}

// retire ends b's hand-outs and queues what it holds to be refunded, if
// Redis still counts it. The shard's lock is held.
func (rs *reserver) retire(b *batch, now time.Time) {
	if b.retired {
		return
	}
	b.retired = true
	rs.live.Add(-1)
	if b.held > 0 && rs.rule.counts(b.start, b.reply, now) {
		b.returned += b.held
		rs.queue(b)
	}
	b.held = 0
}

// queue adds b to the batches to refund, and has the timer refund them.
func (rs *reserver) queue(b *batch) {
	rs.pendingMu.Lock()
	rs.pending = append(rs.pending, b)
	rs.pendingMu.Unlock()
	rs.arm(time.Time{})
}

// tidy forgets key's reservation once nothing is in flight or held.
func (rs *reserver) tidy(sh *reserveShard, key string, r *reservation) {
	if r.inflight == 0 && r.refill == nil && r.b == nil && r.replied == nil && r.waiting == 0 && sh.m[key] == r {
		delete(sh.m, key)
		if len(sh.free) < reserveFree {
			*r = reservation{lastRemaining: -1}
			sh.free = append(sh.free, r)
		}
	}
}

// arm makes the timer sweep at at (the zero time: at once), unless it
// will sooner.
func (rs *reserver) arm(at time.Time) {
	rs.timerMu.Lock()
	defer rs.timerMu.Unlock()
	if !rs.armedAt.IsZero() && !at.Before(rs.armedAt) {
		return
	}
	d := time.Duration(0)
	if !at.IsZero() {
		d = max(at.Sub(rs.now()), 0)
	} else {
		at = time.Unix(0, 1) // before any clock
	}
	rs.armedAt = at
	if rs.timer == nil {
		rs.timer = time.AfterFunc(d, rs.sweep)
	} else {
		rs.timer.Reset(d)
	}
}

// sweep is the timer's: it retires the batches whose time passed, refunds
// what they held, and arms the timer for the next.
func (rs *reserver) sweep() {
	rs.sweepMu.Lock()
	defer rs.sweepMu.Unlock()
	rs.timerMu.Lock()
	rs.armedAt = time.Time{}
	rs.timerMu.Unlock()
	next := rs.retireExpired(rs.now())
	ctx, cancel := context.WithTimeout(context.Background(), sweepTimeout)
	defer cancel()
	_ = rs.refundPending(ctx) // best effort: the permits lapse in Redis
	if !next.IsZero() {
		rs.arm(next)
	}
}

// retireExpired retires every batch that may no longer hand out at now,
// and returns when the next live one's hold ends (zero: none is live).
func (rs *reserver) retireExpired(now time.Time) (next time.Time) {
	for i := range rs.shards {
		sh := &rs.shards[i]
		sh.mu.Lock()
		for key, r := range sh.m {
			b := r.b
			if b == nil {
				continue
			}
			if !now.Before(b.until(b.held + b.claimed)) {
				rs.retire(b, now)
				r.b = nil
				rs.tidy(sh, key, r)
				continue
			}
			if end := b.start.Add(rs.hold); next.IsZero() || end.Before(next) {
				next = end
			}
		}
		sh.mu.Unlock()
	}
	return next
}

// refundPending refunds what the retired batches queued, in pipelines.
func (rs *reserver) refundPending(ctx context.Context) error {
	rs.pendingMu.Lock()
	bs := rs.pending
	rs.pending = nil
	rs.pendingMu.Unlock()
	var errs []error
	for len(bs) > 0 {
		chunk := bs[:min(len(bs), refundChunk)]
		bs = bs[len(chunk):]
		grants := make([]Grant, len(chunk))
		ns := make([]int, len(chunk))
		for i, b := range chunk {
			if _, _, token := engine.GrantParts(b.grant); token == "" {
				continue // a script that keeps no refunds: nothing to give back
			}
			sh := rs.shard(b.key)
			sh.mu.Lock()
			grants[i], ns[i] = b.grant, b.returned
			sh.mu.Unlock()
		}
		if err := engine.RefundEach(ctx, grants, ns); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("redlimit: %s: refunding reserved permits: %w", rs.l.algorithm, errors.Join(errs...))
	}
	return nil
}

// close stops reserving and refunds every held permit, in one pipeline
// per client (per chunk of refundChunk keys).
func (rs *reserver) close(ctx context.Context) error {
	rs.sweepMu.Lock()
	defer rs.sweepMu.Unlock()
	rs.closed.Store(true)
	now := rs.now()
	for i := range rs.shards {
		sh := &rs.shards[i]
		sh.mu.Lock()
		for key, r := range sh.m {
			if r.b != nil {
				rs.retire(r.b, now)
				r.b = nil
				rs.tidy(sh, key, r)
			}
		}
		sh.mu.Unlock()
	}
	return rs.refundPending(ctx)
}

// forget drops key's reservation without a refund: its state in Redis is
// gone (Reset).
func (rs *reserver) forget(key string) {
	sh := rs.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if r := sh.m[key]; r != nil && r.b != nil {
		r.b.held = 0
		rs.retire(r.b, rs.now())
		r.b = nil
		rs.tidy(sh, key, r)
	}
}

// takeLocal answers a call of n permits on key from held permits, if it
// can, without a round trip (AllowAll's parts).
func (rs *reserver) takeLocal(ctx context.Context, key string, n int) (Result, bool) {
	if n <= 0 || rs.closed.Load() || !rs.l.engine.BreakerClosed() {
		return Result{}, false
	}
	start := time.Now()
	now := rs.now()
	sh := rs.shard(key)
	sh.mu.Lock()
	r := sh.m[key]
	if r == nil || r.b == nil || !r.b.take(n, now) {
		sh.mu.Unlock()
		return Result{}, false
	}
	res := r.b.result(r.b.handOut(n), now)
	sh.mu.Unlock()
	rs.l.tellLocal(ctx, key, n, res, start)
	return res, true
}
