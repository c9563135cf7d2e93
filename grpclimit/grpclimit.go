package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/nilcheck"
	"github.com/redlimit/redlimit/internal/shadow"
)

// ErrMissingKey is matched when a call lacks what its key is made of: the
// interceptor answers codes.InvalidArgument.
var ErrMissingKey = errors.New("grpclimit: the call lacks its rate limit key")

// KeyFunc returns the rate limit key of a call; fullMethod is
// "/package.Service/Method". Calls with equal keys share one limit.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// PeerIP keys calls by the IP address of the connection's peer (zones
// dropped, IPv4-mapped addresses as IPv4). A peer without an IP address (a
// unix socket) gets an error: key such servers by metadata.
func PeerIP(ctx context.Context, _ string) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "", errors.New("grpclimit: no peer in the call's context")
	}
	if tcp, ok := p.Addr.(*net.TCPAddr); ok {
		if a, ok := netipAddr(tcp.IP); ok {
			return a, nil
		}
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		host = p.Addr.String()
	}
	if ip := net.ParseIP(strings.Split(host, "%")[0]); ip != nil {
		if a, ok := netipAddr(ip); ok {
			return a, nil
		}
	}
	return "", fmt.Errorf("grpclimit: peer %q has no IP address", p.Addr.String())
}

func netipAddr(ip net.IP) (string, bool) {
	if ip4 := ip.To4(); ip4 != nil {
		return ip4.String(), true
	}
	if ip.To16() != nil {
		return ip.String(), true
	}
	return "", false
}

// Metadata keys calls by the first value of the named incoming metadata
// entry (an API key, a tenant), with surrounding spaces trimmed. A call
// without it gets an error matching ErrMissingKey (codes.InvalidArgument).
// It panics on an empty name.
func Metadata(name string) KeyFunc {
	if strings.TrimSpace(name) == "" {
		panic("grpclimit: Metadata(\"\"): empty name")
	}
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		for _, v := range md.Get(name) {
			if v = strings.TrimSpace(v); v != "" {
				return v, nil
			}
		}
		return "", fmt.Errorf("metadata %s: missing or empty: %w", name, ErrMissingKey)
	}
}

// Option configures the interceptors.
type Option func(*config)

type config struct {
	keyFunc    KeyFunc
	cost       func(ctx context.Context, fullMethod string) int
	failClosed bool
	timeout    time.Duration
	onError    func(ctx context.Context, fullMethod string, err error)
	onDenied   func(ctx context.Context, fullMethod string, res redlimit.Result, enforced bool)
	shadow     bool
	refundIf   func(code codes.Code) bool
	keepAlive  time.Duration // WithKeepAlive's; -1: invalid
}

// WithKeyFunc sets how a call's key is found. Default: PeerIP.
func WithKeyFunc(fn KeyFunc) Option { return func(c *config) { c.keyFunc = fn } }

// WithCost sets how many permits a call takes (say, more for an expensive
// method). Default: 1. A negative cost fails the call with codes.Internal.
func WithCost(fn func(ctx context.Context, fullMethod string) int) Option {
	return func(c *config) { c.cost = fn }
}

// WithFailClosed makes a call the limiter could not decide on fail with
// codes.Unavailable instead of going through. Default: fail open.
func WithFailClosed() Option { return func(c *config) { c.failClosed = true } }

// WithTimeout sets the decision deadline: the longest a call waits for the
// limiter, after which it is undecided (fail open, or codes.Unavailable
// with WithFailClosed). The limiter runs under this deadline alone, on a
// context that keeps the call's values but not its deadline or
// cancellation: the client's grpc-timeout (200µs, say) never cuts a
// decision short, so it can neither skip the limit by failing it open nor
// make a healthy Redis look failed to the limiter's circuit breaker.
// Default: 100ms, far above a healthy round trip to Redis and short enough
// that an outage adds at most a tenth of a second to a call. The go-redis
// client must have ContextTimeoutEnabled for a deadline to cut a read
// short. A timeout that is not positive panics.
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithOnError sets a callback told of every error the interceptor meets:
// key and cost failures and limiter failures, whether the call then fails or
// goes through. Default: none.
func WithOnError(fn func(ctx context.Context, fullMethod string, err error)) Option {
	return func(c *config) { c.onError = fn }
}

// WithOnDenied sets a callback told of every denial, with the Result:
// enforced is true when the call then fails with ResourceExhausted, false
// in shadow mode (WithShadow), where the handler runs. Default: none.
func WithOnDenied(fn func(ctx context.Context, fullMethod string, res redlimit.Result, enforced bool)) Option {
	return func(c *config) { c.onDenied = fn }
}

// ErrNotEnforced is matched, in shadow mode, by every error the OnError
// callback is told of: the call went on.
var ErrNotEnforced = errors.New("grpclimit: shadow mode, not enforced")

