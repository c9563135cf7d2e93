package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// countingRefunder records the refunds that reach it.
type countingRefunder struct{ calls []int }

func (c *countingRefunder) RefundGrant(_ context.Context, _, _ string, _, n int) error {
	c.calls = append(c.calls, n)
	return nil
}

func TestGrantRefundChecksItsArguments(t *testing.T) {
	src := &countingRefunder{}
	g := NewGrant(src, "k", 3, "tok")
	for _, tc := range []struct {
		name string
		g    Grant
		ctx  context.Context
		n    int
	}{
		{"the zero Grant", Grant{}, context.Background(), 1},
		{"n of 0", g, context.Background(), 0},
		{"n below 0", g, context.Background(), -1},
		{"n above what the grant took", g, context.Background(), 4},
		{"a nil ctx", g, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.g.Refund(tc.ctx, tc.n)
			require.True(t, errors.Is(err, ErrInvalidArgument), "Refund(%d) of %v: want ErrInvalidArgument, got %v", tc.n, tc.g, err)
		})
	}
	require.Empty(t, src.calls, "a refund refused for its arguments must not reach the limiter")

	require.NoError(t, g.Refund(context.Background(), 3))
	require.NoError(t, g.Refund(context.Background(), 1))
	require.Equal(t, []int{3, 1}, src.calls, "valid refunds reach the limiter with the n asked for: the limiter keeps the largest")
	require.Equal(t, 3, g.N())
	require.Equal(t, 0, Grant{}.N())
}

func TestGrantsAreComparable(t *testing.T) {
	src := &countingRefunder{}
	a, b := NewGrant(src, "k", 3, "tok"), NewGrant(src, "k", 3, "tok")
	require.True(t, a == b, "two grants of the same limiter, key, permits and token are equal")
	require.False(t, a == NewGrant(src, "k", 3, "other"), "grants with other tokens differ")
	require.Equal(t, "Grant{}", Grant{}.String())
	require.Equal(t, `Grant{3 permits on "k"}`, a.String(), "String never shows the token")
}

// A refund's ARGV[2] is "=<k>:<token>", which spares the script the reads
// of the state it would reply, only for a script that takes it
// (BareRefunds) and when no observer reads that state; else "-<k>:<token>".
func TestRefundMark(t *testing.T) {
	for _, tc := range []struct {
		bare, observed bool
		want           string
	}{
		{false, false, "-2:tok"},
		{true, false, "=2:tok"},
		{true, true, "-2:tok"},
		{false, true, "-2:tok"},
	} {
		cfg := Config{Algorithm: "test", Prefix: "p:", BareRefunds: tc.bare}
		if tc.observed {
			cfg.Observe = func(Event) {}
		}
		req, err := New(nil, cfg).refundRequest(context.Background(), "k", "tok", 2)
		require.NoError(t, err)
		require.Equal(t, tc.want, req.refund, "BareRefunds %v, observed %v", tc.bare, tc.observed)
	}
}
