package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// must holds minimal assertion helpers; testify's go.sum entries are not all
// present in this module yet.
var must = assertions{}

type assertions struct{}

func (assertions) NoError(t *testing.T, err error, msgAndArgs ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("unexpected error: %v%s", err, extra(msgAndArgs))
	}
}

func (assertions) Error(t *testing.T, err error, msgAndArgs ...any) {
	t.Helper()
	if err == nil {
		t.Fatalf("expected an error%s", extra(msgAndArgs))
	}
}

func (assertions) ErrorIs(t *testing.T, err, target error, msgAndArgs ...any) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v is not %v%s", err, target, extra(msgAndArgs))
	}
}

func (assertions) Equal(t *testing.T, want, got any, msgAndArgs ...any) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("got %#v, want %#v%s", got, want, extra(msgAndArgs))
	}
}

func (assertions) NotEqual(t *testing.T, notWant, got any, msgAndArgs ...any) {
	t.Helper()
	if reflect.DeepEqual(notWant, got) {
		t.Fatalf("got %#v, want anything else%s", got, extra(msgAndArgs))
	}
}

func (assertions) NotZero(t *testing.T, got int, msgAndArgs ...any) {
	t.Helper()
	if got == 0 {
		t.Fatalf("got 0%s", extra(msgAndArgs))
	}
}

func (assertions) True(t *testing.T, got bool, msgAndArgs ...any) {
	t.Helper()
	if !got {
		t.Fatalf("got false, want true%s", extra(msgAndArgs))
	}
}

func (assertions) False(t *testing.T, got bool, msgAndArgs ...any) {
	t.Helper()
	if got {
		t.Fatalf("got true, want false%s", extra(msgAndArgs))
	}
}

func (assertions) Contains(t *testing.T, s, sub string, msgAndArgs ...any) {
	t.Helper()
	if !strings.Contains(s, sub) {
		t.Fatalf("%q does not contain %q%s", s, sub, extra(msgAndArgs))
	}
}

func (assertions) Len(t *testing.T, n, want int, msgAndArgs ...any) {
	t.Helper()
	if n != want {
		t.Fatalf("length %d, want %d%s", n, want, extra(msgAndArgs))
	}
}

// extra formats testify-style trailing message arguments.
func extra(msgAndArgs []any) string {
	if len(msgAndArgs) == 0 {
		return ""
	}
	format, ok := msgAndArgs[0].(string)
	if !ok {
		return fmt.Sprint(append([]any{": "}, msgAndArgs...)...)
	}
	return ": " + fmt.Sprintf(format, msgAndArgs[1:]...)
}

func TestMain(m *testing.M) {
	code := m.Run()
	Shutdown()
	os.Exit(code)
}

func TestAddr(t *testing.T) {
	addr := Addr(t)
	must.Equal(t, addr, Addr(t), "Addr must return the same shared server")

	ctx := context.Background()
	client := newClient(addr)
	defer client.Close()
	must.NoError(t, client.Ping(ctx).Err())
	must.NoError(t, client.Set(ctx, "redistest:TestAddr", "v1", time.Minute).Err())
	got, err := client.Get(ctx, "redistest:TestAddr").Result()
	must.NoError(t, err)
	must.Equal(t, "v1", got)

	// No persistence configured.
	save, err := client.ConfigGet(ctx, "save").Result()
	must.NoError(t, err)
	must.Equal(t, "", save["save"])
	aof, err := client.ConfigGet(ctx, "appendonly").Result()
	must.NoError(t, err)
	must.Equal(t, "no", aof["appendonly"])
}

