package inmem

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
)

// TestClockBackwards runs random traces whose clock also jumps back, and
// checks what DESIGN promises then: no panic, never more grants in any
// window than the limit allows (checked for the windows and buckets as the
// burst a key can give at one instant), and never a wait longer than the
// configuration allows.
func TestClockBackwards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(9, 9))
	for c := range 10 {
		for _, dc := range randomDiffCases(rng) {
			t.Run(fmt.Sprintf("%d/%s", c, dc.name), func(t *testing.T) {
				clock := &fakeClock{now: epoch}
				l, err := dc.make(WithClock(clock.Now))
				require.NoError(t, err)
				longest := 40 * dc.scale // the longest window or drain time of any case, with room
				for i := range 2000 {
					if rng.IntN(10) == 0 {
						clock.Advance(-timeStep(rng, dc.scale))
					} else {
						clock.Advance(timeStep(rng, dc.scale))
					}
					r, err := l.AllowN(ctx, "k", 1)
					require.NoError(t, err)
					if !r.Allowed {
						require.Positive(t, r.RetryAfter, "step %d", i)
						require.LessOrEqual(t, r.RetryAfter, longest, "step %d: a wait longer than the configuration allows", i)
					}
					require.LessOrEqual(t, r.ResetAfter, longest, "step %d", i)
					require.LessOrEqual(t, r.Remaining, r.Limit+30, "step %d", i)
				}
			})
		}
	}
}

