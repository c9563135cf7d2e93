package inmem

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/model"
)

// TestDifferentialClockBackwards is TestDifferential with a clock that
// also jumps back, for the windowed algorithms, whose reference models
// define what then happens: a window ends no later than its length from
// now; buckets from the future fold into now's; a shorter window of a
// sliding log takes back the buckets it had let go. (The buckets are left
// out: their model keeps an empty bucket's time and fills it when the clock
// goes back before it, where the script's key has expired and an in-process
// key is dropped; TestClockBackwards checks them by their bounds.)
func TestDifferentialClockBackwards(t *testing.T) {
	ctx := context.Background()
	for c := range 20 {
		seed := uint64(5000 + c)
		rng := rand.New(rand.NewPCG(seed, 0))
		for _, dc := range randomDiffCases(rng) {
			if strings.Contains(dc.name, "bucket") {
				continue
			}
			t.Run(fmt.Sprintf("seed%d/%s", seed, dc.name), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 1))
				clock := &fakeClock{now: epoch.Add(time.Duration(rng.Int64N(int64(time.Hour))))}
				l, err := dc.make(WithClock(clock.Now))
				require.NoError(t, err)
				dc.model.Reset()
				for i := range 2000 {
					step := timeStep(rng, dc.scale)
					if rng.IntN(8) == 0 {
						step = -step
					}
					clock.Advance(step)
					n := rng.IntN(4)
					if rng.IntN(10) < 6 {
						n = 1
					}
					got, err := l.AllowN(ctx, "k", n)
					require.NoError(t, err)
					m := dc.model.Step(clock.now.UnixMicro(), int64(n))
					want := redlimit.Result{Allowed: m.Allowed, Limit: int(m.Limit), Remaining: int(m.Remaining),
						RetryAfter: time.Duration(m.RetryAfterUS) * us, ResetAfter: time.Duration(m.ResetAfterUS) * us}
					if m.RetryAfterUS == model.Never {
						want.RetryAfter = redlimit.Never
					}
					require.Equal(t, want, got, "step %d (%v), n=%d", i, step, n)
				}
			})
		}
	}
}
