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

// The in-process fixed window refunds as the script does: random traces
// of grants, denials, n == 0 and partial refunds (retried, summing past
// their grant, of closed windows), the clock going back now and then,
// against the model.
func TestFixedWindowRefundTracesMatchModel(t *testing.T) {
	ctx := context.Background()
	offset := testseed.Offset(t)
	for trace := range 20 {
		seed := uint64(trace) + offset
		rng := rand.New(rand.NewPCG(seed, 35))
		limit := 2 + rng.IntN(30)
		window := time.Duration(1+rng.IntN(2000)) * time.Millisecond
		W := window.Microseconds()
		clock := &fakeClock{now: epoch}
		l, err := NewFixedWindow(limit, window, WithClock(clock.Now))
		require.NoError(t, err)
		m := model.NewFixedWindow(int64(limit), W)
		type grant struct {
			g  redlimit.Grant
			id int64
		}
		var grants []grant
		for i := range 500 {
			var stepUS int64
			switch p := rng.IntN(100); {
			case p < 40:
			case p < 80:
				stepUS = rng.Int64N(W/8 + 1)
			case p < 90:
				stepUS = -rng.Int64N(W/4 + 1)
			case p < 93:
				stepUS = -W - 1 - rng.Int64N(3*W)
			default:
				stepUS = rng.Int64N(2 * W)
			}
			clock.Advance(time.Duration(stepUS) * time.Microsecond)
			where := fmt.Sprintf("trace %d (seed %d), %d per %v, call %d at %v", trace, seed, limit, window, i, clock.now.Sub(epoch))
			if len(grants) > 0 && rng.IntN(3) == 0 {
				j := len(grants) - 1 - rng.IntN(min(len(grants), 4))
				g := grants[j]
				k := 1 + rng.IntN(g.g.N())
				require.NoError(t, g.g.Refund(ctx, k), where)
				m.Refund(clock.now.UnixMicro(), g.id, int64(k))
			}
			n := rng.IntN(limit/2 + 2)
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
