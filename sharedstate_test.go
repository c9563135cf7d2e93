package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/testseed"
)

// The state of the fixed window and the buckets, read by every
// configuration the same way (DESIGN property 8), changed by nothing but
// grants (property 10), and by a clock that goes back only as the reference
// model says.

// newBucket makes a leaky or a token bucket.
func newBucket(alg string, rdb redis.Scripter, capacity int, rate Rate, opts ...Option) (Limiter, error) {
	if alg == "leaky_bucket" {
		return NewLeakyBucket(rdb, capacity, rate, opts...)
	}
	return NewTokenBucket(rdb, capacity, rate, opts...)
}

// A bucket's level drains at the rate that wrote it, whoever reads it:
// Y = (10 at 10/s) grants 10, then X = (10 at 1/min) on the same key at
// the same instant grants nothing (Y alone grants 10). Once Y's level has
// drained at Y's rate, X grants its 10, which drain at X's rate.
func TestBucketLevelDrainsAtWritersRate(t *testing.T) {
	t.Parallel()
	for _, alg := range []string{"leaky_bucket", "token_bucket"} {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newClock()
				opts := []Option{WithPrefix("rates:"), WithClock(clock.Now)}
				y, err := newBucket(alg, b.rdb, 10, PerSecond(10), opts...)
				require.NoError(t, err)
				x, err := newBucket(alg, b.rdb, 10, PerMinute(1), opts...)
				require.NoError(t, err)

				r, err := y.AllowN(ctx, "k", 10)
				require.NoError(t, err)
				require.True(t, r.Allowed, "Y grants its burst: %+v", r)
				for i := range 10 {
					r, err := x.Allow(ctx, "k")
					require.NoError(t, err)
					require.False(t, r.Allowed, "X's call %d at the instant Y spent the bucket: %+v", i, r)
				}
				r, err = x.AllowN(ctx, "k", 0)
				require.NoError(t, err)
				require.Equal(t, Result{Allowed: true, Limit: 10, ResetAfter: time.Second}, r,
					"X reads Y's level, which drains at Y's 10/s")

				clock.Advance(time.Second)
				r, err = x.AllowN(ctx, "k", 10)
				require.NoError(t, err)
				require.True(t, r.Allowed, "Y's level drained in 1s: %+v", r)
				require.Equal(t, 10*time.Minute, r.ResetAfter, "X's level drains at X's 1/min")
				r, err = y.Allow(ctx, "k")
				require.NoError(t, err)
				require.Equal(t, Result{Limit: 10, RetryAfter: time.Minute, ResetAfter: 10 * time.Minute}, r,
					"Y reads X's level at X's rate: one permit a minute")
			})
		})
	}
}

// twinConfig draws a random configuration of alg with its limit or capacity.
func twinConfig(alg string, rng *rand.Rand) (func(rdb redis.Scripter, opts ...Option) (Limiter, error), int, string) {
	limit := 1 + rng.IntN(10)
	if alg == "fixed_window" {
		window := time.Duration(1+rng.IntN(20))*time.Second + time.Duration(rng.IntN(1000))*time.Millisecond
		return func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewFixedWindow(rdb, limit, window, opts...)
		}, limit, fmt.Sprintf("fixed_window(%d per %v)", limit, window)
	}
	rate := Rate{Count: 1 + rng.IntN(5), Per: time.Duration(1+rng.IntN(10))*time.Second + time.Duration(rng.IntN(1000))*time.Millisecond}
	return func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
		return newBucket(alg, rdb, limit, rate, opts...)
	}, limit, fmt.Sprintf("%s(%d at %d per %v)", alg, limit, rate.Count, rate.Per)
}

