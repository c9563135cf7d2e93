package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/redlimit/redlimit"
)

// featureSection is one feature's targets (issues 35, 37, 38, 39 and 40):
// each target, the figure this run measured, met or missed.
type featureSection struct {
	Feature string         `json:"feature"`
	Issue   int            `json:"issue"`
	Targets []targetResult `json:"targets"`
}

// leaseMemoryResult is MEMORY USAGE of one key holding Leases live leases.
type leaseMemoryResult struct {
	Leases      int    `json:"leases"`
	MemoryUsage int64  `json:"memory_usage_bytes"`
	Encoding    string `json:"encoding"`
	// PerLease is the growth from the previous count, per lease added.
	PerLease float64 `json:"bytes_per_lease_added"`
}

// leaseCounts are the live leases on one key at which its memory is read:
// a sorted set stays a listpack (ziplist before Redis 7.0) up to 128
// members, and the last step shows what a lease costs in a large key.
var leaseCounts = []int{1, 100, 1000, redlimit.MaxConcurrencyLimit}

// featureMemory reads Redis memory per key of the calendar window and of
// the fixed window beside it (issue 39), of a concurrency key with one
// lease, and per live lease of a key holding many (issue 37).
func (e *environment) featureMemory() ([]memoryResult, []leaseMemoryResult, error) {
	selected := func(name string) bool { return e.f.rows == nil || e.f.rows.MatchString("memory "+name) }
	period, err := calendarPeriod()
	if err != nil {
		return nil, nil, err
	}
	fixed := redlimitContenders("")[0]
	var memories []memoryResult
	for i, m := range []struct {
		c   contender
		lim limit
	}{
		{fixed, memoryLimit},
		{calendarContender(period), limit{count: memoryLimit.count}},
		{concurrencyContender("redlimit concurrency", false), limit{count: memoryLimit.count, per: memoryLimit.per}},
	} {
		if !selected(m.c.name) {
			continue
		}
		decide, err := m.c.build(e.rdb, m.lim)
		if err != nil {
			return nil, nil, err
		}
		// Tags as long as memory()'s: MEMORY USAGE counts the key's name.
		r, err := e.keyMemory(fmt.Sprintf("fm%03d", i), m.c, decide)
		if err != nil {
			return nil, nil, err
		}
		memories = append(memories, r)
	}
	if !selected("redlimit concurrency leases") {
		return memories, nil, nil
	}
	// A prefix of its own: the key in Redis is exactly prefix + key.
	const prefix = "leasemem:"
	c, err := redlimit.NewConcurrency(e.rdb, redlimit.MaxConcurrencyLimit, time.Hour, redlimit.WithPrefix(prefix))
	if err != nil {
		return nil, nil, err
	}
	key := e.run
	var leases []leaseMemoryResult
	held := 0
	for _, count := range leaseCounts {
		res, err := c.AllowN(e.ctx, key, count-held)
		if err != nil {
			return nil, nil, fmt.Errorf("lease memory: %w", err)
		}
		if !res.Allowed {
			return nil, nil, fmt.Errorf("lease memory: %d leases denied with %d held", count-held, held)
		}
		r := leaseMemoryResult{Leases: count}
		if r.MemoryUsage, err = e.admin.MemoryUsage(e.ctx, prefix+key, 0).Result(); err != nil {
			return nil, nil, fmt.Errorf("lease memory: %w", err)
		}
		r.Encoding, _ = e.admin.ObjectEncoding(e.ctx, prefix+key).Result()
		if len(leases) > 0 {
			last := leases[len(leases)-1]
			r.PerLease = float64(r.MemoryUsage-last.MemoryUsage) / float64(count-last.Leases)
		}
		logf("lease memory: %d leases: %d B (%s), %.1f B per lease added", count, r.MemoryUsage, r.Encoding, r.PerLease)
		leases = append(leases, r)
		held = count
	}
	e.admin.Unlink(e.ctx, prefix+key)
	return memories, leases, nil
}

