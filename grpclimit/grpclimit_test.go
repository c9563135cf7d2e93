package grpclimit

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/redlimittest"
)

// serve starts a gRPC server with the health service behind the two
// interceptors, on 127.0.0.1, and returns a client of it.
func serve(t *testing.T, l redlimit.Limiter, opts ...Option) healthpb.HealthClient {
	t.Helper()
	return serveWith(t, UnaryServerInterceptor(l, opts...), StreamServerInterceptor(l, opts...))
}

// serveWith starts a gRPC server with the health service behind unary
// and stream, on 127.0.0.1, and returns a client of it.
func serveWith(t *testing.T, unary grpc.UnaryServerInterceptor, stream grpc.StreamServerInterceptor) healthpb.HealthClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// retryDelay returns the RetryInfo detail of err's status, if any.
func retryDelay(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

func TestUnaryAndStream(t *testing.T) {
	env := redlimittest.New(t)
	l, err := redlimit.NewFixedWindow(env.Client(), 2, time.Minute, env.Options()...)
	require.NoError(t, err)
	client := serve(t, l)
	ctx := context.Background()

	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "first call allowed")
	stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err, "second call, a stream, allowed")

	env.Advance(20 * time.Second)
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "third call denied: %v", err)
	delay, ok := retryDelay(err)
	require.True(t, ok, "a denial carries RetryInfo")
	assert.Equal(t, 40*time.Second, delay, "retry when the window closes")

	stream, err = client.Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "a stream is denied when it opens: %v", err)
	_, ok = retryDelay(err)
	assert.True(t, ok, "stream denial carries RetryInfo")

	env.Advance(40 * time.Second)
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "a new window")
}

func TestMetadataKeyAndCost(t *testing.T) {
	env := redlimittest.New(t)
	l, err := redlimit.NewTokenBucket(env.Client(), 3, redlimit.PerHour(1), env.Options()...)
	require.NoError(t, err)
	client := serve(t, l,
		WithKeyFunc(Metadata("X-API-Key")),
		WithCost(func(_ context.Context, method string) int {
			if method == "/grpc.health.v1.Health/Check" {
				return 2
			}
			return 5 // above the capacity
		}))
	withKey := func(key string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key)
	}
	_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "a call without the key is the client's fault: %v", err)

	_, err = client.Check(withKey("a"), &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "2 of 3")
	_, err = client.Check(withKey("a"), &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "2 more of 1 left")
	_, err = client.Check(withKey("b"), &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "another key has its own limit")

	stream, err := client.Watch(withKey("c"), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "5 of capacity 3 can never be allowed")
	_, ok := retryDelay(err)
	assert.False(t, ok, "no RetryInfo when no wait helps")
}

// failing is a limiter whose every call fails without a decision.
type failing struct {
	redlimit.Limiter
	err error
}

func (f failing) AllowN(context.Context, string, int) (redlimit.Result, error) {
	return redlimit.Result{}, f.err
}

// unavailable is what a limiter with an open circuit breaker returns.
type unavailable struct{ cooldown time.Duration }

func (u unavailable) Error() string             { return "unavailable" }
func (u unavailable) Unwrap() error             { return redlimit.ErrUnavailable }
func (u unavailable) RetryAfter() time.Duration { return u.cooldown }

func TestNoDecision(t *testing.T) {
	var told []error
	onError := WithOnError(func(_ context.Context, _ string, err error) { told = append(told, err) })

	client := serve(t, failing{err: errors.New("connection refused")}, onError)
	_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "fail open by default")
	require.Len(t, told, 1, "OnError is told")

	client = serve(t, failing{err: unavailable{2 * time.Second}}, WithFailClosed())
	_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err), "fail closed")
	delay, ok := retryDelay(err)
	require.True(t, ok, "the breaker's cooldown as RetryInfo")
	assert.Equal(t, 2*time.Second, delay)
}

// slow blocks until the call's context ends.
type slow struct{ redlimit.Limiter }

func (slow) AllowN(ctx context.Context, _ string, _ int) (redlimit.Result, error) {
	<-ctx.Done()
	return redlimit.Result{}, ctx.Err()
}

func TestTimeout(t *testing.T) {
	client := serve(t, slow{}, WithFailClosed(), WithTimeout(30*time.Millisecond))
	start := time.Now()
	_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	assert.Less(t, time.Since(start), 2*time.Second, "a stuck limiter is cut off at the decision timeout")
}

func TestPanicsOnSetupErrors(t *testing.T) {
	env := redlimittest.New(t)
	l, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options()...)
	require.NoError(t, err)
	for name, fn := range map[string]func(){
		"nil limiter":       func() { UnaryServerInterceptor(nil) },
		"typed nil limiter": func() { StreamServerInterceptor((*redlimit.TokenBucket)(nil)) },
		"nil option":        func() { UnaryServerInterceptor(l, nil) },
		"nil key func":      func() { UnaryServerInterceptor(l, WithKeyFunc(nil)) },
		"negative timeout":  func() { UnaryServerInterceptor(l, WithTimeout(-1)) },
		"zero timeout":      func() { UnaryServerInterceptor(l, WithTimeout(0)) },
		"empty metadata":    func() { Metadata(" ") },
	} {
		t.Run(name, func(t *testing.T) { assert.Panics(t, fn) })
	}
}
