package main

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// memoryResult is Redis memory per key of one contender.
type memoryResult struct {
	Name          string  `json:"name"`
	Algorithm     string  `json:"algorithm"`
	Keys          int     `json:"keys"`
	SampleKey     string  `json:"sample_key"`
	MemoryUsage   int64   `json:"memory_usage_bytes"`  // MEMORY USAGE key SAMPLES 0
	UsedMemoryPer float64 `json:"used_memory_per_key"` // used_memory delta / keys
	Type          string  `json:"type"`
	Encoding      string  `json:"encoding"`
}

// memoryLimit keeps one permit's state alive for seconds: with allowLimit a
// bucket that took one permit drains in 60µs and its key expires at once.
var memoryLimit = limit{count: 1000, per: time.Hour}

// memory writes one decision on each of f.memKeys fresh keys per contender
// and reads what Redis spends on them.
func (e *environment) memory() ([]memoryResult, error) {
	var out []memoryResult
	contenders := append(redlimitContenders(""), peers...)
	for i, c := range contenders {
		decide, err := c.build(e.rdb, memoryLimit)
		if err != nil {
			logf("memory: %s skipped: %v", c.name, err)
			continue
		}
		m, err := e.keyMemory(fmt.Sprintf("mem%02d", i), c, decide)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// keyMemory writes one decision of c on each of f.memKeys fresh keys
// named after tag, and reads what Redis spends on them: used_memory's
// growth per key, and MEMORY USAGE of one of them.
func (e *environment) keyMemory(tag string, c contender, decide decider) (memoryResult, error) {
	if e.owned {
		if err := e.admin.FlushAll(e.ctx).Err(); err != nil {
			return memoryResult{}, err
		}
	}
	// Key names of equal length for every contender; the library adds its prefix.
	if !e.owned {
		tag += e.run
	}
	keys := make([]string, e.f.memKeys)
	for k := range keys {
		keys[k] = fmt.Sprintf("%s:%05d", tag, k)
	}
	time.Sleep(50 * time.Millisecond)
	before, err := readStats(e.ctx, e.admin)
	if err != nil {
		return memoryResult{}, err
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for g := 0; g < e.f.goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := next.Add(1) - 1
				if k >= int64(len(keys)) {
					return
				}
				if _, err := decide(e.ctx, keys[k]); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return memoryResult{}, fmt.Errorf("%s: %w", c.name, err)
	}
	after, err := readStats(e.ctx, e.admin)
	if err != nil {
		return memoryResult{}, err
	}
	m := memoryResult{Name: c.name, Algorithm: c.algorithm, Keys: len(keys),
		UsedMemoryPer: float64(after.usedMemory-before.usedMemory) / float64(len(keys))}
	found, _, err := e.admin.Scan(e.ctx, 0, "*"+keys[0], 0).Result()
	for cursor := uint64(0); err == nil && len(found) == 0; {
		found, cursor, err = e.admin.Scan(e.ctx, cursor, "*"+keys[0], 1000).Result()
		if cursor == 0 {
			break
		}
	}
	if err != nil {
		return memoryResult{}, err
	}
	if len(found) > 0 {
		m.SampleKey = found[0]
		m.MemoryUsage, _ = e.admin.MemoryUsage(e.ctx, m.SampleKey, 0).Result()
		m.Type, _ = e.admin.Type(e.ctx, m.SampleKey).Result()
		m.Encoding, _ = e.admin.ObjectEncoding(e.ctx, m.SampleKey).Result()
	}
	logf("memory: %s: %d B (MEMORY USAGE %s), %.1f B/key used_memory", c.name, m.MemoryUsage, m.SampleKey, m.UsedMemoryPer)
	return m, nil
}

// exactnessResult is one contender's run of the exactness check.
type exactnessResult struct {
	Name     string `json:"name"`
	Attempts int    `json:"attempts"`
	Admitted int    `json:"admitted"`
	Errors   int    `json:"errors"`
	FirstErr string `json:"first_error,omitempty"`
	Exact    bool   `json:"exact"`
}

const (
	exactClients    = 4
	exactGoroutines = 50 // per client
	exactAttempts   = 10 // per goroutine
	exactLimit      = 1000
)

// exactness has 4 clients × 50 goroutines race for one key limited to 1,000
// (refilling at most once a day): exactly 1,000 must be admitted.
func (e *environment) exactness() ([]exactnessResult, error) {
	var out []exactnessResult
	lim := limit{count: exactLimit, per: 24 * time.Hour}
	for i, c := range append(redlimitContenders(""), peers...) {
		r, err := e.exactOne(fmt.Sprintf("exact%02d:%s", i, e.run), c, lim)
		if err != nil {
			return nil, err
		}
		r.Exact = r.Admitted == exactLimit && r.Errors == 0
		out = append(out, r)
	}
	return out, nil
}

// exactOne runs exactClients clients of c, each with exactGoroutines
// goroutines making exactAttempts calls, on one key.
func (e *environment) exactOne(key string, c contender, lim limit) (exactnessResult, error) {
	clients := make([]*redis.Client, exactClients)
	deciders := make([]decider, exactClients)
	for k := range clients {
		clients[k] = redis.NewClient(&redis.Options{Addr: e.rdb.Options().Addr, PoolSize: exactGoroutines})
		d, err := c.build(clients[k], lim)
		if err != nil {
			return exactnessResult{}, fmt.Errorf("%s: %w", c.name, err)
		}
		deciders[k] = d
	}
	var admitted, errs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	ready := make(chan struct{})
	for k := range clients {
		for g := 0; g < exactGoroutines; g++ {
			wg.Add(1)
			go func(decide decider) {
				defer wg.Done()
				<-ready
				for a := 0; a < exactAttempts; a++ {
					ok, err := decide(e.ctx, key)
					if err != nil {
						errs.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					} else if ok {
						admitted.Add(1)
					}
				}
			}(deciders[k])
		}
	}
	close(ready)
	wg.Wait()
	for _, cl := range clients {
		cl.Close()
	}
	r := exactnessResult{Name: c.name, Attempts: exactClients * exactGoroutines * exactAttempts,
		Admitted: int(admitted.Load()), Errors: int(errs.Load())}
	r.FirstErr, _ = firstErr.Load().(string)
	logf("exactness: %s: admitted %d of %d, %d errors", c.name, r.Admitted, r.Attempts, r.Errors)
	return r, nil
}

// scalingResult compares Redis µs per call of a bucketed limiter with 10 and
// with 3,600 nonempty buckets in its window.
type scalingResult struct {
	Algorithm string  `json:"algorithm"`
	Mode      string  `json:"mode"` // "new bucket each call" or "same bucket"
	US10      float64 `json:"script_us_10_buckets"`
	US3600    float64 `json:"script_us_3600_buckets"`
	Ratio     float64 `json:"ratio"`
}

// fakeClock is a clock the bench advances by hand, safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }
func newFakeClock(t time.Time) *fakeClock    { c := &fakeClock{}; c.ns.Store(t.UnixNano()); return c }

// scaling fills windows of 10 and of 3,600 one-second buckets (one permit each, on a
// fake clock one precision apart), then measures, in interleaved batches,
// calls that each open a new bucket (so one leaves the window) and calls into
// the newest bucket.
func (e *environment) scaling() ([]scalingResult, error) {
	// Long enough that no key expires (a real-time TTL) while a batch runs.
	const precision = time.Second
	batches, calls := 6, 500
	if e.f.quick {
		batches, calls = 4, 200
	}
	modes := []struct {
		name string
		step time.Duration
	}{{"new bucket each call", precision}, {"same bucket", 0}}
	var out []scalingResult
	for _, algorithm := range []string{"sliding_window", "sliding_log"} {
		type subject struct {
			buckets int
			clock   *fakeClock
			l       redlimit.Limiter
			key     string
			us      map[string][]float64
		}
		var subjects []*subject
		for _, buckets := range []int{10, 3600} {
			s := &subject{buckets: buckets, clock: newFakeClock(time.Unix(1_900_000_000, 0)), us: map[string][]float64{},
				key: fmt.Sprintf("scale:%s:%d:%s", algorithm, buckets, e.run)}
			window := time.Duration(buckets) * precision
			var err error
			if algorithm == "sliding_window" {
				s.l, err = redlimit.NewSlidingWindow(e.rdb, 1<<30, window, precision, redlimit.WithClock(s.clock.now))
			} else {
				s.l, err = redlimit.NewSlidingLog(e.rdb, precision, []redlimit.Strategy{
					{Limit: 1 << 29, Window: window / 2}, {Limit: 1 << 30, Window: window},
				}, redlimit.WithClock(s.clock.now))
			}
			if err != nil {
				return nil, err
			}
			for i := 0; i < buckets; i++ {
				if _, err := s.l.Allow(e.ctx, s.key); err != nil {
					return nil, err
				}
				s.clock.advance(precision)
			}
			subjects = append(subjects, s)
		}
		for batch := 0; batch < batches; batch++ {
			for _, mode := range modes {
				for k := range subjects {
					s := subjects[(k+batch)%len(subjects)]
					before, err := readStats(e.ctx, e.admin)
					if err != nil {
						return nil, err
					}
					for i := 0; i < calls; i++ {
						r, err := s.l.Allow(e.ctx, s.key)
						if err != nil {
							return nil, err
						}
						if !r.Allowed {
							return nil, fmt.Errorf("scaling: %s denied", algorithm)
						}
						s.clock.advance(mode.step)
					}
					after, err := readStats(e.ctx, e.admin)
					if err != nil {
						return nil, err
					}
					d := after.sub(before)
					s.us[mode.name] = append(s.us[mode.name], float64(d.scriptUS)/float64(d.scriptCall))
				}
			}
		}
		for _, mode := range modes {
			r := scalingResult{Algorithm: algorithm, Mode: mode.name, US10: median(subjects[0].us[mode.name]), US3600: median(subjects[1].us[mode.name])}
			r.Ratio = r.US3600 / r.US10
			logf("scaling: %s, %s: %.2f µs (10 buckets) vs %.2f µs (3600): %.2f×", algorithm, mode.name, r.US10, r.US3600, r.Ratio)
			out = append(out, r)
		}
	}
	return out, nil
}

// denyCacheResult compares a limiter with WithDenyCache against the same
// limiter without, on the same fake clock and the same request sequence.
type denyCacheResult struct {
	Algorithm        string  `json:"algorithm"`
	Decisions        int     `json:"decisions"`
	Allowed          int     `json:"allowed"`
	SameAllowed      int     `json:"same_allowed"`       // decisions whose Allowed matches
	SameResult       int     `json:"same_result"`        // whole Result matches
	CallsPerDecision float64 `json:"calls_per_decision"` // cached limiter's round trips / decisions
	Identical        bool    `json:"identical"`
	FirstDifference  string  `json:"first_difference,omitempty"`
}

// denyCacheIdentity runs the hot workload (100/s on one key, requests every
// 100µs of fake time: 99% denied) on a cached and an uncached limiter side by
// side. Redis counts TTLs in real time, and a step can take longer than its
// 100µs of fake time, so a key could expire before its fake-time state is
// spent and make the uncached limiter look like a fresh key: both keys are
// PERSISTed after every step (through the client whose calls are not
// counted). Expiry is tested apart; this compares decisions.
func (e *environment) denyCacheIdentity() ([]denyCacheResult, error) {
	steps := 20000
	if e.f.quick {
		steps = 4000
	}
	var out []denyCacheResult
	for _, rc := range redlimitConstructors {
		clock := newFakeClock(time.Unix(1_900_000_000, 0))
		hook := &roundTrips{}
		cachedClient := redis.NewClient(&redis.Options{Addr: e.rdb.Options().Addr})
		cachedClient.AddHook(hook)
		lim := hotLimit
		lim.clock = clock.now
		plain, err := newRedlimitLimiter(rc.algorithm, e.rdb, lim)
		if err != nil {
			return nil, err
		}
		lim.denyCache = denyCacheSize
		cached, err := newRedlimitLimiter(rc.algorithm, cachedClient, lim)
		if err != nil {
			return nil, err
		}
		r := denyCacheResult{Algorithm: rc.algorithm, Decisions: steps}
		plainKey, cachedKey := "dc:plain:"+rc.algorithm+":"+e.run, "dc:cached:"+rc.algorithm+":"+e.run
		var redisKeys []string // of plainKey and cachedKey, once they exist
		for i := 0; i < steps; i++ {
			want, err := plain.Allow(e.ctx, plainKey)
			if err != nil {
				return nil, err
			}
			got, err := cached.Allow(e.ctx, cachedKey)
			if err != nil {
				return nil, err
			}
			if want.Allowed {
				r.Allowed++
			}
			if want.Allowed == got.Allowed {
				r.SameAllowed++
			}
			if want == got {
				r.SameResult++
			} else if r.FirstDifference == "" {
				r.FirstDifference = fmt.Sprintf("step %d: uncached %+v, cached %+v", i, want, got)
			}
			// Real Redis counts TTLs in real time while the fake clock runs
			// its own: keep both keys alive (with a TTL: a key without one
			// is foreign to redlimit).
			if redisKeys == nil {
				// Found once both exist: a bucket's first grant sets a TTL
				// of a refill in fake time (10ms here), which a loaded
				// machine's real time can pass before the lookup.
				if redisKeys, err = e.redisKeys(plainKey, cachedKey); err != nil {
					return nil, err
				}
			}
			for _, k := range redisKeys {
				if err := e.rdb.PExpire(e.ctx, k, time.Hour).Err(); err != nil {
					return nil, err
				}
			}
			clock.advance(100 * time.Microsecond)
		}
		cachedClient.Close()
		r.CallsPerDecision = float64(hook.n.Load()) / float64(steps)
		r.Identical = r.SameAllowed == steps
		logf("deny cache: %s: %d/%d Allowed identical, %d/%d Results identical, %.4f calls/decision",
			rc.algorithm, r.SameAllowed, steps, r.SameResult, steps, r.CallsPerDecision)
		out = append(out, r)
	}
	return out, nil
}

// redisKeys returns the Redis keys that hold the state of keys under
// default prefixes (redlimit:<algorithm>:<config>:<key>), each key unique
// to this run: they are found once, by pattern.
func (e *environment) redisKeys(keys ...string) ([]string, error) {
	var out []string
	for _, key := range keys {
		found, err := e.rdb.Keys(e.ctx, "redlimit:*:"+key).Result()
		if err != nil {
			return nil, err
		}
		if len(found) > 1 {
			return nil, fmt.Errorf("bench: %d Redis keys for %q, want 1", len(found), key)
		}
		if len(found) == 0 {
			return nil, nil // not there (yet, or expired already): look again later
		}
		out = append(out, found[0])
	}
	return out, nil
}
