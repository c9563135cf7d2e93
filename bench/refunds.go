package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/redlimit/redlimit"
)

// Refunds (issue 35): a refund is the decision's own script called again,
// so INFO's commandstats cannot tell a refund's time from its grant's when
// they alternate. Each batch therefore takes a grant on each of
// refundBatch keys, reads INFO, refunds part of each grant, and reads INFO
// again: every refund follows its grant by one batch (a few ms), and the
// two halves give the grant's and the refund's Redis time apart, on the
// same keys in the same moment. Batches run on fresh keys (a key's first
// refund) and on keys holding the most refund records a key keeps.
// Rounds interleave the algorithms, as the rows' do, and figures are
// medians over rounds.

const (
	refundBatch = 100 // keys per batch: each takes one grant, then one refund
	refundTake  = 4   // permits each grant takes
	refundGive  = 2   // permits each refund gives back
)

// refundLimit keeps what a grant took counted for a day, so that its
// refund a batch later still gives permits back: at 1,000,000 a minute a
// bucket refills 4 permits in 240µs, and the refund would have nothing to
// do. A day's 1,000,000 are never spent by a run.
var refundLimit = limit{count: 1_000_000, per: 24 * time.Hour}

// refundResult is one algorithm's grants and refunds in the refund
// batches.
type refundResult struct {
	Algorithm string `json:"algorithm"`
	// Keys are the keys granted and refunded on (refundModes).
	Keys string `json:"keys"`
	// Took and Gave are the permits each grant took and each refund gave
	// back (a concurrency grant is one lease, released whole).
	Took int `json:"took"`
	Gave int `json:"gave"`
	// GrantUS and RefundUS are Redis script µs per call, medians over
	// rounds; Ratio is the median over rounds of the round's refund ÷
	// grant.
	GrantUS  float64 `json:"grant_script_us"`
	RefundUS float64 `json:"refund_script_us"`
	Ratio    float64 `json:"refund_vs_grant"`
	// Counted over every batch of every round.
	RoundTripsPerGrant  float64 `json:"round_trips_per_grant"`
	RoundTripsPerRefund float64 `json:"round_trips_per_refund"`
	CommandsPerGrant    float64 `json:"redis_commands_per_grant"`  // the script's own included
	CommandsPerRefund   float64 `json:"redis_commands_per_refund"` // the script's own included
	// Latency and Go allocations of a refund, medians over rounds.
	RefundP50US     float64 `json:"refund_p50_us"`
	RefundP99US     float64 `json:"refund_p99_us"`
	AllocsPerRefund float64 `json:"allocs_per_refund"`
	Refunds         int     `json:"refunds"`
	// Missing says why nothing was measured: an algorithm whose grants
	// carry no Grant yet.
	Missing string `json:"missing,omitempty"`
}

// errNoGrant is a grant that came without a Grant to refund it by.
var errNoGrant = errors.New("allowed with the zero Grant: this algorithm does not refund yet")

// refundSubject grants and refunds on one limiter. take grants on key and
// keeps what it took as the i-th of the batch; give refunds part of the
// i-th.
type refundSubject struct {
	algorithm  string
	took, gave int
	take       func(ctx context.Context, key string, i int) error
	give       func(ctx context.Context, i int) error
}

// refundName is what -rows matches for the refunds of algorithm.
func refundName(algorithm string) string { return "refund redlimit " + algorithm }

// limiterRefunds grants refundTake permits and refunds refundGive of
// them, through Result.Grant.
func limiterRefunds(algorithm string, l redlimit.Limiter) refundSubject {
	grants := make([]redlimit.Grant, refundBatch)
	return refundSubject{algorithm: algorithm, took: refundTake, gave: refundGive,
		take: func(ctx context.Context, key string, i int) error {
			res, err := l.AllowN(ctx, key, refundTake)
			if err != nil {
				return err
			}
			if !res.Allowed {
				return fmt.Errorf("%s: grant of %d on %s denied", algorithm, refundTake, key)
			}
			if res.Grant.N() == 0 {
				return errNoGrant
			}
			grants[i] = res.Grant
			return nil
		},
		give: func(ctx context.Context, i int) error { return grants[i].Refund(ctx, refundGive) },
	}
}

