// Command simulate replays one bursty request trace through all five redlimit
// algorithms, each configured for the same nominal rate of 10 requests per
// second, and draws what each admitted and denied over time as an SVG chart.
//
//	go run ./examples/simulate -o chart.svg
//
// The trace is random but seeded (-seed), so the chart is reproducible. It
// runs on an embedded miniredis with a fake clock (redlimit.WithClock, via
// redlimittest), so a minute of traffic is replayed in well under a second.
// The chart uses only the standard library.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/redlimittest"
)

// The nominal rate every limiter is configured for, and the burst each may
// let through at once.
const (
	ratePerSecond = 10
	burst         = 20
	window        = 2 * time.Second // burst / rate: the windows of the windowed algorithms
)

// lane is one algorithm of the chart.
type lane struct {
	name   string
	config []string // one or two short lines
	build  func(env *redlimittest.Env) (redlimit.Limiter, error)

	admitted []time.Duration // offsets from the start of the trace
	denied   []time.Duration
}

func lanes() []*lane {
	return []*lane{
		{name: "Fixed window", config: []string{"20 per 2 s window"}, build: func(env *redlimittest.Env) (redlimit.Limiter, error) {
			return redlimit.NewFixedWindow(env.Client(), burst, window, env.Options()...)
		}},
		{name: "Sliding window", config: []string{"20 per 2 s, counted in", "100 ms buckets"}, build: func(env *redlimittest.Env) (redlimit.Limiter, error) {
			return redlimit.NewSlidingWindow(env.Client(), burst, window, 100*time.Millisecond, env.Options()...)
		}},
		{name: "Sliding log", config: []string{"20 per 2 s and 3 per 200 ms,", "counted in 100 ms buckets"}, build: func(env *redlimittest.Env) (redlimit.Limiter, error) {
			return redlimit.NewSlidingLog(env.Client(), 100*time.Millisecond, []redlimit.Strategy{
				{Limit: burst, Window: window},
				{Limit: 3, Window: 200 * time.Millisecond},
			}, env.Options()...)
		}},
		{name: "Leaky bucket", config: []string{"capacity 20, leaks 10/s"}, build: func(env *redlimittest.Env) (redlimit.Limiter, error) {
			return redlimit.NewLeakyBucket(env.Client(), burst, redlimit.PerSecond(ratePerSecond), env.Options()...)
		}},
		{name: "Token bucket", config: []string{"capacity 20, refills 10/s"}, build: func(env *redlimittest.Env) (redlimit.Limiter, error) {
			return redlimit.NewTokenBucket(env.Client(), burst, redlimit.PerSecond(ratePerSecond), env.Options()...)
		}},
	}
}

