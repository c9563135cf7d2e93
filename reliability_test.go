package redlimit

// Outages under load: real redis-server processes started, killed,
// restarted, promoted, starved of memory, partitioned and slowed by the
// tests, each under concurrent load from several clients. README "Failure
// behaviour" says what a caller sees in each case; its numbers come from the
// t.Logf lines of these tests (go test -v -run TestReliability). Faults of
// one call (a dead or hung Redis, a flushed script cache, foreign values) are
// in faults_test.go.
//
// Every test checks the same promise at the end: no call reports a decision
// that did not happen. For every key, the permits reported allowed are at
// most what the surviving state in Redis has counted, and no two allowed
// calls saw the same state (their Remaining values are distinct).
//
// But for TestReliabilityMaxmemory, none calls t.Parallel: they measure
// time, and they change go-redis's logger.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/faultproxy"
	"github.com/redlimit/redlimit/internal/redistest"
)

const (
	// relDeadline is the ctx deadline of every call under load.
	relDeadline = 300 * time.Millisecond
	// relSlack is how late past its deadline a call may return before it
	// counts as a hang, and long: a loaded machine held a decided call
	// 1.2s past its deadline, failing the 1s once allowed here. Calls
	// that wait for the client's timeouts instead of their deadline are
	// caught by TestBreakerOnStoppedRedis.
	relSlack = 10 * time.Second
	// relCooldown is the breaker cooldown of the limiters under load. The
	// default (1s) would only add to every wait for
	// recovery; the breaker's own timing is tested on a fake clock.
	relCooldown = 100 * time.Millisecond
	// relRecovery is how soon after Redis is back calls must succeed again.
	// go-redis stops dialing after PoolSize failed dials in a row and then
	// probes once a second, so a client may take that second, plus a dial
	// (relDialSlack), to notice; then the breaker's probe. With the default
	// cooldown that is operations.md's "within 2s".
	relRecovery  = time.Second + relCooldown
	relDialSlack = 250 * time.Millisecond
)

// relLimiters returns one limiter per algorithm on rdb, in registry order,
// each granting exactly limit permits per key for as long as a test runs
// (nothing refills within forever while limit is at most relUnreached),
// and each, as by default, with a breaker of its own (but cooling down for
// relCooldown), or none on a cluster client.
func relLimiters(t *testing.T, rdb redis.Scripter, limit int) []Limiter {
	t.Helper()
	ls := make([]Limiter, len(algorithms))
	for i, a := range algorithms {
		var opts []Option
		if _, cluster := rdb.(*redis.ClusterClient); !cluster {
			b, err := NewBreaker(BreakerConfig{Cooldown: relCooldown})
			require.NoError(t, err)
			opts = append(opts, WithBreaker(b))
		}
		l, err := a.new(rdb, limit, forever, opts...)
		require.NoError(t, err, "constructing %s", a.name)
		ls[i] = l
	}
	return ls
}

// relUnreached is a limit no test reaches in its few seconds of load: any
// denial would be a guess. Within forever it regains one permit every few
// minutes.
const relUnreached = 10_000

// relCall is one AllowN(ctx, key, 1) made under load.
type relCall struct {
	client, alg int
	key         string
	start, end  time.Time
	res         Result
	err         error
}

func (c relCall) latency() time.Duration { return c.end.Sub(c.start) }

// relLoad is the load of a fault test: goroutines calling Allow on the
// limiters of several clients until stopped.
type relLoad struct {
	stop   atomic.Bool
	wg     sync.WaitGroup
	mu     sync.Mutex
	calls  []relCall
	panics []string
}

// relRun starts perClient goroutines for every client's limiters (sets[c][alg]).
// Each loops: pick an algorithm and key, Allow with a relDeadline ctx, record.
func relRun(sets [][]Limiter, perClient int, pick func(r *rand.Rand) (alg int, key string)) *relLoad {
	l := &relLoad{}
	for c, set := range sets {
		for g := range perClient {
			l.wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(c), uint64(g)))
				var mine []relCall
				defer func() {
					if p := recover(); p != nil {
						mine = append(mine, relCall{client: c, err: fmt.Errorf("panic: %v", p)})
						l.mu.Lock()
						l.panics = append(l.panics, fmt.Sprint(p))
						l.mu.Unlock()
					}
					l.mu.Lock()
					l.calls = append(l.calls, mine...)
					l.mu.Unlock()
				}()
				for !l.stop.Load() {
					alg, key := pick(r)
					ctx, cancel := context.WithTimeout(context.Background(), relDeadline)
					start := time.Now()
					res, err := set[alg].Allow(ctx, key)
					end := time.Now()
					cancel()
					mine = append(mine, relCall{client: c, alg: alg, key: key, start: start, end: end, res: res, err: err})
					if err != nil {
						// A service's callers are not infinitely many: without
						// a pause a dead server turns the load into a spin.
						time.Sleep(time.Millisecond) // pacing, in real time; nothing counts on it
					}
				}
			})
		}
	}
	return l
}

// finish stops the load and returns every call, by start time. A goroutine
// that does not return within a few deadlines is a hang.
func (l *relLoad) finish(t *testing.T) []relCall {
	t.Helper()
	l.stop.Store(true)
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(relDeadline + relSlack):
		buf := make([]byte, 1<<20)
		t.Fatalf("load goroutines still running %v after stop: a call hangs\n%s", relDeadline+relSlack, buf[:runtime.Stack(buf, true)])
	}
	require.Empty(t, l.panics, "a call panicked")
	slices.SortFunc(l.calls, func(a, b relCall) int { return a.start.Compare(b.start) })
	return l.calls
}

