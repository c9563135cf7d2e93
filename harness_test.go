package redlimit

// The test harness of package redlimit, shared by every test file:
//
//   - algorithms, the registry of the five algorithms: a test of something
//     every algorithm does loops over it (`for _, alg := range algorithms`)
//     and builds each with alg.new(rdb, limit, period, opts...);
//   - forEachBackend, which runs a test on miniredis (over an in-memory
//     pipe) and on a real redis-server, in parallel, each with keys of its
//     own;
//   - newClock, a fake clock for WithClock, starting at epoch;
//   - commandRecorder, a go-redis hook recording the commands a client
//     sends (decisions by key, NOSCRIPT answers, dials);
//   - keepTTL, a go-redis hook keeping the keys of a fake-clock trace alive
//     on a real server (it sends the scripts as variants whose TTLs are an
//     hour);
//   - RecommendedOptions, the go-redis options of a client that fails fast,
//     and patientClient, one that fails only at its calls' ctx deadlines;
//   - deadRedis, a client of a Redis that is not there.
//
// Tests that kill, stop or reconfigure a server start their own
// (redistest.Start), and tests that measure time or change process-wide
// state (loggers, SCRIPT FLUSH on a shared server) do not call t.Parallel:
// go test runs them first, alone, before the parallel ones.

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

func TestMain(m *testing.M) {
	// miniredis runs gopher-lua, which builds a new Lua state for every
	// script call: at the default GOGC, collecting them takes about half
	// the CPU of the miniredis tests.
	debug.SetGCPercent(400)
	code := m.Run()
	redistest.Shutdown()
	os.Exit(code)
}

// Units of the step tables.
const (
	us = time.Microsecond
	ms = time.Millisecond
)

// forever is the longest period every algorithm accepts (the sliding log's
// second strategy is ten periods long): a limiter built with it regains
// nothing while a test runs unless limit is in the hundreds of thousands.
const forever = 20 * 24 * time.Hour

// algorithm is one of the five algorithms as the tests build it.
type algorithm struct {
	name string // as Decision.Algorithm and error messages name it
	code string // in default keys: redlimit:<code>:<config>:<key>
	hash bool   // its state is a sorted set (the sliding algorithms), else a string
	// shaped is new with the setting new derives from limit and period set
	// by s (see shape).
	shaped func(rdb redis.Scripter, limit int, period time.Duration, s shape, opts ...Option) (Limiter, error)
	// periods is how many periods a key takes from exhausted to fully
	// available: see recovery.
	periods int
	// strategies is how many limits a limiter enforces: the sliding log's
	// two, limit and 2×limit (see limits).
	strategies int
}

// shape is the part of an algorithm's configuration that new derives from
// limit and period, for the tests that vary it (the fuzzers). A zero field
// takes new's value.
type shape struct {
	precision time.Duration // sliding window and log: bucket length (period/10)
	count     int           // leaky and token bucket: Rate.Count per period (limit)
}

// new returns a limiter that grants a fresh key limit permits at once and
// regains them over period: a window of period (in buckets of period/10
// for the sliding window and log; the log adds a second strategy of
// 2×limit per 10×period), or a bucket of capacity limit refilled (or
// drained) at limit per period.
func (a algorithm) new(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error) {
	return a.shaped(rdb, limit, period, shape{}, opts...)
}

// limits returns the limits a limiter built with limit enforces, smallest
// first.
func (a algorithm) limits(limit int) []int {
	if a.strategies == 2 {
		return []int{limit, 2 * limit}
	}
	return []int{limit}
}

// recovery is the time a limiter built with period takes from exhausted
// (its burst granted at one instant) back to fully available.
func (a algorithm) recovery(period time.Duration) time.Duration {
	return time.Duration(a.periods) * period
}

// precisionOr returns the precision s sets, or period/10.
func (s shape) precisionOr(period time.Duration) time.Duration {
	if s.precision != 0 {
		return s.precision
	}
	return period / 10
}