func main() {
	out := flag.String("o", "chart.svg", "write the SVG chart to this file")
	seed := flag.Uint64("seed", 7, "seed of the random trace")
	duration := flag.Duration("d", time.Minute, "length of the trace")
	flag.Parse()
	if *duration < 10*time.Second || *duration > time.Hour {
		log.Fatalf("simulate: -d %v: must be between 10s and 1h", *duration)
	}

	trace := bursty(*seed, *duration)
	ls := lanes()
	if err := replay(trace, ls); err != nil {
		log.Fatal(err)
	}

	fmt.Printf("%d requests over %v (seed %d), nominal rate %d/s:\n", len(trace), *duration, *seed, ratePerSecond)
	for _, l := range ls {
		fmt.Printf("  %-15s admitted %4d, denied %4d, at most %2d admitted in any %s (allows %s)\n",
			l.name, len(l.admitted), len(l.denied), maxInWindow(l.admitted, window), seconds(window), l.bound())
	}
	svg := chart(trace, ls, *duration, *seed)
	if err := os.WriteFile(*out, []byte(svg), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Println("wrote", *out)
}

// bursty returns the arrival times of a seeded trace: a quiet background
// of about 4 requests per second, bursts of 30 to 60 per second lasting 1
// to 4 seconds, and one burst placed to straddle a 2 s boundary. Times are
// whole microseconds, sorted.
func bursty(seed uint64, d time.Duration) []time.Duration {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var trace []time.Duration
	poisson := func(from, to time.Duration, perSecond float64) {
		for t := from; ; {
			gap := time.Duration(rng.ExpFloat64() / perSecond * float64(time.Second))
			t += gap
			if t >= to {
				return
			}
			trace = append(trace, t.Truncate(time.Microsecond))
		}
	}
	poisson(0, d, 4)
	for t := 3 * time.Second; t < d; {
		length := time.Duration(1+rng.IntN(4)) * time.Second
		poisson(t, min(t+length, d), float64(30+rng.IntN(31)))
		t += length + time.Duration(4+rng.IntN(8))*time.Second
	}
	slices.Sort(trace)
	return trace
}

// replay asks every lane's limiter about every request of trace, on one
// fake clock, and records the decisions.
func replay(trace []time.Duration, ls []*lane) error {
	env, err := redlimittest.Run()
	if err != nil {
		return err
	}
	defer env.Close()
	limiters := make([]redlimit.Limiter, len(ls))
	for i, l := range ls {
		if limiters[i], err = l.build(env); err != nil {
			return fmt.Errorf("%s: %w", l.name, err)
		}
	}
	ctx := context.Background()
	start := env.Now()
	for _, t := range trace {
		env.Set(start.Add(t))
		for i, l := range ls {
			r, err := limiters[i].Allow(ctx, "client")
			if err != nil {
				return fmt.Errorf("%s at %v: %w", l.name, t, err)
			}
			if r.Allowed {
				l.admitted = append(l.admitted, t)
			} else {
				l.denied = append(l.denied, t)
			}
		}
	}
	return nil
}

// maxInWindow returns the most times of sorted that fit in any half-open
// interval of length w.
func maxInWindow(sorted []time.Duration, w time.Duration) int {
	n, _ := busiestSpan(sorted, w)
	return n
}

// busiestSpan returns the most times of sorted that fit in any half-open
// interval [from, from+w), and the earliest such from (the first time in it).
func busiestSpan(sorted []time.Duration, w time.Duration) (n int, from time.Duration) {
	lo := 0
	for hi, t := range sorted {
		for sorted[lo] <= t-w {
			lo++
		}
		if hi-lo+1 > n {
			n, from = hi-lo+1, sorted[lo]
		}
	}
	return n, from
}

// fixedWindowStarts returns where the fixed window's windows opened: at
// the first admitted request that found none open (windows are not aligned
// to the clock; a window opens at its first request).
func fixedWindowStarts(admitted []time.Duration, w time.Duration) []time.Duration {
	var starts []time.Duration
	end := time.Duration(-1)
	for _, t := range admitted {
		if t >= end {
			starts = append(starts, t)
			end = t + w
		}
	}
	return starts
}

// bound is what each algorithm promises about any span of one window: the
// most it may admit, and why.
func (l *lane) bound() string {
	switch l.name {
	case "Fixed window":
		return fmt.Sprintf("up to %d: 2 windows at a boundary", 2*burst)
	case "Leaky bucket", "Token bucket":
		return fmt.Sprintf("up to %d: burst %d + %d/s", burst+int(window.Seconds())*ratePerSecond, burst, ratePerSecond)
	default:
		return fmt.Sprintf("%d, plus a bucket's edge", burst)
	}
}

// Chart geometry, in SVG user units (pixels at 100%).
const (
	width       = 1200
	marginLeft  = 250
	marginRight = 24
	headerH     = 96 // title, subtitle, legend
	laneH       = 120
	laneGap     = 26
	footerH     = 58 // time axis and its label
	bin         = 500 * time.Millisecond
	colAdmitted = "#2e9d5b"
	colDenied   = "#e0604f"
	colNominal  = "#1f3b73"
	colGrid     = "#e3e6ea"
	colText     = "#1d232b"
	colMuted    = "#5b6673"
	colSpan     = "#fff1c2" // the busiest window-long span of a lane
	colBoundary = "#8a94a3" // where a fixed window opened
)

// chart draws one lane per algorithm: per bin of 500 ms, a bar of admitted
// requests with the denied ones stacked above, and the nominal rate as a
// dashed line.
func chart(trace []time.Duration, ls []*lane, d time.Duration, seed uint64) string {
	bins := int((d + bin - 1) / bin)
	count := func(ts []time.Duration) []int {
		c := make([]int, bins)
		for _, t := range ts {
			c[int(t/bin)]++
		}
		return c
	}
	offered := count(trace)
	yMax := niceCeil(float64(slices.Max(offered)))
	nominalPerBin := ratePerSecond * bin.Seconds()

	plotW := float64(width - marginLeft - marginRight)
	binW := plotW / float64(bins)
	height := headerH + len(ls)*(laneH+laneGap) + footerH
	x := func(t time.Duration) float64 { return marginLeft + plotW*t.Seconds()/d.Seconds() }

	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...); b.WriteByte('\n') }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="13">`, width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>`)
	p(`<text x="%d" y="30" font-size="20" font-weight="bold" fill="%s">One bursty trace, five rate limiters at %d requests/s</text>`, marginLeft, colText, ratePerSecond)
	p(`<text x="%d" y="52" fill="%s">%d requests over %s (seed %d), replayed on a fake clock. Each bar: requests in %s, admitted below, denied above.</text>`,
		marginLeft, colMuted, len(trace), seconds(d), seed, seconds(bin))

	// Legend.
	lx := float64(marginLeft)
	legend := func(swatch, label string) {
		p(`%s<text x="%.1f" y="80" fill="%s">%s</text>`, swatch, lx+22, colText, label)
		lx += 22 + 7.5*float64(len(label)) + 28
	}
	legend(fmt.Sprintf(`<rect x="%.1f" y="69" width="14" height="14" fill="%s"/>`, lx, colAdmitted), "admitted")
	legend(fmt.Sprintf(`<rect x="%.1f" y="69" width="14" height="14" fill="%s"/>`, lx, colDenied), "denied")
	legend(fmt.Sprintf(`<line x1="%.1f" y1="76" x2="%.1f" y2="76" stroke="%s" stroke-width="2" stroke-dasharray="5,3"/>`, lx, lx+16, colNominal),
		fmt.Sprintf("nominal rate (%d/s = %g per bar)", ratePerSecond, nominalPerBin))
	legend(fmt.Sprintf(`<rect x="%.1f" y="69" width="14" height="14" fill="%s"/>`, lx, colSpan), fmt.Sprintf("busiest %s", seconds(window)))
	legend(fmt.Sprintf(`<line x1="%.1f" y1="69" x2="%.1f" y2="83" stroke="%s"/>`, lx+7, lx+7, colBoundary), "fixed window opens")

	for i, l := range ls {
		top := float64(headerH + i*(laneH+laneGap))
		base := top + laneH
		y := func(v float64) float64 { return base - laneH*v/yMax }

		// Lane label.
		p(`<text x="14" y="%.1f" font-size="15" font-weight="bold" fill="%s">%s</text>`, top+22, colText, l.name)
		for j, line := range l.config {
			p(`<text x="14" y="%.1f" font-size="11.5" fill="%s">%s</text>`, top+40+float64(j)*15, colMuted, line)
		}
		p(`<text x="14" y="%.1f" font-size="11.5" fill="%s">admitted %d of %d</text>`, top+84, colText, len(l.admitted), len(trace))
		most, from := busiestSpan(l.admitted, window)
		p(`<text x="14" y="%.1f" font-size="11.5" fill="%s">most in any %s: %d (shaded)</text>`, top+100, colText, seconds(window), most)
		p(`<text x="14" y="%.1f" font-size="11.5" fill="%s">allows %s</text>`, top+115, colMuted, l.bound())

		// The busiest span of one window, shaded behind the bars.
		p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="%s"/>`, x(from), top, x(from+window)-x(from), laneH, colSpan)
		if l.name == "Fixed window" {
			// Where each window opened: the boundary burst shows as
			// two full windows side by side.
			for _, start := range fixedWindowStarts(l.admitted, window) {
				p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1"/>`, x(start), top, x(start), base, colBoundary)
			}
		}

		// Grid and y-axis ticks.
		for _, v := range []float64{0, yMax / 2, yMax} {
			p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"/>`, marginLeft, y(v), width-marginRight, y(v), colGrid)
			p(`<text x="%d" y="%.1f" font-size="10.5" text-anchor="end" fill="%s">%g</text>`, marginLeft-6, y(v)+4, colMuted, v)
		}

		// Bars.
		admitted, denied := count(l.admitted), count(l.denied)
		for k := 0; k < bins; k++ {
			bx := marginLeft + float64(k)*binW + 0.5
			bw := math.Max(binW-1, 0.5)
			if a := admitted[k]; a > 0 {
				p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, bx, y(float64(a)), bw, laneH*float64(a)/yMax, colAdmitted)
			}
			if dn := denied[k]; dn > 0 {
				a := float64(admitted[k])
				p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, bx, y(a+float64(dn)), bw, laneH*float64(dn)/yMax, colDenied)
			}
		}
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-width="2" stroke-dasharray="5,3"/>`,
			marginLeft, y(nominalPerBin), width-marginRight, y(nominalPerBin), colNominal)
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"/>`, marginLeft, base, width-marginRight, base, colMuted)
	}

	// Time axis, under the last lane.
	axisY := float64(headerH + len(ls)*(laneH+laneGap) - laneGap)
	step := 5 * time.Second
	if d > 2*time.Minute {
		step = time.Duration(math.Ceil(d.Minutes()/12)) * time.Minute
	}
	for t := time.Duration(0); t <= d; t += step {
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`, x(t), axisY, x(t), axisY+5, colMuted)
		p(`<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle" fill="%s">%g</text>`, x(t), axisY+18, colMuted, t.Seconds())
	}
	p(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="%s">time (s)</text>`, marginLeft+plotW/2, axisY+40, colText)
	yLabelY := float64(headerH) + float64(len(ls)*(laneH+laneGap)-laneGap)/2
	p(`<text transform="translate(%d %.1f) rotate(-90)" text-anchor="middle" fill="%s">requests per %s</text>`, marginLeft-34, yLabelY, colText, seconds(bin))
	p(`</svg>`)
	return b.String()
}

// seconds formats d for the chart: "0.5 s", "60 s".
func seconds(d time.Duration) string {
	return fmt.Sprintf("%g s", d.Seconds())
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten, and to at least
// 2, so that the axis has round ticks at 0, half and full.
func niceCeil(v float64) float64 {
	if v <= 2 {
		return 2
	}
	pow := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*pow >= v {
			return m * pow
		}
	}
	return 10 * pow
}
