package engine

import (
	"context"
	"fmt"
)

// Grant is what one allowed call took: the limiter that made it (a
// Refunder), the key, the permits, and the token its script returned
// naming the grant in the key's state. It is a small comparable value; its
// zero value refers to nothing. The root package exports it as
// redlimit.Grant, where its use is documented.
type Grant struct {
	src   Refunder
	key   string
	token string
	n     int
}

// Refunder gives back permits of a grant it made: until n of the took
// permits of the grant named by key and token have been given back in
// all. Every limiter that returns Grants implements it; n is already
// checked (1 <= n <= took).
type Refunder interface {
	RefundGrant(ctx context.Context, key, token string, took, n int) error
}

// NewGrant returns the grant of n permits on key that src made, named by
// token in the key's state ("" where src needs no name).
func NewGrant(src Refunder, key string, n int, token string) Grant {
	return Grant{src: src, key: key, token: token, n: n}
}

// N is the number of permits g took; 0 for the zero Grant.
func (g Grant) N() int { return g.n }

// Refund gives back permits that g took until n of them in all have been
// given back: the total given back from one grant is the largest n any
// Refund of it asked for, never a sum, so a retried refund gives nothing
// more. n <= 0, n above what g took, the zero Grant or a nil ctx are
// ErrInvalidArgument, without a round trip.
func (g Grant) Refund(ctx context.Context, n int) error {
	if g.src == nil {
		return Errorf(ErrInvalidArgument, "redlimit: refund of the zero Grant: only an allowed call with n > 0 has a Grant to refund")
	}
	if ctx == nil {
		return Errorf(ErrInvalidArgument, "redlimit: refund: nil context (use context.Background())")
	}
	if n <= 0 || n > g.n {
		return Errorf(ErrInvalidArgument, "redlimit: refund of %d permits: must be from 1 to the %d the grant took", n, g.n)
	}
	return g.src.RefundGrant(ctx, g.key, g.token, g.n, n)
}

// Releaser is a Refunder whose grants hold something in flight (a
// Concurrency's leases): ReleaseGrant ends it, as a refund of all took
// permits would, while a grant of any other limiter holds nothing in
// flight and stays counted.
type Releaser interface {
	ReleaseGrant(ctx context.Context, key, token string, took int) error
}

// Release ends what g holds in flight and keeps what it counted: a
// Concurrency's leases are released (as Refund of every permit would), a
// group grant (AllowAll) releases the leases of its parts and keeps their
// other permits, and a grant of any other limiter is left as it is. The
// zero Grant holds nothing. A nil ctx is ErrInvalidArgument.
func (g Grant) Release(ctx context.Context) error {
	if ctx == nil {
		return Errorf(ErrInvalidArgument, "redlimit: release: nil context (use context.Background())")
	}
	if r, ok := g.src.(Releaser); ok {
		return r.ReleaseGrant(ctx, g.key, g.token, g.n)
	}
	return nil
}

// String describes g for logs: its permits and key, never its token.
func (g Grant) String() string {
	if g.src == nil {
		return "Grant{}"
	}
	return fmt.Sprintf("Grant{%d permits on %s}", g.n, QuoteKey(g.key))
}