// relRequireBounded checks that every call returned within its deadline and
// that no failed call looks like a denial.
func relRequireBounded(t *testing.T, calls []relCall) {
	t.Helper()
	var slowest time.Duration
	for _, c := range calls {
		slowest = max(slowest, c.latency())
		require.LessOrEqual(t, c.latency(), relDeadline+relSlack,
			"call on %s: took %v, past its %v deadline: err %v", c.key, c.latency(), relDeadline, c.err)
		if c.err != nil {
			require.NotErrorIs(t, c.err, ErrAcquireFailed, "call on %s: a failure to decide must not look like a denial", c.key)
			require.Zero(t, c.res, "call on %s: a failed call must return no Result", c.key)
		}
	}
	t.Logf("%d calls, slowest %v (deadline %v)", len(calls), slowest, relDeadline)
}

// relTooSlow reports the error of a call that missed its own deadline
// while Redis was up: the machine (two cores shared with other work) was
// too busy to finish the round trip in relDeadline, which says nothing of
// the recovery under test. A refused connection is never that.
func relTooSlow(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, syscall.ECONNREFUSED)
}

// relKey names one key of one algorithm.
type relKey struct {
	alg int
	key string
}

// relRequireNoPhantoms checks, for every key: the allowed calls saw distinct
// states (distinct Remaining), granted at most limit, and, when used is
// given (permits the surviving state in Redis has counted, by key), at most
// used. It returns the permits granted and the permits counted but never
// reported (replies lost in flight).
func relRequireNoPhantoms(t *testing.T, calls []relCall, limit int, used map[relKey]int) (granted, unreported int) {
	t.Helper()
	allowed := map[relKey][]int{}
	for _, c := range calls {
		if c.err == nil && c.res.Allowed {
			k := relKey{c.alg, c.key}
			allowed[k] = append(allowed[k], c.res.Remaining)
		}
	}
	for k, remaining := range allowed {
		name := algorithms[k.alg].name
		slices.Sort(remaining)
		for i := 1; i < len(remaining); i++ {
			require.NotEqual(t, remaining[i-1], remaining[i],
				"%s key %q: two allowed calls report Remaining %d: one of them did not happen as reported", name, k.key, remaining[i])
		}
		require.LessOrEqual(t, len(remaining), limit, "%s key %q: more permits granted than the limit", name, k.key)
		granted += len(remaining)
		if used != nil {
			u, ok := used[k]
			require.True(t, ok, "%s key %q: state not read", name, k.key)
			require.LessOrEqual(t, len(remaining), u,
				"%s key %q: %d calls reported allowed but Redis counted only %d permits: a reported grant never happened", name, k.key, len(remaining), u)
		}
	}
	for k, u := range used {
		unreported += u - len(allowed[k])
	}
	return granted, unreported
}

// relUsed reads, with n == 0, how many permits each key's state in Redis has
// counted (limit - Remaining), through limiters (one per algorithm).
func relUsed(t *testing.T, limiters []Limiter, limit int, keys []relKey) map[relKey]int {
	t.Helper()
	used := make(map[relKey]int, len(keys))
	for _, k := range keys {
		r, err := limiters[k.alg].AllowN(context.Background(), k.key, 0)
		// Right after a fault the breaker cools down and go-redis re-dials,
		// in real time, and a loaded machine may miss the client's 500ms
		// read timeout: a read of the state is retried; the minute only
		// stops a test whose Redis never comes back.
		for deadline := time.Now().Add(time.Minute); relRetryable(err) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			r, err = limiters[k.alg].AllowN(context.Background(), k.key, 0)
		}
		require.NoError(t, err, "reading the state of %q", k.key)
		used[k] = limit - r.Remaining
	}
	return used
}

// relRetryable reports the error of a read of the state worth another
// try: the breaker still open, or a timeout.
func relRetryable(err error) bool {
	var netErr net.Error
	return errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &netErr) && netErr.Timeout())
}

