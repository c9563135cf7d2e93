package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/engine"
	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
)

// wantModel fails t unless res is what the model's want says.
func wantModel(t *testing.T, want model.Result, res Result, what string) {
	t.Helper()
	retry := time.Duration(want.RetryAfterUS) * us
	if want.RetryAfterUS == model.Never {
		retry = Never
	}
	got := Result{Allowed: res.Allowed, Limit: res.Limit, Remaining: res.Remaining, RetryAfter: res.RetryAfter, ResetAfter: res.ResetAfter}
	require.Equal(t, Result{
		Allowed:    want.Allowed,
		Limit:      int(want.Limit),
		Remaining:  int(want.Remaining),
		RetryAfter: retry,
		ResetAfter: time.Duration(want.ResetAfterUS) * us,
	}, got, "%s: the model's Result", what)
	require.Equal(t, want.Allowed && want.GrantID != 0, res.Grant.N() > 0, "%s: a Grant exactly when leases were taken", what)
}

// releaseGiven releases k leases of g through c's engine and returns how
// many places that freed, which Grant.Refund does not tell.
func releaseGiven(t *testing.T, c *Concurrency, g Grant, k int) int {
	t.Helper()
	_, key, token := engine.GrantParts(g)
	_, given, err := c.engine.Refund(context.Background(), key, token, k)
	require.NoError(t, err, "releasing %d of %v", k, g)
	return given
}

// TestConcurrencyAgreesWithModel runs random traces of grants, releases,
// extends and clock steps (forward, back within a lease, back by more: a
// clock gone wrong) against internal/model's Concurrency: every Result and
// every release's freed places must be the model's.
func TestConcurrencyAgreesWithModel(t *testing.T) {
	offset := testseed.Offset(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		b.keepKeys()
		ctx := context.Background()
		seen := map[string]int{} // what the traces did, so that a change of shape cannot hide it
		for trace := range 40 {
			seed := uint64(trace) + offset
			r := rand.New(rand.NewPCG(seed, 37))
			limit := 1 + r.IntN(4)
			lease := time.Duration(1+r.IntN(5)) * 10 * ms
			clock := newClock()
			c, err := NewConcurrency(b.rdb, limit, lease, WithClock(clock.Now))
			require.NoError(t, err)
			m := model.NewConcurrency(int64(limit), lease.Microseconds())
			key := fmt.Sprintf("trace-%d", trace)
			grants := map[int64]Grant{} // by the model's grant id
			var ids []int64
			pick := func() (int64, Grant, bool) {
				if len(ids) == 0 {
					return 0, Grant{}, false
				}
				id := ids[r.IntN(len(ids))]
				return id, grants[id], true
			}
			for step := range 80 {
				now := clock.Now().UnixMicro()
				if m.ClockWrong(now) {
					seen["clock gone wrong"]++
				}
				what := fmt.Sprintf("seed %d step %d at %dµs", seed, step, now-epoch.UnixMicro())
				switch op := r.IntN(10); {
				case op < 2:
					steps := []time.Duration{us, lease / 3, lease, 2 * lease, -lease / 2, -3 * lease}
					clock.Advance(steps[r.IntN(len(steps))] + time.Duration(r.IntN(3))*us)
				case op < 6:
					n := r.IntN(limit + 2)
					res, err := c.AllowN(ctx, key, n)
					require.NoError(t, err, what)
					want := m.Step(now, int64(n))
					wantModel(t, want, res, fmt.Sprintf("%s: AllowN(%d)", what, n))
					seen[fmt.Sprintf("AllowN allowed %v", want.Allowed)]++
					if want.GrantID != 0 {
						grants[want.GrantID] = res.Grant
						ids = append(ids, want.GrantID)
					}
				case op < 8:
					id, g, ok := pick()
					if !ok {
						continue
					}
					k := 1 + r.IntN(g.N())
					want := m.Refund(now, id, int64(k))
					require.Equal(t, int(want), releaseGiven(t, c, g, k), "%s: places freed by releasing %d of %v", what, k, g)
					seen[fmt.Sprintf("release freed some %v", want > 0)]++
				default:
					id, g, ok := pick()
					if !ok {
						continue
					}
					res, err := c.ExtendGrant(ctx, g)
					require.NoError(t, err, what)
					want, newID := m.Extend(now, id)
					wantModel(t, want, res, fmt.Sprintf("%s: ExtendGrant(%v)", what, g))
					seen[fmt.Sprintf("extend allowed %v, same grant %v", want.Allowed, newID == id)]++
					if want.Allowed && newID != id {
						grants[newID] = res.Grant
						ids = append(ids, newID)
					}
				}
			}
		}
		for _, outcome := range []string{"clock gone wrong", "AllowN allowed true", "AllowN allowed false",
			"release freed some true", "release freed some false", "extend allowed true, same grant true",
			"extend allowed true, same grant false", "extend allowed false, same grant true"} {
			require.NotZero(t, seen[outcome], "the traces never saw %q: %v", outcome, seen)
		}
	})
}