// rateOr returns the refill rate s sets, or limit per period.
func (s shape) rateOr(limit int, period time.Duration) Rate {
	if s.count != 0 {
		return Rate{Count: s.count, Per: period}
	}
	return Rate{Count: limit, Per: period}
}

// algorithms is the registry of the five algorithms.
var algorithms = []algorithm{
	{name: "fixed_window", code: "fw", periods: 1, strategies: 1,
		shaped: func(rdb redis.Scripter, limit int, period time.Duration, _ shape, opts ...Option) (Limiter, error) {
			return NewFixedWindow(rdb, limit, period, opts...)
		}},
	{name: "sliding_window", code: "sw", hash: true, periods: 1, strategies: 1,
		shaped: func(rdb redis.Scripter, limit int, period time.Duration, s shape, opts ...Option) (Limiter, error) {
			return NewSlidingWindow(rdb, limit, period, s.precisionOr(period), opts...)
		}},
	{name: "sliding_log", code: "sl", hash: true, periods: 10, strategies: 2,
		shaped: func(rdb redis.Scripter, limit int, period time.Duration, s shape, opts ...Option) (Limiter, error) {
			return NewSlidingLog(rdb, s.precisionOr(period), []Strategy{{Limit: limit, Window: period}, {Limit: 2 * limit, Window: 10 * period}}, opts...)
		}},
	{name: "leaky_bucket", code: "lb", periods: 1, strategies: 1,
		shaped: func(rdb redis.Scripter, limit int, period time.Duration, s shape, opts ...Option) (Limiter, error) {
			return NewLeakyBucket(rdb, limit, s.rateOr(limit, period), opts...)
		}},
	{name: "token_bucket", code: "tb", periods: 1, strategies: 1,
		shaped: func(rdb redis.Scripter, limit int, period time.Duration, s shape, opts ...Option) (Limiter, error) {
			return NewTokenBucket(rdb, limit, s.rateOr(limit, period), opts...)
		}},
}

// newLimiters returns one limiter of every algorithm, in registry order,
// each granting limit per period.
func newLimiters(t testing.TB, rdb redis.Scripter, limit int, period time.Duration, opts ...Option) []Limiter {
	t.Helper()
	ls := make([]Limiter, len(algorithms))
	for i, a := range algorithms {
		l, err := a.new(rdb, limit, period, opts...)
		require.NoError(t, err, "constructing %s with limit %d per %v", a.name, limit, period)
		ls[i] = l
	}
	return ls
}

// keyPrefix returns l's Redis key prefix: WithPrefix's, or the default
// redlimit:<code>:<config>:.
func keyPrefix(l Limiter) string { return redisKey(l, "") }

// redisKey returns the Redis key that holds key's state in l, one of this
// package's limiters.
func redisKey(l Limiter, key string) string {
	return l.(interface{ redisKey(string) string }).redisKey(key)
}

// backend is a Redis server a script test runs on.
type backend struct {
	name string
	rdb  *redis.Client
	mini *miniredis.Miniredis // nil on a real server
}

// keepKeys makes a real server keep every key an hour (keepTTL), for tests
// whose fake clock runs on while the server's does not: a key must not
// expire before that clock is done with it. A miniredis expires nothing
// unless fast-forwarded.
func (b backend) keepKeys() {
	if b.mini == nil {
		keepTTL(b.rdb, time.Hour)
	}
}

