package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/inmem"
	"github.com/redlimit/redlimit/redlimittest"
)

// planLimits are the three limits of an API platform's plan: 5 a minute per
// user, 3 a minute per tenant, 2 in flight per user.
type planLimits struct {
	user, tenant redlimit.Limiter
	inFlight     *redlimit.Concurrency
}

func newPlanLimits(t *testing.T) (*redlimittest.Env, planLimits) {
	env := redlimittest.New(t)
	user, err := redlimit.NewFixedWindow(env.Client(), 5, time.Minute, env.Options(redlimit.WithPrefix("user:"))...)
	require.NoError(t, err)
	tenant, err := redlimit.NewFixedWindow(env.Client(), 3, time.Minute, env.Options(redlimit.WithPrefix("tenant:"))...)
	require.NoError(t, err)
	inFlight, err := redlimit.NewConcurrency(env.Client(), 2, time.Minute, env.Options(redlimit.WithPrefix("flight:"))...)
	require.NoError(t, err)
	return env, planLimits{user, tenant, inFlight}
}

// parts returns the plan's parts: the user from x-user, the tenant from
// x-tenant, in flight per user.
func (pl planLimits) parts() []Part {
	return []Part{
		{Name: "user", Limiter: pl.user, Key: Metadata("x-user")},
		{Name: "tenant", Limiter: pl.tenant, Key: Metadata("x-tenant")},
		{Name: "inflight", Limiter: pl.inFlight, Key: Metadata("x-user")},
	}
}

// remaining reads what is left of key on l, taking nothing.
func remaining(t *testing.T, l redlimit.Limiter, key string) int {
	t.Helper()
	res, err := l.AllowN(context.Background(), key, 0)
	require.NoError(t, err)
	return res.Remaining
}

// serveAll starts a gRPC server with the health service behind the two
// *All interceptors, on 127.0.0.1, and returns a client of it.
func serveAll(t *testing.T, parts []Part, opts ...Option) healthpb.HealthClient {
	t.Helper()
	return serveWith(t, UnaryServerInterceptorAll(parts, opts...), StreamServerInterceptorAll(parts, opts...))
}

// as returns a context whose calls come from user in tenant ("" leaves
// the entry out).
func as(ctx context.Context, user, tenant string) context.Context {
	if user != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-user", user)
	}
	if tenant != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-tenant", tenant)
	}
	return ctx
}

// quotaSubject returns the subject of the QuotaFailure detail of err's
// status, if any.
func quotaSubject(err error) (string, bool) {
	for _, d := range status.Convert(err).Details() {
		if qf, ok := d.(*errdetails.QuotaFailure); ok && len(qf.GetViolations()) == 1 {
			return qf.GetViolations()[0].GetSubject(), true
		}
	}
	return "", false
}

// The tenant's limit denies a user who has permits left: the status names
// the tenant, RetryInfo is the tenant's wait, and the user's permit and
// place in flight were not taken.
func TestAllTenantDenies(t *testing.T) {
	env, pl := newPlanLimits(t)
	var denied []redlimit.Result
	client := serveAll(t, pl.parts(),
		WithOnError(func(_ context.Context, _ string, err error) { t.Errorf("no decision: %v", err) }),
		WithOnDenied(func(_ context.Context, _ string, res redlimit.Result, enforced bool) { denied = append(denied, res) }),
	)
	bg := context.Background()
	for i, user := range []string{"alice", "alice", "bob"} {
		_, err := client.Check(as(bg, user, "acme"), &healthpb.HealthCheckRequest{})
		require.NoError(t, err, "call %d: the tenant has 3 a minute", i)
		env.Advance(10 * time.Second)
	}
	_, err := client.Check(as(bg, "carol", "acme"), &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "the tenant's fourth call: %v", err)
	subject, ok := quotaSubject(err)
	require.True(t, ok, "a denial carries a QuotaFailure: %v", err)
	assert.Equal(t, "tenant", subject, "naming the part that denied")
	delay, ok := retryDelay(err)
	require.True(t, ok, "a denial carries RetryInfo")
	assert.Equal(t, 30*time.Second, delay, "the tenant's window closes in 30s")
	require.Len(t, denied, 1)
	assert.Equal(t, 1, denied[0].Part, "OnDenied's Result names the tenant part")

	assert.Equal(t, 5, remaining(t, pl.user, "carol"), "nothing was taken from the user's limit")
	assert.Equal(t, 2, remaining(t, pl.inFlight, "carol"), "the place in flight taken with the denial was given back")
	assert.Equal(t, 3, remaining(t, pl.user, "alice"), "alice's two calls stay counted")
	assert.Equal(t, 2, remaining(t, pl.inFlight, "alice"), "alice's places ended with her calls")

	stream, err := client.Watch(as(bg, "dave", "acme"), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "a stream is decided on every part too: %v", err)
	subject, _ = quotaSubject(err)
	assert.Equal(t, "tenant", subject)
	assert.Equal(t, 5, remaining(t, pl.user, "dave"), "nothing was taken from the user's limit")
}

