package model

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Refunds of the fixed window, step by step: partial, retried, summing
// past the grant, from a clock behind, after the window closed, from a
// clock gone wrong, and past the records' bound.
func TestFixedWindowRefund(t *testing.T) {
	const L, W = 10, 1000
	m := NewFixedWindow(L, W)
	a := m.Step(10000, 4)
	b := m.Step(10100, 5)
	require.Equal(t, int64(1), b.Remaining)
	steps := []struct {
		at, id, k, given, remaining int64
		what                        string
	}{
		{10200, b.GrantID, 2, 2, 3, "2 of 5"},
		{10200, b.GrantID, 2, 0, 3, "the same again"},
		{10300, b.GrantID, 1, 0, 3, "less than given"},
		{10300, b.GrantID, 9, 3, 6, "past the grant: its other 3"},
		{9000, a.GrantID, 1, 1, 7, "from a clock behind: the key's window"},
		{5000, a.GrantID, 4, 0, 7, "from a clock gone wrong: nothing"},
		{11000, a.GrantID, 4, 0, 10, "the window closed: nothing"},
	}
	for _, s := range steps {
		require.Equal(t, s.given, m.Refund(s.at, s.id, s.k), s.what)
		require.Equal(t, s.remaining, m.Clone().Step(max(s.at, 10000), 0).Remaining, s.what)
	}
	require.Zero(t, m.Refund(11000, 12345, 1), "an unknown grant")

	// A window emptied by refunds stays open until its end.
	m = NewFixedWindow(L, W)
	g := m.Step(20000, 3)
	require.Equal(t, int64(3), m.Refund(20500, g.GrantID, 3))
	r := m.Step(20900, 10)
	require.True(t, r.Allowed)
	require.Equal(t, int64(100), r.ResetAfterUS, "the window of 20000")

	// 17 refunded grants: the oldest's record goes, and it gives nothing.
	m = NewFixedWindow(100, W)
	var ids []int64
	for range 20 {
		ids = append(ids, m.Step(30000, 2).GrantID)
	}
	for _, id := range ids[:17] {
		require.Equal(t, int64(1), m.Refund(30000, id, 1))
	}
	require.Zero(t, m.Refund(30000, ids[0], 2), "at the horizon")
	require.Equal(t, int64(1), m.Refund(30000, ids[1], 2), "after it")
	require.Equal(t, int64(2), m.Refund(30000, ids[19], 2), "never refunded, after the horizon")
}