// relKeysOf returns the distinct keys the calls used, where match says so.
func relKeysOf(calls []relCall, match func(relCall) bool) []relKey {
	seen := map[relKey]bool{}
	var keys []relKey
	for _, c := range calls {
		k := relKey{c.alg, c.key}
		if c.key != "" && !seen[k] && match(c) {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	return keys
}

// relErrorKinds summarises errors for the log: messages with addresses and
// numbers blanked, by count.
func relErrorKinds(calls []relCall) string {
	numbers := regexp.MustCompile(`[0-9]+(\.[0-9]+)*(:[0-9]+)?`)
	kinds := map[string]int{}
	for _, c := range calls {
		if c.err != nil {
			kinds[numbers.ReplaceAllString(c.err.Error(), "N")]++
		}
	}
	var lines []string
	for k, n := range kinds {
		lines = append(lines, fmt.Sprintf("%6d × %s", n, k))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// relRequireNoLeak waits for the number of goroutines to fall to at most
// before, and fails with every stack if it does not within a minute: a
// leak never ends, and a loaded machine may take seconds to run the
// goroutines out. It polls: nothing signals a goroutine's end.
func relRequireNoLeak(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		now := runtime.NumGoroutine()
		if now <= before {
			t.Logf("goroutines: %d before, %d after", before, now)
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutine leak: %d before, %d after a minute\n%s", before, now, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// relLogger counts go-redis's log lines instead of printing them: a dead
// server makes it log every failed dial.
type relLogger struct{ lines atomic.Int64 }

func (l *relLogger) Printf(context.Context, string, ...any) { l.lines.Add(1) }

// relStderrLogger is go-redis's default logger, put back after a test.
type relStderrLogger struct{ log *log.Logger }

func (l relStderrLogger) Printf(_ context.Context, format string, v ...any) {
	_ = l.log.Output(2, fmt.Sprintf(format, v...))
}

func relQuietRedisLog(t *testing.T) *relLogger {
	l := &relLogger{}
	redis.SetLogger(l)
	t.Cleanup(func() {
		redis.SetLogger(relStderrLogger{log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)})
	})
	return l
}

// relInfo returns the fields of an INFO section.
func relInfo(t *testing.T, rdb *redis.Client, section string) map[string]string {
	t.Helper()
	raw, err := rdb.Info(context.Background(), section).Result()
	require.NoError(t, err, "INFO %s", section)
	fields := map[string]string{}
	for line := range strings.Lines(raw) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	return fields
}

// relInfoInt returns one integer field of an INFO section.
func relInfoInt(t *testing.T, rdb *redis.Client, section, field string) int64 {
	t.Helper()
	v, ok := relInfo(t, rdb, section)[field]
	require.True(t, ok, "INFO %s has no %s", section, field)
	n, err := strconv.ParseInt(v, 10, 64)
	require.NoError(t, err, "INFO %s %s=%q", section, field, v)
	return n
}

// relCommandCalls returns the calls of a command from INFO commandstats,
// failed ones (NOSCRIPT) included.
func relCommandCalls(t *testing.T, rdb *redis.Client, command string) int64 {
	t.Helper()
	v := relInfo(t, rdb, "commandstats")["cmdstat_"+command]
	for field := range strings.SplitSeq(v, ",") {
		if n, ok := strings.CutPrefix(field, "calls="); ok {
			calls, err := strconv.ParseInt(n, 10, 64)
			require.NoError(t, err, "cmdstat_%s %q", command, v)
			return calls
		}
	}
	return 0
}

// relClients returns n clients on addr with RecommendedOptions (the ctx
// deadline of each call, relDeadline, comes before their timeouts), with
// opts applied, closed at cleanup.
func relClients(t *testing.T, n int, addr string, opts func(*redis.Options)) []*redis.Client {
	t.Helper()
	var rdbs []*redis.Client
	for range n {
		o := RecommendedOptions(addr)
		if opts != nil {
			opts(o)
		}
		rdb := redis.NewClient(o)
		t.Cleanup(func() { rdb.Close() })
		rdbs = append(rdbs, rdb)
	}
	return rdbs
}

func relSkipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("fault test: starts, breaks and stops redis-server processes")
	}
}

// TestReliabilityRedisRestart kills redis-server under load from three clients
// and restarts it on the same port. During the outage every call fails
// within its deadline; within relRecovery of the restart calls succeed
// again; no goroutine is left behind; and no reported grant is missing from
// the state. The state of the killed server (no persistence) is lost: keys
// start afresh.
func TestReliabilityRedisRestart(t *testing.T) {
	relSkipShort(t)
	relQuietRedisLog(t)
	srv := redistest.Start(t)
	before := runtime.NumGoroutine()

	const clients, perClient, keys, limit = 3, 4, 20, 50
	rdbs := relClients(t, clients, srv.Addr(), nil)
	var sets [][]Limiter
	for _, rdb := range rdbs {
		sets = append(sets, relLimiters(t, rdb, limit))
	}
	// Keys carry the phase they were picked in: 0 before the kill, 1 during
	// the outage, 2 after the restart.
	var phase atomic.Int32
	load := relRun(sets, perClient, func(r *rand.Rand) (int, string) {
		return r.IntN(len(sets[0])), fmt.Sprintf("restart:%d:%d", phase.Load(), r.IntN(keys))
	})

	// The phases below are real time, as the outage is: a loaded machine
	// makes fewer calls in each, and the checks go by when each call
	// started and ended, never by how many there were.
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, srv.Kill(), "killing redis-server")
	killed := time.Now()
	phase.Store(1)
	time.Sleep(700 * time.Millisecond) // the outage, in real time
	restarting := time.Now()
	srv.Restart(t)
	restarted := time.Now()
	phase.Store(2)
	time.Sleep(relRecovery + 500*time.Millisecond) // real time: go-redis's re-dial and the breaker's cooldown
	calls := load.finish(t)

	relRequireBounded(t, calls)
	var outage, outageOK int
	firstOK := make([]time.Duration, clients)
	for i := range firstOK {
		firstOK[i] = -1
	}
	for _, c := range calls {
		switch {
		case !c.start.Before(killed) && c.end.Before(restarting):
			outage++
			if c.err == nil {
				outageOK++
			}
		case !c.start.Before(restarted) && c.err == nil && firstOK[c.client] < 0:
			firstOK[c.client] = c.end.Sub(restarted)
		}
		if c.start.After(restarted.Add(relRecovery+relDialSlack)) && !relTooSlow(c.err) {
			require.NoError(t, c.err, "client %d, %v after the restart: calls must succeed again within %v", c.client, c.start.Sub(restarted), relRecovery)
		}
	}
	t.Logf("outage %v: %d calls, errors:\n%s", restarting.Sub(killed), outage, relErrorKinds(calls))
	require.Positive(t, outage, "the load must have run during the outage")
	require.Zero(t, outageOK, "no call can be decided while redis-server is down")
	for c, d := range firstOK {
		require.GreaterOrEqual(t, d, time.Duration(0), "client %d never succeeded after the restart", c)
		require.LessOrEqual(t, d, relRecovery+relDialSlack, "client %d: first success %v after the restart", c, d)
	}
	t.Logf("first success after the restart (Restart took %v), by client: %v", restarted.Sub(restarting), firstOK)

	// Keys of the phase before the kill died with the server; the others
	// must have counted at least every grant reported.
	relRequireNoPhantoms(t, calls, limit, nil)
	var afterKill []relCall
	for _, c := range calls {
		if c.key != "" && !strings.HasPrefix(c.key, "restart:0:") {
			afterKill = append(afterKill, c)
		}
	}
	survivors := relKeysOf(afterKill, func(relCall) bool { return true })
	granted, unreported := relRequireNoPhantoms(t, afterKill, limit, relUsed(t, sets[0], limit, survivors))
	t.Logf("after the restart: %d permits granted, %d counted in Redis but not reported (replies lost)", granted, unreported)

	for _, rdb := range rdbs {
		require.NoError(t, rdb.Close())
	}
	relRequireNoLeak(t, before)
}

// TestReliabilityScriptFlush flushes the script cache while three clients
// hammer all five limiters: no call fails, each goroutine pays at most one
// EVAL per script, and then everything is back on EVALSHA. Done serially,
// each limiter pays exactly one EVAL.
func TestReliabilityScriptFlush(t *testing.T) {
	relSkipShort(t)
	srv := redistest.Start(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()

	const clients, perClient, keys, limit = 3, 4, 50, relUnreached
	var sets [][]Limiter
	for _, rdb := range relClients(t, clients, srv.Addr(), nil) {
		sets = append(sets, relLimiters(t, rdb, limit))
	}
	load := relRun(sets, perClient, func(r *rand.Rand) (int, string) {
		return r.IntN(len(sets[0])), fmt.Sprintf("flush:%d", r.IntN(keys))
	})
	time.Sleep(200 * time.Millisecond) // load in real time: every script loaded, or EVAL below counts a first load
	evals, evalshas := relCommandCalls(t, admin, "eval"), relCommandCalls(t, admin, "evalsha")
	require.NoError(t, admin.ScriptFlush(ctx).Err())
	time.Sleep(300 * time.Millisecond) // the load meets the flushed cache, in real time
	calls := load.finish(t)

	relRequireBounded(t, calls)
	tooSlow := 0
	for _, c := range calls {
		if relTooSlow(c.err) {
			tooSlow++ // a loaded machine, not the flush: NOSCRIPT is no timeout
			continue
		}
		require.NoError(t, c.err, "call on %q at %v: SCRIPT FLUSH must be invisible to callers", c.key, c.start)
	}
	require.Less(t, tooSlow, len(calls), "some calls must have been decided")
	paid := relCommandCalls(t, admin, "eval") - evals
	t.Logf("SCRIPT FLUSH under load: %d calls (%d past their deadline), %d EVALSHA, %d EVAL (%d limiters, %d goroutines)",
		len(calls), tooSlow, relCommandCalls(t, admin, "evalsha")-evalshas, paid, len(sets[0]), clients*perClient)
	require.GreaterOrEqual(t, paid, int64(len(sets[0])), "each of the %d scripts must be sent again with EVAL", len(sets[0]))
	require.LessOrEqual(t, paid, int64(clients*perClient*len(sets[0])), "at most one EVAL per goroutine and script: each is back on EVALSHA after its own EVAL")

	evals = relCommandCalls(t, admin, "eval")
	for _, set := range sets {
		for alg, l := range set {
			_, err := l.Allow(ctx, "flush:after")
			for deadline := time.Now().Add(time.Minute); relRetryable(err) && time.Now().Before(deadline); {
				time.Sleep(50 * time.Millisecond) // a breaker a loaded machine opened cools down in real time
				_, err = l.Allow(ctx, "flush:after")
			}
			require.NoError(t, err, "%s after the flush", algorithms[alg].name)
		}
	}
	require.Equal(t, evals, relCommandCalls(t, admin, "eval"), "after the flush every limiter must be back on EVALSHA")

	for alg, l := range sets[0] {
		name := algorithms[alg].name
		require.NoError(t, admin.ScriptFlush(ctx).Err())
		evals, evalshas := relCommandCalls(t, admin, "eval"), relCommandCalls(t, admin, "evalsha")
		_, err := l.Allow(ctx, "flush:serial")
		require.NoError(t, err, "%s: first call after SCRIPT FLUSH", name)
		require.Equal(t, evals+1, relCommandCalls(t, admin, "eval"), "%s: one EVAL after NOSCRIPT", name)
		require.Equal(t, evalshas+1, relCommandCalls(t, admin, "evalsha"), "%s: one EVALSHA, answered NOSCRIPT", name)
		_, err = l.Allow(ctx, "flush:serial")
		require.NoError(t, err, "%s: second call after SCRIPT FLUSH", name)
		require.Equal(t, evals+1, relCommandCalls(t, admin, "eval"), "%s: the second call must not EVAL", name)
		require.Equal(t, evalshas+2, relCommandCalls(t, admin, "evalsha"), "%s: the second call is one EVALSHA", name)
	}
}

// relSwitchableDialer dials whatever address target holds at the time: a
// stand-in for a DNS name or virtual IP moved by a failover.
func relSwitchableDialer(target *atomic.Pointer[string]) func(ctx context.Context, network, _ string) (net.Conn, error) {
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, *target.Load())
	}
}

// relWaitReplicaSynced waits until the primary streams writes to the
// replica. After a diskless full sync, Redis 7.0 lists the replica online
// but starts the stream only on the replica's first ACK, up to a second
// later; writes until then are held back. So once the link is up, a probe
// is written and waited for: it must come through the stream, as a probe
// written before the sync would come in the sync's snapshot.
func relWaitReplicaSynced(t *testing.T, primary, replica *redis.Client) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute) // only a replica that never syncs
	for probe := 0; ; probe++ {
		info := relInfo(t, replica, "replication")
		if info["master_link_status"] == "up" {
			value := strconv.Itoa(probe)
			require.NoError(t, primary.Set(ctx, "replication-probe", value, 0).Err())
			// Polls the real replica, for at most 100ms a probe.
			for wait := time.Now().Add(100 * time.Millisecond); time.Now().Before(wait); time.Sleep(5 * time.Millisecond) {
				if replica.Get(ctx, "replication-probe").Val() == value {
					require.NoError(t, primary.Del(ctx, "replication-probe").Err())
					return
				}
			}
		}
		require.True(t, time.Now().Before(deadline), "replica not streaming after a minute: %v", info)
		time.Sleep(20 * time.Millisecond) // polling a real replication link: nothing signals it
	}
}