// featureSections checks the figures of this run against the targets of
// issues 35, 37, 38, 39 and 40. A target whose figures the run did not
// measure (-rows) is left out.
func featureSections(rep report) []featureSection {
	row := func(workload, name string) *rowResult {
		for i := range rep.Rows {
			if rep.Rows[i].Workload == workload && rep.Rows[i].Name == name {
				return &rep.Rows[i]
			}
		}
		return nil
	}
	refund := func(algorithm string) *refundResult {
		for i := range rep.Refunds {
			if rep.Refunds[i].Algorithm == algorithm {
				return &rep.Refunds[i]
			}
		}
		return nil
	}
	memory := func(algorithm string) *memoryResult {
		for i := range rep.FeatureMemory {
			if rep.FeatureMemory[i].Algorithm == algorithm {
				return &rep.FeatureMemory[i]
			}
		}
		return nil
	}
	// exactly is a count per call that must be want: round trips are
	// counted, never sampled, so only a retry (NOSCRIPT) moves them.
	exactly := func(got, want float64) bool { return math.Abs(got-want) < 0.005*want }

	refunds := featureSection{Feature: "refunds", Issue: 35}
	for _, r := range rep.Refunds {
		if r.Algorithm == "concurrency" {
			continue // a release: the concurrency section's
		}
		if r.Missing != "" {
			refunds.Targets = append(refunds.Targets, targetResult{Target: "round trips per refund", Subject: r.Algorithm, Want: "= 1", Note: "not measured: " + r.Missing})
			continue
		}
		note := fmt.Sprintf("a grant of %d, a refund of %d a batch later: refund %.2f µs, grant %.2f µs", r.Took, r.Gave, r.RefundUS, r.GrantUS)
		if a := row("allow", "redlimit "+r.Algorithm); a != nil {
			note += fmt.Sprintf("; a grant of 1 in the allow row: %.2f µs", a.ScriptUSMedian)
		}
		refunds.Targets = append(refunds.Targets,
			targetResult{Target: "round trips per refund, " + r.Keys, Subject: r.Algorithm, Measured: r.RoundTripsPerRefund, Want: "= 1", Pass: exactly(r.RoundTripsPerRefund, 1),
				Note: fmt.Sprintf("%.2f Redis commands per refund, %.2f per grant", r.CommandsPerRefund, r.CommandsPerGrant)},
			targetResult{Target: "refund script µs ÷ grant's, " + r.Keys, Subject: r.Algorithm, Measured: r.Ratio, Want: "<= 1.0", Pass: r.Ratio <= 1.0, Note: note})
	}

	leases := featureSection{Feature: "concurrency (leases)", Issue: 37}
	acquire, pair, sliding := row("allow", acquireLapseRow), row("allow", acquireReleaseRow), row("allow", "redlimit sliding_window")
	if acquire != nil {
		leases.Targets = append(leases.Targets, targetResult{Target: "round trips per Acquire", Subject: "concurrency", Measured: acquire.RoundTripsPerDecision, Want: "= 1", Pass: exactly(acquire.RoundTripsPerDecision, 1),
			Note: fmt.Sprintf("%q, %.1f%% allowed", acquireLapseRow, 100*acquire.AllowedFraction)})
	}
	if pair != nil {
		leases.Targets = append(leases.Targets, targetResult{Target: "round trips per Acquire+Release", Subject: "concurrency", Measured: pair.RoundTripsPerDecision, Want: "= 2 (1 each)", Pass: exactly(pair.RoundTripsPerDecision, 2),
			Note: fmt.Sprintf("%.2f script µs per pair, %.1f allocs per pair, p50 %.0f µs", pair.ScriptUSMedian, pair.AllocsPerOp, pair.P50US)})
	}
	if r := refund("concurrency"); r != nil {
		leases.Targets = append(leases.Targets, targetResult{Target: "round trips per Release", Subject: "concurrency", Measured: r.RoundTripsPerRefund, Want: "= 1", Pass: exactly(r.RoundTripsPerRefund, 1),
			Note: fmt.Sprintf("refund batches, %s: Release %.2f µs, Acquire %.2f µs", r.Keys, r.RefundUS, r.GrantUS)})
	}
	if acquire != nil && sliding != nil && sliding.ScriptUSMedian > 0 {
		ratio := acquire.ScriptUSMedian / sliding.ScriptUSMedian
		note := fmt.Sprintf("Acquire %.2f µs (leases lapse), sliding window grant %.2f µs (allow)", acquire.ScriptUSMedian, sliding.ScriptUSMedian)
		if a, s := refund("concurrency"), refund("sliding_window"); a != nil && s != nil && s.Missing == "" {
			note += fmt.Sprintf("; refund batches, %s: Acquire %.2f µs, sliding grant of %d %.2f µs", a.Keys, a.GrantUS, s.Took, s.GrantUS)
		}
		leases.Targets = append(leases.Targets, targetResult{Target: "script µs per Acquire ÷ sliding window's grant", Subject: "concurrency", Measured: ratio, Want: "<= 1.0", Pass: ratio <= 1.0, Note: note})
	}
	if acquire != nil {
		leases.Targets = append(leases.Targets, targetResult{Target: "Go allocs per Acquire", Subject: "concurrency", Measured: acquire.AllocsPerOp, Want: "<= 8", Pass: acquire.AllocsPerOp <= 8,
			Note: fmt.Sprintf("%.0f B per Acquire", acquire.BytesPerOp)})
	}
	if n := len(rep.LeaseMemory); n > 1 {
		last := rep.LeaseMemory[n-1]
		var steps []string
		for _, l := range rep.LeaseMemory {
			steps = append(steps, fmt.Sprintf("%d leases %d B (%s)", l.Leases, l.MemoryUsage, l.Encoding))
		}
		note := "MEMORY USAGE of one key: " + strings.Join(steps, ", ")
		if m := memory("concurrency"); m != nil {
			note += fmt.Sprintf("; a key of one lease: %d B", m.MemoryUsage)
		}
		leases.Targets = append(leases.Targets, targetResult{Target: fmt.Sprintf("Redis bytes per live lease (%d to %d on a key)", rep.LeaseMemory[n-2].Leases, last.Leases), Subject: "concurrency",
			Measured: last.PerLease, Want: "stated", Pass: last.PerLease > 0, Note: note})
	}

	allowAll := featureSection{Feature: "AllowAll", Issue: 38}
	if r := row("allow", allowAllRow); r != nil {
		allowAll.Targets = append(allowAll.Targets, targetResult{Target: "round trips per call, 3 parts granted", Subject: "AllowAll", Measured: r.RoundTripsPerDecision, Want: "= 1", Pass: exactly(r.RoundTripsPerDecision, 1),
			Note: fmt.Sprintf("%.1f%% granted; %.2f Redis commands per call", 100*r.AllowedFraction, r.CommandsPerDecision)})
		allowAll.Targets = append(allowAll.Targets, allowAllLatency(row, r, "")...)
		if l := row("allow", allowAllRow+linkSuffix); l != nil {
			allowAll.Targets = append(allowAll.Targets, allowAllLatency(row, l, linkSuffix)...)
		}
		want := 8 + 4*allowAllParts
		allowAll.Targets = append(allowAll.Targets, targetResult{Target: "Go allocs per call", Subject: "AllowAll", Measured: r.AllocsPerOp, Want: fmt.Sprintf("<= %d (8 + 4 × %d parts)", want, allowAllParts), Pass: r.AllocsPerOp <= float64(want),
			Note: fmt.Sprintf("%.0f B per call", r.BytesPerOp)})
	}

	calendar := featureSection{Feature: "calendar windows", Issue: 39}
	for _, workload := range []string{"allow", "hot"} {
		c, f := row(workload, calendarRow), row(workload, "redlimit fixed_window")
		if c == nil || f == nil || f.ScriptUSMedian == 0 {
			continue
		}
		ratio := c.ScriptUSMedian / f.ScriptUSMedian
		calendar.Targets = append(calendar.Targets, targetResult{Target: "script µs per decision ÷ fixed window's, " + workload, Subject: "calendar_window", Measured: ratio, Want: "<= 1.1", Pass: ratio <= 1.1,
			Note: fmt.Sprintf("%.2f µs vs %.2f µs; %.1f%% vs %.1f%% allowed", c.ScriptUSMedian, f.ScriptUSMedian, 100*c.AllowedFraction, 100*f.AllowedFraction)})
	}
	if c, f := memory("calendar_window"), memory("fixed_window"); c != nil && f != nil {
		calendar.Targets = append(calendar.Targets, targetResult{Target: "MEMORY USAGE per key (bytes)", Subject: "calendar_window", Measured: float64(c.MemoryUsage), Want: fmt.Sprintf("<= %d (fixed window's)", f.MemoryUsage), Pass: c.MemoryUsage > 0 && c.MemoryUsage <= f.MemoryUsage,
			Note: fmt.Sprintf("used_memory Δ %.0f vs %.0f B/key", c.UsedMemoryPer, f.UsedMemoryPer)})
	}

	reservations := featureSection{Feature: "reservations (hot allowed keys)", Issue: 40, Targets: reservationTargets(row, rep.Exactness)}

	var out []featureSection
	for _, s := range []featureSection{refunds, leases, allowAll, calendar, reservations} {
		if len(s.Targets) > 0 {
			out = append(out, s)
		}
	}
	return out
}

