package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	code := m.Run()
	Shutdown()
	os.Exit(code)
}

func TestAddr(t *testing.T) {
	addr := Addr(t)
	require.Equal(t, addr, Addr(t), "Addr must return the same shared server")

	ctx := context.Background()
	client := newClient(addr)
	defer client.Close()
	require.NoError(t, client.Ping(ctx).Err())
	require.NoError(t, client.Set(ctx, "redistest:TestAddr", "v1", time.Minute).Err())
	got, err := client.Get(ctx, "redistest:TestAddr").Result()
	require.NoError(t, err)
	require.Equal(t, "v1", got)

	// No persistence configured.
	save, err := client.ConfigGet(ctx, "save").Result()
	require.NoError(t, err)
	require.Equal(t, "", save["save"])
	aof, err := client.ConfigGet(ctx, "appendonly").Result()
	require.NoError(t, err)
	require.Equal(t, "no", aof["appendonly"])
}

func TestStartKillRestart(t *testing.T) {
	// Extra args reach the server. maxmemory leaves room for the writes
	// below: an empty 7.2+ or Valkey server built with libc malloc already
	// uses about 1 MiB.
	s := Start(t, "--maxmemory", "64mb")
	ctx := context.Background()
	client := newClient(s.Addr())
	defer func() { client.Close() }()

	maxmemory, err := client.ConfigGet(ctx, "maxmemory").Result()
	require.NoError(t, err)
	require.Equal(t, "67108864", maxmemory["maxmemory"], "extra args must reach the server")

	require.NoError(t, client.Set(ctx, "k", "v", 0).Err())
	port, pid := s.Port(), s.Pid()
	require.NotZero(t, pid)
	require.Equal(t, fmt.Sprintf("127.0.0.1:%d", port), s.Addr())

	require.NoError(t, s.Kill())
	require.Error(t, dialCheck(ctx, s.Addr()), "server must be down after Kill")
	require.NoError(t, s.Kill(), "Kill of a dead server is a no-op")

	s.Restart(t)
	// A go-redis pool whose dials failed keeps failing fast for about a
	// second, so use a fresh client after a restart.
	client.Close()
	client = newClient(s.Addr())
	require.Equal(t, port, s.Port())
	require.NotEqual(t, pid, s.Pid())
	require.NoError(t, client.Ping(ctx).Err())
	require.ErrorIs(t, client.Get(ctx, "k").Err(), redis.Nil, "data must not survive a kill")

	// Graceful stop and restart work too.
	require.NoError(t, client.Set(ctx, "k", "v", 0).Err())
	require.NoError(t, s.Stop())
	require.NoError(t, s.Stop(), "Stop of a stopped server is a no-op")
	s.Restart(t)
	client.Close()
	client = newClient(s.Addr())
	require.ErrorIs(t, client.Get(ctx, "k").Err(), redis.Nil, "data must not survive a restart")
}

func TestStartBadArgsReportsLog(t *testing.T) {
	Require(t)
	_, err := startServer([]string{"--no-such-option", "x"}, false)
	require.Error(t, err)
	require.Contains(t, err.Error(), "no-such-option", "error must quote the server log")
}

func TestClusterAddrs(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a 3-master Redis Cluster; runs without -short")
	}
	start := time.Now()
	addrs := ClusterAddrs(t)
	t.Logf("cluster ready after %v", time.Since(start))
	require.Len(t, addrs, clusterMasters)
	require.Equal(t, addrs, ClusterAddrs(t), "ClusterAddrs must return the same shared cluster")

	ctx := context.Background()
	for _, addr := range addrs {
		node := newClient(addr)
		info, err := node.ClusterInfo(ctx).Result()
		node.Close()
		require.NoError(t, err)
		require.Contains(t, info, "cluster_state:ok", "node %s", addr)
	}

	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DisableIdentity: true})
	defer client.Close()
	masters := map[string]bool{}
	for i := range 50 {
		key := fmt.Sprintf("redistest:TestClusterAddrs:%d", i)
		value := fmt.Sprintf("v%d", i)
		require.NoError(t, client.Set(ctx, key, value, time.Minute).Err())
		got, err := client.Get(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, value, got)

		slot, err := client.ClusterKeySlot(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, int(slot), keySlot(key), "keySlot(%q)", key)
		node, err := client.MasterForKey(ctx, key)
		require.NoError(t, err)
		masters[node.Options().Addr] = true
	}
	require.Len(t, masters, clusterMasters, "50 keys must spread over all masters")
}

func TestKeySlot(t *testing.T) {
	require.Equal(t, uint16(0x31C3), crc16([]byte("123456789")))
	require.Equal(t, keySlot("user1000"), keySlot("{user1000}.following"))
	require.Equal(t, keySlot("{}x"), int(crc16([]byte("{}x")))%clusterSlots, "empty hash tag hashes the whole key")
}

// fakeTB records Skip and Fatal calls, ending the calling goroutine like the
// real testing.TB does.
type fakeTB struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped, f.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// runFake runs fn with a fakeTB in its own goroutine and returns the fake.
func runFake(fn func(testing.TB)) *fakeTB {
	f := &fakeTB{}
	var wg sync.WaitGroup
	wg.Go(func() { fn(f) })
	wg.Wait()
	return f
}

func TestRequireWithoutRedis(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	require.False(t, Available())

	entryPoints := map[string]func(testing.TB){
		"Require":      Require,
		"Addr":         func(tb testing.TB) { Addr(tb) },
		"ClusterAddrs": func(tb testing.TB) { ClusterAddrs(tb) },
		"Start":        func(tb testing.TB) { Start(tb) },
	}
	for name, fn := range entryPoints {
		t.Run(name, func(t *testing.T) {
			t.Setenv(requireEnv, "")
			f := runFake(fn)
			require.True(t, f.skipped, "must skip")
			require.False(t, f.failed)
			require.Contains(t, f.msg, "redis-server not found")

			t.Setenv(requireEnv, "1")
			f = runFake(fn)
			require.True(t, f.failed, "must fail with %s=1", requireEnv)
			require.False(t, f.skipped)
			require.Contains(t, f.msg, "redis-server not found")
		})
	}
}

func TestClusterRequiresRedisCli(t *testing.T) {
	Require(t)
	// A PATH with redis-server but not redis-cli.
	dir := t.TempDir()
	server, err := exec.LookPath("redis-server")
	require.NoError(t, err)
	require.NoError(t, os.Symlink(server, filepath.Join(dir, "redis-server")))
	t.Setenv("PATH", dir)
	t.Setenv(requireEnv, "")

	f := runFake(func(tb testing.TB) { ClusterAddrs(tb) })
	require.True(t, f.skipped)
	require.Contains(t, f.msg, "redis-cli not found")
}

// The skip summary says how many, why, and what to do.
func TestSkipLine(t *testing.T) {
	line := skipLine("redlimit.test", 158)
	for _, want := range []string{"redlimit.test", "158 real-Redis tests skipped", "not on PATH", "REDLIMIT_REQUIRE_REDIS=1"} {
		if !strings.Contains(line, want) {
			t.Errorf("skip line %q lacks %q", line, want)
		}
	}
	before := skipped.Load()
	t.Setenv(requireEnv, "")
	t.Setenv("PATH", t.TempDir())
	runFake(Require)
	if got := skipped.Load() - before; got != 1 {
		t.Errorf("a skip for want of redis-server counted %d times, want 1", got)
	}
}
