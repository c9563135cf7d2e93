package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/redis/go-redis/v9"
)

type report struct {
	Machine   machineInfo       `json:"machine"`
	Command   string            `json:"command"`
	Config    string            `json:"config"`
	Rows      []rowResult       `json:"rows"`
	Memory    []memoryResult    `json:"memory"`
	Exactness []exactnessResult `json:"exactness"`
	Scaling   []scalingResult   `json:"scaling"`
	DenyCache []denyCacheResult `json:"deny_cache"`
	// Adversarial is a sliding-window call on states an attacker can build.
	Adversarial []adversarialResult `json:"adversarial"`
	// Floors compare each algorithm's script µs with its floor's (floors.go)
	// and with go-redis/redis_rate's, in the same run.
	Floors  []floorResult  `json:"floors"`
	Targets []targetResult `json:"targets"`
	// Refunds are each algorithm's grants and refunds, measured apart
	// (refunds.go).
	Refunds []refundResult `json:"refunds"`
	// FeatureMemory is Redis memory per key of the calendar window, the
	// fixed window beside it and a concurrency key of one lease;
	// LeaseMemory that of one key holding more and more live leases.
	FeatureMemory []memoryResult      `json:"feature_memory"`
	LeaseMemory   []leaseMemoryResult `json:"lease_memory"`
	// Features are the targets of issues 35, 37, 38, 39 and 40, a section per
	// feature (featurereport.go).
	Features []featureSection `json:"features"`
}

// floorResult is one algorithm under one workload next to its floor and
// to redis_rate.
type floorResult struct {
	Workload      string  `json:"workload"`
	Algorithm     string  `json:"algorithm"`
	ScriptUS      float64 `json:"script_us"`
	FloorUS       float64 `json:"floor_us"`
	RedisRateUS   float64 `json:"redis_rate_us"`
	VsFloor       float64 `json:"script_vs_floor"`
	VsRedisRate   float64 `json:"script_vs_redis_rate"`
	FloorVsRate   float64 `json:"floor_vs_redis_rate"`
	Want          float64 `json:"want_vs_redis_rate"` // the target, script µs ÷ redis_rate
	ScriptCmds    float64 `json:"script_cmds_per_decision"`
	FloorCmds     float64 `json:"floor_cmds_per_decision"`
	RedisRateCmds float64 `json:"redis_rate_cmds_per_decision"`
}

// wantVsRedisRate is the target per algorithm (issue 19): script µs per
// decision ÷ go-redis/redis_rate's, allow and hot workloads, the sliding
// log with two strategies.
var wantVsRedisRate = map[string]float64{
	"fixed_window":   0.9,
	"leaky_bucket":   1.0,
	"token_bucket":   1.0,
	"sliding_window": 1.2,
	"sliding_log":    1.5,
}

// wantMemory is the most MEMORY USAGE a key may take after one grant
// (issue 19: no worse than the strings' 72 B and the sliding state's
// 136 / 152 B before state format 7).
var wantMemory = map[string]int64{
	"fixed_window":   72,
	"leaky_bucket":   72,
	"token_bucket":   72,
	"sliding_window": 136,
	"sliding_log":    152,
}

func floors(rows []rowResult) []floorResult {
	find := func(workload, name string) *rowResult {
		for i := range rows {
			if rows[i].Workload == workload && rows[i].Name == name {
				return &rows[i]
			}
		}
		return nil
	}
	var out []floorResult
	for _, workload := range []string{"allow", "hot"} {
		rate := find(workload, peers[0].name)
		for _, rc := range redlimitConstructors {
			script, floor := find(workload, "redlimit "+rc.algorithm), find(workload, "floor "+rc.algorithm)
			if script == nil || floor == nil || rate == nil || floor.ScriptUSMedian == 0 || rate.ScriptUSMedian == 0 {
				continue
			}
			// Medians over rounds: a row's total is at the mercy of one
			// round that a busy machine slowed down.
			out = append(out, floorResult{
				Workload: workload, Algorithm: rc.algorithm,
				ScriptUS: script.ScriptUSMedian, FloorUS: floor.ScriptUSMedian, RedisRateUS: rate.ScriptUSMedian,
				VsFloor:     script.ScriptUSMedian / floor.ScriptUSMedian,
				VsRedisRate: script.ScriptUSMedian / rate.ScriptUSMedian,
				FloorVsRate: floor.ScriptUSMedian / rate.ScriptUSMedian,
				Want:        wantVsRedisRate[rc.algorithm],
				ScriptCmds:  script.CommandsPerDecision, FloorCmds: floor.CommandsPerDecision, RedisRateCmds: rate.CommandsPerDecision,
			})
		}
	}
	return out
}

