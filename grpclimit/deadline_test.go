package grpclimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/redlimittest"
)

// call runs one unary call through interceptor as a gRPC server does: the
// ctx carries the caller's metadata and, when deadline > 0, the deadline
// its grpc-timeout set.
func call(interceptor grpc.UnaryServerInterceptor, client string, deadline time.Duration) error {
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-client", client))
	if deadline != 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, deadline)
		defer cancel()
	}
	_, err := interceptor(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/test.Service/Method"}, func(context.Context, any) (any, error) {
		return "ok", nil
	})
	return err
}

// Attackers whose calls carry a grpc-timeout of 20µs to 320µs, shorter
// than a round trip to Redis, neither open the limiter's circuit breaker
// nor get an honest client's limit failed open: the honest client gets
// exactly its 5, then ResourceExhausted, with fail open and with fail
// closed, on miniredis and on a real redis-server.
func TestClientDeadlinesCannotOpenTheBreaker(t *testing.T) {
	backends := map[string]func(t *testing.T) (string, []redlimit.Option){
		"miniredis": func(t *testing.T) (string, []redlimit.Option) {
			env := redlimittest.New(t)
			return env.Server().Addr(), env.Options()
		},
		"redis-server": func(t *testing.T) (string, []redlimit.Option) {
			return redistest.Start(t).Addr(), nil
		},
	}
	for name, backend := range backends {
		for _, failClosed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/failClosed=%v", name, failClosed), func(t *testing.T) {
				addr, opts := backend(t)
				client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
					DialTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute, PoolTimeout: time.Minute})
				t.Cleanup(func() { client.Close() })
				var opened atomic.Int32
				breaker, err := redlimit.NewBreaker(redlimit.BreakerConfig{OnChange: func(_, to redlimit.BreakerState, err error) {
					if to == redlimit.BreakerOpen {
						opened.Add(1)
						t.Logf("breaker opened: %v", err)
					}
				}})
				require.NoError(t, err)
				l, err := redlimit.NewFixedWindow(client, 5, time.Minute, append(opts, redlimit.WithBreaker(breaker))...)
				require.NoError(t, err)
				// A decision deadline and client timeouts far above what a
				// loaded test machine needs, so that only the attackers'
				// deadlines could fail calls.
				grpcOpts := []Option{WithKeyFunc(Metadata("x-client")), WithTimeout(time.Minute)}
				if failClosed {
					grpcOpts = append(grpcOpts, WithFailClosed())
				}
				interceptor := UnaryServerInterceptor(l, grpcOpts...)

				stop := make(chan struct{})
				var wg sync.WaitGroup
				for i := range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for n := 0; ; n++ {
							select {
							case <-stop:
								return
							default:
							}
							call(interceptor, fmt.Sprintf("attacker-%d-%d", i, n), time.Duration(20+rand.IntN(300))*time.Microsecond)
						}
					}()
				}
				codesSeen := map[codes.Code]int{}
				for range 20 {
					codesSeen[status.Code(call(interceptor, "honest", 0))]++
					time.Sleep(2 * time.Millisecond) // spread over the attack: pacing, which no assertion times
				}
				close(stop)
				wg.Wait()
				assert.Equal(t, map[codes.Code]int{codes.OK: 5, codes.ResourceExhausted: 15}, codesSeen, "the honest client gets its 5, then ResourceExhausted")
				assert.Zero(t, opened.Load(), "the breaker never opened")
			})
		}
	}
}

// A call whose deadline passed before the interceptor ran is decided all
// the same: a caller cannot skip the limit with its own deadline.
func TestDeadlinePassedIsStillDecided(t *testing.T) {
	env := redlimittest.New(t)
	l, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options()...)
	require.NoError(t, err)
	interceptor := UnaryServerInterceptor(l, WithKeyFunc(Metadata("x-client")))
	assert.Equal(t, codes.OK, status.Code(call(interceptor, "c", -time.Second)))
	assert.Equal(t, codes.ResourceExhausted, status.Code(call(interceptor, "c", -time.Second)), "not failed open")
}

// keyLimit refuses keys longer than 1024 bytes as the redlimit limiters do:
// ErrInvalidArgument, without a decision.
type keyLimit struct{ redlimit.Limiter }

func (k keyLimit) AllowN(ctx context.Context, key string, n int) (redlimit.Result, error) {
	if len(key) > 1024 {
		return redlimit.Result{}, fmt.Errorf("%w: key of %d bytes: at most 1024", redlimit.ErrInvalidArgument, len(key))
	}
	return k.Limiter.AllowN(ctx, key, n)
}

// A megabyte key is the caller's error, InvalidArgument, with fail open or
// closed: never a call let through, never Internal or Unavailable.
func TestLongKeyIsInvalidArgument(t *testing.T) {
	env := redlimittest.New(t)
	fw, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options()...)
	require.NoError(t, err)
	for _, opts := range [][]Option{nil, {WithFailClosed()}} {
		var told []error
		opts = append(opts, WithKeyFunc(Metadata("x-api-key")), WithOnError(func(_ context.Context, _ string, err error) { told = append(told, err) }))
		client := serve(t, keyLimit{fw}, opts...)
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", strings.Repeat("k", 1<<20))
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "error %v", err)
		require.Len(t, told, 1, "OnError is told")
		assert.ErrorIs(t, told[0], redlimit.ErrInvalidArgument)
	}
}