// TestConcurrentGrantsExact has many goroutines drain one key of every
// limiter at one instant: exactly the limit is granted.
func TestConcurrentGrantsExact(t *testing.T) {
	clock := &fakeClock{now: epoch}
	mk := map[string]func() (redlimit.Limiter, error){
		"fixed_window": func() (redlimit.Limiter, error) { return NewFixedWindow(100, time.Minute, WithClock(clock.Now)) },
		"sliding_window": func() (redlimit.Limiter, error) {
			return NewSlidingWindow(100, time.Minute, time.Second, WithClock(clock.Now))
		},
		"sliding_log": func() (redlimit.Limiter, error) {
			return NewSlidingLog(time.Second, []redlimit.Strategy{{Limit: 100, Window: time.Minute}, {Limit: 1000, Window: time.Hour}}, WithClock(clock.Now))
		},
		"leaky_bucket": func() (redlimit.Limiter, error) {
			return NewLeakyBucket(100, redlimit.PerMinute(1), WithClock(clock.Now))
		},
		"token_bucket": func() (redlimit.Limiter, error) {
			return NewTokenBucket(100, redlimit.PerMinute(1), WithClock(clock.Now))
		},
	}
	for name, make := range mk {
		t.Run(name, func(t *testing.T) {
			l, err := make()
			require.NoError(t, err)
			var granted atomic.Int64
			var wg sync.WaitGroup
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 50 {
						if l.TryAcquire(context.Background(), "hot") == nil {
							granted.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			require.EqualValues(t, 100, granted.Load())
			err = l.TryAcquire(context.Background(), "hot")
			require.ErrorIs(t, err, redlimit.ErrAcquireFailed)
			var v *redlimit.ViolationStrategyError
			require.True(t, errors.As(err, &v))
			require.Equal(t, 100, v.Limit)
		})
	}
}

// TestMemoryBound checks that the number of keys held never passes the
// bound, and that a key whose own decision leaves it initial takes no room.
func TestMemoryBound(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: epoch}
	// The bound is kept per shard: a random seed spreads keys unevenly, so
	// a shard fills before the whole does.
	l, err := NewTokenBucket(2, redlimit.PerSecond(1), WithClock(clock.Now), WithMaxKeys(1000))
	require.NoError(t, err)
	for i := range 100_000 {
		_, err := l.Allow(ctx, fmt.Sprint("x", i))
		require.NoError(t, err)
	}
	require.LessOrEqual(t, l.store.len(), 1024, "at most WithMaxKeys, rounded up to the shards")

	n, err := NewFixedWindow(5, time.Second, WithClock(clock.Now))
	require.NoError(t, err)
	_, err = n.AllowN(ctx, "only-looking", 0)
	require.NoError(t, err)
	require.Zero(t, n.store.len())
}

// A key cut from a larger string (a header line, a request body) does not
// keep that string alive: the store holds a copy, so its memory is bounded
// by its keys, not by what they were cut from.
func TestKeysAreCopied(t *testing.T) {
	ctx := context.Background()
	l, err := NewFixedWindow(5, time.Hour)
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range 64 {
		line := strings.Repeat("x", 1<<20) + strconv.Itoa(i) // 1 MiB each
		_, err := l.Allow(ctx, line[1<<20-4:])
		require.NoError(t, err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	require.Equal(t, 64, l.store.len())
	require.Less(t, int64(after.HeapAlloc)-int64(before.HeapAlloc), int64(8<<20), "64 keys of about 6 bytes hold their 1 MiB lines")
	runtime.KeepAlive(l)
}

// TestChurnKeepsDeniedKey is the finding of a client that bought its
// denied key back by sending new keys until the bound evicted it: a key
// whose permits are spent is the last to go, for every algorithm, so it
// stays denied however many keys come after it.
func TestChurnKeepsDeniedKey(t *testing.T) {
	ctx := context.Background()
	strategies := []redlimit.Strategy{{Limit: 10, Window: time.Hour}, {Limit: 20, Window: 2 * time.Hour}}
	cases := map[string]func(opts ...Option) (redlimit.Limiter, error){
		"fixed_window": func(opts ...Option) (redlimit.Limiter, error) { return NewFixedWindow(10, time.Hour, opts...) },
		"sliding_window": func(opts ...Option) (redlimit.Limiter, error) {
			return NewSlidingWindow(10, time.Hour, time.Minute, opts...)
		},
		"sliding_log": func(opts ...Option) (redlimit.Limiter, error) {
			return NewSlidingLog(time.Minute, strategies, opts...)
		},
		"leaky_bucket": func(opts ...Option) (redlimit.Limiter, error) {
			return NewLeakyBucket(10, redlimit.PerHour(10), opts...)
		},
		"token_bucket": func(opts ...Option) (redlimit.Limiter, error) {
			return NewTokenBucket(10, redlimit.PerHour(10), opts...)
		},
	}
	for name, make := range cases {
		for _, maxKeys := range []int{20, 1000} {
			t.Run(fmt.Sprintf("%s/max%d", name, maxKeys), func(t *testing.T) {
				clock := &fakeClock{now: epoch}
				l, err := make(WithClock(clock.Now), WithMaxKeys(maxKeys))
				require.NoError(t, err)
				granted := 0
				for range 11 {
					if r, err := l.Allow(ctx, "A"); err == nil && r.Allowed {
						granted++
					}
				}
				require.Equal(t, 10, granted, "key A gets its 10 per hour")
				for i := range 5 * maxKeys {
					clock.Advance(time.Millisecond)
					r, err := l.Allow(ctx, fmt.Sprint("new-", i))
					require.NoError(t, err)
					require.True(t, r.Allowed, "new key %d", i)
					if i%maxKeys == 0 {
						r, err := l.Allow(ctx, "A")
						require.NoError(t, err)
						require.False(t, r.Allowed, "key A after %d new keys (bound %d): still denied: %+v", i+1, maxKeys, r)
					}
				}
				r, err := l.Allow(ctx, "A")
				require.NoError(t, err)
				require.False(t, r.Allowed, "key A after %d new keys (bound %d): still denied: %+v", 5*maxKeys, maxKeys, r)
			})
		}
	}
}

// TestEvictsInitialFirst: when room is needed, keys back in their initial
// state go before any key in use. Eviction looks at a sample of the
// shard's keys (sample, 8), so the test uses a shard no larger than the
// sample: the answer is then the same on every run, whatever order the map
// iterates in. (With a larger shard a sample may hold no ended key, and a
// key in use may go; that is the documented bound, not a bug.)
func TestEvictsInitialFirst(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: epoch}
	l, err := NewFixedWindow(2, time.Second, WithClock(clock.Now), WithMaxKeys(sample))
	require.NoError(t, err)
	require.Len(t, l.store.shards, 1, "one shard, no larger than the sample")
	for i := range sample - 1 {
		_, err := l.Allow(ctx, fmt.Sprint("old-", i))
		require.NoError(t, err)
	}
	clock.Advance(time.Second) // every old key's window ends
	_, err = l.Allow(ctx, "kept")
	require.NoError(t, err)
	for i := range sample - 1 {
		_, err := l.Allow(ctx, fmt.Sprint("new-", i))
		require.NoError(t, err)
	}
	require.Equal(t, sample, l.store.len())
	r, err := l.AllowN(ctx, "kept", 0)
	require.NoError(t, err)
	require.Equal(t, 1, r.Remaining, "the key in use kept its state while ended windows made room")
}

func TestInvalid(t *testing.T) {
	_, err := NewFixedWindow(0, time.Second)
	require.ErrorIs(t, err, redlimit.ErrInvalidConfig)
	_, err = NewSlidingWindow(5, 1500*time.Millisecond, time.Second)
	require.ErrorIs(t, err, redlimit.ErrInvalidConfig)
	_, err = NewSlidingLog(time.Second, []redlimit.Strategy{{Limit: 5, Window: time.Minute}, {Limit: 5, Window: time.Hour}})
	require.ErrorIs(t, err, redlimit.ErrInvalidConfig)
	_, err = NewTokenBucket(5, redlimit.Rate{Count: 1, Per: time.Microsecond})
	require.ErrorIs(t, err, redlimit.ErrInvalidConfig)
	if strconv.IntSize == 64 { // a 32-bit int cannot say more than 2^52
		twoTo52, largest := int64(1<<52), int64(math.MaxInt64)
		_, err = NewTokenBucket(5, redlimit.Rate{Count: int(twoTo52 + 1), Per: time.Second})
		require.ErrorIs(t, err, redlimit.ErrInvalidConfig, "a rate the scripts cannot count exactly")
		_, err = NewLeakyBucket(3, redlimit.Rate{Count: int(largest), Per: time.Second})
		require.ErrorIs(t, err, redlimit.ErrInvalidConfig, "a rate the scripts cannot count exactly")
	}
	_, err = NewTokenBucket(5, redlimit.PerSecond(1), WithClock(nil))
	require.ErrorIs(t, err, redlimit.ErrInvalidConfig)
	_, err = NewTokenBucket(5, redlimit.PerSecond(1), WithMaxKeys(0))
	require.ErrorIs(t, err, redlimit.ErrInvalidConfig)
	l, err := NewLeakyBucket(5, redlimit.PerSecond(1))
	require.NoError(t, err)
	_, err = l.AllowN(context.Background(), "", 1)
	require.ErrorIs(t, err, redlimit.ErrInvalidArgument)
	_, err = l.AllowN(context.Background(), "k", -1)
	require.ErrorIs(t, err, redlimit.ErrInvalidArgument)
}

// A limiter no constructor made (a zero value) answers ErrInvalidConfig,
// alone or as a Redis limiter's fallback, and never panics.
func TestZeroValues(t *testing.T) {
	ctx := context.Background()
	for _, l := range []redlimit.Limiter{&FixedWindow{}, &SlidingWindow{}, &SlidingLog{}, &LeakyBucket{}, &TokenBucket{}} {
		_, err := l.Allow(ctx, "k")
		require.ErrorIs(t, err, redlimit.ErrInvalidConfig, "%T", l)
		require.ErrorIs(t, l.TryAcquire(ctx, "k"), redlimit.ErrInvalidConfig, "%T", l)
		require.ErrorIs(t, l.Reset(ctx, "k"), redlimit.ErrInvalidConfig, "%T", l)
	}
}

func TestShare(t *testing.T) {
	require.Equal(t, 250, Share(1000, 4))
	require.Equal(t, 333, Share(1000, 3))
	require.Equal(t, 1, Share(2, 4))
	require.Equal(t, redlimit.Rate{Count: 10, Per: 4 * time.Second}, ShareRate(redlimit.PerSecond(10), 4))
}

// BenchmarkAllow measures one decision: on one hot key, and spread over
// 100k keys, for every algorithm.
func BenchmarkAllow(b *testing.B) {
	mk := []struct {
		name string
		make func() (redlimit.Limiter, error)
	}{
		{"fixed_window", func() (redlimit.Limiter, error) { return NewFixedWindow(1_000_000_000, time.Hour) }},
		{"sliding_window", func() (redlimit.Limiter, error) { return NewSlidingWindow(1_000_000_000, time.Minute, time.Second) }},
		{"sliding_log", func() (redlimit.Limiter, error) {
			return NewSlidingLog(time.Second, []redlimit.Strategy{{Limit: 1_000_000_000, Window: time.Minute}, {Limit: 2_000_000_000, Window: time.Hour}})
		}},
		{"leaky_bucket", func() (redlimit.Limiter, error) { return NewLeakyBucket(1_000_000_000, redlimit.PerSecond(1000)) }},
		{"token_bucket", func() (redlimit.Limiter, error) { return NewTokenBucket(1_000_000_000, redlimit.PerSecond(1000)) }},
	}
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%d", i)
	}
	ctx := context.Background()
	for _, m := range mk {
		b.Run(m.name+"/1key", func(b *testing.B) {
			l, _ := m.make()
			b.ReportAllocs()
			for b.Loop() {
				_, _ = l.Allow(ctx, "hot")
			}
		})
		b.Run(m.name+"/100k_keys", func(b *testing.B) {
			l, _ := m.make()
			for _, k := range keys {
				_, _ = l.Allow(ctx, k)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				_, _ = l.Allow(ctx, keys[i])
				if i++; i == len(keys) {
					i = 0
				}
			}
		})
	}
}

// Calls are checked as the Redis limiters check them: a key of 1 to
// MaxKeyBytes bytes, a ctx that is not nil and a clock from 2001 to 2112,
// else ErrInvalidArgument.
func TestCallArguments(t *testing.T) {
	newLimiters := map[string]func(opts ...Option) (redlimit.Limiter, error){
		"fixed window": func(opts ...Option) (redlimit.Limiter, error) { return NewFixedWindow(5, time.Second, opts...) },
		"sliding window": func(opts ...Option) (redlimit.Limiter, error) {
			return NewSlidingWindow(5, time.Second, 100*time.Millisecond, opts...)
		},
		"sliding log": func(opts ...Option) (redlimit.Limiter, error) {
			return NewSlidingLog(100*time.Millisecond, []redlimit.Strategy{{Limit: 5, Window: time.Second}}, opts...)
		},
		"leaky bucket": func(opts ...Option) (redlimit.Limiter, error) {
			return NewLeakyBucket(5, redlimit.PerSecond(1), opts...)
		},
		"token bucket": func(opts ...Option) (redlimit.Limiter, error) {
			return NewTokenBucket(5, redlimit.PerSecond(1), opts...)
		},
	}
	for name, newLimiter := range newLimiters {
		t.Run(name, func(t *testing.T) {
			for _, at := range []time.Time{time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)} {
				l, err := newLimiter(WithClock(func() time.Time { return at }))
				require.NoError(t, err)
				_, err = l.Allow(context.Background(), "k")
				require.ErrorIs(t, err, redlimit.ErrInvalidArgument, "a clock at %v, outside what the scripts take", at)
			}
			l, err := newLimiter()
			require.NoError(t, err)
			ctx := context.Background()
			_, err = l.Allow(ctx, strings.Repeat("k", redlimit.MaxKeyBytes))
			require.NoError(t, err, "a key of MaxKeyBytes")
			for _, key := range []string{strings.Repeat("k", redlimit.MaxKeyBytes+1), strings.Repeat("k", 1<<20)} {
				_, err = l.Allow(ctx, key)
				require.ErrorIs(t, err, redlimit.ErrInvalidArgument, "a key of %d bytes", len(key))
				require.Less(t, len(err.Error()), 200, "the error does not grow with the key")
				require.ErrorIs(t, l.Reset(ctx, key), redlimit.ErrInvalidArgument, "Reset of a key of %d bytes", len(key))
			}
			//lint:ignore SA1012 a nil ctx is what is tested
			_, err = l.Allow(nil, "k")
			require.ErrorIs(t, err, redlimit.ErrInvalidArgument, "a nil ctx, as for the Redis limiters")
		})
	}
}
