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
// same keys in the same moment. Rounds interleave the algorithms, as the
// rows' do, and figures are medians over rounds.

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

// refundSamples is what one subject's batches gathered.
type refundSamples struct {
	grantUS, refundUS, ratio, p50, p99, allocs []float64 // one per round
	grants, refunds                            int
	grantTrips, refundTrips                    int64
	grantCmds, refundCmds                      int64
}

// refunds runs refund batches for every subject, e.f.seq of them per
// subject per round (at least one batch), rounds interleaved.
func (e *environment) refunds() ([]refundResult, error) {
	subjects, err := e.refundSubjects()
	if err != nil || len(subjects) == 0 {
		return nil, err
	}
	var out, missing []refundResult
	keys := make([][]string, 0, len(subjects))
	for j := 0; j < len(subjects); j++ {
		s := subjects[j]
		var ks []string
		for k := 0; k < refundBatch; k++ {
			ks = append(ks, fmt.Sprintf("rf:%s:%s:%04d", s.algorithm, e.run, k))
		}
		// Warm up: load the script, with its refund.
		err := s.take(e.ctx, ks[0], 0)
		if errors.Is(err, errNoGrant) {
			logf("refunds: %s: %v", s.algorithm, err)
			missing = append(missing, refundResult{Algorithm: s.algorithm, Took: s.took, Gave: s.gave, Missing: err.Error()})
			subjects = slices.Delete(subjects, j, j+1)
			j--
			continue
		}
		if err == nil {
			err = s.give(e.ctx, 0)
		}
		if err != nil {
			return nil, fmt.Errorf("refunds: %s: warm-up: %w", s.algorithm, err)
		}
		keys = append(keys, ks)
	}
	samples := make([]refundSamples, len(subjects))
	lat := make([]time.Duration, 0, 1<<16)
	for round := 0; round < e.f.rounds; round++ {
		logf("refunds: round %d/%d: %d algorithms", round+1, e.f.rounds, len(subjects))
		offset := round * len(subjects) / e.f.rounds
		for i := range subjects {
			j := (i + offset) % len(subjects)
			s, sm := subjects[j], &samples[j]
			var grant, refund serverStats
			var grants, mallocs uint64
			lat = lat[:0]
			for deadline := time.Now().Add(e.f.seq); len(lat) == 0 || time.Now().Before(deadline); {
				st0, err := readStats(e.ctx, e.admin)
				if err != nil {
					return nil, err
				}
				rt0 := e.hook.n.Load()
				for k, key := range keys[j] {
					if err := s.take(e.ctx, key, k); err != nil {
						return nil, fmt.Errorf("refunds: %w", err)
					}
				}
				rt1 := e.hook.n.Load()
				st1, err := readStats(e.ctx, e.admin)
				if err != nil {
					return nil, err
				}
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				rt2 := e.hook.n.Load()
				for k := range keys[j] {
					start := time.Now()
					if err := s.give(e.ctx, k); err != nil {
						return nil, fmt.Errorf("refunds: %s: %w", s.algorithm, err)
					}
					lat = append(lat, time.Since(start))
				}
				rt3 := e.hook.n.Load()
				runtime.ReadMemStats(&after)
				st2, err := readStats(e.ctx, e.admin)
				if err != nil {
					return nil, err
				}
				grant, refund = grant.add(st1.sub(st0)), refund.add(st2.sub(st1))
				grants += refundBatch
				mallocs += after.Mallocs - before.Mallocs
				sm.grantTrips += rt1 - rt0
				sm.refundTrips += rt3 - rt2
			}
			n := float64(grants)
			sm.grantUS = append(sm.grantUS, float64(grant.scriptUS)/n)
			sm.refundUS = append(sm.refundUS, float64(refund.scriptUS)/n)
			sm.ratio = append(sm.ratio, float64(refund.scriptUS)/float64(grant.scriptUS))
			sm.allocs = append(sm.allocs, float64(mallocs)/n)
			slices.Sort(lat)
			sm.p50 = append(sm.p50, micros(lat[len(lat)/2]))
			sm.p99 = append(sm.p99, micros(lat[len(lat)*99/100]))
			sm.grants += int(grants)
			sm.refunds += int(grants)
			sm.grantCmds += grant.calls
			sm.refundCmds += refund.calls
		}
	}
	for j, s := range subjects {
		sm := samples[j]
		r := refundResult{Algorithm: s.algorithm, Took: s.took, Gave: s.gave,
			GrantUS: median(sm.grantUS), RefundUS: median(sm.refundUS), Ratio: median(sm.ratio),
			RoundTripsPerGrant:  float64(sm.grantTrips) / float64(sm.grants),
			RoundTripsPerRefund: float64(sm.refundTrips) / float64(sm.refunds),
			CommandsPerGrant:    float64(sm.grantCmds) / float64(sm.grants),
			CommandsPerRefund:   float64(sm.refundCmds) / float64(sm.refunds),
			RefundP50US:         median(sm.p50), RefundP99US: median(sm.p99),
			AllocsPerRefund: median(sm.allocs), Refunds: sm.refunds}
		logf("refunds: %s: grant %.2f µs, refund %.2f µs (%.2f×), %.3f round trips per refund",
			s.algorithm, r.GrantUS, r.RefundUS, r.Ratio, r.RoundTripsPerRefund)
		out = append(out, r)
	}
	return append(out, missing...), nil
}
