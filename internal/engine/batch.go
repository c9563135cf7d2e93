package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A batch is several limiters' requests sent at once, for AllowAll: every
// request on one client goes in one pipeline (a ClusterClient splits it by
// node and sends the parts in parallel), so a batch whose parts share a
// client costs one round trip. A request that cannot go in a pipeline (its
// breaker is not closed, its deadline is short, its client cannot
// pipeline) takes its own round trip, guardedRun's, at the same time.

// Pending is one decision of a batch: Begin, then Batch.Add and
// Batch.Send. The caller holds it (AllowAll keeps one per part in one
// allocation), with room for its command's arguments.
type Pending struct {
	c     call
	start time.Time
	done  bool
	// Reply, Local and Err are the outcome, as Decide's: set by Begin when
	// the call is answered without a round trip (Local: the deny cache;
	// Err: bad input), else by Batch.Send.
	Reply Reply
	Local bool
	Err   error
	trip  trip
	next  *Pending // the batch's next decision
	argv  [16]any  // the command's arguments (see request.argv)
}

// Done reports whether p was answered without a round trip (Begin).
func (p *Pending) Done() bool { return p.done }

// Begin starts a decision of n permits for key, in p, that a Batch will
// send: it checks the arguments and asks the deny cache, which may answer
// it at once (Done).
func (e *Engine) Begin(ctx context.Context, key string, n int, p *Pending) {
	*p = Pending{start: time.Now()}
	c, r, local, err := e.begin(ctx, key, n)
	p.c = c
	if err != nil || local {
		p.done, p.Reply, p.Local, p.Err = true, r, local, err
		e.tell(ctx, key, n, p)
	}
}

// tell tells the observer of p's outcome.
func (e *Engine) tell(ctx context.Context, key string, n int, p *Pending) {
	if e.observe != nil {
		e.observe(Event{Ctx: ctx, Key: key, N: n, Reply: p.Reply, Err: p.Err, Latency: time.Since(p.start), Local: p.Local})
	}
}

// A Batch is the decisions Begin did not answer, in the order added: a
// list threaded through them, so that collecting them allocates nothing.
type Batch struct{ first, last *Pending }

// Add adds p, which Begin did not answer, to b.
func (b *Batch) Add(p *Pending) {
	p.next = nil
	if b.last == nil {
		b.first = p
	} else {
		b.last.next = p
	}
	b.last = p
}

// Send sends b's decisions as one batch, and finishes each as Decide
// would (deny cache, fallback, observer).
func (b *Batch) Send(ctx context.Context) {
	var trips tripList
	for p := b.first; p != nil; p = p.next {
		req := p.c.request()
		req.argv = p.argv[:0]
		p.trip = trip{t: &p.c.e.roundTrip, req: req}
		trips.add(&p.trip)
	}
	runBatch(ctx, trips.first)
	for p := b.first; p != nil; p = p.next {
		p.Reply, p.Err = p.c.finish(ctx, p.trip.text, p.trip.err)
		p.done = true
		p.c.e.tell(ctx, p.c.key, p.c.n, p)
	}
}

// RefundAll gives back n permits of each grant (as Grant.Refund(ctx, n)
// would), those made by Redis limiters as one batch, and returns every
// failure, joined.
func RefundAll(ctx context.Context, grants []Grant, n int) error {
	ns := make([]int, len(grants))
	for i := range ns {
		ns[i] = n
	}
	return RefundEach(ctx, grants, ns)
}

