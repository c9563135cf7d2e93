package grpclimit_test

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
	"github.com/redlimit/redlimit/redlimittest"
)

// Two calls per minute per API key. A service passes the interceptors to
// grpc.NewServer; here the interceptor is called as the server would, with
// the caller's metadata in the context. The embedded miniredis has a fake
// clock, so the output is exact.
func ExampleUnaryServerInterceptor() {
	env, err := redlimittest.Run()
	if err != nil {
		panic(err)
	}
	defer env.Close()
	limiter, err := redlimit.NewFixedWindow(env.Client(), 2, time.Minute, env.Options()...)
	if err != nil {
		panic(err)
	}
	interceptor := grpclimit.UnaryServerInterceptor(limiter, grpclimit.WithKeyFunc(grpclimit.Metadata("x-api-key")))
	_ = grpc.NewServer(grpc.UnaryInterceptor(interceptor)) // how a service uses it

	handler := func(ctx context.Context, req any) (any, error) { return "hello", nil }
	info := &grpc.UnaryServerInfo{FullMethod: "/greeter.Greeter/Hello"}
	for _, apiKey := range []string{"k-1", "k-1", "k-1", "k-2", ""} {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", apiKey))
		resp, err := interceptor(ctx, nil, info, handler)
		fmt.Printf("%q: %v %v\n", apiKey, resp, status.Code(err))
	}
	// Output:
	// "k-1": hello OK
	// "k-1": hello OK
	// "k-1": <nil> ResourceExhausted
	// "k-2": hello OK
	// "": <nil> InvalidArgument
}

// Shadow mode: the limit is decided and counted, OnDenied hears of the
// would-be denial, and the call still runs.
func ExampleWithShadow() {
	env, err := redlimittest.Run()
	if err != nil {
		panic(err)
	}
	defer env.Close()
	limiter, err := redlimit.NewFixedWindow(env.Client(), 1, time.Minute, env.Options()...)
	if err != nil {
		panic(err)
	}
	interceptor := grpclimit.UnaryServerInterceptor(limiter,
		grpclimit.WithKeyFunc(grpclimit.Metadata("x-api-key")),
		grpclimit.WithShadow(),
		grpclimit.WithOnDenied(func(ctx context.Context, method string, res redlimit.Result, enforced bool) {
			fmt.Println("denied", method, "enforced:", enforced)
		}),
	)
	handler := func(ctx context.Context, req any) (any, error) { return "hello", nil }
	info := &grpc.UnaryServerInfo{FullMethod: "/greeter.Greeter/Hello"}
	for range 2 {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "k-1"))
		resp, err := interceptor(ctx, nil, info, handler)
		fmt.Println(resp, status.Code(err))
	}
	// Output:
	// hello OK
	// denied /greeter.Greeter/Hello enforced: false
	// hello OK
}

// Two limits decided as one: 3 calls a minute per user, 4 a minute per
// tenant. The tenant's denial names the tenant in a QuotaFailure detail,
// and costs bob nothing.
func ExampleUnaryServerInterceptorAll() {
	env, err := redlimittest.Run()
	if err != nil {
		panic(err)
	}
	defer env.Close()
	perUser, err := redlimit.NewFixedWindow(env.Client(), 3, time.Minute, env.Options(redlimit.WithPrefix("user:"))...)
	if err != nil {
		panic(err)
	}
	perTenant, err := redlimit.NewFixedWindow(env.Client(), 4, time.Minute, env.Options(redlimit.WithPrefix("tenant:"))...)
	if err != nil {
		panic(err)
	}
	interceptor := grpclimit.UnaryServerInterceptorAll([]grpclimit.Part{
		{Name: "user", Limiter: perUser, Key: grpclimit.Metadata("x-user")},
		{Name: "tenant", Limiter: perTenant, Key: grpclimit.Metadata("x-tenant")},
	})
	handler := func(ctx context.Context, req any) (any, error) { return "hello", nil }
	info := &grpc.UnaryServerInfo{FullMethod: "/greeter.Greeter/Hello"}
	for _, user := range []string{"alice", "alice", "alice", "alice", "bob", "bob"} {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-user", user, "x-tenant", "acme"))
		_, err := interceptor(ctx, nil, info, handler)
		fmt.Print(user, " ", status.Code(err))
		for _, d := range status.Convert(err).Details() {
			if qf, ok := d.(*errdetails.QuotaFailure); ok {
				fmt.Print(" denied by ", qf.GetViolations()[0].GetSubject())
			}
		}
		fmt.Println()
	}
	left, _ := perUser.AllowN(context.Background(), "bob", 0)
	fmt.Println("bob's calls left:", left.Remaining)
	// Output:
	// alice OK
	// alice OK
	// alice OK
	// alice ResourceExhausted denied by user
	// bob OK
	// bob ResourceExhausted denied by tenant
	// bob's calls left: 2
}