// forEachBackend runs fn, as two parallel subtests, on a miniredis of its
// own and on a database of its own on the real redis-server the test binary
// shares (redistest.DB; skipped, or failed when REDLIMIT_REQUIRE_REDIS=1,
// when redis-server is not on PATH). Every script behaviour is checked on
// both. fn may write any key and fast-forward the miniredis: nothing else
// sees them.
//
// Under -short, with redis-server on PATH, fn runs on the real server
// only: miniredis's Lua (gopher-lua, a new interpreter for every script
// call) took 70% of the package's CPU under -short, and the server matrix
// runs -short once per server, each time on the same miniredis. The full
// suite runs both; without redis-server, -short runs on miniredis.
func forEachBackend(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Helper()
	if !testing.Short() || !redistest.Available() {
		t.Run("miniredis", func(t *testing.T) {
			t.Parallel()
			m := miniredis.RunT(t)
			fn(t, backend{name: "miniredis", rdb: newMiniClient(t, m), mini: m})
		})
	}
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		addr, db := redistest.DB(t)
		fn(t, backend{name: "redis", rdb: newClient(t, addr, db)})
	})
}

// slowMachine is the client timeout of the script tests' clients: go-redis's
// defaults (3s reads, 5s dials) are what a machine running other work next
// to the tests can miss, and a script test is about Results, not timeouts
// (the fault and outage tests build clients of their own).
const slowMachine = time.Minute

// newClient returns a client of database db at addr, closed when t ends.
func newClient(t testing.TB, addr string, db int) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DB: db,
		DialTimeout: slowMachine, ReadTimeout: slowMachine, WriteTimeout: slowMachine, PoolTimeout: slowMachine})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// newMiniClient returns a client of m, closed when t ends, that talks to it