// TestReliabilityReplicaPromotion kills the primary under load and promotes its
// replica (REPLICAOF NO ONE); clients follow through a dialer that switches
// address, as they would through a moved DNS name. The limiters work on the
// new primary at once, and the test measures what the failover forgot:
// grants the old primary reported but never replicated. Each forgotten
// permit can be granted a second time: that is the over-admission.
func TestReliabilityReplicaPromotion(t *testing.T) {
	relSkipShort(t)
	relQuietRedisLog(t)
	// No 5s wait before the replica's first full sync.
	primary := redistest.Start(t, "--repl-diskless-sync-delay", "0")
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	primaryAdmin := redis.NewClient(&redis.Options{Addr: primary.Addr()})
	replicaAdmin := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	t.Cleanup(func() { primaryAdmin.Close(); replicaAdmin.Close() })
	relWaitReplicaSynced(t, primaryAdmin, replicaAdmin)

	// Limits are never reached: every call writes, so the writes in flight
	// at the crash are as many as the load can make.
	const clients, perClient, keys, limit = 3, 4, 20, relUnreached
	var target atomic.Pointer[string]
	primaryAddr, replicaAddr := primary.Addr(), replica.Addr()
	target.Store(&primaryAddr)
	var sets [][]Limiter
	for _, rdb := range relClients(t, clients, primaryAddr, func(o *redis.Options) { o.Dialer = relSwitchableDialer(&target) }) {
		sets = append(sets, relLimiters(t, rdb, limit))
	}
	var promotedAt atomic.Pointer[time.Time]
	load := relRun(sets, perClient, func(r *rand.Rand) (int, string) {
		return r.IntN(len(sets[0])), fmt.Sprintf("failover:%d", r.IntN(keys))
	})
	time.Sleep(400 * time.Millisecond) // real time, as the outage is: writes in flight at the kill
	require.NoError(t, primary.Kill(), "killing the primary")
	killed := time.Now()
	require.NoError(t, replicaAdmin.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err(), "promoting the replica")

	// What the new primary knows, before any client reaches it.
	checker := relLimiters(t, replicaAdmin, limit)
	var all []relKey
	for alg := range sets[0] {
		for k := range keys {
			all = append(all, relKey{alg, fmt.Sprintf("failover:%d", k)})
		}
	}
	atPromotion := relUsed(t, checker, limit, all)
	promoted := time.Now()
	promotedAt.Store(&promoted)
	target.Store(&replicaAddr)
	time.Sleep(relRecovery + relDialSlack + 300*time.Millisecond) // real time: go-redis's re-dial
	calls := load.finish(t)
	relRequireBounded(t, calls)

	final := relUsed(t, checker, limit, all)
	grantedBefore := map[relKey]int{}
	grantedAfter := map[relKey]int{}
	var firstOK time.Duration = -1
	var lastBeforeKill time.Time
	for _, c := range calls {
		k := relKey{c.alg, c.key}
		if !c.start.Before(promoted.Add(relRecovery+relDialSlack)) && !relTooSlow(c.err) {
			require.NoError(t, c.err, "%v after the promotion, calls must succeed", c.start.Sub(promoted))
		}
		if c.err != nil || !c.res.Allowed {
			continue
		}
		switch {
		case c.start.Before(killed):
			grantedBefore[k]++
			if c.end.After(lastBeforeKill) {
				lastBeforeKill = c.end
			}
		case c.end.Before(promoted):
			t.Fatalf("call on %q started %v after the kill and was decided %v before the promotion, with no server to reach", c.key, c.start.Sub(killed), promoted.Sub(c.end))
		default:
			// Started after the kill: only the new primary can have decided
			// it, once the clients could reach it. A call that waited for a
			// connection may have started before the promotion.
			grantedAfter[k]++
			if d := c.end.Sub(promoted); firstOK < 0 || d < firstOK {
				firstOK = d
			}
		}
	}
	require.GreaterOrEqual(t, firstOK, time.Duration(0), "no call succeeded on the new primary")
	forgotten, forgottenKeys, unreported, total := 0, 0, 0, 0
	for _, k := range all {
		lost := grantedBefore[k] - atPromotion[k]
		if lost > 0 {
			forgotten += lost
			forgottenKeys++
		} else {
			unreported -= lost
		}
		total += grantedBefore[k]
		// On the new primary nothing may be lost: every grant reported there is counted.
		require.LessOrEqual(t, grantedAfter[k], final[k]-atPromotion[k],
			"%s key %q: %d grants reported by the new primary, %d counted", algorithms[k.alg].name, k.key, grantedAfter[k], final[k]-atPromotion[k])
	}
	t.Logf("failover: %d grants reported by the old primary; %d of them (on %d of %d keys) missing on the new primary (not yet replicated: over-admission); %d counted but never reported; first grant on the new primary %v after promotion",
		total, forgotten, forgottenKeys, len(all), unreported, firstOK)
	// On a loopback link replication lags by well under the time of a few
	// hundred calls; anything near a whole load would mean the replica did
	// not follow at all.
	require.Less(t, forgotten, total/10+1, "the replica must have received nearly everything before the crash")

	// A fresh key on the new primary is limited exactly.
	l := checker[0]
	for i := range 5 {
		r, err := l.Allow(context.Background(), "failover:fresh")
		require.NoError(t, err)
		require.True(t, r.Allowed, "call %d on a fresh key", i)
	}
	small, err := NewFixedWindow(replicaAdmin, 5, time.Hour)
	require.NoError(t, err)
	for i := range 5 {
		r, err := small.Allow(context.Background(), "failover:small")
		require.NoError(t, err)
		require.True(t, r.Allowed, "call %d of 5 on the new primary", i)
	}
	r, err := small.Allow(context.Background(), "failover:small")
	require.NoError(t, err)
	require.False(t, r.Allowed, "the sixth call of a limit of 5 on the new primary")
}

