package redlimit

// Issue 34's findings on the sliding limiters as regression tests: a key's
// time that clocks a little apart ratchet forward, one step of the clock
// back that frees a bucket, and a coarse first writer whose grid holds a
// finer configuration to a fraction of its limit (DESIGN "A key's time",
// property 8).

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Two instances share a key, one clock 1ms ahead of the other, and call in
// turn with almost no real time passing, around a bucket's boundary: the
// key grants what the two buckets the clocks read allow, never one more per
// boundary they cross (finding 1: 400 of 400 granted, as each call from the
// clock behind moved the key's time a bucket ahead).
func TestSlidingFindingSkewNoRatchet(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		make  slidingMaker
		start time.Duration // the first call's real time after epoch
		want  int
	}{
		// One window holds both clocks' buckets.
		{"window 20 per 1s in 100ms", slidingWindowMaker(20, time.Second, 100*ms), 99500 * us, 20},
		// The clock behind grants 1 in its hour; the one ahead then grants
		// in the next, and from then on every call decides there, at the
		// key's time (each clock's hour could have granted 10).
		{"log 10 an hour and 100 a day in 1h", slidingLogMaker(time.Hour,
			Strategy{10, time.Hour}, Strategy{100, 24 * time.Hour}), time.Hour - 500*us, 11},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, be backend) {
				ctx := context.Background()
				// The window's TTL is a second of fake time, which a loaded
				// machine's 400 calls can outlast in real time: the key
				// expired mid-trace and granted 33.
				be.keepKeys()
				real := epoch.Add(c.start)
				behind, err := c.make(be.rdb, WithClock(func() time.Time { return real }))
				require.NoError(t, err)
				ahead, err := c.make(be.rdb, WithClock(func() time.Time { return real.Add(time.Millisecond) }))
				require.NoError(t, err)
				granted := 0
				for i := range 400 {
					l := behind
					if i%2 == 1 {
						l = ahead
					}
					r, err := l.Allow(ctx, "k")
					require.NoError(t, err)
					if r.Allowed {
						granted++
					}
					real = real.Add(3 * us)
				}
				require.Equal(t, c.want, granted, "400 calls within 1.2ms of real time, clocks 1ms apart")
			})
		})
	}
}

// One step of the clock back frees nothing (finding 2): 11 per minute in
// 6s buckets, 10 granted at 0.5s and 1 at 54.0005s; a call at 53.9995s (a
// denial, or an n == 0 look), then 10 more asked at 54.001s: the window
// [0s, 60s) holds 11 already, so none is granted. The call from the clock
// behind decided at the key's time and wrote nothing.
func TestSlidingFindingStepBackFreesNothing(t *testing.T) {
	t.Parallel()
	makers := map[string]slidingMaker{
		"window": slidingWindowMaker(11, time.Minute, 6*time.Second),
		"log":    slidingLogMaker(6*time.Second, Strategy{11, time.Minute}, Strategy{100, time.Hour}),
	}
	for name, make := range makers {
		for _, look := range []int{1, 0} {
			t.Run(fmt.Sprintf("%s n=%d", name, look), func(t *testing.T) {
				forEachBackend(t, func(t *testing.T, be backend) {
					ctx := context.Background()
					clock := newClock()
					l, err := make(be.rdb, WithClock(clock.Now))
					require.NoError(t, err)
					allow := func(at time.Duration, n int) Result {
						clock.now = epoch.Add(at)
						r, err := l.AllowN(ctx, "k", n)
						require.NoError(t, err)
						return r
					}
					require.True(t, allow(500*ms, 10).Allowed)
					require.True(t, allow(54000500*us, 1).Allowed)
					r := allow(53999500*us, look)
					if look > 0 {
						require.False(t, r.Allowed, "the clock 1ms behind: the window holds 11: %+v", r)
						require.Equal(t, 6000500*us, r.RetryAfter, "until the grants at 0.5s leave, on this clock")
					}
					granted := 0
					for range 10 {
						if allow(54001*ms, 1).Allowed {
							granted++
						}
					}
					require.Zero(t, granted, "11 granted in [0s, 60s) already")
				})
			})
		}
	}
}

// A configuration alone on a shared key grants what it alone would, once
// another's grants left every window (finding 3): one grant under "10 a
// day in 1h buckets", then the plan becomes "10 a second in 100ms
// buckets". A day and more later, the new plan answers on that key as on
// a key it alone ever used, sampled every 10 minutes for an hour (where a
// key kept on the first writer's hour-long grid granted 10 an hour).
func TestSlidingFindingCoarseWriterEnds(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		clock, opts := prefixClock(be, "coarse")
		old, err := NewSlidingWindow(be.rdb, 10, 24*time.Hour, time.Hour, opts...)
		require.NoError(t, err)
		plan, err := NewSlidingWindow(be.rdb, 10, time.Second, 100*ms, opts...)
		require.NoError(t, err)
		r, err := old.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, r.Allowed)
		clock.Advance(25 * time.Hour)
		for sample := range 6 {
			for i := range 12 {
				want, err := plan.Allow(ctx, "alone")
				require.NoError(t, err)
				got, err := plan.Allow(ctx, "k")
				require.NoError(t, err)
				require.Equal(t, withoutGrant(want), withoutGrant(got), "sample %d, call %d", sample, i)
			}
			clock.Advance(10 * time.Minute)
		}
	})
}