// featuresMarkdown prints the refunds, the features' memory and a table
// of targets per feature.
func featuresMarkdown(rep report) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	if len(rep.Refunds) > 0 {
		p("\n| refunds: grant, then refund a batch later (%d keys), medians over rounds | keys | took / gave | grant script µs | refund script µs | refund ÷ grant | round trips / refund | cmds / grant | cmds / refund | refund p50 µs | refund p99 µs | allocs / refund | refunds |\n", refundBatch)
		p("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	}
	for _, r := range rep.Refunds {
		if r.Missing != "" {
			p("| %s | – | %d / – | %s |||||||||\n", r.Algorithm, r.Took, r.Missing)
			continue
		}
		p("| %s | %s | %d / %d | %.2f | %.2f | %.2f | %.3f | %.2f | %.2f | %.1f | %.1f | %.1f | %d |\n",
			r.Algorithm, r.Keys, r.Took, r.Gave, r.GrantUS, r.RefundUS, r.Ratio, r.RoundTripsPerRefund, r.CommandsPerGrant, r.CommandsPerRefund, r.RefundP50US, r.RefundP99US, r.AllocsPerRefund, r.Refunds)
	}
	if len(rep.FeatureMemory) > 0 {
		p("\n| Redis memory per key, features | sample key | type / encoding | MEMORY USAGE (B) | used_memory Δ / key (B) |\n|---|---|---|--:|--:|\n")
	}
	for _, m := range rep.FeatureMemory {
		p("| %s | `%s` | %s / %s | %d | %.1f |\n", m.Name, m.SampleKey, m.Type, m.Encoding, m.MemoryUsage, m.UsedMemoryPer)
	}
	if len(rep.LeaseMemory) > 0 {
		p("\n| live leases on one key | MEMORY USAGE (B) | encoding | B per lease added |\n|--:|--:|---|--:|\n")
	}
	for _, l := range rep.LeaseMemory {
		p("| %d | %d | %s | %.1f |\n", l.Leases, l.MemoryUsage, l.Encoding, l.PerLease)
	}
	for _, s := range rep.Features {
		p("\n| %s (issue %d): target | subject | measured | want | result | note |\n|---|---|--:|---|---|---|\n", s.Feature, s.Issue)
		for _, t := range s.Targets {
			res := "PASS"
			if !t.Pass {
				res = "MISS"
			}
			p("| %s | %s | %.3g | %s | %s | %s |\n", t.Target, t.Subject, t.Measured, t.Want, res, t.Note)
		}
	}
	return b.String()
}

// allowAllLatency is AllowAll's p50 latency target: r, AllowAll's row
// measured on the link named by suffix ("" for loopback), against the
// fastest of its parts alone on the same link. row finds a row by workload
// and name.
func allowAllLatency(row func(workload, name string) *rowResult, r *rowResult, suffix string) []targetResult {
	var fastest *rowResult
	var singles []string
	for _, a := range allowAllSingles {
		if s := row("allow", "redlimit "+a+suffix); s != nil {
			singles = append(singles, fmt.Sprintf("%s %.0f µs", a, s.P50US))
			if fastest == nil || s.P50US < fastest.P50US {
				fastest = s
			}
		}
	}
	if fastest == nil || fastest.P50US <= 0 {
		return nil
	}
	note := fmt.Sprintf("AllowAll p50 %.0f µs, p99 %.0f µs; alone: %s", r.P50US, r.P99US, strings.Join(singles, ", "))
	if c := row("allow", "ceiling EVALSHA return 1"+suffix); c != nil && suffix != "" {
		note += fmt.Sprintf("; the link's round trip (return 1): %.0f µs", c.P50US)
	}
	ratio := r.P50US / fastest.P50US
	return []targetResult{{Target: "p50 latency ÷ its fastest part's alone" + suffix, Subject: "AllowAll", Measured: ratio, Want: "<= 1.3", Pass: ratio <= 1.3,
		Note: note}}
}
