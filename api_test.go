package redlimit

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// A key is 1 to MaxKeyBytes bytes: a longer one is refused before Redis, by
// every call, so that a client who chooses its key cannot store megabytes.
func TestKeyLength(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	longest := strings.Repeat("k", MaxKeyBytes)
	tooLong := longest + "k"
	megabyte := strings.Repeat("m", 1<<20)
	forEachBackend(t, func(t *testing.T, b backend) {
		cmds := &commandRecorder{}
		b.rdb.AddHook(cmds)
		for _, alg := range algorithms {
			t.Run(alg.name, func(t *testing.T) {
				l, err := alg.new(b.rdb, 4, time.Minute)
				require.NoError(t, err)
				calls := []struct {
					name string
					call func(key string) error
				}{
					{"TryAcquire", func(key string) error { return l.TryAcquire(ctx, key) }},
					{"Allow", func(key string) error { _, err := l.Allow(ctx, key); return err }},
					{"AllowN n=0", func(key string) error { _, err := l.AllowN(ctx, key, 0); return err }},
					{"AllowN n=3", func(key string) error { _, err := l.AllowN(ctx, key, 3); return err }},
					{"Reset", func(key string) error { return l.Reset(ctx, key) }},
				}
				cmds.take()
				for _, c := range calls {
					for _, key := range []string{tooLong, megabyte} {
						err := c.call(key)
						require.ErrorIs(t, err, ErrInvalidArgument, "%s with a %d-byte key: want ErrInvalidArgument", c.name, len(key))
						require.Contains(t, err.Error(), "at most 1024 bytes", "%s: the message must give the bound", c.name)
						require.Less(t, len(err.Error()), 300, "%s: the message must not carry the key whole", c.name)
					}
				}
				require.Empty(t, cmds.take(), "a key longer than %d bytes must never reach Redis", MaxKeyBytes)

				r, err := l.Allow(ctx, longest)
				require.NoError(t, err, "a key of exactly %d bytes is valid", MaxKeyBytes)
				require.True(t, r.Allowed, "a fresh key of %d bytes is allowed", MaxKeyBytes)
				require.NoError(t, l.Reset(ctx, longest))
			})
		}
	})
}

// A limiter no constructor made is a programming error. A zero value
// answers ErrInvalidConfig from every method (TestMisuseIsAnError); a nil
// *FixedWindow, ... panics on its methods, as a nil *rate.Limiter does in
// golang.org/x/time/rate, and Wait given it, or a nil Limiter, returns
// ErrInvalidConfig naming the type instead of panicking.
func TestNilLimiters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nils := []struct {
		name string
		l    Limiter
	}{
		{"FixedWindow", (*FixedWindow)(nil)},
		{"SlidingWindow", (*SlidingWindow)(nil)},
		{"SlidingLog", (*SlidingLog)(nil)},
		{"LeakyBucket", (*LeakyBucket)(nil)},
		{"TokenBucket", (*TokenBucket)(nil)},
	}
	for _, tc := range nils {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.l
			waits := map[string]func() error{
				"Wait":  func() error { return Wait(ctx, l, "k") },
				"WaitN": func() error { return WaitN(ctx, l, "k", 2) },
			}
			for name, call := range waits {
				var err error
				require.NotPanics(t, func() { err = call() }, "%s on a nil *%s", name, tc.name)
				require.ErrorIs(t, err, ErrInvalidConfig, "%s on a nil *%s", name, tc.name)
				require.Contains(t, err.Error(), "nil *", "%s: the message says the limiter is nil", name)
				require.Contains(t, err.Error(), tc.name, "%s: the message names the nil type", name)
			}
			require.Panics(t, func() { _ = l.TryAcquire(ctx, "k") }, "a method of a nil *%s", tc.name)
		})
	}
	t.Run("nil Limiter", func(t *testing.T) {
		for _, err := range []error{Wait(ctx, nil, "k"), WaitN(ctx, nil, "k", 3)} {
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.Contains(t, err.Error(), "nil Limiter")
		}
	})
	t.Run("constructor error", func(t *testing.T) {
		l, err := NewTokenBucket(redis.NewClient(&redis.Options{}), 0, PerSecond(1))
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.Nil(t, l, "no limiter with an error")
	})
}

// WaitN's error for n above the capacity names the limit's real window.
func TestWaitNeverNamesWindow(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	rdb := newMiniClient(t, m)
	ctx := context.Background()
	cases := []struct {
		name string
		new  func() (Limiter, error)
		n    int
		want string
	}{
		{"fixed window", func() (Limiter, error) { return NewFixedWindow(rdb, 5, time.Minute) }, 6, "5 per 1m0s"},
		{"token bucket", func() (Limiter, error) { return NewTokenBucket(rdb, 5, PerSecond(1)) }, 6, "5 per 5s"},
		{"leaky bucket per day", func() (Limiter, error) { return NewLeakyBucket(rdb, 5, PerDay(5)) }, 9, "5 per 24h0m0s"},
		{"sliding log", func() (Limiter, error) {
			return NewSlidingLog(rdb, time.Second, []Strategy{{Limit: 5, Window: time.Minute}, {Limit: 50, Window: time.Hour}})
		}, 6, "5 per 1m0s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, err := tc.new()
			require.NoError(t, err)
			err = WaitN(ctx, l, "k", tc.n)
			require.ErrorIs(t, err, ErrAcquireFailed)
			require.Contains(t, err.Error(), tc.want, "the error names the limit and its window")
			require.NotContains(t, err.Error(), "per 0s")
		})
	}
	t.Run("unknown window", func(t *testing.T) {
		err := (&ViolationStrategyError{Limit: 5, RetryAfter: Never}).Error()
		require.Equal(t, "redlimit: rate limit exceeded: limit 5, request larger than the limit", err)
	})
}