// TestReliabilityMaxmemory fills a memory-capped Redis with other data
// while limiter keys hold denials, under each eviction policy, and counts
// the limiter keys that lost their state (each one lets a whole limit
// through again). Hot keys are hit all along; idle ones were filled and
// then left alone, as a user who was denied and went away.
//
// Unlike the other tests here it measures no time and keeps go-redis's
// logger, so it runs in parallel.
func TestReliabilityMaxmemory(t *testing.T) {
	t.Parallel()
	relSkipShort(t)
	for _, policy := range []string{"allkeys-lru", "volatile-lru", "noeviction"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			relEviction(t, policy)
		})
	}
}

func relEviction(t *testing.T, policy string) {
	const (
		maxmemory = 4 << 20
		hot       = 100  // keys asked again all along
		idle      = 1000 // keys left alone once denied
		limit     = 5
		value     = 1 << 10
	)
	classes := map[string]int{"hot": hot, "idle": idle}
	srv := redistest.Start(t, "--maxmemory", strconv.Itoa(maxmemory), "--maxmemory-policy", policy)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	l, err := NewFixedWindow(rdb, limit, time.Hour)
	require.NoError(t, err)

	for class, keys := range classes {
		for i := range keys {
			r, err := l.AllowN(ctx, fmt.Sprintf("%s:%d", class, i), limit)
			require.NoError(t, err)
			require.True(t, r.Allowed)
		}
	}
	// Other data, four times maxmemory, with no TTL (an app's own keys):
	// after every 100 writes, 100 hot keys are asked again and denied.
	filler := strings.Repeat("x", value)
	var fillErrs, hotErrs, hotTouched int
	var fillErr, hotErr error
	for i := 0; i < 4*maxmemory/value; i += 100 {
		pipe := rdb.Pipeline()
		for j := i; j < i+100; j++ {
			pipe.Set(ctx, fmt.Sprintf("app:%d", j), filler, 0)
		}
		cmds, _ := pipe.Exec(ctx)
		for _, c := range cmds {
			if c.Err() != nil {
				fillErrs++
				fillErr = c.Err()
			}
		}
		for j := range 100 {
			hotTouched++
			r, err := l.Allow(ctx, fmt.Sprintf("hot:%d", (i+j)%hot))
			if err != nil {
				hotErrs++
				hotErr = err
				require.NotErrorIs(t, err, ErrAcquireFailed)
				continue
			}
			_ = r // evicted or not is counted below
		}
	}
	// Each limiter key still there holds its denial; each evicted one grants
	// the whole limit again.
	if policy == "noeviction" {
		// Memory use hovers at the limit once writes fail; make sure the
		// next calls find it full, as a service would most of the time.
		used := relInfoInt(t, rdb, "memory", "used_memory")
		require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used/2, 10)).Err())
	}
	evicted := map[string]int{}
	for class, keys := range classes {
		for i := range keys {
			r, err := l.AllowN(ctx, fmt.Sprintf("%s:%d", class, i), 0)
			require.NoError(t, err, "reading state under %s", policy)
			if r.Remaining == limit {
				evicted[class]++
			}
		}
	}
	fresh, freshErr := l.Allow(ctx, "fresh")
	denied, deniedErr := l.Allow(ctx, "hot:0")
	stats := relInfo(t, rdb, "stats")
	t.Logf("%s: maxmemory %d MiB, %d app writes of %d B (%d failed: %v); evicted keys %s; limiter keys lost: hot %d/%d, idle %d/%d (each lets %d permits through again); hot calls failed %d/%d (%v); a new key: %+v, %v; a hot key: %+v, %v",
		policy, maxmemory>>20, 4*maxmemory/value, value, fillErrs, fillErr, stats["evicted_keys"],
		evicted["hot"], hot, evicted["idle"], idle, limit, hotErrs, hotTouched, hotErr, fresh, freshErr, denied, deniedErr)

	switch policy {
	case "allkeys-lru":
		// The app's data, older than the hot keys, goes first; idle limiter
		// keys go with it, as any idle key would.
		require.Zero(t, fillErrs, "allkeys-lru always makes room")
		require.Less(t, evicted["hot"], hot/10, "LRU must spare the keys in use")
		require.Positive(t, evicted["idle"], "idle limiter keys are evicted like any idle key")
		require.NoError(t, freshErr)
	case "volatile-lru":
		// Only keys with a TTL may go: the limiter's, hot or not, while the
		// app's keys stay; then writes fail.
		require.Equal(t, idle, evicted["idle"], "volatile-lru evicts limiter keys, as they are the only ones with a TTL")
		require.Greater(t, evicted["hot"], hot/2, "volatile-lru evicts even the limiter keys in use")
		require.Positive(t, fillErrs, "once no key with a TTL is left, writes fail")
	case "noeviction":
		// Nothing is lost: writes fail instead, the limiter's grants too.
		require.Zero(t, evicted["hot"]+evicted["idle"], "noeviction never drops limiter state")
		require.Positive(t, fillErrs, "writes fail once maxmemory is reached")
		require.Error(t, freshErr, "a grant needs a write, and writes fail")
		require.NotErrorIs(t, freshErr, ErrAcquireFailed, "an OOM error is not a denial")
		require.ErrorContains(t, freshErr, "OOM")
		require.Zero(t, hotErrs, "a denial writes nothing and still works")
		require.NoError(t, deniedErr, "a denial writes nothing and still works")
		require.False(t, denied.Allowed, "the hot key is still denied")
	}
}