// Two keys with the same grants, by random configurations sharing a
// prefix; one also gets random calls that grant nothing (n == 0, requests
// above the capacity, requests one above Remaining) by any of them. Every
// later answer on the two is the same (DESIGN property 10).
func TestTwinKeysAnswerAlike(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	for ai, alg := range []string{"fixed_window", "leaky_bucket", "token_bucket"} {
		t.Run(alg, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				b.keepKeys()
				for trace := range 4 {
					rng := rand.New(rand.NewPCG(uint64(trace)+offset, uint64(ai)))
					clock := newClock()
					prefix := fmt.Sprintf("twin:%s:%d:", alg, trace)
					var limiters []Limiter
					var limits []int
					var descs []string
					for range 2 + rng.IntN(2) {
						make, limit, desc := twinConfig(alg, rng)
						l, err := make(b.rdb, WithPrefix(prefix), WithClock(clock.Now))
						require.NoError(t, err)
						limiters, limits, descs = append(limiters, l), append(limits, limit), append(descs, desc)
					}
					for step := range 150 {
						clock.Advance(time.Duration(rng.Int64N(int64(2 * time.Second))).Truncate(time.Microsecond))
						for range rng.IntN(3) {
							i := rng.IntN(len(limiters))
							switch rng.IntN(3) {
							case 0:
								r, err := limiters[i].AllowN(ctx, "extra", 0)
								require.NoError(t, err)
								require.True(t, r.Allowed)
							case 1:
								r, err := limiters[i].AllowN(ctx, "extra", limits[i]+1+rng.IntN(3))
								require.NoError(t, err)
								require.False(t, r.Allowed)
							default:
								r, err := limiters[i].AllowN(ctx, "extra", 0)
								require.NoError(t, err)
								r, err = limiters[i].AllowN(ctx, "extra", r.Remaining+1)
								require.NoError(t, err)
								require.False(t, r.Allowed, "one more than Remaining")
							}
						}
						i, n := rng.IntN(len(limiters)), 1+rng.IntN(3)
						want, err := limiters[i].AllowN(ctx, "plain", n)
						require.NoError(t, err)
						got, err := limiters[i].AllowN(ctx, "extra", n)
						require.NoError(t, err)
						require.Equal(t, withoutGrant(want), withoutGrant(got), "trace %d step %d: %s asks %d; configurations %v", trace, step, descs[i], n, descs)
					}
				}
			})
		})
	}
}

// Random traces of one configuration whose clock also jumps back, against
// the reference model fed every call as the scripts keep state
// (model.StepStored): every call decides (the key is always read as ours)
// and answers as the model does, and only a grant, or a call that finds the
// clock gone back past the state (clamped as the model clamps it), changes
// the key.
func TestClockBackTracesMatchModel(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	type step struct {
		atUS int64
		n    int64
	}
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		b.keepKeys()
		for c := range 3 {
			seed := uint64(7000+c) + offset
			rng := rand.New(rand.NewPCG(seed, 0))
			for _, dc := range randomDiffCases(rng) {
				if dc.name[0] == 's' { // the sliding scripts are not this file's
					continue
				}
				t.Run(fmt.Sprintf("seed%d/%s", seed, dc.name), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(seed, 1))
					clock := &fakeClock{now: epoch.Add(time.Duration(rng.Int64N(int64(time.Hour))))}
					prefix := fmt.Sprintf("back:%d:", c)
					l, err := dc.make(b.rdb, WithClock(clock.Now), WithPrefix(prefix))
					require.NoError(t, err)
					require.NoError(t, l.Reset(ctx, "k"))
					var history []step
					latestUS := int64(0) // the latest time a call changed the key
					for i := range 250 {
						move := timeStep(rng, dc.scale)
						if rng.IntN(6) == 0 {
							move = -move
						}
						clock.Advance(move)
						n := int64(rng.IntN(4))
						if rng.IntN(10) < 6 {
							n = 1
						}
						before := b.rdb.Get(ctx, prefix+"k").Val()
						got, err := l.AllowN(ctx, "k", int(n))
						require.NoError(t, err, "step %d: a key the limiter wrote is read as its own", i)
						now := clock.now.UnixMicro()
						dc.model.Reset()
						history = append(history, step{now, n})
						var m model.Result
						for _, s := range history {
							m = model.StepStored(dc.model, s.atUS, s.n)
						}
						want := Result{Allowed: m.Allowed, Limit: int(m.Limit), Remaining: int(m.Remaining),
							RetryAfter: time.Duration(m.RetryAfterUS) * us, ResetAfter: time.Duration(m.ResetAfterUS) * us}
						if m.RetryAfterUS == model.Never {
							want.RetryAfter = Never
						}
						require.Equal(t, want, withoutGrant(got), "step %d (%v) at +%dµs, n=%d", i, move, now-epoch.UnixMicro(), n)
						if b.rdb.Get(ctx, prefix+"k").Val() != before {
							require.True(t, (got.Allowed && n > 0) || now < latestUS,
								"step %d: only a grant, or a call after the clock went back, changes the key", i)
							latestUS = max(latestUS, now)
						}
					}
				})
			}
		}
	})
}