// leaseRefunds acquires a lease and releases it: a concurrency grant's
// refund.
func leaseRefunds(c *redlimit.Concurrency) refundSubject {
	leases := make([]*redlimit.Lease, refundBatch)
	return refundSubject{algorithm: "concurrency", took: 1, gave: 1,
		take: func(ctx context.Context, key string, i int) (err error) {
			leases[i], err = c.Acquire(ctx, key)
			return err
		},
		give: func(ctx context.Context, i int) error { return leases[i].Release(ctx) },
	}
}

// refundSubjects returns the subjects -rows selects: the five algorithms,
// the calendar window and the concurrency limiter.
func (e *environment) refundSubjects() ([]refundSubject, error) {
	var out []refundSubject
	selected := func(algorithm string) bool {
		return e.f.rows == nil || e.f.rows.MatchString(refundName(algorithm))
	}
	for _, rc := range redlimitConstructors {
		if !selected(rc.algorithm) {
			continue
		}
		l, err := newRedlimitLimiter(rc.algorithm, e.rdb, refundLimit)
		if err != nil {
			return nil, err
		}
		out = append(out, limiterRefunds(rc.algorithm, l))
	}
	if selected("calendar_window") {
		period, err := calendarPeriod()
		if err != nil {
			return nil, err
		}
		l, err := redlimit.NewCalendarWindow(e.rdb, refundLimit.count, period)
		if err != nil {
			return nil, err
		}
		out = append(out, limiterRefunds("calendar_window", l))
	}
	if selected("concurrency") {
		c, err := redlimit.NewConcurrency(e.rdb, redlimit.MaxConcurrencyLimit, time.Hour)
		if err != nil {
			return nil, err
		}
		out = append(out, leaseRefunds(c))
	}
	return out, nil
}

// refundModes are the keys a batch grants and refunds on: a refund's
// cost grows with the refund records its key keeps (docs/refunds.md).
var refundModes = []struct {
	name  string
	fresh bool
}{
	{"fresh keys", true},
	{"keys refunded 16 times before", false},
}

// refundRecords is the most refund records a key keeps (a fixed or
// calendar window's): the kept keys are refunded that often before they
// are measured.
const refundRecords = 16

// refundUnit is one subject on one mode's keys, with what its batches
// gathered.
type refundUnit struct {
	s       refundSubject
	mode    string
	fresh   bool
	keys    []string
	batches int

	grantUS, refundUS, ratio, p50, p99, allocs []float64 // one per round
	refunds                                    int
	grantTrips, refundTrips                    int64
	grantCmds, refundCmds                      int64
}

// nextKeys returns the keys of u's next batch: new ones for fresh keys.
func (u *refundUnit) nextKeys(run string) []string {
	u.batches++
	if u.fresh || u.keys == nil {
		u.keys = u.keys[:0]
		for k := 0; k < refundBatch; k++ {
			u.keys = append(u.keys, fmt.Sprintf("rf:%s:%s:%d:%04d", u.s.algorithm, run, u.batches, k))
		}
	}
	return u.keys
}