func floorsMarkdown(fs []floorResult) string {
	if len(fs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n| Redis script µs per decision, median over rounds | workload | script µs | floor µs | script − floor | script ÷ floor | redis_rate µs | script ÷ redis_rate | floor ÷ redis_rate | want ÷ redis_rate | cmds/dec script / floor / redis_rate |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, f := range fs {
		fmt.Fprintf(&b, "| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | <= %.1f | %.2f / %.2f / %.2f |\n",
			f.Algorithm, f.Workload, f.ScriptUS, f.FloorUS, f.ScriptUS-f.FloorUS, f.VsFloor, f.RedisRateUS, f.VsRedisRate, f.FloorVsRate, f.Want, f.ScriptCmds, f.FloorCmds, f.RedisRateCmds)
	}
	return b.String()
}

type machineInfo struct {
	CPUs       int    `json:"nproc"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPUModel   string `json:"cpu_model"`
	OS         string `json:"os"`
	Go         string `json:"go"`
	Server     string `json:"server"` // the server measured and its version: "Redis 7.0.15", "Valkey 8.0.1"
}

func machine(ctx context.Context, admin *redis.Client) machineInfo {
	m := machineInfo{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if info, err := admin.Info(ctx, "server").Result(); err == nil {
		m.Server = serverName(info)
	}
	return m
}

// serverName names the server that answered INFO server, with its version.
// Valkey reports the Redis version it is compatible with as redis_version
// (7.2.4 for Valkey 8) and its own as valkey_version.
func serverName(info string) string {
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	if v, ok := fields["valkey_version"]; ok {
		return "Valkey " + v
	}
	return "Redis " + fields["redis_version"]
}

// rowResult is one row of the main table: medians over rounds for the
// per-round figures, totals over all rounds for the counted ones.
type rowResult struct {
	Workload              string    `json:"workload"`
	Name                  string    `json:"name"`
	Kind                  string    `json:"kind"`
	Algorithm             string    `json:"algorithm"`
	P50US                 float64   `json:"p50_us"`
	P99US                 float64   `json:"p99_us"`
	DecisionsPerSec       float64   `json:"decisions_per_sec"`
	VsReturnOne           float64   `json:"vs_return1"` // median over rounds of decisions/s ÷ the same round's return 1
	AllowedFraction       float64   `json:"allowed_fraction"`
	CommandsPerDecision   float64   `json:"redis_commands_per_decision"` // every command the server ran, in scripts too
	RoundTripsPerDecision float64   `json:"round_trips_per_decision"`
	ScriptUSPerDecision   float64   `json:"script_us_per_decision"`
	ScriptUSMedian        float64   `json:"script_us_per_decision_median"`     // median over rounds: the floors table uses it
	SeqScriptUSMedian     float64   `json:"seq_script_us_per_decision_median"` // the sequential pass's alone
	ScriptVsReturnOne     float64   `json:"script_us_vs_return1"`
	AllocsPerOp           float64   `json:"allocs_per_op"`
	BytesPerOp            float64   `json:"bytes_per_op"`
	Decisions             int       `json:"decisions"`
	Errors                int       `json:"errors"`
	FirstError            string    `json:"first_error,omitempty"`
	PerSecondRounds       []float64 `json:"decisions_per_sec_rounds"`
}

func summarize(rows []*row) []rowResult {
	// A row is held against the ceiling of its workload on its own link:
	// loopback, or the link rows' (features.go).
	onLink := func(r *row) string {
		if strings.HasSuffix(r.c.name, linkSuffix) {
			return r.workload + linkSuffix
		}
		return r.workload
	}
	ceiling := map[string]*row{}
	for _, r := range rows {
		if r.c.algorithm == "return1" {
			ceiling[onLink(r)] = r
		}
	}
	var out []rowResult
	for _, r := range rows {
		res := rowResult{
			Workload: r.workload, Name: r.c.name, Kind: r.c.kind, Algorithm: r.c.algorithm,
			P50US: median(r.p50), P99US: median(r.p99), DecisionsPerSec: median(r.perSecond),
			AllocsPerOp: median(r.allocs), BytesPerOp: median(r.bytes), ScriptUSMedian: median(r.scriptUS), SeqScriptUSMedian: median(r.seqScriptUS),
			Decisions: r.decisions, Errors: r.errs, PerSecondRounds: r.perSecond,
		}
		if r.decisions > 0 {
			n := float64(r.decisions)
			res.AllowedFraction = float64(r.allowed) / n
			res.CommandsPerDecision = float64(r.server.calls) / n
			res.RoundTripsPerDecision = float64(r.roundTrips) / n
			res.ScriptUSPerDecision = float64(r.server.scriptUS) / n
		}
		if r.firstErr != nil {
			res.FirstError = r.firstErr.Error()
		}
		if c := ceiling[onLink(r)]; c != nil {
			var ratios []float64
			for i := range r.perSecond {
				ratios = append(ratios, r.perSecond[i]/c.perSecond[i])
			}
			res.VsReturnOne = median(ratios)
			if c.server.scriptUS > 0 && res.ScriptUSPerDecision > 0 {
				res.ScriptVsReturnOne = res.ScriptUSPerDecision / (float64(c.server.scriptUS) / float64(c.decisions))
			}
		}
		out = append(out, res)
	}
	return out
}

type targetResult struct {
	Target   string  `json:"target"`
	Subject  string  `json:"subject"`
	Measured float64 `json:"measured"`
	Want     string  `json:"want"`
	Pass     bool    `json:"pass"`
	Note     string  `json:"note,omitempty"`
}

// targets checks the figures against issue 3's targets.
func targets(rep report) []targetResult {
	var out []targetResult
	find := func(workload, name string) *rowResult {
		for i := range rep.Rows {
			if rep.Rows[i].Workload == workload && rep.Rows[i].Name == name {
				return &rep.Rows[i]
			}
		}
		return nil
	}
	peerNote := func(workload string, value func(rowResult) float64, format string) string {
		var parts []string
		for _, p := range peers {
			if r := find(workload, p.name); r != nil {
				parts = append(parts, fmt.Sprintf(format, strings.Fields(p.name)[0], value(*r)))
			}
		}
		return strings.Join(parts, ", ")
	}
	for _, rc := range redlimitConstructors {
		name := "redlimit " + rc.algorithm
		if r := find("allow", name); r != nil {
			out = append(out, targetResult{Target: "decisions/s (64 goroutines) ÷ return 1", Subject: rc.algorithm, Measured: r.VsReturnOne, Want: ">= 0.90", Pass: r.VsReturnOne >= 0.90,
				Note: "peers: " + peerNote("allow", func(r rowResult) float64 { return r.VsReturnOne }, "%s %.2f")})
		}
	}
	for _, rc := range redlimitConstructors {
		if r := find("allow", "redlimit "+rc.algorithm); r != nil {
			out = append(out, targetResult{Target: "Redis script µs per decision ÷ return 1", Subject: rc.algorithm, Measured: r.ScriptVsReturnOne, Want: "<= 2.5", Pass: r.ScriptVsReturnOne <= 2.5,
				Note: "peers: " + peerNote("allow", func(r rowResult) float64 { return r.ScriptVsReturnOne }, "%s %.1f")})
		}
	}
	for _, rc := range redlimitConstructors {
		if r := find("allow", "redlimit "+rc.algorithm); r != nil {
			out = append(out, targetResult{Target: "Go allocs per decision", Subject: rc.algorithm, Measured: r.AllocsPerOp, Want: "<= 12", Pass: r.AllocsPerOp <= 12,
				Note: "peers: " + peerNote("allow", func(r rowResult) float64 { return r.AllocsPerOp }, "%s %.0f")})
		}
	}
	for _, m := range rep.Memory {
		want, ok := wantMemory[m.Algorithm]
		if !ok || m.Name != "redlimit "+m.Algorithm {
			continue
		}
		out = append(out, targetResult{Target: "MEMORY USAGE per key (bytes)", Subject: m.Algorithm, Measured: float64(m.MemoryUsage), Want: fmt.Sprintf("<= %d", want), Pass: m.MemoryUsage > 0 && m.MemoryUsage <= want,
			Note: fmt.Sprintf("key %q; used_memory Δ %.0f B/key", m.SampleKey, m.UsedMemoryPer)})
	}
	worst := map[string]float64{}
	for _, s := range rep.Scaling {
		worst[s.Algorithm] = max(worst[s.Algorithm], s.Ratio)
	}
	for _, a := range []string{"sliding_window", "sliding_log"} {
		if v, ok := worst[a]; ok {
			out = append(out, targetResult{Target: "Redis µs per call, 3,600 buckets ÷ 10 buckets (worst mode)", Subject: a, Measured: v, Want: "<= 1.5", Pass: v <= 1.5})
		}
	}
	if len(rep.Adversarial) > 1 {
		worst := rep.Adversarial[1]
		for _, a := range rep.Adversarial[1:] {
			if a.VsNormal > worst.VsNormal {
				worst = a
			}
		}
		out = append(out, targetResult{Target: "worst adversarial state: script µs per call ÷ normal call", Subject: "sliding_window", Measured: worst.VsNormal, Want: "<= 3", Pass: worst.VsNormal <= 3,
			Note: fmt.Sprintf("%s: %.1f µs, normal %.1f µs", worst.State, worst.ScriptUS, rep.Adversarial[0].ScriptUS)})
	}
	for _, f := range rep.Floors {
		note := fmt.Sprintf("%.2f µs vs redis_rate %.2f µs; floor %.2f µs = %.2f× redis_rate", f.ScriptUS, f.RedisRateUS, f.FloorUS, f.FloorVsRate)
		if f.FloorVsRate > f.Want {
			note += ": the floor alone misses"
		}
		out = append(out, targetResult{Target: "script µs ÷ redis_rate, " + f.Workload, Subject: f.Algorithm, Measured: f.VsRedisRate, Want: fmt.Sprintf("<= %.1f", f.Want), Pass: f.VsRedisRate <= f.Want, Note: note})
	}
	for _, d := range rep.DenyCache {
		r := find("hot", "redlimit "+d.Algorithm+" +deny cache")
		if r == nil {
			continue
		}
		pass := r.RoundTripsPerDecision <= 0.01 && d.Identical
		out = append(out, targetResult{Target: "hot + WithDenyCache: Redis calls per decision, decisions identical", Subject: d.Algorithm, Measured: r.RoundTripsPerDecision, Want: "<= 0.01 and identical", Pass: pass,
			Note: fmt.Sprintf("%d/%d decisions identical to uncached (fake clock)", d.SameAllowed, d.Decisions)})
	}
	for _, rc := range redlimitConstructors {
		if r := find("autopipeline", "redlimit "+rc.algorithm); r != nil {
			out = append(out, targetResult{Target: "AutoPipeline decisions/s ÷ autopipelined return 1", Subject: rc.algorithm, Measured: r.VsReturnOne, Want: ">= 0.6", Pass: r.VsReturnOne >= 0.6,
				Note: "peers: " + peerNote("autopipeline", func(r rowResult) float64 { return r.VsReturnOne }, "%s %.2f")})
		}
	}
	return out
}

func (rep report) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	m := rep.Machine
	p("Machine: %d CPUs (%s), GOMAXPROCS %d, %s, %s, %s. Command: `%s` (%s).\n\n", m.CPUs, m.CPUModel, m.GOMAXPROCS, m.OS, m.Go, m.Server, rep.Command, rep.Config)
	p("| workload | row | p50 µs | p99 µs | decisions/s (64 g) | × return 1 | allowed | cmds/dec | round trips/dec | script µs/dec | × return 1 script | allocs/op | B/op | errors |\n")
	p("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rep.Rows {
		// "–" where the run had no return 1 row to divide by (-rows).
		vs, script := "–", "–"
		if r.VsReturnOne > 0 {
			vs = fmt.Sprintf("%.2f", r.VsReturnOne)
		}
		if r.ScriptVsReturnOne > 0 {
			script = fmt.Sprintf("%.2f", r.ScriptVsReturnOne)
		}
		p("| %s | %s | %.1f | %.1f | %.0f | %s | %.1f%% | %.2f | %.3f | %.2f | %s | %.1f | %.0f | %d |\n",
			r.Workload, r.Name, r.P50US, r.P99US, r.DecisionsPerSec, vs, 100*r.AllowedFraction,
			r.CommandsPerDecision, r.RoundTripsPerDecision, r.ScriptUSPerDecision, script, r.AllocsPerOp, r.BytesPerOp, r.Errors)
	}
	if len(rep.Memory) > 0 {
		p("\n| Redis memory per key | sample key | type / encoding | MEMORY USAGE (B) | used_memory Δ / key (B) |\n|---|---|---|--:|--:|\n")
	}
	for _, mr := range rep.Memory {
		p("| %s | `%s` | %s / %s | %d | %.1f |\n", mr.Name, mr.SampleKey, mr.Type, mr.Encoding, mr.MemoryUsage, mr.UsedMemoryPer)
	}
	if len(rep.Exactness) > 0 {
		p("\n| exactness: 4 clients × 50 goroutines × 10 tries, limit 1,000 on one key (+reservation: exact is at most 1,000 and at least 1,000 − 4 × 63) | admitted | errors | exact |\n|---|--:|--:|---|\n")
	}
	for _, e := range rep.Exactness {
		p("| %s | %d | %d | %v |\n", e.Name, e.Admitted, e.Errors, e.Exact)
	}
	if len(rep.Scaling) > 0 {
		p("\n| bucket scaling | mode | script µs, 10 buckets | script µs, 3,600 buckets | ratio |\n|---|---|--:|--:|--:|\n")
	}
	for _, s := range rep.Scaling {
		p("| %s | %s | %.2f | %.2f | %.2f |\n", s.Algorithm, s.Mode, s.US10, s.US3600, s.Ratio)
	}
	if len(rep.DenyCache) > 0 {
		p("\n| deny cache vs uncached (fake clock, 100/s, a request every 100µs) | decisions | allowed | same Allowed | same Result | round trips/dec |\n|---|--:|--:|--:|--:|--:|\n")
	}
	for _, d := range rep.DenyCache {
		p("| %s | %d | %d | %d | %d | %.4f |\n", d.Algorithm, d.Decisions, d.Allowed, d.SameAllowed, d.SameResult, d.CallsPerDecision)
	}
	if len(rep.Adversarial) > 0 {
		b.WriteString(adversarialMarkdown(rep.Adversarial))
	}
	b.WriteString(floorsMarkdown(rep.Floors))
	b.WriteString(featuresMarkdown(rep))
	b.WriteString(reservationMarkdown(rep.Rows))
	if len(rep.Targets) > 0 {
		p("\n| target | subject | measured | want | result | note |\n|---|---|--:|---|---|---|\n")
	}
	for _, t := range rep.Targets {
		res := "PASS"
		if !t.Pass {
			res = "MISS"
		}
		p("| %s | %s | %.3g | %s | %s | %s |\n", t.Target, t.Subject, t.Measured, t.Want, res, t.Note)
	}
	return b.String()
}

func (rep report) writeJSON(path string) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