// over in-memory pipes (m.Dial) rather than TCP: the same commands and
// replies, without the system calls of a socket on either side, which cost
// the miniredis tests a fifth of their CPU. It never retries a command.
func newMiniClient(t testing.TB, m *miniredis.Miniredis) *redis.Client {
	rdb := redis.NewClient(&redis.Options{
		Addr:        m.Addr(),
		Dialer:      func(context.Context, string, string) (net.Conn, error) { return m.Dial() },
		MaxRetries:  -1,
		ReadTimeout: slowMachine, WriteTimeout: slowMachine, PoolTimeout: slowMachine,
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// RecommendedOptions are ClientOptions, without the handshake commands
// (CLIENT SETINFO, maintenance notifications) that the tests' command
// recorders would see. It is exported for the outage table, in package
// redlimit_test.
func RecommendedOptions(addr string) *redis.Options {
	o := ClientOptions(addr)
	o.DisableIdentity = true
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return o
}

// recommendedClient returns a client of addr with RecommendedOptions,
// closed when t ends.
func recommendedClient(t testing.TB, addr string) *redis.Client {
	rdb := redis.NewClient(RecommendedOptions(addr))
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// patientClient returns a client of addr with RecommendedOptions but the
// client timeouts of slowMachine, closed when t ends: for a fault test
// whose failures come from the calls' own ctx deadlines (which the
// recommended options honour) or from a refused connection, and whose
// successes must come however long a loaded machine takes to answer.
func patientClient(t testing.TB, addr string) *redis.Client {
	o := RecommendedOptions(addr)
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = slowMachine, slowMachine, slowMachine, slowMachine
	rdb := redis.NewClient(o)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// deadRedis returns a client, closed when t ends, of a Redis that does not
// answer: at addr (a killed server, a listener that never replies), or, when
// addr is "", at a port of 127.0.0.1 where nothing listens. It dials once,
// retries nothing and honours ctx deadlines; readTimeout bounds reads and
// writes (0: 100ms).
func deadRedis(t testing.TB, addr string, readTimeout time.Duration) *redis.Client {
	t.Helper()
	if addr == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err, "find a free port")
		addr = ln.Addr().String()
		require.NoError(t, ln.Close())
	}
	o := RecommendedOptions(addr)
	o.DialerRetryTimeout = time.Millisecond
	o.ReadTimeout, o.WriteTimeout = 100*time.Millisecond, 100*time.Millisecond
	if readTimeout != 0 {
		o.ReadTimeout, o.WriteTimeout = readTimeout, readTimeout
	}
	rdb := redis.NewClient(o)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// epoch is a round Unix time, a multiple of every precision the tests use,
// so that bucket boundaries fall where the tables say.
var epoch = time.Unix(1_800_000_000, 0)

// fakeClock is a settable clock for WithClock. It is not safe for
// concurrent use: a test moves it between calls.
type fakeClock struct{ now time.Time }

// newClock returns a fake clock reading epoch.
func newClock() *fakeClock { return &fakeClock{now: epoch} }

// withoutGrant is r without its Grant, to compare with a Result that names
// no grant (a literal, a model's).
func withoutGrant(r Result) Result {
	r.Grant = Grant{}
	return r
}

func (c *fakeClock) Now() time.Time          { return c.now }
func (c *fakeClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

// commandRecorder is a go-redis hook (rdb.AddHook) that records every
// command a client sends, pipelined or not, and counts its dials. It is
// safe for concurrent use.
type commandRecorder struct {
	mu        sync.Mutex
	cmds      []recordedCmd
	decisions map[string]int // by Redis key, since the last take
	dials     int
	// afterReply, when set before the client is used, is called with each
	// command once its reply has arrived and before the caller gets it.
	afterReply func(c recordedCmd)
}

// recordedCmd is one command as the server answered it.
type recordedCmd struct {
	name     string // "evalsha", "eval", "script", "get", ...
	key      string // KEYS[1] of an EVAL or EVALSHA
	decision bool   // an EVAL or EVALSHA with ARGV: a decision (Reset's script has none)
	noScript bool   // the server answered NOSCRIPT
	err      error
}

// isNoScript reports whether err is a server's NOSCRIPT answer: an EVALSHA
// of a script it does not hold.
func isNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

// add records c; r.mu is held.
func (r *commandRecorder) add(c recordedCmd) {
	r.cmds = append(r.cmds, c)
	if c.decision && !c.noScript {
		if r.decisions == nil {
			r.decisions = map[string]int{}
		}
		r.decisions[c.key]++
	}
}

func record(cmd redis.Cmder, err error) recordedCmd {
	c := recordedCmd{name: cmd.Name(), noScript: isNoScript(err), err: err}
	if args := cmd.Args(); (c.name == "evalsha" || c.name == "eval") && len(args) > 3 {
		// EVALSHA sha numkeys key ARGV...
		c.key, _ = args[3].(string)
		c.decision = len(args) > 4
	}
	return c
}

func (r *commandRecorder) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		r.mu.Lock()
		r.dials++
		r.mu.Unlock()
		return next(ctx, network, addr)
	}
}

func (r *commandRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		c := record(cmd, err)
		r.mu.Lock()
		r.add(c)
		r.mu.Unlock()
		if r.afterReply != nil {
			r.afterReply(c)
		}
		return err
	}
}

func (r *commandRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		r.mu.Lock()
		for _, cmd := range cmds {
			r.add(record(cmd, cmd.Err()))
		}
		r.mu.Unlock()
		return err
	}
}

// take returns the commands recorded since the last take and forgets them.
func (r *commandRecorder) take() []recordedCmd {
	r.mu.Lock()
	defer r.mu.Unlock()
	cmds := r.cmds
	r.cmds, r.decisions = nil, nil
	return cmds
}

// names returns the names of the commands recorded since the last take and
// forgets them.
func (r *commandRecorder) names() []string {
	var names []string
	for _, c := range r.take() {
		names = append(names, c.name)
	}
	return names
}

// decided returns how many decisions on the Redis key redisKey the server
// made: EVALSHA and EVAL with ARGV, not counting NOSCRIPT answers (the EVAL
// that follows one makes the decision), since the last take.
func (r *commandRecorder) decided(redisKey string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.decisions[redisKey]
}

// scripts returns how many EVAL and EVALSHA commands were sent since the
// last take, NOSCRIPT answers included.
func (r *commandRecorder) scripts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.cmds {
		if c.name == "eval" || c.name == "evalsha" {
			n++
		}
	}
	return n
}