func TestPerDay(t *testing.T) {
	t.Parallel()
	require.Equal(t, Rate{Count: 7, Per: 24 * time.Hour}, PerDay(7))
}

// One observer tells a service's limiters apart by their WithName names.
func TestWithName(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	rdb := newMiniClient(t, m)
	ctx := context.Background()
	var seen []string
	observe := WithObserver(func(d Decision) { seen = append(seen, d.Limiter+"/"+d.Algorithm) })
	login, err := NewFixedWindow(rdb, 1, time.Minute, observe, WithName("login"))
	require.NoError(t, err)
	api, err := NewTokenBucket(rdb, 1, PerSecond(1), WithName("api"), observe, WithDenyCache(8))
	require.NoError(t, err)
	unnamed, err := NewLeakyBucket(rdb, 1, PerSecond(1), observe)
	require.NoError(t, err)
	require.NoError(t, login.TryAcquire(ctx, "k"))
	require.NoError(t, api.TryAcquire(ctx, "k"))
	require.ErrorIs(t, api.TryAcquire(ctx, "k"), ErrAcquireFailed)
	require.ErrorIs(t, api.TryAcquire(ctx, "k"), ErrAcquireFailed) // the deny cache's
	_, err = login.Allow(ctx, "")
	require.Error(t, err)
	require.NoError(t, unnamed.TryAcquire(ctx, "k"))
	require.Equal(t, []string{
		"login/fixed_window", "api/token_bucket", "api/token_bucket", "api/token_bucket",
		"login/fixed_window", "/leaky_bucket",
	}, seen, "every decision, errors and deny-cache answers included, carries its limiter's name")
}

// A client built from ClientOptions fails fast against a killed Redis, and
// within its own timeouts against a paused one, even for calls without a
// ctx deadline.
func TestClientOptionsFailFast(t *testing.T) {
	o := ClientOptions("127.0.0.1:6379")
	require.True(t, o.ContextTimeoutEnabled, "ctx deadlines honoured")
	require.Equal(t, -1, o.MaxRetries, "a retried EVALSHA can take a second permit")
	require.Equal(t, 1, o.DialerRetries)

	srv := redistest.Start(t)
	rdb := redis.NewClient(ClientOptions(srv.Addr()))
	t.Cleanup(func() { rdb.Close() })
	l, err := NewTokenBucket(rdb, 10, PerSecond(10), WithoutBreaker())
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, l.TryAcquire(ctx, "k"))

	if !testing.Short() {
		require.NoError(t, syscall.Kill(srv.Pid(), syscall.SIGSTOP))
		start := time.Now()
		err = l.TryAcquire(ctx, "k")
		took := time.Since(start)
		require.NoError(t, syscall.Kill(srv.Pid(), syscall.SIGCONT))
		require.ErrorIs(t, err, os.ErrDeadlineExceeded, "a paused Redis: the read times out")
		require.Less(t, took, time.Second, "ReadTimeout (500ms) bounds a call without a deadline against a paused Redis")
		t.Logf("paused Redis, no ctx deadline: %v", took)
	}

	require.NoError(t, srv.Kill())
	for i := range 5 {
		start := time.Now()
		err := l.TryAcquire(ctx, "k")
		took := time.Since(start)
		require.ErrorIs(t, err, syscall.ECONNREFUSED, "call %d", i)
		require.Less(t, took, 100*time.Millisecond, "call %d: a killed Redis refuses at once: one dial, no retries", i)
	}
}

// Every limiter reports the limits it enforces, so that middlewares and
// Wait can name a window without being told it.
func TestStrategies(t *testing.T) {
	t.Parallel()
	rdb := deadRedis(t, "", 0) // never dialled
	must := func(l interface{ Strategies() []Strategy }, err error) []Strategy {
		t.Helper()
		require.NoError(t, err)
		return l.Strategies()
	}
	cases := []struct {
		name string
		got  []Strategy
		want []Strategy
	}{
		{"fixed_window", must(NewFixedWindow(rdb, 10, time.Minute)), []Strategy{{10, time.Minute}}},
		{"sliding_window", must(NewSlidingWindow(rdb, 10, time.Minute, time.Second)), []Strategy{{10, time.Minute}}},
		{"sliding_log", must(NewSlidingLog(rdb, time.Second, []Strategy{{1000, time.Hour}, {10, time.Second}})),
			[]Strategy{{10, time.Second}, {1000, time.Hour}}},
		{"leaky_bucket", must(NewLeakyBucket(rdb, 10, PerSecond(5))), []Strategy{{10, 2 * time.Second}}},
		{"token_bucket: capacity / rate, rounded up", must(NewTokenBucket(rdb, 10, PerSecond(3))), []Strategy{{10, 3333334 * time.Microsecond}}},
	}
	for _, c := range cases {
		require.Equal(t, c.want, c.got, c.name)
	}
	require.Nil(t, (&TokenBucket{}).Strategies(), "a limiter no constructor made reports none")
}