// WithShadow turns on shadow mode, to roll out a new limit safely: every
// call is decided and counted as usual (the permits are taken, the
// limiter's observer sees the decision with Decision.Shadow set), but the
// handler always runs. A denial is told to OnDenied with enforced false;
// an error (no key, a bad cost, no decision) is told to OnError, matching
// ErrNotEnforced, whatever WithFailClosed says. Watch the share of shadow
// decisions that were denied (observer: Shadow && !Result.Allowed) before
// turning enforcement on. Default: off.
func WithShadow() Option { return func(c *config) { c.shadow = true } }

// limiter holds what both interceptors share.
type limiter struct {
	cfg   config
	l     redlimit.Limiter // nil with parts
	parts []Part           // the *All interceptors'; their Keys set
	// leases is set when a part's grants are leases, released when the
	// call ends.
	leases bool
}

func newLimiter(l redlimit.Limiter, opts []Option) *limiter {
	if nilcheck.IsNil(l) {
		panic(fmt.Sprintf("grpclimit: nil Limiter (%T): check the error of its constructor", l))
	}
	c := newConfig(PeerIP, opts)
	if c.keyFunc == nil {
		panic("grpclimit: WithKeyFunc(nil)")
	}
	return &limiter{cfg: c, l: l}
}

// newConfig applies opts to the defaults, with keyFunc as given, and
// panics on an invalid option.
func newConfig(keyFunc KeyFunc, opts []Option) config {
	c := config{
		keyFunc: keyFunc,
		cost:    func(context.Context, string) int { return 1 },
		timeout: 100 * time.Millisecond,
	}
	for _, opt := range opts {
		if opt == nil {
			panic("grpclimit: nil Option")
		}
		opt(&c)
	}
	switch {
	case c.cost == nil:
		panic("grpclimit: WithCost(nil)")
	case c.timeout <= 0:
		panic(fmt.Sprintf("grpclimit: WithTimeout(%v): must be positive", c.timeout))
	case c.keepAlive < 0:
		panic("grpclimit: WithKeepAlive: the interval must be positive")
	}
	return c
}

// check decides one call: nil lets it through, with the Grant of what it
// took (the zero Grant when it took nothing or went through undecided)
// and, for the *All interceptors, the indexes in lim.parts of the parts it
// decided, in AllowAll's order; else a status error. In shadow mode every
// call goes through. A denial marks the call's flight, so that the
// interceptors around this one give back what they took.
func (lim *limiter) check(ctx context.Context, method string) (redlimit.Grant, []int, error) {
	g, decided, err := lim.decide(ctx, method)
	if err != nil && lim.cfg.shadow {
		return g, decided, nil
	}
	if err != nil && status.Code(err) == codes.ResourceExhausted {
		if f, _ := ctx.Value(flightKey{}).(*flight); f != nil {
			f.denied = true
		}
	}
	return g, decided, err
}

// decide is check as enforced.
func (lim *limiter) decide(ctx context.Context, method string) (redlimit.Grant, []int, error) {
	var none redlimit.Grant
	c := &lim.cfg
	var key string
	var parts []redlimit.Part
	var decided []int // the index in lim.parts of each of parts
	var err error
	if lim.parts == nil {
		key, err = c.keyFunc(ctx, method)
		if err == nil && key == "" {
			err = errors.New("empty key")
		}
	} else {
		parts, decided, err = lim.partKeys(ctx, method)
	}
	if err != nil {
		lim.tell(ctx, method, err)
		if errors.Is(err, ErrMissingKey) {
			return none, nil, status.Error(codes.InvalidArgument, "missing rate limit key")
		}
		return none, nil, status.Error(codes.Internal, "no rate limit key")
	}
	cost := c.cost(ctx, method)
	if cost < 0 {
		lim.tell(ctx, method, fmt.Errorf("grpclimit: cost %d is negative", cost))
		return none, nil, status.Error(codes.Internal, "bad request cost")
	}
	if lim.parts != nil && len(parts) == 0 {
		return none, nil, nil // no part applies
	}
	// The client's grpc-timeout plays no part: see WithTimeout.
	decideCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	if c.shadow {
		decideCtx = shadow.With(decideCtx)
	}
	var res redlimit.Result
	if lim.parts == nil {
		res, err = lim.l.AllowN(decideCtx, key, cost)
	} else {
		res, err = redlimit.AllowAll(decideCtx, cost, parts...)
		if err != nil && res != (redlimit.Result{}) {
			// Denied, and giving back what the other parts took failed:
			// they stay taken until they lapse, stricter; the denial stands.
			lim.tell(ctx, method, fmt.Errorf("%w: %w", ErrRefund, err))
			err = nil
		}
		if err == nil {
			res.Part = decided[res.Part]
		}
	}
	if err != nil {
		lim.tell(ctx, method, err)
		if errors.Is(err, redlimit.ErrInvalidArgument) {
			// A key the limiter refuses (longer than 1024 bytes, say) is
			// the caller's input: never a reason to fail open.
			return none, nil, status.Error(codes.InvalidArgument, "invalid rate limit key")
		}
		if !c.failClosed {
			return none, nil, nil
		}
		st := status.New(codes.Unavailable, "rate limiter unavailable")
		if wait, ok := redlimit.RetryAfter(err); ok && wait > 0 {
			st = withRetry(st, wait)
		}
		return none, nil, st.Err()
	}
	if res.Allowed {
		return res.Grant, decided, nil
	}
	if c.onDenied != nil {
		c.onDenied(ctx, method, res, !c.shadow)
	}
	if res.RetryAfter == redlimit.Never {
		return none, nil, lim.withPart(status.Newf(codes.ResourceExhausted, "request exceeds the rate limit of %d", res.Limit), res).Err()
	}
	return none, nil, withRetry(lim.withPart(status.New(codes.ResourceExhausted, "rate limit exceeded"), res), res.RetryAfter).Err()
}