// dialed returns how many connections the client has opened.
func (r *commandRecorder) dialed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dials
}

// ttlKeeper is a go-redis hook for traces on a fake clock against a real
// server, which expires keys in real time: the TTLs the scripts set are in
// fake time, often milliseconds. It sends every algorithm's script as a
// variant whose every TTL (PEXPIRE, SET … PX) is ttl instead: EVALSHA of
// the variant's SHA, EVAL of its source, alone or pipelined. The key's TTL
// is then set by the same script call that wrote the key. A PEXPIRE sent
// after the script, even in the same MULTI/EXEC, is not enough: Redis 7.0
// does not stop its clock within EXEC, and a server stalled a millisecond
// between the two (a loaded machine) expired a key whose fake-time TTL was
// that short before the PEXPIRE reached it (TestSlidingRefundSharedTwins,
// once in 40 loaded runs). Expiry is tested apart; a key always keeps a
// TTL, as one without is foreign.
type ttlKeeper struct {
	bySHA    map[string]string // a script's SHA: its variant's
	bySource map[string]string // a script's source: its variant's
}

// newTTLKeeper returns a ttlKeeper of ttl for every algorithm's script.
func newTTLKeeper(ttl time.Duration) ttlKeeper {
	k := ttlKeeper{bySHA: map[string]string{}, bySource: map[string]string{}}
	// One line, so that the script's own line numbers move by one: a
	// local redis whose call puts ttl in every TTL, and forwards the rest.
	prefix := fmt.Sprintf("local redis = setmetatable({call = function(...) local a = {...} local c = string.upper(a[1]) "+
		"if c == 'PEXPIRE' then a[3] = %[1]d elseif c == 'SET' then for i = 4, #a - 1 do "+
		"if string.upper(a[i]) == 'PX' then a[i + 1] = %[1]d end end end "+
		"return redis.call(unpack(a)) end}, {__index = redis})\n", ttl.Milliseconds())
	for _, sc := range []script{tokenBucketScript, leakyBucketScript, fixedWindowScript, calendarScript, slidingScript, concurrencyScript} {
		variant := prefix + sc.source
		k.bySHA[sc.Hash()] = redis.NewScript(variant).Hash()
		k.bySource[sc.source] = variant
	}
	return k
}

// swap makes cmd, if it runs one of the scripts, run its variant.
func (k ttlKeeper) swap(cmd redis.Cmder) {
	args := cmd.Args() // the command's own slice
	if len(args) < 2 {
		return
	}
	body, _ := args[1].(string)
	switch cmd.Name() {
	case "evalsha":
		if v, ok := k.bySHA[body]; ok {
			args[1] = v
		}
	case "eval":
		if v, ok := k.bySource[body]; ok {
			args[1] = v
		}
	}
}

// beforeDecision is a go-redis hook that calls do as each decision (a
// script call with arguments) is sent: a caller who cancels mid-call, a
// request slow to reach Redis.
type beforeDecision struct{ do func() }

func (h beforeDecision) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h beforeDecision) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if record(cmd, nil).decision {
			h.do()
		}
		return next(ctx, cmd)
	}
}

func (h beforeDecision) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// keepTTL adds a ttlKeeper of ttl to rdb, unless it has one.
func keepTTL(rdb *redis.Client, ttl time.Duration) {
	if _, had := ttlKept.LoadOrStore(rdb, true); !had {
		rdb.AddHook(newTTLKeeper(ttl))
	}
}

// ttlKept holds the clients keepTTL has hooked.
var ttlKept sync.Map

func (k ttlKeeper) DialHook(next redis.DialHook) redis.DialHook { return next }

func (k ttlKeeper) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		k.swap(cmd)
		return next(ctx, cmd)
	}
}

func (k ttlKeeper) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			k.swap(cmd)
		}
		return next(ctx, cmds)
	}
}
