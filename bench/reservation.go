package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The hot allowed workload (issue 40): one key that every call finds
// allowed, each algorithm with and without WithReservation(64, 250ms).
// Its 64-goroutine pass is a busy key; its sequential pass, one call at a
// time, a key that is not busy.

// useHalf takes half of each key's limit, as a key in use finds it: a
// bucket then sits far from full, as under demand near its rate, where a
// reservation can take permits ahead without stopping its refill (a full
// bucket is decided call by call: see docs/reservations.md).
func (e *environment) useHalf(algorithm string, c redis.Scripter, lim limit, keys []string) error {
	lim.batch, lim.denyCache = 0, 0
	l, err := newRedlimitLimiter(algorithm, c, lim)
	if err != nil {
		return err
	}
	for _, key := range keys {
		r, err := l.AllowN(e.ctx, key, lim.count/2)
		if err != nil {
			return err
		}
		if !r.Allowed {
			return fmt.Errorf("half of %d on %q denied", lim.count, key)
		}
	}
	return nil
}

// reservationExactness runs the exactness check (4 clients, 50
// goroutines each, 10 calls each, limit 1,000 on one key) on every
// algorithm with WithReservation(64, 250ms), or those -rows names
// ("exactness redlimit fixed_window +reservation 64"). Exact means never
// past the limit, and short of it by at most what the clients may hold
// when the calls stop (4 × 63).
func (e *environment) reservationExactness() ([]exactnessResult, error) {
	var out []exactnessResult
	lim := limit{count: exactLimit, per: 24 * time.Hour, batch: reserveBatch, hold: reserveHold}
	for i, c := range redlimitContenders(reservedSuffix) {
		if e.f.rows != nil && !e.f.rows.MatchString("exactness "+c.name) {
			continue
		}
		r, err := e.exactOne(fmt.Sprintf("exactR%02d:%s", i, e.run), c, lim)
		if err != nil {
			return nil, err
		}
		r.Exact = r.Admitted <= exactLimit && r.Admitted >= exactLimit-exactClients*(reserveBatch-1) && r.Errors == 0
		out = append(out, r)
	}
	return out, nil
}

// reservationPair is one algorithm's two rows in the hot allowed workload.
type reservationPair struct {
	algorithm       string
	plain, reserved *rowResult
	ceiling         *rowResult
}

func reservationPairs(find func(workload, name string) *rowResult) []reservationPair {
	var out []reservationPair
	for _, rc := range redlimitConstructors {
		p := reservationPair{
			algorithm: rc.algorithm,
			plain:     find("hot allowed", "redlimit "+rc.algorithm),
			reserved:  find("hot allowed", "redlimit "+rc.algorithm+reservedSuffix),
			ceiling:   find("hot allowed", "ceiling EVALSHA return 1"),
		}
		if p.plain != nil && p.reserved != nil {
			out = append(out, p)
		}
	}
	return out
}

// reservationTargets checks issue 40's targets: busy, at least 3× the
// return 1 ceiling's decisions a second with at most 1/8 Redis round trip
// a decision; not busy, p50 and Redis time within 5% of the limiter
// without the option.
func reservationTargets(find func(workload, name string) *rowResult, exact []exactnessResult) []targetResult {
	var out []targetResult
	for _, x := range exact {
		if !strings.HasSuffix(x.Name, reservedSuffix) {
			continue
		}
		out = append(out, targetResult{Target: "4 clients × 50 goroutines on one key, limit 1,000: admitted", Subject: strings.TrimSuffix(strings.TrimPrefix(x.Name, "redlimit "), reservedSuffix),
			Measured: float64(x.Admitted), Want: fmt.Sprintf("<= %d, >= %d", exactLimit, exactLimit-exactClients*(reserveBatch-1)), Pass: x.Exact,
			Note: fmt.Sprintf("%d calls, %d errors", x.Attempts, x.Errors)})
	}
	for _, p := range reservationPairs(find) {
		r := p.reserved
		if p.ceiling != nil {
			out = append(out, targetResult{Target: "hot allowed +reservation 64: decisions/s (64 goroutines) ÷ return 1", Subject: p.algorithm, Measured: r.VsReturnOne, Want: ">= 3", Pass: r.VsReturnOne >= 3,
				Note: fmt.Sprintf("%.0f/s; without the option %.0f/s (%.2f× return 1)", r.DecisionsPerSec, p.plain.DecisionsPerSec, p.plain.VsReturnOne)})
		}
		out = append(out, targetResult{Target: "hot allowed +reservation 64: Redis round trips per decision", Subject: p.algorithm, Measured: r.RoundTripsPerDecision, Want: "<= 0.125", Pass: r.RoundTripsPerDecision <= 0.125,
			Note: fmt.Sprintf("Redis commands per decision %.3f", r.CommandsPerDecision)})
		if p.plain.P50US > 0 {
			ratio := r.P50US / p.plain.P50US
			out = append(out, targetResult{Target: "not busy (1 goroutine) +reservation: p50 ÷ without", Subject: p.algorithm, Measured: ratio, Want: "<= 1.05", Pass: ratio <= 1.05,
				Note: fmt.Sprintf("%.1f µs vs %.1f µs", r.P50US, p.plain.P50US)})
		}
		if p.plain.SeqScriptUSMedian > 0 {
			ratio := r.SeqScriptUSMedian / p.plain.SeqScriptUSMedian
			out = append(out, targetResult{Target: "not busy (1 goroutine) +reservation: Redis script µs per decision ÷ without", Subject: p.algorithm, Measured: ratio, Want: "<= 1.05", Pass: ratio <= 1.05,
				Note: fmt.Sprintf("%.2f µs vs %.2f µs", r.SeqScriptUSMedian, p.plain.SeqScriptUSMedian)})
		}
	}
	return out
}

// reservationMarkdown is the hot allowed workload side by side.
func reservationMarkdown(rows []rowResult) string {
	find := func(workload, name string) *rowResult {
		for i := range rows {
			if rows[i].Workload == workload && rows[i].Name == name {
				return &rows[i]
			}
		}
		return nil
	}
	pairs := reservationPairs(find)
	if len(pairs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n| hot allowed: one key, WithReservation(64, 250ms) | decisions/s (64 g) without / with | × return 1 without / with | round trips/dec without / with | not busy: p50 µs without / with | not busy: script µs/dec without / with |\n|---|--:|--:|--:|--:|--:|\n")
	for _, p := range pairs {
		fmt.Fprintf(&b, "| %s | %.0f / %.0f | %.2f / %.2f | %.3f / %.4f | %.1f / %.1f | %.2f / %.2f |\n", p.algorithm,
			p.plain.DecisionsPerSec, p.reserved.DecisionsPerSec, p.plain.VsReturnOne, p.reserved.VsReturnOne,
			p.plain.RoundTripsPerDecision, p.reserved.RoundTripsPerDecision,
			p.plain.P50US, p.reserved.P50US, p.plain.SeqScriptUSMedian, p.reserved.SeqScriptUSMedian)
	}
	return b.String()
}