// A call that only looks (n == 0), or asks above every limit, at a key back
// in its initial state leaves it as it was: when the clock then goes back
// into the time the key was in use, what it granted counts again, as the
// in-process limiters and the model stepped as the scripts keep state
// (model.StepStored) have it. Found by TestClockBackTracesMatchModel with
// other seeds, whose model then forgot an ended fixed window.
func TestClockBackAfterLook(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		make  func(redis.Scripter, ...Option) (Limiter, error)
		burst int
	}{
		{"fixed_window", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewFixedWindow(rdb, 3, time.Second, opts...)
		}, 3},
		{"sliding_window", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingWindow(rdb, 3, time.Second, 100*time.Millisecond, opts...)
		}, 3},
		{"sliding_log", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingLog(rdb, 100*time.Millisecond, []Strategy{{Limit: 3, Window: time.Second}, {Limit: 6, Window: 2 * time.Second}}, opts...)
		}, 3},
		{"leaky_bucket", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewLeakyBucket(rdb, 1, PerSecond(1), opts...)
		}, 1},
		{"token_bucket", func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewTokenBucket(rdb, 1, PerSecond(1), opts...)
		}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, be backend) {
				ctx := context.Background()
				be.keepKeys()
				for _, look := range []int{0, c.burst + 1} {
					clock := newClock()
					l, err := c.make(be.rdb, WithClock(clock.Now), WithPrefix(fmt.Sprintf("look:%s:%d:", c.name, look)))
					require.NoError(t, err)
					r, err := l.AllowN(ctx, "k", c.burst)
					require.NoError(t, err)
					require.True(t, r.Allowed, "a fresh key grants its burst")
					clock.Advance(2 * time.Second)
					r, err = l.AllowN(ctx, "k", look)
					require.NoError(t, err)
					require.Equal(t, c.burst, r.Remaining, "n=%d 2s later: the key is back to its initial state: %+v", look, r)
					clock.Advance(-1500 * time.Millisecond)
					r, err = l.Allow(ctx, "k")
					require.NoError(t, err)
					require.False(t, r.Allowed, "n=%d, then the clock back to 0.5s after the burst: %+v", look, r)
					require.Equal(t, 500*ms, r.RetryAfter, "n=%d: the wait as at 0.5s after the burst", look)
				}
			})
		})
	}
}

