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

// Pending is one decision of a batch: Begin, then SendAll.
type Pending struct {
	c     call
	start time.Time
	done  bool
	// Reply, Local and Err are the outcome, as Decide's: set by Begin when
	// the call is answered without a round trip (Local: the deny cache;
	// Err: bad input), else by SendAll.
	Reply Reply
	Local bool
	Err   error
}

// Done reports whether p was answered without a round trip (Begin).
func (p *Pending) Done() bool { return p.done }

// Begin starts a decision of n permits for key that SendAll will send:
// it checks the arguments and asks the deny cache, which may answer it
// at once (Done).
func (e *Engine) Begin(ctx context.Context, key string, n int) *Pending {
	p := &Pending{start: time.Now()}
	c, r, local, err := e.begin(ctx, key, n)
	p.c = c
	if err != nil || local {
		p.done, p.Reply, p.Local, p.Err = true, r, local, err
		e.tell(ctx, key, n, p)
	}
	return p
}

// tell tells the observer of p's outcome.
func (e *Engine) tell(ctx context.Context, key string, n int, p *Pending) {
	if e.observe != nil {
		e.observe(Event{Ctx: ctx, Key: key, N: n, Reply: p.Reply, Err: p.Err, Latency: time.Since(p.start), Local: p.Local})
	}
}

// SendAll sends the decisions of ps that Begin did not answer, as one
// batch, and finishes each as Decide would (deny cache, fallback,
// observer).
func SendAll(ctx context.Context, ps []*Pending) {
	all := make([]trip, 0, len(ps))
	trips := make([]*trip, 0, len(ps))
	for _, p := range ps {
		if !p.done {
			all = append(all, trip{t: &p.c.e.roundTrip, req: p.c.request()})
			trips = append(trips, &all[len(all)-1])
		}
	}
	runBatch(ctx, trips)
	i := 0
	for _, p := range ps {
		if p.done {
			continue
		}
		tr := trips[i]
		i++
		p.Reply, p.Err = p.c.finish(ctx, tr.text, tr.err)
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
		trip *trip
	}
	var refunds []refund
	var trips []*trip
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
		tr := &trip{t: &e.roundTrip, req: req}
		refunds = append(refunds, refund{e, g.key, n, tr})
		trips = append(trips, tr)
	}
	runBatch(ctx, trips)
	for _, r := range refunds {
		r.e.forget(r.key)
		if _, _, err := r.e.refunded(ctx, r.key, r.n, start, r.trip.text, r.trip.err); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// NewGroupGrant returns the grant of n permits from each of grants, which
// one decision took together (AllowAll), one per part in the parts' order:
// refunding it refunds each, as one batch.
func NewGroupGrant(grants []Grant, n int) Grant {
	return Grant{src: &grantGroup{grants: grants}, n: n}
}

// GroupGrants returns a copy of the grants of a group grant, one per part
// in the parts' order, for the middlewares to renew a part's leases; nil
// for any other grant.
func GroupGrants(g Grant) []Grant {
	if group, ok := g.src.(*grantGroup); ok {
		return append([]Grant(nil), group.grants...)
	}
	return nil
}

// grantGroup is the Refunder of a group grant.
type grantGroup struct{ grants []Grant }

// RefundGrant gives back n permits of every grant of the group.
func (g *grantGroup) RefundGrant(ctx context.Context, _, _ string, _, n int) error {
	return RefundAll(ctx, g.grants, n)
}

// ReleaseGrant releases the leases of every grant of the group, as one
// batch, and leaves their other permits counted.
func (g *grantGroup) ReleaseGrant(ctx context.Context, _, _ string, took int) error {
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
}

// pipeliner is what the clients that pipeline have.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// runBatch sends trips: those that can go together in one pipeline per
// client, the others by themselves, all at once.
func runBatch(ctx context.Context, trips []*trip) {
	if len(trips) == 0 {
		return
	}
	start := time.Now()
	// A batch has few clients, most often one: a list, not a map.
	type group struct {
		client pipeliner
		trips  []*trip
	}
	var groups []group
	var lone []*trip
next:
	for _, tr := range trips {
		client, ok := tr.t.pipelinable(ctx, start)
		if !ok {
			lone = append(lone, tr)
			continue
		}
		for i := range groups {
			if groups[i].client == client {
				groups[i].trips = append(groups[i].trips, tr)
				continue next
			}
		}
		groups = append(groups, group{client, append(make([]*trip, 0, len(trips)), tr)})
	}
	var wg sync.WaitGroup
	units := len(lone) + len(groups)
	do := func(f func()) {
		if units == 1 {
			f()
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f()
		}()
	}
	for _, tr := range lone {
		do(func() { tr.text, tr.err = tr.t.guardedRun(ctx, tr.req) })
	}
	for _, g := range groups {
		do(func() { pipeline(ctx, g.client, g.trips, start) })
	}
	wg.Wait()
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

// pipeline sends trips, on one client, in one pipeline, each behind its
// breaker; those the server answers NOSCRIPT go again as EVAL, each alone
// (after a SCRIPT FLUSH, or on a new node).
func pipeline(ctx context.Context, client pipeliner, trips []*trip, start time.Time) {
	sent := make([]*trip, 0, len(trips))
	for _, tr := range trips {
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
		sent = append(sent, tr)
	}
	if len(sent) == 0 {
		return
	}
	p := client.Pipeline()
	cmds := make([]*redis.StringCmd, len(sent))
	for i, tr := range sent {
		cmds[i] = tr.t.scriptCmd(ctx, tr.req, false)
		_ = p.Process(ctx, cmds[i])
	}
	_, _ = p.Exec(ctx)
	for i, tr := range sent {
		tr.text, tr.err = cmds[i].Result()
		if tr.err != nil && redis.HasErrorPrefix(tr.err, "NOSCRIPT") {
			// The server lacks the script (a SCRIPT FLUSH, a new node):
			// EVAL it, alone, as run does.
			cmd := tr.t.scriptCmd(ctx, tr.req, true)
			_ = tr.t.proc.Process(ctx, cmd)
			tr.text, tr.err = cmd.Result()
		}
		if b := tr.t.breaker; b != nil {
			if tr.err != nil {
				b.record(false, b.classify(ctx, tr.err, start), withCtxErr(ctx, tr.err))
			} else {
				b.record(false, answered, nil)
			}
		}
	}
}
