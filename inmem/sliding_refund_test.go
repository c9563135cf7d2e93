package inmem

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
)

// The in-process sliding log refunds as the script does: random traces of
// grants, denials, n == 0 and partial refunds (retried, summing past their
// grant, of buckets gone), the clock going back now and then, and now and
// then wrong, against the model.
func TestSlidingRefundTracesMatchModel(t *testing.T) {
	ctx := context.Background()
	offset := testseed.Offset(t)
	for trace := range 20 {
		seed := uint64(trace) + offset
		rng := rand.New(rand.NewPCG(seed, 35))
		P := int64(1+rng.IntN(4)) * 1000
		limits := []int64{int64(2 + rng.IntN(6))}
		windows := []int64{P * int64(1+rng.IntN(10))}
		if rng.IntN(2) == 0 {
			limits = append(limits, limits[0]*int64(2+rng.IntN(3)))
			windows = append(windows, windows[0]*int64(2+rng.IntN(3)))
		}
		var strategies []redlimit.Strategy
		for i := range limits {
			strategies = append(strategies, redlimit.Strategy{Limit: int(limits[i]), Window: time.Duration(windows[i]) * us})
		}
		clock := &fakeClock{now: epoch}
		l, err := NewSlidingLog(time.Duration(P)*us, strategies, WithClock(clock.Now))
		require.NoError(t, err)
		m := model.NewSlidingLog(P, limits, windows)
		W := windows[len(windows)-1]
		type grant struct {
			g  redlimit.Grant
			id int64
		}
		var grants []grant
		for i := range 400 {
			var stepUS int64
			switch p := rng.IntN(100); {
			case p < 30:
			case p < 85:
				stepUS = rng.Int64N(P + 1)
			case p < 93:
				stepUS = -rng.Int64N(W/2 + 1)
			case p < 95:
				stepUS = -W - 1 - rng.Int64N(3*W)
			default:
				stepUS = rng.Int64N(2 * W)
			}
			clock.Advance(time.Duration(stepUS) * us)
			where := fmt.Sprintf("trace %d (seed %d), by %dµs %v per %vµs, call %d at %v", trace, seed, P, limits, windows, i, clock.now.Sub(epoch))
			if len(grants) > 0 && rng.IntN(3) == 0 {
				g := grants[len(grants)-1-rng.IntN(min(len(grants), 6))]
				k := 1 + rng.IntN(g.g.N())
				require.NoError(t, g.g.Refund(ctx, k), where)
				m.Refund(clock.now.UnixMicro(), g.id, int64(k))
			}
			n := rng.IntN(int(limits[0]) + 2)
			got, err := l.AllowN(ctx, "k", n)
			require.NoError(t, err, where)
			want := m.Step(clock.now.UnixMicro(), int64(n))
			require.Equal(t, modelResult(want), withoutGrant(got), "%s: n=%d", where, n)
			require.Equal(t, want.GrantID != 0, got.Grant.N() != 0, "%s: a grant has a Grant", where)
			if want.GrantID != 0 {
				grants = append(grants, grant{got.Grant, want.GrantID})
			}
		}
	}
}

// Forty grants given back whole in a shuffled order, in four runs of ten
// separated by grants that stay, and more grants that stay between the
// refunds: the key ends exactly at its grants minus its refunds, as the
// script's (four ranges of refunded positions, never more than 16).
func TestSlidingRefundFortyShuffled(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(testseed.Offset(t), 39))
	clock := &fakeClock{now: epoch}
	l, err := NewSlidingWindow(500, time.Hour, time.Second, WithClock(clock.Now))
	require.NoError(t, err)
	var back []redlimit.Grant
	kept := 0
	grant := func(n int) redlimit.Grant {
		clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
		r, err := l.AllowN(ctx, "k", n)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		return r.Grant
	}
	remaining := func() int {
		r, err := l.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		return r.Remaining
	}
	for range 4 {
		for range 10 {
			back = append(back, grant(1+rng.IntN(3)))
		}
		n := 1 + rng.IntN(3)
		grant(n)
		kept += n
	}
	rng.Shuffle(len(back), func(i, j int) { back[i], back[j] = back[j], back[i] })
	for i, g := range back {
		clock.Advance(time.Duration(rng.IntN(500)) * time.Millisecond)
		require.NoError(t, g.Refund(ctx, g.N()))
		if i%5 == 0 {
			n := 1 + rng.IntN(3)
			grant(n)
			kept += n
		}
	}
	require.Equal(t, 500-kept, remaining(), "every refund gave back its grant")
	for _, g := range back {
		require.NoError(t, g.Refund(ctx, g.N()), "a retry")
	}
	require.Equal(t, 500-kept, remaining(), "a retried refund gives nothing")
}