// Twin keys whose clock also goes back, for every algorithm: b also gets
// calls that grant nothing (n == 0, above the capacity, above Remaining),
// by any configuration sharing the prefix and at other times than the
// calls both get, before them or after. Those calls change the state only
// where the clock went back (DESIGN property 10; "Time going backwards"),
// and then only towards later time: at the first answer that differs, b is
// the looser, never the stricter (docs/internals.md, "Clock moved back",
// says where a sliding key further on may trim sooner and then answer a
// longer window more strictly; these traces do not meet it). A sliding
// key's time stands still at its last grant; folding its buckets into
// now's, with a trim that depends on the configuration and the time of the
// call, would make b the stricter.
func TestTwinKeysClockBack(t *testing.T) {
	t.Parallel()
	offset := testseed.Offset(t)
	algorithms := []string{"sliding_window", "sliding_log", "fixed_window", "leaky_bucket", "token_bucket"}
	traces := 100
	if testing.Short() {
		traces = 25
	}
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		be.keepKeys()
		differed := 0
		for tr := range traces {
			alg := algorithms[tr%len(algorithms)]
			rng := rand.New(rand.NewPCG(uint64(tr)+offset, 23))
			clock := newClock()
			prefix := fmt.Sprintf("twinback:%d:", tr)
			var names []string
			var limiters []Limiter
			var limits []int
			for range 2 + rng.IntN(2) {
				var make func(redis.Scripter, ...Option) (Limiter, error)
				var name string
				var limit int
				if alg == "sliding_window" || alg == "sliding_log" {
					var sliding slidingMaker
					name, sliding, limit = randomSlidingConfig(rng, alg == "sliding_window")
					make = sliding
				} else {
					make, limit, name = twinConfig(alg, rng)
				}
				l, err := make(be.rdb, WithPrefix(prefix), WithClock(clock.Now))
				require.NoError(t, err)
				names, limiters, limits = append(names, name), append(limiters, l), append(limits, limit)
			}
			// The sliding configurations have windows of milliseconds.
			scale := 1500 * us
			if alg != "sliding_window" && alg != "sliding_log" {
				scale = 2 * time.Second
			}
			move := func() {
				d := time.Duration(rng.Int64N(int64(scale))).Truncate(us)
				if rng.IntN(4) == 0 {
					d = -2 * d
				}
				clock.Advance(d)
			}
			for step := range 200 {
				move()
				c := rng.IntN(len(limiters))
				n := rng.IntN(limits[c] + 1)
				a, err := limiters[c].AllowN(ctx, "a", n)
				require.NoError(t, err)
				b, err := limiters[c].AllowN(ctx, "b", n)
				require.NoError(t, err, "trace %d step %d: a key the limiter wrote is read as its own", tr, step)
				// At the first answer that differs, b must be the looser;
				// the two then have different grants, and the trace ends.
				looser := func(a, b Result, what string) bool {
					if a == b {
						return false
					}
					stricter := (a.Allowed && !b.Allowed) ||
						(a.Allowed == b.Allowed && (b.Remaining < a.Remaining || (!a.Allowed && b.RetryAfter > a.RetryAfter)))
					require.False(t, stricter, "%s trace %d step %d: %s: without the extra calls %+v, with them %+v (configurations %v)",
						alg, tr, step, what, a, b, names)
					differed++
					return true
				}
				if looser(a, b, fmt.Sprintf("%s asks %d", names[c], n)) {
					break
				}
				if rng.IntN(2) == 0 {
					move()
				}
				if a, b, differ := twinExtraCalls(t, rng, limiters, limits); differ && looser(a, b, "a grant on b made on a too") {
					break
				}
			}
		}
		t.Logf("%d traces: %d differed, b the looser", traces, differed)
	})
}

// twinExtraCalls makes up to two calls on key b alone that grant nothing,
// or grant and are then made on a as well, so that the grants on the two
// stay the same: n == 0, above the configuration's limit, or any n up to
// it (denied above Remaining). When a grant on b is answered otherwise on
// a, the grants differ from then on: it stops and returns the two answers.
func twinExtraCalls(t *testing.T, rng *rand.Rand, limiters []Limiter, limits []int) (a, b Result, differ bool) {
	t.Helper()
	ctx := context.Background()
	for range rng.IntN(3) {
		c := rng.IntN(len(limiters))
		n := []int{0, limits[c] + 1 + rng.IntN(3), 1 + rng.IntN(limits[c])}[rng.IntN(3)]
		b, err := limiters[c].AllowN(ctx, "b", n)
		require.NoError(t, err)
		if b.Allowed && n > 0 {
			a, err := limiters[c].AllowN(ctx, "a", n)
			require.NoError(t, err)
			if a != b {
				return a, b, true
			}
		}
	}
	return Result{}, Result{}, false
}
