package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// row is one contender under one workload, with its samples over rounds.
type row struct {
	workload string
	c        contender
	decide   decider
	keys     []string
	// seqKeys are the sequential pass's keys: keys unless the workload
	// gives that pass keys of its own.
	seqKeys []string

	p50, p99, perSecond, allocs, bytes []float64 // one per round
	scriptUS                           []float64 // script µs per decision, one per round
	seqScriptUS                        []float64 // the same, of the sequential pass alone
	decisions, allowed, errs           int
	firstErr                           error
	server                             serverStats // summed over rounds
	roundTrips                         int64
}

// Workloads.
var (
	allowLimit = limit{count: 1_000_000, per: time.Minute} // over 1,000 keys: nearly all allowed
	hotLimit   = limit{count: 100, per: time.Second}       // on one key: nearly all denied
	// hotAllowLimit is one key that every call of a run finds allowed,
	// however many rounds -rows runs.
	hotAllowLimit = limit{count: 1_000_000_000, per: time.Hour}
)

// reserveBatch and reserveHold are the hot allowed workload's
// WithReservation: a batch of 64, held for at most 250ms (less than the
// time between a row's passes in two rounds, so that each sequential pass
// starts on a key that is not busy).
const (
	reserveBatch = 64
	reserveHold  = 250 * time.Millisecond
)

const denyCacheSize = 1024

func (e *environment) buildRows() ([]*row, error) {
	type entry struct {
		c   contender
		lim limit
	}
	with := func(lim limit, cs ...[]contender) []entry {
		var out []entry
		for _, list := range cs {
			for _, c := range list {
				out = append(out, entry{c, lim})
			}
		}
		return out
	}
	cached := hotLimit
	cached.denyCache = denyCacheSize
	reserved := hotAllowLimit
	reserved.batch, reserved.hold = reserveBatch, reserveHold
	workloads := []struct {
		name   string
		tag    string // starts its keys
		client redis.Scripter
		nkeys  int
		// calm: the sequential pass runs on a key of its own, which the
		// concurrent pass never makes busy (hot allowed).
		calm    bool
		entries []entry
	}{
		{"allow", "a", e.rdb, 1000, false, with(allowLimit, ceilings, redlimitContenders(""), peers, floorContenders("allow"))},
		{"hot", "h", e.rdb, 1, false, append(with(hotLimit, ceilings, redlimitContenders(""), peers, floorContenders("hot")), with(cached, redlimitContenders(" +deny cache"))...)},
		{"autopipeline", "a", e.ap, 1000, false, with(allowLimit, ceilings, redlimitContenders(""), peers)},
		{"hot allowed", "H", e.rdb, 1, true, append(with(hotAllowLimit, ceilings, redlimitContenders("")), with(reserved, redlimitContenders(reservedSuffix))...)},
	}
	var rows []*row
	for _, w := range workloads {
		for i, en := range w.entries {
			if e.f.rows != nil && !e.f.rows.MatchString(w.name+" "+en.c.name) {
				continue
			}
			decide, err := en.c.build(w.client, en.lim)
			if err != nil {
				if en.c.kind == "peer" {
					logf("%s: %s skipped: %v", w.name, en.c.name, err)
					continue
				}
				return nil, fmt.Errorf("%s: %s: %w", w.name, en.c.name, err)
			}
			r := &row{workload: w.name, c: en.c, decide: decide}
			for k := 0; k < w.nkeys; k++ {
				r.keys = append(r.keys, fmt.Sprintf("%s%d:%s:%04d", w.tag, i, e.run, k))
			}
			r.seqKeys = r.keys
			if w.calm {
				r.seqKeys = []string{fmt.Sprintf("%s%d:%s:calm", w.tag, i, e.run)}
				if en.c.kind == "redlimit" {
					if err := e.useHalf(en.c.algorithm, w.client, en.lim, append(slices.Clone(r.keys), r.seqKeys...)); err != nil {
						return nil, fmt.Errorf("%s: %s: %w", w.name, en.c.name, err)
					}
				}
			}
			// Warm up: load the script, open connections.
			for k := 0; k < 50; k++ {
				if _, err := decide(e.ctx, r.keys[k%len(r.keys)]); err != nil {
					if en.c.kind == "peer" {
						logf("%s: %s: warm-up error: %v", w.name, en.c.name, err)
						break
					}
					return nil, fmt.Errorf("%s: %s: warm-up: %w", w.name, en.c.name, err)
				}
			}
			rows = append(rows, r)
		}
	}
	// The rows of leases, AllowAll and calendar windows (features.go).
	more, err := e.featureRows()
	if err != nil {
		return nil, err
	}
	return append(rows, more...), nil
}

// rounds runs every row once per round, each round starting at another row,
// so that slow drift of the machine hits all rows alike.
func (e *environment) rounds(rows []*row) error {
	for round := 0; round < e.f.rounds; round++ {
		logf("round %d/%d: %d rows", round+1, e.f.rounds, len(rows))
		offset := round * len(rows) / e.f.rounds
		for i := range rows {
			r := rows[(i+offset)%len(rows)]
			before, err := readStats(e.ctx, e.admin)
			if err != nil {
				return err
			}
			rt := e.hook.n.Load()
			seq := sequential(e.ctx, r.decide, r.seqKeys, e.f.seq)
			between, err := readStats(e.ctx, e.admin)
			if err != nil {
				return err
			}
			if d := between.sub(before); seq.ops > 0 {
				r.seqScriptUS = append(r.seqScriptUS, float64(d.scriptUS)/float64(seq.ops))
			}
			conc := concurrent(e.ctx, r.decide, r.keys, e.f.goroutines, e.f.conc)
			after, err := readStats(e.ctx, e.admin)
			if err != nil {
				return err
			}
			r.roundTrips += e.hook.n.Load() - rt
			d := after.sub(before)
			if ops := seq.ops + conc.ops; ops > 0 {
				r.scriptUS = append(r.scriptUS, float64(d.scriptUS)/float64(ops))
			}
			r.server.calls += d.calls
			r.server.scriptCall += d.scriptCall
			r.server.scriptUS += d.scriptUS
			r.p50 = append(r.p50, micros(seq.p50))
			r.p99 = append(r.p99, micros(seq.p99))
			r.allocs = append(r.allocs, seq.allocsPerOp)
			r.bytes = append(r.bytes, seq.bytesPerOp)
			r.perSecond = append(r.perSecond, conc.perSecond())
			r.decisions += seq.ops + conc.ops
			r.allowed += seq.allowed + conc.allowed
			r.errs += seq.errs + conc.errs
			if r.firstErr == nil {
				r.firstErr = conc.firstErr
			}
		}
	}
	return nil
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