// An open stream holds its place in flight until it ends: the user's
// third call meanwhile is denied by that part alone.
func TestAllStreamHoldsTheLease(t *testing.T) {
	_, pl := newPlanLimits(t)
	client := serveAll(t, pl.parts())
	ctx, cancel := context.WithCancel(as(context.Background(), "alice", "acme"))
	for range 2 {
		stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		_, err = stream.Recv()
		require.NoError(t, err, "the stream opened")
	}
	_, err := client.Check(as(context.Background(), "alice", "acme"), &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "two streams in flight: %v", err)
	subject, _ := quotaSubject(err)
	assert.Equal(t, "inflight", subject)
	assert.Equal(t, 3, remaining(t, pl.user, "alice"), "the denied call took no user permit")
	assert.Equal(t, 1, remaining(t, pl.tenant, "acme"), "nor a tenant permit")

	cancel()
	require.Eventually(t, func() bool { return remaining(t, pl.inFlight, "alice") == 2 },
		10*time.Second, time.Millisecond, "the places end with the streams")
	assert.Equal(t, 3, remaining(t, pl.user, "alice"), "the rate limits' permits stay counted")
}

// WithRefundIf and Settle give back to every part at once.
func TestAllRefunds(t *testing.T) {
	_, pl := newPlanLimits(t)
	notFound := WithRefundIf(func(code codes.Code) bool { return code == codes.NotFound })
	client := serveAll(t, pl.parts(), notFound)
	_, err := client.Check(as(context.Background(), "alice", "acme"), &healthpb.HealthCheckRequest{Service: "nope"})
	require.Equal(t, codes.NotFound, status.Code(err))
	assert.Equal(t, 5, remaining(t, pl.user, "alice"), "the user's permit was given back")
	assert.Equal(t, 3, remaining(t, pl.tenant, "acme"), "the tenant's permit was given back")
	assert.Equal(t, 2, remaining(t, pl.inFlight, "alice"), "the place in flight ended")

	interceptor := UnaryServerInterceptorAll(pl.parts()[:2], WithCost(func(context.Context, string) int { return 3 }))
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-user", "bob", "x-tenant", "globex"))
	_, err = interceptor(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/t/Settle"}, func(ctx context.Context, _ any) (any, error) {
		return nil, Settle(ctx, 1)
	})
	require.NoError(t, err)
	assert.Equal(t, 4, remaining(t, pl.user, "bob"), "the user's limit kept the 1 permit used")
	assert.Equal(t, 2, remaining(t, pl.tenant, "globex"), "so did the tenant's")
}

// A part whose Key returns ErrSkip is left out; any other Key error fails
// the call with nothing taken.
func TestAllKeys(t *testing.T) {
	_, pl := newPlanLimits(t)
	parts := pl.parts()
	tenantOrSkip := func(ctx context.Context, method string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-tenant"); len(v) > 0 {
			return v[0], nil
		}
		return "", ErrSkip // a user of no tenant
	}
	parts[1].Key = tenantOrSkip
	client := serveAll(t, parts)
	bg := context.Background()

	_, err := client.Check(as(bg, "alice", ""), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, 4, remaining(t, pl.user, "alice"))

	_, err = client.Check(as(bg, "", "acme"), &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "the user's key is missing: %v", err)
	assert.Equal(t, 3, remaining(t, pl.tenant, "acme"), "nothing was taken from the tenant")

	skipAll := serveAll(t, []Part{{Name: "tenant", Limiter: pl.tenant, Key: tenantOrSkip}})
	_, err = skipAll.Check(as(bg, "alice", ""), &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "no part applies: the call goes on")
}

func TestAllPanicsOnBadSetup(t *testing.T) {
	_, pl := newPlanLimits(t)
	user := Part{Name: "user", Limiter: pl.user}
	for name, build := range map[string]func(){
		"no parts":        func() { UnaryServerInterceptorAll(nil) },
		"nil limiter":     func() { StreamServerInterceptorAll([]Part{{Name: "user"}}) },
		"name used twice": func() { UnaryServerInterceptorAll([]Part{user, user}) },
		"empty name":      func() { UnaryServerInterceptorAll([]Part{{Limiter: pl.user}}) },
		"WithKeyFunc":     func() { UnaryServerInterceptorAll([]Part{user}, WithKeyFunc(PeerIP)) },
	} {
		assert.Panics(t, build, name)
	}
}

