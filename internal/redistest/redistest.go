// Package redistest starts real Redis servers for tests: a standalone server
// and a 3-master Redis Cluster shared by all tests of a test binary, and
// dedicated servers for tests that need to stop, kill or reconfigure them.
//
// Servers listen on 127.0.0.1 only, run without persistence in temporary
// directories and are child processes of the test binary (on Linux they are
// killed when it dies). A package using the shared servers should stop them
// from TestMain:
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		redistest.Shutdown()
//		os.Exit(code)
//	}
//
// When redis-server (or, for the cluster, redis-cli) is not on PATH, tests are
// skipped, unless the environment variable REDLIMIT_REQUIRE_REDIS=1 is set, in
// which case they fail.
package redistest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// requireEnv is the environment variable that, set to "1", turns a missing
// redis-server or redis-cli into a test failure instead of a skip.
const requireEnv = "REDLIMIT_REQUIRE_REDIS"

var (
	sharedMu      sync.Mutex
	sharedServer  *Server
	sharedCluster *cluster
)

// sharedDatabases is how many databases the shared server has: enough for
// every test of a binary that runs at once to hold one (see DB).
const sharedDatabases = 256

// freeDBs holds the numbers of the shared server's databases no test holds.
var freeDBs = func() chan int {
	c := make(chan int, sharedDatabases)
	for db := 1; db < sharedDatabases; db++ { // 0 is left to Addr's users
		c <- db
	}
	return c
}()

// Available reports whether redis-server is on PATH.
func Available() bool {
	_, err := exec.LookPath("redis-server")
	return err == nil
}

// Require is what tests call first: when redis-server is not on PATH it calls
// tb.Skip with a message saying so, except when the environment variable
// REDLIMIT_REQUIRE_REDIS=1, where it calls tb.Fatal. Addr, ClusterAddrs and
// Start apply the same rule themselves; ClusterAddrs also requires redis-cli.
func Require(tb testing.TB) {
	tb.Helper()
	requireBinaries(tb, "redis-server")
}

// requireBinaries applies the rule of Require to each named program.
func requireBinaries(tb testing.TB, names ...string) {
	tb.Helper()
	for _, name := range names {
		if _, err := exec.LookPath(name); err == nil {
			continue
		}
		if os.Getenv(requireEnv) == "1" {
			tb.Fatalf("redistest: %s not found on PATH, and %s=1 requires it", name, requireEnv)
		}
		skipped.Add(1)
		tb.Skipf("redistest: %s not found on PATH; skipping (set %s=1 to fail instead)", name, requireEnv)
	}
}

// Addr returns the address of a real redis-server shared by all tests of the
// current test binary, starting it on first use. Tests sharing its database
// 0 should use distinct keys and must not stop it or flush it; a test that
// wants a database to itself calls DB. Server-wide commands (SCRIPT FLUSH,
// CONFIG SET, INFO commandstats) reach every test: a test that needs them
// starts its own server. If the shared server has died, a new one is
// started.
func Addr(tb testing.TB) string {
	tb.Helper()
	Require(tb)
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedServer != nil && !sharedServer.running() {
		if err := sharedServer.close(); err != nil {
			tb.Logf("redistest: cleaning up dead shared redis-server: %v", err)
		}
		sharedServer = nil
	}
	if sharedServer == nil {
		s, err := startServer([]string{"--databases", strconv.Itoa(sharedDatabases)}, false)
		if err != nil {
			tb.Fatalf("redistest: shared server: %v", err)
		}
		sharedServer = s
	}
	return sharedServer.Addr()
}

// DB returns the address of the shared server (see Addr) and the number of
// one of its databases that no other test holds until tb ends: the test may
// write any key there and flush it, and tests holding databases of their own
// may run in parallel. The database is empty when handed out; tb.Cleanup
// flushes it and gives it back.
func DB(tb testing.TB) (addr string, db int) {
	tb.Helper()
	addr = Addr(tb)
	select {
	case db = <-freeDBs:
	case <-time.After(time.Minute):
		tb.Fatalf("redistest: all %d databases of the shared server held for a minute", sharedDatabases-1)
	}
	tb.Cleanup(func() {
		client := redis.NewClient(&redis.Options{Addr: addr, DB: db, DisableIdentity: true, MaxRetries: -1})
		defer client.Close()
		// A server restarted since (Addr restarts a dead one) is empty anyway.
		if err := client.FlushDB(context.Background()).Err(); err != nil && Available() {
			tb.Logf("redistest: flushing database %d: %v", db, err)
		}
		freeDBs <- db
	})
	return addr, db
}

// ClusterAddrs returns the seed addresses of a shared local 3-master Redis
// Cluster (started on first use; all 16384 slots covered, cluster_state:ok on
// every node). It skips or fails the test as Require does when redis-server
// or redis-cli is missing. The returned slice is the caller's to modify.
func ClusterAddrs(tb testing.TB) []string {
	tb.Helper()
	requireBinaries(tb, "redis-server", "redis-cli")
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedCluster == nil {
		c, err := startCluster()
		if err != nil {
			tb.Fatalf("redistest: shared cluster: %v", err)
		}
		sharedCluster = c
	}
	return sharedCluster.addrs()
}

// skipped counts the tests skipped for want of redis-server or redis-cli.
var skipped atomic.Int64

// Shutdown stops the shared server and cluster, if started, and removes their
// directories. Call it from TestMain after m.Run. Later calls to Addr or
// ClusterAddrs start new ones. When tests were skipped for want of
// redis-server, it also says how many, once per test binary (see
// reportSkips).
func Shutdown() {
	reportSkips(skipped.Load())
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedServer != nil {
		if err := sharedServer.close(); err != nil {
			fmt.Fprintf(os.Stderr, "redistest: shutdown shared server: %v\n", err)
		}
		sharedServer = nil
	}
	if sharedCluster != nil {
		if err := sharedCluster.close(); err != nil {
			fmt.Fprintf(os.Stderr, "redistest: shutdown shared cluster: %v\n", err)
		}
		sharedCluster = nil
	}
}

// reportSkips says, in one line, how many real-Redis tests were skipped and
// why. go test shows a passing package's output only with -v, so without -v
// the line goes to the terminal (/dev/tty) when there is one: a developer
// without redis-server sees that the package passed without its real-Redis
// tests, not just "ok".
func reportSkips(n int64) {
	if n == 0 {
		return
	}
	line := skipLine(filepath.Base(os.Args[0]), n)
	if f := flag.Lookup("test.v"); f != nil && f.Value.String() != "false" {
		fmt.Print(line)
		return
	}
	tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0)
	if err != nil {
		return // no terminal (CI): go test -v shows the skips themselves
	}
	defer tty.Close()
	fmt.Fprint(tty, line)
}

func skipLine(binary string, n int64) string {
	return fmt.Sprintf("redistest: %s: %d real-Redis tests skipped: redis-server (or redis-cli) is not on PATH; install it to run them, or set %s=1 to fail instead\n",
		binary, n, requireEnv)
}
