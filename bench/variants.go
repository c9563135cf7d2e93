package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// variant is a Lua script measured on its own, to find where a limiter's
// Redis time goes.
type variant struct {
	Name string `json:"name"`
	src  string
	args func(now time.Time) []any
}

type variantResult struct {
	Name      string  `json:"name"`
	ScriptUS  float64 `json:"script_us_per_call"`
	Commands  float64 `json:"commands_per_call"`
	VsReturn1 float64 `json:"vs_return1"`
}

// scriptFile reads one of redlimit's scripts from the source tree, beside
// this module.
func scriptFile(name string) string {
	_, self, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(self), "..", "scripts", name))
	if err != nil {
		panic(err)
	}
	return string(b) + "\n"
}

func variants() []variant {
	server := func(time.Time) []any { return []any{"", 1, 1_000_000, int64(60_000_000)} }
	client := func(now time.Time) []any { return []any{now.UnixMicro(), 1, 1_000_000, int64(60_000_000)} }
	// Joined as fixedwindow.go, leakybucket.go and tokenbucket.go join them.
	fw := scriptFile("fixedwindow.lua")
	lb := scriptFile("leakybucket.lua") + scriptFile("gcra.lua")
	tb := scriptFile("tokenbucket.lua") + scriptFile("gcra.lua")
	// The buckets' allow workload: 1,000,000 per minute, reduced to 1 per 60µs.
	bucket := func(time.Time) []any { return []any{"", 1, 1_000_000, 60, 1} }
	floor := func(algorithm, workload string) variant {
		f := floorScripts[algorithm][workload]
		return variant{"floor " + algorithm + " " + workload, f.src, func(time.Time) []any { return []any{f.value, f.resp} }}
	}
	return []variant{
		{"return 1", "return 1", server},
		{"TIME", "local t = redis.call('TIME') return 1", server},
		{"GET", "redis.call('GET', KEYS[1]) return 1", server},
		{"SET PX", "redis.call('SET', KEYS[1], '1', 'PX', 60000) return 1", server},
		{"GET + SET PX", "redis.call('GET', KEYS[1]) redis.call('SET', KEYS[1], '1', 'PX', 60000) return 1", server},
		{"TIME + GET + SET PX", "redis.call('TIME') redis.call('GET', KEYS[1]) redis.call('SET', KEYS[1], '1', 'PX', 60000) return 1", server},
		{"TIME + GET + SET PX + format reply", "redis.call('TIME') redis.call('GET', KEYS[1]) redis.call('SET', KEYS[1], '1', 'PX', 60000) return string.format('%d %d %d %d %d', 1, 5, 0, 100, 0)", server},
		{"GET + INCRBY (keeps TTL)", "redis.call('GET', KEYS[1]) redis.call('INCRBY', KEYS[1], 1) return 1", server},
		{"GET + SET KEEPTTL", "redis.call('GET', KEYS[1]) redis.call('SET', KEYS[1], '1', 'KEEPTTL') return 1", server},
		{"TIME + GET + INCRBY + format reply", "redis.call('TIME') redis.call('GET', KEYS[1]) redis.call('INCRBY', KEYS[1], 1) return string.format('%d %d %d %d %d', 1, 5, 0, 100, 0)", server},
		{"return format reply", "return string.format('%d %d %d %d %d', 1, 5, 0, 100, 0)", server},
		{"return {1,5,0,100,0} (array)", "return {1, 5, 0, 100, 0}", server},
		{"fixed window (server TIME)", fw, server},
		{"fixed window (WithClock)", fw, client},
		floor("fixed_window", "allow"),
		{"leaky bucket (server TIME)", lb, bucket},
		floor("leaky_bucket", "allow"),
		{"token bucket (server TIME)", tb, bucket},
		floor("token_bucket", "allow"),
	}
}

// measureVariants runs each variant calls times per round, rounds
// interleaved, and reads its Redis µs per call (median over rounds).
func (e *environment) measureVariants(calls, rounds int) ([]variantResult, error) {
	vs := variants()
	scripts := make([]*redis.Script, len(vs))
	keys := make([][]string, len(vs))
	us := make([][]float64, len(vs))
	cmds := make([]float64, len(vs))
	for i, v := range vs {
		scripts[i] = redis.NewScript(v.src)
		for k := 0; k < 1000; k++ {
			keys[i] = append(keys[i], "var"+strconv.Itoa(i)+":"+e.run+":"+strconv.Itoa(k))
		}
		if err := scripts[i].Run(e.ctx, e.rdb, keys[i][:1], v.args(time.Now())...).Err(); err != nil {
			return nil, fmt.Errorf("variant %s: %w", v.Name, err)
		}
	}
	for round := 0; round < rounds; round++ {
		for i, v := range vs {
			before, err := readStats(e.ctx, e.admin)
			if err != nil {
				return nil, err
			}
			for k := 0; k < calls; k++ {
				if err := scripts[i].Run(e.ctx, e.rdb, keys[i][k%1000:k%1000+1], v.args(time.Now())...).Err(); err != nil {
					return nil, fmt.Errorf("variant %s: %w", v.Name, err)
				}
			}
			after, err := readStats(e.ctx, e.admin)
			if err != nil {
				return nil, err
			}
			d := after.sub(before)
			us[i] = append(us[i], float64(d.scriptUS)/float64(d.scriptCall))
			cmds[i] = float64(d.calls) / float64(calls)
		}
	}
	var out []variantResult
	base := median(us[0])
	for i, v := range vs {
		r := variantResult{Name: v.Name, ScriptUS: median(us[i]), Commands: cmds[i]}
		r.VsReturn1 = r.ScriptUS / base
		logf("variant %-40s %6.2f µs/call  %.2f× return 1  %.1f commands", v.Name, r.ScriptUS, r.VsReturn1, r.Commands)
		out = append(out, r)
	}
	return out, nil
}
