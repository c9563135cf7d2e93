package redlimittest_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/redlimittest"
)

func TestClock(t *testing.T) {
	env := redlimittest.New(t)
	assert.Equal(t, redlimittest.Epoch, env.Now(), "a new Env reads Epoch")
	env.Advance(1500 * time.Millisecond)
	assert.Equal(t, redlimittest.Epoch.Add(1500*time.Millisecond), env.Now())
	env.Advance(-time.Second)
	assert.Equal(t, redlimittest.Epoch.Add(500*time.Millisecond), env.Now(), "Advance with a negative d goes back")
	env.Set(redlimittest.Epoch.Add(time.Hour))
	assert.Equal(t, redlimittest.Epoch.Add(time.Hour), env.Now())
	env.Set(redlimittest.Epoch)
	assert.Equal(t, redlimittest.Epoch, env.Now(), "Set goes back too")
}

// Every algorithm built with Options decides on the fake clock: it denies
// until the clock passes RetryAfter, and not a microsecond earlier.
func TestLimitersFollowTheClock(t *testing.T) {
	builds := map[string]func(env *redlimittest.Env, opts ...redlimit.Option) (redlimit.Limiter, error){
		"fixed_window": func(env *redlimittest.Env, opts ...redlimit.Option) (redlimit.Limiter, error) {
			return redlimit.NewFixedWindow(env.Client(), 2, time.Minute, opts...)
		},
		"sliding_window": func(env *redlimittest.Env, opts ...redlimit.Option) (redlimit.Limiter, error) {
			return redlimit.NewSlidingWindow(env.Client(), 2, time.Minute, time.Second, opts...)
		},
		"sliding_log": func(env *redlimittest.Env, opts ...redlimit.Option) (redlimit.Limiter, error) {
			return redlimit.NewSlidingLog(env.Client(), time.Second, []redlimit.Strategy{{Limit: 2, Window: time.Minute}}, opts...)
		},
		"leaky_bucket": func(env *redlimittest.Env, opts ...redlimit.Option) (redlimit.Limiter, error) {
			return redlimit.NewLeakyBucket(env.Client(), 2, redlimit.PerMinute(1), opts...)
		},
		"token_bucket": func(env *redlimittest.Env, opts ...redlimit.Option) (redlimit.Limiter, error) {
			return redlimit.NewTokenBucket(env.Client(), 2, redlimit.PerMinute(1), opts...)
		},
	}
	for name, build := range builds {
		t.Run(name, func(t *testing.T) {
			env := redlimittest.New(t)
			// The deny cache reads the clock of WithClock: with a wall
			// clock it would still deny after Advance.
			l, err := build(env, env.Options(redlimit.WithDenyCache(8))...)
			require.NoError(t, err)
			ctx := context.Background()
			for i := 0; i < 2; i++ {
				require.NoError(t, l.TryAcquire(ctx, "k"), "permit %d of 2", i+1)
			}
			r, err := l.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, r.Allowed, "third permit must be denied")
			require.Positive(t, r.RetryAfter)

			env.Advance(r.RetryAfter - time.Microsecond)
			assert.ErrorIs(t, l.TryAcquire(ctx, "k"), redlimit.ErrAcquireFailed, "one microsecond before RetryAfter")
			env.Advance(time.Microsecond)
			assert.NoError(t, l.TryAcquire(ctx, "k"), "at RetryAfter")
		})
	}
}

// A limiter built without Options reads the server's TIME, which follows
// the fake clock too.
func TestServerTimeFollowsTheClock(t *testing.T) {
	env := redlimittest.New(t)
	l, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, l.TryAcquire(ctx, "k"))
	r, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, r.Allowed)
	assert.Equal(t, time.Minute, r.ResetAfter, "the window opened at the fake clock's time")
	env.Advance(time.Minute)
	assert.NoError(t, l.TryAcquire(ctx, "k"), "a minute later on the fake clock")
}

// Advance counts TTLs down on the server, so keys expire as they would.
func TestAdvanceExpiresKeys(t *testing.T) {
	env := redlimittest.New(t)
	l, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options(redlimit.WithPrefix("window:"))...)
	require.NoError(t, err)
	require.NoError(t, l.TryAcquire(context.Background(), "k"))
	const key = "window:k"
	require.True(t, env.Server().Exists(key), "the window's key")
	env.Advance(time.Minute - time.Millisecond)
	require.True(t, env.Server().Exists(key), "still there just before its TTL")
	env.Advance(time.Hour)
	assert.False(t, env.Server().Exists(key), "expired after its TTL")
}

func TestServerErrors(t *testing.T) {
	env := redlimittest.New(t)
	l, err := redlimit.NewTokenBucket(env.Client(), 1, redlimit.PerSecond(1), env.Options()...)
	require.NoError(t, err)
	ctx := context.Background()
	env.Server().SetError("ERR down for the test")
	err = l.TryAcquire(ctx, "k")
	require.Error(t, err)
	assert.NotErrorIs(t, err, redlimit.ErrAcquireFailed, "no decision is not a denial")
	assert.ErrorContains(t, err, "down for the test")
	env.Server().SetError("")
	assert.NoError(t, l.TryAcquire(ctx, "k"), "back up")
}

func TestConcurrentClock(t *testing.T) {
	env := redlimittest.New(t)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				env.Advance(time.Millisecond)
				_ = env.Now()
			}
		})
	}
	wg.Wait()
	assert.Equal(t, redlimittest.Epoch.Add(800*time.Millisecond), env.Now(), "every Advance counted once")
}

func TestRunAndClose(t *testing.T) {
	env, err := redlimittest.Run()
	require.NoError(t, err)
	require.NoError(t, env.Client().Ping(context.Background()).Err())
	env.Close()
	assert.Error(t, env.Client().Ping(context.Background()).Err(), "closed")
}

// slowServer makes every command take delay before it reaches the server:
// a machine too busy to answer within a middleware's deadline.
type slowServer struct{ delay time.Duration }

func (s slowServer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s slowServer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		time.Sleep(s.delay) // real time, as the middleware's deadline is; load only adds to it
		return next(ctx, cmd)
	}
}

func (s slowServer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A round trip slower than httplimit's 100ms deadline still decides under
// an Env: the 429 a test expects is a 429, not a request let through
// undecided.
func TestDecisionsOutlastMiddlewareDeadlines(t *testing.T) {
	env := redlimittest.New(t)
	env.Client().AddHook(slowServer{150 * time.Millisecond})
	l, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options()...)
	require.NoError(t, err)
	var undecided []error
	h := httplimit.Middleware(l, httplimit.WithOnError(func(_ *http.Request, err error) { undecided = append(undecided, err) }))(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		require.Equal(t, want, rec.Code, "request %d: %v", i+1, undecided)
	}
	require.Empty(t, undecided, "every request decided")
}