// relStartCluster starts a 3-master cluster of dedicated servers (stopped
// at cleanup) that keeps serving the slots it still has when a master dies.
func relStartCluster(t *testing.T) []*redistest.Server {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		if os.Getenv("REDLIMIT_REQUIRE_REDIS") == "1" {
			t.Fatalf("redis-cli not on PATH: %v", err)
		}
		t.Skipf("redis-cli not on PATH: %v", err)
	}
	var nodes []*redistest.Server
	var addrs []string
	for range 3 {
		// A node timeout of 2s, not 500ms: on a loaded machine a live
		// master answered CLUSTERDOWN a second after another was stopped,
		// as a master does that finds itself in a minority (pings between
		// the live ones late past the node timeout, most likely).
		n := redistest.StartClusterNode(t, "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no")
		nodes = append(nodes, n)
		addrs = append(addrs, n.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	out, err := exec.CommandContext(ctx, cli, append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	require.NoError(t, err, "redis-cli --cluster create: %s", out)
	for _, n := range nodes {
		rdb := redis.NewClient(&redis.Options{Addr: n.Addr()})
		for {
			info, err := rdb.ClusterInfo(ctx).Result()
			require.NoError(t, err, "CLUSTER INFO on %s", n.Addr())
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			time.Sleep(20 * time.Millisecond) // polling a real cluster's gossip: nothing signals it
		}
		rdb.Close()
	}
	return nodes
}

// relWaitNodeFailed waits until the cluster node at addr flags the node at
// failed as failing (fail, not just fail?), for at most timeout.
func relWaitNodeFailed(t *testing.T, addr, failed string, timeout time.Duration) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	// Polls the nodes' real gossip, which nothing signals.
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		nodes, err := rdb.ClusterNodes(context.Background()).Result()
		require.NoError(t, err, "CLUSTER NODES on %s", addr)
		for line := range strings.Lines(nodes) {
			// <id> <ip:port@cport> <flags> ...
			fields := strings.Fields(line)
			if len(fields) > 2 && strings.HasPrefix(fields[1], failed+"@") && slices.Contains(strings.Split(fields[2], ","), "fail") {
				return
			}
		}
		require.True(t, time.Now().Before(deadline), "%s has not marked %s failed after %v:\n%s", addr, failed, timeout, nodes)
	}
}