func TestStartKillRestart(t *testing.T) {
	s := Start(t, "--maxmemory", "1mb")
	ctx := context.Background()
	client := newClient(s.Addr())
	defer func() { client.Close() }()

	maxmemory, err := client.ConfigGet(ctx, "maxmemory").Result()
	must.NoError(t, err)
	must.Equal(t, "1048576", maxmemory["maxmemory"], "extra args must reach the server")

	must.NoError(t, client.Set(ctx, "k", "v", 0).Err())
	port, pid := s.Port(), s.Pid()
	must.NotZero(t, pid)
	must.Equal(t, fmt.Sprintf("127.0.0.1:%d", port), s.Addr())

	must.NoError(t, s.Kill())
	must.Error(t, dialCheck(ctx, s.Addr()), "server must be down after Kill")
	must.NoError(t, s.Kill(), "Kill of a dead server is a no-op")

	s.Restart(t)
	// A go-redis pool whose dials failed keeps failing fast for about a
	// second, so use a fresh client after a restart.
	client.Close()
	client = newClient(s.Addr())
	must.Equal(t, port, s.Port())
	must.NotEqual(t, pid, s.Pid())
	must.NoError(t, client.Ping(ctx).Err())
	must.ErrorIs(t, client.Get(ctx, "k").Err(), redis.Nil, "data must not survive a kill")

	// Graceful stop and restart work too.
	must.NoError(t, client.Set(ctx, "k", "v", 0).Err())
	must.NoError(t, s.Stop())
	must.NoError(t, s.Stop(), "Stop of a stopped server is a no-op")
	s.Restart(t)
	client.Close()
	client = newClient(s.Addr())
	must.ErrorIs(t, client.Get(ctx, "k").Err(), redis.Nil, "data must not survive a restart")
}

func TestStartBadArgsReportsLog(t *testing.T) {
	Require(t)
	_, err := startServer([]string{"--no-such-option", "x"}, false)
	must.Error(t, err)
	must.Contains(t, err.Error(), "no-such-option", "error must quote the server log")
}

func TestClusterAddrs(t *testing.T) {
	start := time.Now()
	addrs := ClusterAddrs(t)
	t.Logf("cluster ready after %v", time.Since(start))
	must.Len(t, len(addrs), clusterMasters)
	must.Equal(t, addrs, ClusterAddrs(t), "ClusterAddrs must return the same shared cluster")

	ctx := context.Background()
	for _, addr := range addrs {
		node := newClient(addr)
		info, err := node.ClusterInfo(ctx).Result()
		node.Close()
		must.NoError(t, err)
		must.Contains(t, info, "cluster_state:ok", "node %s", addr)
	}

	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DisableIdentity: true})
	defer client.Close()
	masters := map[string]bool{}
	for i := range 50 {
		key := fmt.Sprintf("redistest:TestClusterAddrs:%d", i)
		value := fmt.Sprintf("v%d", i)
		must.NoError(t, client.Set(ctx, key, value, time.Minute).Err())
		got, err := client.Get(ctx, key).Result()
		must.NoError(t, err)
		must.Equal(t, value, got)

		slot, err := client.ClusterKeySlot(ctx, key).Result()
		must.NoError(t, err)
		must.Equal(t, int(slot), keySlot(key), "keySlot(%q)", key)
		node, err := client.MasterForKey(ctx, key)
		must.NoError(t, err)
		masters[node.Options().Addr] = true
	}
	must.Len(t, len(masters), clusterMasters, "50 keys must spread over all masters")
}

func TestKeySlot(t *testing.T) {
	must.Equal(t, uint16(0x31C3), crc16([]byte("123456789")))
	must.Equal(t, keySlot("user1000"), keySlot("{user1000}.following"))
	must.Equal(t, keySlot("{}x"), int(crc16([]byte("{}x")))%clusterSlots, "empty hash tag hashes the whole key")
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
	must.False(t, Available())

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
			must.True(t, f.skipped, "must skip")
			must.False(t, f.failed)
			must.Contains(t, f.msg, "redis-server not found")

			t.Setenv(requireEnv, "1")
			f = runFake(fn)
			must.True(t, f.failed, "must fail with %s=1", requireEnv)
			must.False(t, f.skipped)
			must.Contains(t, f.msg, "redis-server not found")
		})
	}
}

func TestClusterRequiresRedisCli(t *testing.T) {
	Require(t)
	// A PATH with redis-server but not redis-cli.
	dir := t.TempDir()
	server, err := exec.LookPath("redis-server")
	must.NoError(t, err)
	must.NoError(t, os.Symlink(server, filepath.Join(dir, "redis-server")))
	t.Setenv("PATH", dir)
	t.Setenv(requireEnv, "")

	f := runFake(func(tb testing.TB) { ClusterAddrs(tb) })
	must.True(t, f.skipped)
	must.Contains(t, f.msg, "redis-cli not found")
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
