package grpclimit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/engine"
	"github.com/redlimit/redlimit/redlimittest"
)

// grantingLimiter grants every call (or denies every one, when deny is
// set) with a Grant whose refunds it records.
type grantingLimiter struct {
	deny       bool
	failRefund error

	mu      sync.Mutex
	refunds []int
}

func (l *grantingLimiter) AllowN(_ context.Context, key string, n int) (redlimit.Result, error) {
	if l.deny {
		return redlimit.Result{Limit: 1, RetryAfter: 1e9}, nil
	}
	res := redlimit.Result{Allowed: true, Limit: 100, Remaining: 100 - n}
	if n > 0 {
		res.Grant = engine.NewGrant(l, key, n, "t")
	}
	return res, nil
}

func (l *grantingLimiter) Allow(ctx context.Context, key string) (redlimit.Result, error) {
	return l.AllowN(ctx, key, 1)
}

func (l *grantingLimiter) TryAcquire(ctx context.Context, key string) error {
	_, err := l.AllowN(ctx, key, 1)
	return err
}

func (l *grantingLimiter) Reset(context.Context, string) error { return nil }

func (l *grantingLimiter) RefundGrant(_ context.Context, _, _ string, _, n int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refunds = append(l.refunds, n)
	return l.failRefund
}

func (l *grantingLimiter) taken() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.refunds...)
}

// peerCtx is a call's context as a server sees it, with a peer address
// for PeerIP.
func peerCtx() context.Context {
	return metadata.NewIncomingContext(context.Background(), metadata.Pairs("key", "k"))
}

func serverFaults(code codes.Code) bool { return code == codes.Internal || code == codes.Unavailable }

var unaryInfo = &grpc.UnaryServerInfo{FullMethod: "/test.Service/Method"}

func TestUnaryRefundIf(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want []int
	}{
		{"OK counts", nil, nil},
		{"NotFound counts", status.Error(codes.NotFound, "no"), nil},
		{"Unavailable is given back", status.Error(codes.Unavailable, "down"), []int{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &grantingLimiter{}
			in := UnaryServerInterceptor(l, WithKeyFunc(Metadata("key")), WithCost(func(context.Context, string) int { return 2 }), WithRefundIf(serverFaults))
			_, err := in(peerCtx(), nil, unaryInfo, func(context.Context, any) (any, error) { return nil, tc.err })
			require.Equal(t, tc.err, err)
			require.Equal(t, tc.want, l.taken())
		})
	}
}

func TestUnaryRefundIfPanic(t *testing.T) {
	l := &grantingLimiter{}
	in := UnaryServerInterceptor(l, WithKeyFunc(Metadata("key")), WithRefundIf(serverFaults))
	require.PanicsWithValue(t, "bug", func() {
		_, _ = in(peerCtx(), nil, unaryInfo, func(context.Context, any) (any, error) { panic("bug") })
	})
	require.Equal(t, []int{1}, l.taken(), "a panicking call counts as codes.Internal")
}

func TestChainedInterceptorsGiveBackWhenAnInnerOneDenies(t *testing.T) {
	outer, inner := &grantingLimiter{}, &grantingLimiter{deny: true}
	o := UnaryServerInterceptor(outer, WithKeyFunc(Metadata("key")))
	i := UnaryServerInterceptor(inner, WithKeyFunc(Metadata("key")))
	reached := false
	_, err := o(peerCtx(), nil, unaryInfo, func(ctx context.Context, req any) (any, error) {
		return i(ctx, req, unaryInfo, func(context.Context, any) (any, error) { reached = true; return nil, nil })
	})
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	require.False(t, reached)
	require.Equal(t, []int{1}, outer.taken(), "the outer limit is not charged for a call the inner one refused")
}

func TestStreamSettle(t *testing.T) {
	l := &grantingLimiter{}
	in := StreamServerInterceptor(l, WithKeyFunc(Metadata("key")), WithCost(func(context.Context, string) int { return 4000 }))
	var errs []error
	err := in(nil, fakeStream{peerCtx()}, &grpc.StreamServerInfo{FullMethod: "/test.Service/Stream"}, func(_ any, ss grpc.ServerStream) error {
		errs = append(errs, Settle(ss.Context(), 1500), Settle(ss.Context(), 1500))
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []error{nil, nil}, errs)
	require.Equal(t, []int{2500, 2500}, l.taken(), "settling asks for 2500 given back in all, twice: the grant keeps the largest")
	require.ErrorIs(t, Settle(context.Background(), 1), redlimit.ErrInvalidArgument)
}

func TestRefundFailureIsTold(t *testing.T) {
	l := &grantingLimiter{failRefund: errors.New("redis down")}
	var told []error
	in := UnaryServerInterceptor(l, WithKeyFunc(Metadata("key")), WithRefundIf(serverFaults),
		WithOnError(func(_ context.Context, _ string, err error) { told = append(told, err) }))
	_, _ = in(peerCtx(), nil, unaryInfo, func(context.Context, any) (any, error) { return nil, status.Error(codes.Internal, "x") })
	require.Len(t, told, 1)
	require.ErrorIs(t, told[0], ErrRefund)
}

// fakeStream is a ServerStream with a context and nothing else.
type fakeStream struct{ ctx context.Context }

func (s fakeStream) Context() context.Context   { return s.ctx }
func (fakeStream) SetHeader(metadata.MD) error  { return nil }
func (fakeStream) SendHeader(metadata.MD) error { return nil }
func (fakeStream) SetTrailer(metadata.MD)       {}
func (fakeStream) SendMsg(any) error            { return nil }
func (fakeStream) RecvMsg(any) error            { return nil }

// A stream holds its lease until it ends, and a panicking handler's lease
// is released too.
func TestStreamHoldsItsLease(t *testing.T) {
	env := redlimittest.New(t)
	l, err := redlimit.NewConcurrency(env.Client(), 1, time.Minute, env.Options()...)
	require.NoError(t, err)
	in := StreamServerInterceptor(l, WithKeyFunc(Metadata("key")))
	info := &grpc.StreamServerInfo{FullMethod: "/test.Service/Stream"}
	err = in(nil, fakeStream{peerCtx()}, info, func(_ any, ss grpc.ServerStream) error {
		inner := in(nil, fakeStream{peerCtx()}, info, func(any, grpc.ServerStream) error { return nil })
		require.Equal(t, codes.ResourceExhausted, status.Code(inner), "one stream in flight: a second is refused while it lasts")
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, in(nil, fakeStream{peerCtx()}, info, func(any, grpc.ServerStream) error { return nil }), "the lease went with the stream")

	unary := UnaryServerInterceptor(l, WithKeyFunc(Metadata("key")))
	require.Panics(t, func() {
		_, _ = unary(peerCtx(), nil, unaryInfo, func(context.Context, any) (any, error) { panic("bug") })
	})
	_, err = unary(peerCtx(), nil, unaryInfo, func(context.Context, any) (any, error) { return nil, nil })
	require.NoError(t, err, "the panicking call's lease was released")
}