// TestReliabilityClusterMasterDown stops one master of a 3-master cluster under
// load. Keys on the other masters' slots keep working without an error;
// keys on the dead master's slots fail cleanly (an error, not a denial,
// within the deadline).
func TestReliabilityClusterMasterDown(t *testing.T) {
	relSkipShort(t)
	relQuietRedisLog(t)
	nodes := relStartCluster(t)
	ctx := context.Background()

	opts := func() *redis.ClusterOptions {
		o := RecommendedOptions("") // as a cluster client's options
		return &redis.ClusterOptions{
			Addrs:                    []string{nodes[0].Addr(), nodes[1].Addr(), nodes[2].Addr()},
			DialTimeout:              o.DialTimeout,
			ReadTimeout:              o.ReadTimeout,
			WriteTimeout:             o.WriteTimeout,
			PoolTimeout:              o.PoolTimeout,
			ContextTimeoutEnabled:    o.ContextTimeoutEnabled,
			MaxRetries:               o.MaxRetries,
			MaxRedirects:             1,
			DialerRetries:            o.DialerRetries,
			DisableIdentity:          o.DisableIdentity,
			MaintNotificationsConfig: o.MaintNotificationsConfig,
		}
	}
	const clients, perClient, keys, limit = 3, 4, 60, relUnreached
	var sets [][]Limiter
	for range clients {
		rdb := redis.NewClusterClient(opts())
		t.Cleanup(func() { rdb.Close() })
		sets = append(sets, relLimiters(t, rdb, limit))
	}

	// Which master owns each limiter key (prefix included).
	dead := nodes[1].Addr()
	admin := redis.NewClient(&redis.Options{Addr: nodes[0].Addr()})
	t.Cleanup(func() { admin.Close() })
	//lint:ignore SA1019 CLUSTER SLOTS answers on every Redis we support; CLUSTER SHARDS needs 7.0.
	slots, err := admin.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	var prefixes []string
	for _, l := range sets[0] {
		prefixes = append(prefixes, keyPrefix(l))
	}
	onDead := map[relKey]bool{}
	deadKeys := 0
	for alg, prefix := range prefixes {
		for k := range keys {
			key := fmt.Sprintf("cluster:%d", k)
			slot, err := admin.ClusterKeySlot(ctx, prefix+key).Result()
			require.NoError(t, err)
			for _, s := range slots {
				if int64(s.Start) <= slot && slot <= int64(s.End) && s.Nodes[0].Addr == dead {
					onDead[relKey{alg, key}] = true
					deadKeys++
				}
			}
		}
	}
	require.Positive(t, deadKeys, "some keys must live on the master that will be stopped")
	require.Less(t, deadKeys, len(prefixes)*keys, "some keys must live on the other masters")

	load := relRun(sets, perClient, func(r *rand.Rand) (int, string) {
		return r.IntN(len(sets[0])), fmt.Sprintf("cluster:%d", r.IntN(keys))
	})
	time.Sleep(300 * time.Millisecond) // real time, as the cluster's failure detection is
	require.NoError(t, nodes[1].Stop(), "stopping a master")
	stopped := time.Now()
	// Until the live masters mark it failed (node timeout 2s), and a
	// while after: the calls meet the cluster in both states.
	for _, n := range []*redistest.Server{nodes[0], nodes[2]} {
		relWaitNodeFailed(t, n.Addr(), dead, time.Minute) // only a cluster that never notices
	}
	marked := time.Now()
	t.Logf("the live masters marked the stopped one failed %v after the stop", marked.Sub(stopped))
	time.Sleep(500 * time.Millisecond) // the calls meet the failed node in real time
	calls := load.finish(t)
	relRequireBounded(t, calls)

	var liveCalls, liveTimeouts, liveOKAfter, deadCalls, deadOK int
	var live []relCall
	for _, c := range calls {
		k := relKey{c.alg, c.key}
		if !onDead[k] {
			live = append(live, c)
			liveCalls++
			if c.err != nil {
				// A busy machine may starve a call past its deadline; an
				// error of any other kind means the dead master was in
				// the way.
				require.ErrorIs(t, c.err, context.DeadlineExceeded,
					"key %q on a live master, %v after the stop: only a timeout is excusable", c.key, c.start.Sub(stopped))
				liveTimeouts++
			} else if c.start.After(marked) {
				liveOKAfter++
			}
			continue
		}
		if c.start.After(stopped) {
			deadCalls++
			if c.err == nil {
				deadOK++
			}
		}
	}
	t.Logf("master down: %d calls on live slots, %d timed out; %d on dead slots after the stop, errors:\n%s", liveCalls, liveTimeouts, deadCalls, relErrorKinds(calls))
	// How many calls a loaded machine starves past their deadline is no
	// property of the cluster: keys on live masters keep working when
	// they are decided once the dead master is marked failed.
	require.Positive(t, liveOKAfter, "keys on live masters must keep working")
	require.Positive(t, deadCalls)
	require.Zero(t, deadOK, "a key on a stopped master cannot be decided")
	relRequireNoPhantoms(t, live, limit, relUsed(t, sets[0], limit, relKeysOf(live, func(relCall) bool { return true })))
}