// grantAndRefund grants on each of keys, then refunds part of each grant, and
// returns the server's work in each half, the round trips of each, the
// Go allocations of the refunds, and appends the refunds' latencies to
// lat.
func (e *environment) grantAndRefund(s refundSubject, keys []string, lat []time.Duration) (grant, refund serverStats, grantTrips, refundTrips int64, mallocs uint64, _ []time.Duration, err error) {
	st0, err := readStats(e.ctx, e.admin)
	if err != nil {
		return
	}
	rt0 := e.hook.n.Load()
	for k, key := range keys {
		if err = s.take(e.ctx, key, k); err != nil {
			err = fmt.Errorf("refunds: %w", err)
			return
		}
	}
	rt1 := e.hook.n.Load()
	st1, err := readStats(e.ctx, e.admin)
	if err != nil {
		return
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rt2 := e.hook.n.Load()
	for k := range keys {
		start := time.Now()
		if err = s.give(e.ctx, k); err != nil {
			err = fmt.Errorf("refunds: %s: %w", s.algorithm, err)
			return
		}
		lat = append(lat, time.Since(start))
	}
	rt3 := e.hook.n.Load()
	runtime.ReadMemStats(&after)
	st2, err := readStats(e.ctx, e.admin)
	if err != nil {
		return
	}
	return st1.sub(st0), st2.sub(st1), rt1 - rt0, rt3 - rt2, after.Mallocs - before.Mallocs, lat, nil
}

// refunds runs refund batches for every subject on each mode's keys,
// e.f.seq of them per subject and mode per round (at least one batch),
// rounds interleaved.
func (e *environment) refunds() ([]refundResult, error) {
	subjects, err := e.refundSubjects()
	if err != nil || len(subjects) == 0 {
		return nil, err
	}
	var out, missing []refundResult
	var units []*refundUnit
	for _, s := range subjects {
		// Warm up: load the script, with its refund.
		key := fmt.Sprintf("rf:%s:%s:warm", s.algorithm, e.run)
		err := s.take(e.ctx, key, 0)
		if errors.Is(err, errNoGrant) {
			logf("refunds: %s: %v", s.algorithm, err)
			missing = append(missing, refundResult{Algorithm: s.algorithm, Took: s.took, Gave: s.gave, Missing: err.Error()})
			continue
		}
		if err == nil {
			err = s.give(e.ctx, 0)
		}
		if err != nil {
			return nil, fmt.Errorf("refunds: %s: warm-up: %w", s.algorithm, err)
		}
		for _, m := range refundModes {
			u := &refundUnit{s: s, mode: m.name, fresh: m.fresh}
			if !m.fresh {
				keys := u.nextKeys(e.run)
				for i := 0; i < refundRecords; i++ {
					if _, _, _, _, _, _, err := e.grantAndRefund(s, keys, nil); err != nil {
						return nil, err
					}
				}
			}
			units = append(units, u)
		}
	}
	lat := make([]time.Duration, 0, 1<<16)
	for round := 0; round < e.f.rounds && len(units) > 0; round++ {
		logf("refunds: round %d/%d: %d algorithms × %d kinds of keys", round+1, e.f.rounds, len(units)/len(refundModes), len(refundModes))
		offset := round * len(units) / e.f.rounds
		for i := range units {
			u := units[(i+offset)%len(units)]
			var grant, refund serverStats
			var grants, mallocs uint64
			lat = lat[:0]
			for deadline := time.Now().Add(e.f.seq); len(lat) == 0 || time.Now().Before(deadline); {
				g, r, gt, rt, m, l, err := e.grantAndRefund(u.s, u.nextKeys(e.run), lat)
				if err != nil {
					return nil, err
				}
				grant, refund, lat = grant.add(g), refund.add(r), l
				grants += refundBatch
				mallocs += m
				u.grantTrips += gt
				u.refundTrips += rt
			}
			n := float64(grants)
			u.grantUS = append(u.grantUS, float64(grant.scriptUS)/n)
			u.refundUS = append(u.refundUS, float64(refund.scriptUS)/n)
			u.ratio = append(u.ratio, float64(refund.scriptUS)/float64(grant.scriptUS))
			u.allocs = append(u.allocs, float64(mallocs)/n)
			slices.Sort(lat)
			u.p50 = append(u.p50, micros(lat[len(lat)/2]))
			u.p99 = append(u.p99, micros(lat[len(lat)*99/100]))
			u.refunds += int(grants)
			u.grantCmds += grant.calls
			u.refundCmds += refund.calls
		}
	}
	for _, u := range units {
		n := float64(u.refunds)
		r := refundResult{Algorithm: u.s.algorithm, Keys: u.mode, Took: u.s.took, Gave: u.s.gave,
			GrantUS: median(u.grantUS), RefundUS: median(u.refundUS), Ratio: median(u.ratio),
			RoundTripsPerGrant:  float64(u.grantTrips) / n,
			RoundTripsPerRefund: float64(u.refundTrips) / n,
			CommandsPerGrant:    float64(u.grantCmds) / n,
			CommandsPerRefund:   float64(u.refundCmds) / n,
			RefundP50US:         median(u.p50), RefundP99US: median(u.p99),
			AllocsPerRefund: median(u.allocs), Refunds: u.refunds}
		logf("refunds: %s, %s: grant %.2f µs, refund %.2f µs (%.2f×), %.3f round trips per refund",
			r.Algorithm, r.Keys, r.GrantUS, r.RefundUS, r.Ratio, r.RoundTripsPerRefund)
		out = append(out, r)
	}
	return append(out, missing...), nil
}
