// Command bench compares redlimit's limiters with the Redis rate limiters
// people would otherwise pick, and with two ceilings (PING, and EVALSHA of a
// script that returns 1), on one redis-server in one run. Rounds interleave
// the rows, so that drift on the machine hits all of them alike; figures are
// medians over rounds. It prints markdown tables and, with -json, writes
// every figure as JSON. See BENCHMARKS.md for a full run.
//
//	go run .                 # full run, about 4 minutes on 2 cores
//	go run . -quick          # CI smoke, under a minute
//	go run . -json out.json  # also write JSON
//	go run . -adversarial    # only the sliding window on adversarial states
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/faultproxy"
)

type flags struct {
	addr       string
	quick      bool
	rounds     int
	seq        time.Duration
	conc       time.Duration
	goroutines int
	memKeys    int
	variants   bool
	adverse    bool
	jsonPath   string
	mdPath     string
	rows       *regexp.Regexp // nil: every row and every measurement
}

func main() {
	var f flags
	flag.StringVar(&f.addr, "addr", "", "use the Redis at this address instead of starting redis-server (it is not flushed; memory figures are then approximate)")
	flag.BoolVar(&f.quick, "quick", false, "short run for CI smoke (under a minute); figures are noisier")
	flag.IntVar(&f.rounds, "rounds", 0, "interleaved rounds over all rows (default 5, -quick 2)")
	flag.DurationVar(&f.seq, "seq", 0, "sequential (latency, allocs) pass per row per round (default 300ms, -quick 60ms)")
	flag.DurationVar(&f.conc, "conc", 0, "concurrent (decisions/s) pass per row per round (default 700ms, -quick 120ms)")
	flag.IntVar(&f.goroutines, "goroutines", 64, "goroutines in the concurrent pass")
	flag.IntVar(&f.memKeys, "memkeys", 10000, "keys written to measure Redis memory per key")
	flag.BoolVar(&f.variants, "variants", false, "only measure Lua script variants (where a limiter's Redis time goes) and exit")
	flag.BoolVar(&f.adverse, "adversarial", false, "only measure sliding-window calls on adversarial states and exit")
	flag.StringVar(&f.jsonPath, "json", "", "write all results as JSON to this file")
	flag.StringVar(&f.mdPath, "md", "", "also write the markdown tables to this file")
	rows := flag.String("rows", "", "only the rows whose \"workload name\" matches this regexp (and the refunds and features' memory whose \"refund name\" or \"memory name\" does), no other measurement, and only the features' targets: a focused comparison that can afford more -rounds (see docs/performance.md)")
	flag.Parse()
	if *rows != "" {
		re, err := regexp.Compile(*rows)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: -rows:", err)
			os.Exit(2)
		}
		f.rows = re
	}
	def := func(d *time.Duration, full, quick time.Duration) {
		if *d == 0 {
			*d = full
			if f.quick {
				*d = quick
			}
		}
	}
	def(&f.seq, 300*time.Millisecond, 60*time.Millisecond)
	def(&f.conc, 700*time.Millisecond, 120*time.Millisecond)
	if f.rounds == 0 {
		f.rounds = 5
		if f.quick {
			f.rounds = 2
		}
	}
	if err := run(f); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(f flags) error {
	ctx := context.Background()
	addr := f.addr
	owned := addr == ""
	if owned {
		srv, err := startServer()
		if err != nil {
			return err
		}
		defer srv.stop()
		// Stop the server by its pid on SIGINT/SIGTERM too.
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
		go func() {
			s := <-sigs
			fmt.Fprintf(os.Stderr, "bench: %v: stopping redis-server (pid %d)\n", s, srv.cmd.Process.Pid)
			srv.stop()
			os.Exit(130)
		}()
		addr = srv.addr
		logf("redis-server pid %d on %s", srv.cmd.Process.Pid, addr)
	}

	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	if err := admin.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("no redis-server at %s: %w", addr, err)
	}
	if owned {
		if err := admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
	}
	hook := &roundTrips{}
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: f.goroutines, MinIdleConns: f.goroutines})
	defer rdb.Close()
	rdb.AddHook(hook)
	// go-redis's AutoPipeliner satisfies redis.Scripter: redlimit takes it as is.
	ap, err := rdb.AutoPipeline()
	if err != nil {
		return fmt.Errorf("AutoPipeline: %w", err)
	}
	defer ap.Close()
	var _ redis.Scripter = ap

	env := &environment{ctx: ctx, f: f, admin: admin, rdb: rdb, ap: ap, hook: hook, owned: owned, run: runID()}
	defer env.close()
	if f.variants {
		_, err := env.measureVariants(5000, 7)
		return err
	}
	if f.adverse {
		rs, err := env.adversarial()
		fmt.Print(adversarialMarkdown(rs))
		return err
	}
	rep := report{Machine: machine(ctx, admin), Command: commandLine(), Config: f.describe()}
	logf("measuring %s at %s", rep.Machine.Server, addr)

	rows, err := env.buildRows()
	if err != nil {
		return err
	}
	if len(rows) > 0 {
		if err := env.rounds(rows); err != nil {
			return err
		}
	}
	rep.Rows = summarize(rows)
	rep.Floors = floors(rep.Rows)
	if rep.Refunds, err = env.refunds(); err != nil {
		return fmt.Errorf("refunds: %w", err)
	}
	if f.rows != nil {
		// Only what -rows names: "memory redlimit calendar_window", say.
		if rep.FeatureMemory, rep.LeaseMemory, err = env.featureMemory(); err != nil {
			return fmt.Errorf("feature memory: %w", err)
		}
		if rep.Exactness, err = env.reservationExactness(); err != nil {
			return fmt.Errorf("exactness: %w", err)
		}
		if len(rows) == 0 && len(rep.Refunds) == 0 && len(rep.FeatureMemory) == 0 && len(rep.LeaseMemory) == 0 && len(rep.Exactness) == 0 {
			return fmt.Errorf("-rows %q: nothing matches", f.rows)
		}
		rep.Features = featureSections(rep)
		return rep.write(f)
	}

	if rep.Memory, err = env.memory(); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	if rep.FeatureMemory, rep.LeaseMemory, err = env.featureMemory(); err != nil {
		return fmt.Errorf("feature memory: %w", err)
	}
	if rep.Exactness, err = env.exactness(); err != nil {
		return fmt.Errorf("exactness: %w", err)
	}
	reserved, err := env.reservationExactness()
	if err != nil {
		return fmt.Errorf("exactness: %w", err)
	}
	rep.Exactness = append(rep.Exactness, reserved...)
	if rep.Scaling, err = env.scaling(); err != nil {
		return fmt.Errorf("scaling: %w", err)
	}
	if rep.DenyCache, err = env.denyCacheIdentity(); err != nil {
		return fmt.Errorf("deny cache: %w", err)
	}
	if rep.Adversarial, err = env.adversarial(); err != nil {
		return fmt.Errorf("adversarial: %w", err)
	}
	rep.Targets = targets(rep)
	rep.Features = featureSections(rep)
	return rep.write(f)
}