// TestReliabilityNetworkLatency puts a proxy between the clients and Redis and
// makes it slow, then mute. A reply slower than the deadline, or none, is an
// error within the deadline, never an allowed or denied guess; replies
// below it only make decisions slower; and after the network heals, every
// grant reported is in the state, none twice.
func TestReliabilityNetworkLatency(t *testing.T) {
	relSkipShort(t)
	relQuietRedisLog(t)
	srv := redistest.Start(t)
	proxy, err := faultproxy.Start(srv.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, proxy.Close()) })

	// Limits no test phase reaches: any denial would be a guess.
	const clients, perClient, keys, limit = 3, 4, 30, relUnreached
	var sets [][]Limiter
	for _, rdb := range relClients(t, clients, proxy.Addr(), nil) {
		sets = append(sets, relLimiters(t, rdb, limit))
	}
	load := relRun(sets, perClient, func(r *rand.Rand) (int, string) {
		return r.IntN(len(sets[0])), fmt.Sprintf("latency:%d", r.IntN(keys))
	})
	type phase struct {
		name       string
		delay      time.Duration
		drop       bool
		start, end time.Time
	}
	const settle = 100 * time.Millisecond // replies read before a change may still arrive as they were
	phases := []*phase{
		{name: "normal"},
		{name: "delay 30ms", delay: 30 * time.Millisecond},
		{name: "delay 2×deadline", delay: 2 * relDeadline},
		{name: "replies dropped", drop: true},
		{name: "healed"},
	}
	for _, p := range phases {
		proxy.SetDelay(p.delay)
		proxy.SetDrop(p.drop)
		p.start = time.Now()
		time.Sleep(settle + 3*relDeadline) // the network's phases are real time, as the deadlines are
		p.end = time.Now()
	}
	calls := load.finish(t)
	relRequireBounded(t, calls)

	socketTimeouts := 0
	// A loaded machine makes some calls miss their deadline with no fault at
	// all: the normal phase counts them. Where calls must succeed, a phase
	// may miss as many as the normal phase did, plus 10% of its calls; a
	// fault that broke decisions fails far more.
	var normalMissed float64
	for _, p := range phases {
		var n, failed, missed int
		var slowest time.Duration
		for _, c := range calls {
			if c.start.Before(p.start.Add(settle)) || c.end.After(p.end) {
				continue
			}
			n++
			slowest = max(slowest, c.latency())
			if c.err != nil {
				failed++
			}
			require.True(t, c.err != nil || c.res.Allowed, "%s: call on %q denied, but no limit was reached: a guess", p.name, c.key)
			switch {
			case p.drop || p.delay > relDeadline:
				require.Error(t, c.err, "%s: a reply that never comes in time cannot be a decision", p.name)
				// go-redis turns the ctx deadline into a socket deadline; the
				// error is the socket's, and redlimit makes it match the
				// ctx's too (DESIGN property 7).
				require.ErrorIs(t, c.err, context.DeadlineExceeded, "%s: want the ctx's deadline error", p.name)
				if errors.Is(c.err, os.ErrDeadlineExceeded) {
					socketTimeouts++
				}
			case p.name == "healed" && c.start.After(p.start.Add(relRecovery)):
				if c.err != nil {
					require.ErrorIs(t, c.err, context.DeadlineExceeded, "%s: %v after healing", p.name, c.start.Sub(p.start))
					missed++
				}
			case p.delay > 0:
				if c.err != nil {
					require.ErrorIs(t, c.err, context.DeadlineExceeded, "%s: a delay under the deadline only slows decisions", p.name)
					missed++
					continue
				}
				require.GreaterOrEqual(t, c.latency(), p.delay, "%s: the delay must have applied", p.name)
			}
		}
		require.Positive(t, n, "%s: no calls", p.name)
		if p.name == "normal" {
			normalMissed = float64(failed) / float64(n)
		}
		require.LessOrEqual(t, float64(missed)/float64(n), normalMissed+0.1,
			"%s: %d of %d calls missed their deadline (normal phase: %.1f%%): a delay under the deadline only slows decisions, and healed calls succeed",
			p.name, missed, n, 100*normalMissed)
		t.Logf("%-18s %5d calls, %5d failed, slowest %v", p.name, n, failed, slowest)
	}
	t.Logf("errors (%d match os.ErrDeadlineExceeded, the rest context.DeadlineExceeded):\n%s", socketTimeouts, relErrorKinds(calls))

	granted, unreported := relRequireNoPhantoms(t, calls, limit, relUsed(t, sets[0], limit, relKeysOf(calls, func(relCall) bool { return true })))
	t.Logf("%d grants reported, all counted; %d permits counted whose replies were late or dropped (taken, never reported)", granted, unreported)
}

// TestReliabilityMiniredisMinuteBuckets: a denial by a sliding window or log
// whose buckets are coarser than about 27s must be as quick on miniredis
// (the examples' embedded default) as anywhere else. gopher-lua, the Lua
// of miniredis, keeps integer keys below 2^26 in a table's array part and
// fills every slot up to the key: a script that indexed a Lua table by
// bucket number (numbers near 3×10^7 today with minute buckets) allocated
// about half a gigabyte a denial.
func TestReliabilityMiniredisMinuteBuckets(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	// The sliding log runs the same script; one case is enough, as each
	// slow call would allocate so much.
	l, err := NewSlidingWindow(rdb, 1, time.Hour, time.Minute)
	require.NoError(t, err)
	r, err := l.Allow(context.Background(), "minute")
	require.NoError(t, err)
	require.True(t, r.Allowed)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	r, err = l.Allow(ctx, "minute")
	took := time.Since(start)
	require.NoError(t, err, "a denial with minute buckets on miniredis: no answer after %v", took)
	require.False(t, r.Allowed)
	require.Less(t, took, 250*time.Millisecond, "a denial with minute buckets on miniredis took %v", took)
}
