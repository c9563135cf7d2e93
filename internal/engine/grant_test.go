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