// RefundEach gives back ns[i] permits of grants[i] (as
// grants[i].Refund(ctx, ns[i]) would; a grant that took fewer is
// skipped), those made by Redis limiters as one batch, and returns every
// failure, joined.
func RefundEach(ctx context.Context, grants []Grant, ns []int) error {
	var errs []error
	type refund struct {
		e    *Engine
		key  string
		n    int
		trip trip
	}
	refunds := make([]refund, 0, len(grants))
	start := time.Now()
	for i, g := range grants {
		n := ns[i]
		if g.src == nil || n > g.n {
			continue
		}
		e, ok := g.src.(*Engine)
		if !ok {
			if err := g.src.RefundGrant(ctx, g.key, g.token, g.n, n); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		req, err := e.refundRequest(ctx, g.key, g.token, n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		e.forget(g.key)
		refunds = append(refunds, refund{e, g.key, n, trip{t: &e.roundTrip, req: req}})
	}
	var trips tripList
	for i := range refunds {
		trips.add(&refunds[i].trip)
	}
	runBatch(ctx, trips.first)
	for _, r := range refunds {
		r.e.forget(r.key)
		if _, _, err := r.e.refunded(ctx, r.key, r.n, start, r.trip.text, r.trip.err); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// GrantGroup is the grants one decision took together (AllowAll): its
// Grant refunds each of them, as one batch.
type GrantGroup struct {
	grants []Grant
	inline [4]Grant // grants' storage, for as many parts as most calls have
}

// Init empties g and makes room for parts grants: in g itself when they
// are few.
func (g *GrantGroup) Init(parts int) {
	*g = GrantGroup{}
	g.grants = g.inline[:0]
	if parts > len(g.inline) {
		g.grants = make([]Grant, 0, parts)
	}
}

// Add adds gr to g.
func (g *GrantGroup) Add(gr Grant) { g.grants = append(g.grants, gr) }

// Refund gives back n permits of each grant of g (as RefundAll).
func (g *GrantGroup) Refund(ctx context.Context, n int) error {
	return RefundAll(ctx, g.grants, n)
}

// Grant returns the grant of n permits from each grant of g.
func (g *GrantGroup) Grant(n int) Grant { return Grant{src: g, n: n} }

// NewGroupGrant returns the grant of n permits from each of grants, one
// per part in the parts' order (a group renewed: see GroupGrants).
func NewGroupGrant(grants []Grant, n int) Grant {
	return Grant{src: &GrantGroup{grants: grants}, n: n}
}

// GroupGrants returns a copy of the grants of a group grant, one per part
// in the parts' order, for the middlewares to renew a part's leases; nil
// for any other grant.
func GroupGrants(g Grant) []Grant {
	if group, ok := g.src.(*GrantGroup); ok {
		return append([]Grant(nil), group.grants...)
	}
	return nil
}

// RefundGrant gives back n permits of every grant of the group.
func (g *GrantGroup) RefundGrant(ctx context.Context, _, _ string, _, n int) error {
	return RefundAll(ctx, g.grants, n)
}

// ReleaseGrant releases the leases of every grant of the group, as one
// batch, and leaves their other permits counted.
func (g *GrantGroup) ReleaseGrant(ctx context.Context, _, _ string, took int) error {
	var leases []Grant
	var errs []error
	for _, p := range g.grants {
		switch src := p.src.(type) {
		case *Engine:
			if src.leases {
				leases = append(leases, p)
			}
		case Releaser:
			if err := src.ReleaseGrant(ctx, p.key, p.token, p.n); err != nil {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, RefundAll(ctx, leases, took))
	return errors.Join(errs...)
}

// trip is one request of a batch, and its outcome.
type trip struct {
	t    *roundTrip
	req  request
	text string
	err  error
	next *trip // the batch's next request
	// Set by runBatch: the client whose pipeline the request goes in
	// (pipelined), whether it is the first of its client's, and the
	// command, once queued.
	client    pipeliner
	pipelined bool
	leader    bool
	cmd       *redis.StringCmd
}

// tripList collects a batch's trips, threaded through them.
type tripList struct{ first, last *trip }

func (l *tripList) add(tr *trip) {
	tr.next = nil
	if l.last == nil {
		l.first = tr
	} else {
		l.last.next = tr
	}
	l.last = tr
}

// pipeliner is what the clients that pipeline have.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// runBatch sends the trips from first on: those that can go together in
// one pipeline per client, the others by themselves, all at once. A batch
// of one pipeline, the common case, runs on the caller's goroutine and
// allocates nothing of its own.
func runBatch(ctx context.Context, first *trip) {
	if first == nil {
		return
	}
	start := time.Now()
	units := 0
	for tr := first; tr != nil; tr = tr.next {
		tr.client, tr.pipelined = tr.t.pipelinable(ctx, start)
		tr.leader = tr.pipelined
		// A batch has few clients, most often one: the trips before are
		// searched, no map is built.
		for o := first; tr.pipelined && o != tr; o = o.next {
			if o.pipelined && o.client == tr.client {
				tr.leader = false
				break
			}
		}
		if !tr.pipelined || tr.leader {
			units++
		}
	}
	if units > 1 {
		runUnits(ctx, first, start)
		return
	}
	runUnit(ctx, first, start)
}

// runUnits runs each unit of a batch (a request alone, or a client's
// pipeline) in a goroutine of its own, and waits for all.
func runUnits(ctx context.Context, first *trip, start time.Time) {
	var wg sync.WaitGroup
	for tr := first; tr != nil; tr = tr.next {
		if tr.pipelined && !tr.leader {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			runUnit(ctx, tr, start)
		}()
	}
	wg.Wait()
}

// runUnit sends tr alone, or, when it leads its client's requests, their
// pipeline.
func runUnit(ctx context.Context, tr *trip, start time.Time) {
	if tr.pipelined {
		pipeline(ctx, tr, start)
		return
	}
	tr.text, tr.err = tr.t.guardedRun(ctx, tr.req)
}

// pipelinable reports whether a request of t can go in a pipeline now, and
// on which client: one that pipelines, with a closed breaker (or none), a
// deadline that leaves at least MinDeadline, and a client that ends a call
// at its ctx's deadline (see runWithin).
func (t *roundTrip) pipelinable(ctx context.Context, start time.Time) (pipeliner, bool) {
	if t.proc == nil || ctx.Err() != nil || t.short(ctx, start) {
		return nil, false
	}
	if t.breaker != nil && t.breaker.state.Load() != stClosed {
		return nil, false
	}
	if deadline, ok := ctx.Deadline(); ok && t.bound != 0 && time.Until(deadline) < t.bound {
		return nil, false
	}
	switch c := t.rdb.(type) {
	case *redis.Client:
		return c, true
	case *redis.ClusterClient:
		return c, true
	case *redis.Ring:
		return c, true
	}
	return nil, false
}

// pipeline sends the trips of leader's client, from leader on, in one
// pipeline, each behind its breaker; those the server answers NOSCRIPT go
// again as EVAL, each alone (after a SCRIPT FLUSH, or on a new node).
func pipeline(ctx context.Context, leader *trip, start time.Time) {
	p := leader.t.pipe(leader.client)
	for tr := leader; tr != nil; tr = tr.next {
		// Another client's trips are another goroutine's (runUnits).
		if !tr.pipelined || tr.client != leader.client {
			continue
		}
		tr.cmd = nil
		if tr.t.breaker != nil {
			probe, err := tr.t.breaker.admit()
			if err != nil {
				tr.err = err
				continue
			}
			if probe {
				// The breaker opened and cooled down since pipelinable
				// looked: this request is its probe, judged alone.
				tr.text, tr.err = tr.t.detach(ctx, start, func(detached context.Context) (string, error) {
					return tr.t.recordedRun(detached, detached, start, tr.req, true)
				})
				continue
			}
		}
		tr.cmd = tr.t.scriptCmd(ctx, tr.req, false)
		p.cmds = append(p.cmds, tr.cmd)
	}
	if len(p.cmds) > 0 {
		_ = p.BatchProcess(ctx, p.cmds...)
		_, _ = p.Exec(ctx)
	}
	leader.t.putPipe(p)
	for tr := leader; tr != nil; tr = tr.next {
		if !tr.pipelined || tr.client != leader.client || tr.cmd == nil {
			continue
		}
		tr.text, tr.err = tr.cmd.Result()
		if tr.err != nil && redis.HasErrorPrefix(tr.err, "NOSCRIPT") {
			// The server lacks the script (a SCRIPT FLUSH, a new node):
			// EVAL it, alone, as run does.
			cmd := tr.t.scriptCmd(ctx, tr.req, true)
			_ = tr.t.proc.Process(ctx, cmd)
			tr.text, tr.err = cmd.Result()
		}
		tr.cmd = nil
		if b := tr.t.breaker; b != nil {
			if tr.err != nil {
				b.record(false, b.classify(ctx, tr.err, start), withCtxErr(ctx, tr.err))
			} else {
				b.record(false, answered, nil)
			}
		}
	}
}

// pipe is a client's Pipeliner, kept for the next batch: go-redis builds
// one in four allocations, and one that has run holds nothing (Exec
// empties it). cmds is the batch's commands, handed to it at once.
type pipe struct {
	redis.Pipeliner
	cmds []redis.Cmder
}

// keptPipes is how many Pipeliners a limiter keeps for its batches: as
// many as batches usually run at once through it. A free list, not a
// sync.Pool, whose every garbage collection would cost the next batches
// their four allocations again.
const keptPipes = 16

// pipe returns a Pipeliner of t's client, one kept from an earlier batch
// when there is one.
func (t *roundTrip) pipe(client pipeliner) *pipe {
	select {
	case p := <-t.pipes:
		return p
	default:
		return &pipe{Pipeliner: client.Pipeline()}
	}
}

// putPipe keeps p, which has run, for t's next batch, if there is room.
func (t *roundTrip) putPipe(p *pipe) {
	clear(p.cmds)
	p.cmds = p.cmds[:0]
	select {
	case t.pipes <- p:
	default:
	}
}