// write prints the report's markdown and writes the files f asks for. It
// fails when a row of ours had errors.
func (rep report) write(f flags) error {
	md := rep.markdown()
	fmt.Print(md)
	if f.mdPath != "" {
		if err := os.WriteFile(f.mdPath, []byte(md), 0o644); err != nil {
			return err
		}
	}
	if f.jsonPath != "" {
		if err := rep.writeJSON(f.jsonPath); err != nil {
			return err
		}
	}
	for _, r := range rep.Rows {
		if r.Errors > 0 && r.Kind != "peer" {
			return fmt.Errorf("%s (%s): %d errors, first: %s", r.Name, r.Workload, r.Errors, r.FirstError)
		}
	}
	return nil
}

// environment is what every phase of a run shares.
type environment struct {
	ctx   context.Context
	f     flags
	admin *redis.Client // INFO, MEMORY, SCAN: never counted
	rdb   *redis.Client // the limiters' client, counted by hook
	ap    *redis.AutoPipeliner
	hook  *roundTrips
	owned bool   // the server is ours: FLUSHALL is allowed
	run   string // marks this run's keys
	// link and proxy: the link rows' client and its delaying proxy
	// (linkClient), started on first use.
	link  *redis.Client
	proxy *faultproxy.Proxy
}

func (f flags) describe() string {
	d := fmt.Sprintf("rounds=%d seq=%v conc=%v goroutines=%d memkeys=%d quick=%v", f.rounds, f.seq, f.conc, f.goroutines, f.memKeys, f.quick)
	if f.rows != nil {
		d += fmt.Sprintf(" rows=%q", f.rows)
	}
	return d
}

func runID() string {
	b := make([]byte, 3)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func commandLine() string {
	s := "go run ."
	for _, a := range os.Args[1:] {
		s += " " + a
	}
	return s
}

var start = time.Now()

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}