// withPart adds, for the *All interceptors, a QuotaFailure detail naming
// the part that denied res.
func (lim *limiter) withPart(st *status.Status, res redlimit.Result) *status.Status {
	if lim.parts == nil {
		return st
	}
	detailed, err := st.WithDetails(&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject:     lim.parts[res.Part].Name,
		Description: st.Message(),
	}}})
	if err != nil {
		return st // cannot happen with a QuotaFailure; the code still says it all
	}
	return detailed
}

// withRetry adds a RetryInfo detail to st.
func withRetry(st *status.Status, d time.Duration) *status.Status {
	detailed, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	if err != nil {
		return st // cannot happen with a RetryInfo; the code still says it all
	}
	return detailed
}

// tell hands err to the OnError callback, marked ErrNotEnforced in shadow
// mode.
func (lim *limiter) tell(ctx context.Context, method string, err error) {
	if lim.cfg.onError == nil {
		return
	}
	if lim.cfg.shadow {
		err = fmt.Errorf("%w: %w", ErrNotEnforced, err)
	}
	lim.cfg.onError(ctx, method, err)
}

// UnaryServerInterceptor limits unary calls with l; see the package
// documentation for the answers. It panics on a nil or typed-nil l or a bad
// option: programming errors, caught at start-up.
func UnaryServerInterceptor(l redlimit.Limiter, opts ...Option) grpc.UnaryServerInterceptor {
	return newLimiter(l, opts).unary
}

// unary is the unary interceptor.
func (lim *limiter) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	ctx, f := inFlight(ctx)
	g, decided, err := lim.check(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	if g.N() == 0 {
		return handler(ctx, req)
	}
	ch := lim.charge(ctx, info.FullMethod, g, decided)
	f.innermost = ch
	returned := false
	defer func() { lim.settleCall(ctx, info.FullMethod, f, ch, err, returned) }()
	resp, err = handler(ctx, req)
	returned = true
	return resp, err
}

// StreamServerInterceptor limits streams with l, once per stream when it
// opens; see the package documentation. It panics like
// UnaryServerInterceptor.
func StreamServerInterceptor(l redlimit.Limiter, opts ...Option) grpc.StreamServerInterceptor {
	return newLimiter(l, opts).stream
}

// stream is the stream interceptor.
func (lim *limiter) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	ctx, f := inFlight(ss.Context())
	g, decided, err := lim.check(ctx, info.FullMethod)
	if err != nil {
		return err
	}
	if g.N() == 0 {
		return handler(srv, contextStream{ss, ctx})
	}
	ch := lim.charge(ctx, info.FullMethod, g, decided)
	f.innermost = ch
	returned := false
	defer func() { lim.settleCall(ctx, info.FullMethod, f, ch, err, returned) }()
	err = handler(srv, contextStream{ss, ctx})
	returned = true
	return err
}

// charge returns the charge of a call granted g (on the parts decided):
// for a limiter whose grants are leases, or parts some of whose are, one
// that holds them until the call ends, renewed with WithKeepAlive.
func (lim *limiter) charge(ctx context.Context, method string, g redlimit.Grant, decided []int) *charge {
	ch := &charge{grant: g, inFlight: lim.leases}
	var extend extendFunc
	if l, ok := lim.l.(leaser); ok {
		ch.lease = true
		extend = l.ExtendGrant
	} else if lim.leases {
		extend = lim.extendParts(decided)
	}
	if extend != nil && lim.cfg.keepAlive > 0 {
		ch.stop = lim.keepAlive(ctx, method, extend, ch)
	}
	return ch
}
