package inmem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
)

// wantLeaseModel fails t unless res is the model's want.
func wantLeaseModel(t *testing.T, want model.Result, res redlimit.Result, what string) {
	t.Helper()
	retry := time.Duration(want.RetryAfterUS) * us
	if want.RetryAfterUS == model.Never {
		retry = redlimit.Never
	}
	require.Equal(t, redlimit.Result{
		Allowed: want.Allowed, Limit: int(want.Limit), Remaining: int(want.Remaining),
		RetryAfter: retry, ResetAfter: time.Duration(want.ResetAfterUS) * us,
	}, redlimit.Result{
		Allowed: res.Allowed, Limit: res.Limit, Remaining: res.Remaining,
		RetryAfter: res.RetryAfter, ResetAfter: res.ResetAfter,
	}, "%s: the model's Result", what)
	require.Equal(t, want.Allowed && want.GrantID != 0, res.Grant.N() > 0, "%s: a Grant exactly when leases were taken", what)
}

// TestConcurrencyAgreesWithModel runs random traces of grants, releases,
// extends and clock steps (back by more than a lease included) against
// internal/model's Concurrency; after each release, an n == 0 call must
// see what the model sees.
func TestConcurrencyAgreesWithModel(t *testing.T) {
	ctx := context.Background()
	offset := testseed.Offset(t)
	seen := map[string]int{}
	for trace := range 200 {
		seed := uint64(trace) + offset
		r := rand.New(rand.NewPCG(seed, 37))
		limit := 1 + r.IntN(4)
		lease := time.Duration(1+r.IntN(5)) * 10 * ms
		clock := &fakeClock{now: epoch}
		l, err := NewConcurrency(limit, lease, WithClock(clock.Now))
		require.NoError(t, err)
		m := model.NewConcurrency(int64(limit), lease.Microseconds())
		grants := map[int64]redlimit.Grant{}
		var ids []int64
		for step := range 80 {
			now := clock.Now().UnixMicro()
			wrong := m.ClockWrong(now)
			if wrong {
				seen["clock gone wrong"]++
			}
			what := fmt.Sprintf("seed %d step %d", seed, step)
			switch op := r.IntN(10); {
			case op < 2:
				steps := []time.Duration{us, lease / 3, lease, 2 * lease, -lease / 2, -3 * lease}
				clock.Advance(steps[r.IntN(len(steps))] + time.Duration(r.IntN(3))*us)
			case op < 6:
				n := r.IntN(limit + 2)
				res, err := l.AllowN(ctx, "k", n)
				require.NoError(t, err, what)
				want := m.Step(now, int64(n))
				wantLeaseModel(t, want, res, fmt.Sprintf("%s: AllowN(%d)", what, n))
				seen[fmt.Sprintf("allowed %v", want.Allowed)]++
				if want.GrantID != 0 && wrong {
					seen["grant on a clock gone wrong"]++
				}
				if want.GrantID != 0 {
					grants[want.GrantID], ids = res.Grant, append(ids, want.GrantID)
				}
			case op < 8 && len(ids) > 0:
				id := ids[r.IntN(len(ids))]
				k := 1 + r.IntN(grants[id].N())
				require.NoError(t, grants[id].Refund(ctx, k), what)
				seen[fmt.Sprintf("release freed some %v", m.Refund(now, id, int64(k)) > 0)]++
				res, err := l.AllowN(ctx, "k", 0)
				require.NoError(t, err, what)
				wantLeaseModel(t, m.Step(now, 0), res, fmt.Sprintf("%s: after releasing %d", what, k))
			case len(ids) > 0:
				id := ids[r.IntN(len(ids))]
				res, err := l.ExtendGrant(ctx, grants[id])
				require.NoError(t, err, what)
				want, newID := m.Extend(now, id)
				wantLeaseModel(t, want, res, what+": ExtendGrant")
				seen[fmt.Sprintf("extend allowed %v, same grant %v", want.Allowed, newID == id)]++
				if want.Allowed && newID != id {
					grants[newID], ids = res.Grant, append(ids, newID)
				}
			}
		}
	}
	for _, outcome := range []string{"clock gone wrong", "allowed true", "allowed false",
		"release freed some true", "release freed some false", "extend allowed true, same grant true",
		"extend allowed true, same grant false", "extend allowed false, same grant true", "grant on a clock gone wrong"} {
		require.NotZero(t, seen[outcome], "the traces never saw %q: %v", outcome, seen)
	}
}

// TestConcurrencyBadConfig: a limit below 1 or above
// redlimit.MaxConcurrencyLimit, or a lease below 1ms, is ErrInvalidConfig
// naming the field.
func TestConcurrencyBadConfig(t *testing.T) {
	for _, tc := range []struct {
		limit int
		lease time.Duration
		field string
	}{
		{0, time.Second, "limit 0"},
		{redlimit.MaxConcurrencyLimit + 1, time.Second, "limit 10001"},
		{1, time.Millisecond - 1, "lease 999.999µs"},
	} {
		_, err := NewConcurrency(tc.limit, tc.lease)
		require.ErrorIs(t, err, redlimit.ErrInvalidConfig, tc.field)
		require.ErrorContains(t, err, tc.field)
	}
}

// TestConcurrencyGrantOfAnotherLimiter: ExtendGrant refuses a Grant it did
// not make, and the zero Grant.
func TestConcurrencyGrantOfAnotherLimiter(t *testing.T) {
	ctx := context.Background()
	a, err := NewConcurrency(1, time.Second)
	require.NoError(t, err)
	b, err := NewConcurrency(1, time.Second)
	require.NoError(t, err)
	res, err := a.Allow(ctx, "k")
	require.NoError(t, err)
	_, err = b.ExtendGrant(ctx, res.Grant)
	require.True(t, errors.Is(err, redlimit.ErrInvalidArgument), "extending a's grant through b: %v", err)
	_, err = b.ExtendGrant(ctx, redlimit.Grant{})
	require.ErrorIs(t, err, redlimit.ErrInvalidArgument)
}