// A denial stands when giving back what the other parts took fails: the
// call is refused, never failed open, and OnError hears of the refund.
func TestAllDenialWhoseRefundFails(t *testing.T) {
	user := &grantingLimiter{failRefund: errors.New("redis down")}
	var told []error
	interceptor := UnaryServerInterceptorAll([]Part{
		{Name: "user", Limiter: user, Key: Metadata("x-user")},
		{Name: "tenant", Limiter: &grantingLimiter{deny: true}, Key: Metadata("x-tenant")},
	}, WithOnError(func(_ context.Context, _ string, err error) { told = append(told, err) }))
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-user", "alice", "x-tenant", "acme"))
	ran := false
	_, err := interceptor(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/t/M"}, func(context.Context, any) (any, error) {
		ran = true
		return nil, nil
	})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "the tenant denied: %v", err)
	assert.False(t, ran, "the handler did not run")
	subject, _ := quotaSubject(err)
	assert.Equal(t, "tenant", subject)
	assert.Equal(t, []int{1}, user.taken(), "the user's permit was asked back")
	require.Len(t, told, 1)
	assert.ErrorIs(t, told[0], ErrRefund, "OnError hears that the refund failed")
}

// WithKeepAlive renews a stream's lease, alone or a part's (and of that
// part only): on the fake clock three lease periods pass while the stream
// runs, each after a renewal, and the place is still held. The in-process
// part after the lease part is decided before the Redis one, so this also
// finds the lease among the group's grants by its part.
func TestKeepAlive(t *testing.T) {
	for _, alone := range []bool{true, false} {
		t.Run(fmt.Sprintf("alone=%v", alone), func(t *testing.T) {
			env := redlimittest.New(t)
			var renewed atomic.Int64
			count := redlimit.WithObserver(func(d redlimit.Decision) {
				if d.Result.Allowed && d.N > 0 && !d.Refund {
					renewed.Add(1) // the grant, then each renewal
				}
			})
			inFlight, err := redlimit.NewConcurrency(env.Client(), 1, time.Minute, env.Options(count)...)
			require.NoError(t, err)
			user, err := inmem.NewFixedWindow(100, time.Hour, inmem.WithClock(env.Now))
			require.NoError(t, err)
			var told []error
			onError := WithOnError(func(_ context.Context, _ string, err error) { told = append(told, err) })
			in := StreamServerInterceptor(inFlight, WithKeyFunc(Metadata("x-user")), WithKeepAlive(time.Millisecond), onError)
			if !alone {
				in = StreamServerInterceptorAll([]Part{
					{Name: "inflight", Limiter: inFlight, Key: Metadata("x-user")},
					{Name: "user", Limiter: user, Key: Metadata("x-user")},
				}, WithKeepAlive(time.Millisecond), onError)
			}
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-user", "alice"))
			info := &grpc.StreamServerInfo{FullMethod: "/test.Service/Stream"}
			err = in(nil, fakeStream{ctx}, info, func(any, grpc.ServerStream) error {
				// A renewal seen after a step may have read the clock
				// before it: steps of a third of the lease leave it a
				// third to spare.
				for range 9 {
					seen := renewed.Load()
					require.Eventually(t, func() bool { return renewed.Load() > seen }, 10*time.Second, time.Millisecond, "a renewal")
					env.Advance(20 * time.Second)
				}
				second := in(nil, fakeStream{ctx}, info, func(any, grpc.ServerStream) error { return nil })
				require.Equal(t, codes.ResourceExhausted, status.Code(second), "three lease periods later the renewed lease still holds the place")
				return nil
			})
			require.NoError(t, err)
			assert.Equal(t, 1, remaining(t, inFlight, "alice"), "the renewed lease ended with the stream")
			if !alone {
				assert.Equal(t, 99, remaining(t, user, "alice"), "the user part's permit stays counted, the denial took none")
			}
			assert.Empty(t, told, "every renewal and the release went through")
		})
	}
}

// In shadow mode a denial by one part lets the call through, and OnDenied
// hears which part would have denied it.
func TestAllShadow(t *testing.T) {
	_, pl := newPlanLimits(t)
	var denied []redlimit.Result
	in := UnaryServerInterceptorAll(pl.parts()[:2], WithShadow(),
		WithOnDenied(func(_ context.Context, _ string, res redlimit.Result, enforced bool) {
			assert.False(t, enforced)
			denied = append(denied, res)
		}))
	for i, user := range []string{"alice", "bob", "carol", "dave"} {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-user", user, "x-tenant", "acme"))
		_, err := in(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/t/M"}, func(context.Context, any) (any, error) { return nil, nil })
		require.NoError(t, err, "call %d goes through", i)
	}
	require.Len(t, denied, 1, "the tenant's fourth call would have been denied")
	assert.Equal(t, 1, denied[0].Part, "by the tenant part")
	assert.Equal(t, 5, remaining(t, pl.user, "dave"), "the would-be denial took nothing from the user part")
}
