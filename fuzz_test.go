//go:build !386 && !arm && !mips && !mipsle

// Limits up to 2^40 need a 64-bit int: on 32-bit platforms int cannot hold
// them, and these tests of the bounds do not build there.

package redlimit

// Hostile input: fuzz targets for every constructor (any ints and durations
// give an error or a working limiter, never a panic) and for keys (any bytes
// are handled, and a call on one key never touches another). Run one with
//
//	go test -run '^$' -fuzz '^FuzzNewFixedWindow$' -fuzztime 30s .
//
// Without -fuzz, go test runs their seeds as ordinary tests.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// fuzzRedis returns a client on a miniredis that lives as long as the fuzz
// target (one per fuzzing process), and a function that empties it: each
// input starts from nothing, so that a failure reproduces on its own.
func fuzzRedis(f *testing.F) (*redis.Client, func()) {
	m := miniredis.RunT(f)
	return newMiniClient(f, m), m.FlushAll
}

// fuzzCall checks a constructor's outcome and, for a limiter, one AllowN:
// a bad configuration is ErrInvalidConfig with a message that says so; a
// good one decides, and its Result keeps every promise of the contract.
// limits are the configured limits, smallest first.
func fuzzCall(t *testing.T, l Limiter, err error, limits []int, key string, n int) {
	t.Helper()
	if err != nil {
		require.ErrorIs(t, err, ErrInvalidConfig, "a constructor may only fail with ErrInvalidConfig")
		require.True(t, strings.HasPrefix(err.Error(), "redlimit: "), "error %q must say where it comes from", err)
		return
	}
	// Only a hung call should reach the deadline: a minute, which a
	// loaded machine meets.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := l.AllowN(ctx, key, n)
	if key == "" || len(key) > MaxKeyBytes || n < 0 {
		require.ErrorIs(t, err, ErrInvalidArgument, "key of %d bytes, n %d", len(key), n)
		return
	}
	require.NoError(t, err, "a valid limiter must decide key %q, n %d", key, n)
	require.Contains(t, limits, r.Limit, "Limit must be a configured limit")
	require.GreaterOrEqual(t, r.Remaining, 0)
	require.LessOrEqual(t, r.Remaining, limits[len(limits)-1], "Remaining above the largest limit")
	require.GreaterOrEqual(t, r.ResetAfter, time.Duration(0))
	switch {
	case n == 0:
		require.True(t, r.Allowed, "n == 0 is always allowed")
		require.Zero(t, r.RetryAfter)
	case n > limits[0]:
		require.False(t, r.Allowed, "n %d above the limit %d", n, limits[0])
		require.Equal(t, Never, r.RetryAfter, "n above the limit can never be allowed")
	case r.Allowed:
		require.Zero(t, r.RetryAfter, "an allowed call has RetryAfter 0")
	default:
		require.Positive(t, r.RetryAfter, "a denial of n <= limit must say when to retry")
		require.LessOrEqual(t, r.RetryAfter, r.ResetAfter, "a retry comes no later than the full reset")
	}
}

// fuzzSeeds are durations (ns) worth starting from: zero, negative, below
// 1ms, not whole µs, ordinary, and around the largest window (2^44 µs).
var fuzzSeeds = []int64{0, -1, 999_999, 1_000_001, int64(time.Millisecond), int64(time.Second),
	int64(time.Hour), (1 << 44) * 1000, (1<<44)*1000 + 1000, 1<<63 - 1, -1 << 63}

func FuzzNewFixedWindow(f *testing.F) {
	for _, d := range fuzzSeeds {
		f.Add(3, d, "k", 1)
	}
	f.Add(1<<40, int64(time.Hour), "k", 1<<40)
	f.Add(1<<40+1, int64(time.Hour), "k", 1)
	f.Add(-5, int64(time.Second), "", -1)
	rdb, flush := fuzzRedis(f)
	f.Fuzz(func(t *testing.T, limit int, window int64, key string, n int) {
		flush()
		l, err := NewFixedWindow(rdb, limit, time.Duration(window))
		fuzzCall(t, l, err, []int{limit}, key, n)
	})
}

func FuzzNewSlidingWindow(f *testing.F) {
	for _, d := range fuzzSeeds {
		f.Add(3, d, int64(time.Millisecond), "k", 1)
		f.Add(3, int64(time.Second), d, "k", 2)
	}
	f.Add(1<<40, (1<<44)*int64(1000), int64(time.Millisecond), "k", 1)
	rdb, flush := fuzzRedis(f)
	f.Fuzz(func(t *testing.T, limit int, window, precision int64, key string, n int) {
		flush()
		l, err := NewSlidingWindow(rdb, limit, time.Duration(window), time.Duration(precision))
		fuzzCall(t, l, err, []int{limit}, key, n)
	})
}

func FuzzNewSlidingLog(f *testing.F) {
	for _, d := range fuzzSeeds {
		f.Add(int64(time.Millisecond), 3, d, 10, int64(time.Minute), uint8(2), "k", 1)
	}
	f.Add(int64(time.Second), 10, int64(time.Second), 500, int64(time.Hour), uint8(2), "k", 11)
	f.Add(int64(time.Second), 10, int64(time.Minute), 5, int64(time.Second), uint8(2), "k", 1)
	f.Add(int64(time.Second), 10, int64(time.Second), 20, int64(time.Second), uint8(2), "k", 1)
	f.Add(int64(time.Second), 10, int64(time.Second), 20, int64(time.Minute), uint8(0), "k", 1)
	rdb, flush := fuzzRedis(f)
	f.Fuzz(func(t *testing.T, precision int64, limit1 int, window1 int64, limit2 int, window2 int64, count uint8, key string, n int) {
		flush()
		strategies := []Strategy{{limit1, time.Duration(window1)}, {limit2, time.Duration(window2)}}[:min(int(count), 2)]
		l, err := NewSlidingLog(rdb, time.Duration(precision), strategies)
		var limits []int
		for _, s := range strategies {
			limits = append(limits, s.Limit)
		}
		slices.Sort(limits)
		fuzzCall(t, l, err, limits, key, n)
	})
}

func FuzzNewLeakyBucket(f *testing.F) {
	for _, d := range fuzzSeeds {
		f.Add(10, 3, d, "k", 1)
	}
	f.Add(1<<40, 1, int64(time.Millisecond), "k", 1)
	f.Add(1<<40, 1, int64(time.Hour), "k", 1)
	f.Add(10, 0, int64(time.Second), "k", 1)
	f.Add(10, 7, int64(time.Second), "k", 11)
	rdb, flush := fuzzRedis(f)
	f.Fuzz(func(t *testing.T, capacity, count int, per int64, key string, n int) {
		flush()
		l, err := NewLeakyBucket(rdb, capacity, Rate{Count: count, Per: time.Duration(per)})
		fuzzCall(t, l, err, []int{capacity}, key, n)
	})
}

func FuzzNewTokenBucket(f *testing.F) {
	for _, d := range fuzzSeeds {
		f.Add(10, 3, d, "k", 1)
	}
	f.Add(1<<40, 1, int64(time.Millisecond), "k", 1)
	f.Add(3, 1<<62, int64(time.Millisecond), "k", 3)
	f.Add(10, -1, int64(time.Second), "k", 1)
	rdb, flush := fuzzRedis(f)
	f.Fuzz(func(t *testing.T, capacity, count int, per int64, key string, n int) {
		flush()
		l, err := NewTokenBucket(rdb, capacity, Rate{Count: count, Per: time.Duration(per)})
		fuzzCall(t, l, err, []int{capacity}, key, n)
	})
}

// hostileKeys are keys that stress how a key travels to Redis and back.
func hostileKeys() map[string]string {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	return map[string]string{
		"every byte":            string(all),
		"NUL":                   "\x00",
		"NUL inside":            "a\x00b",
		"invalid UTF-8":         "\xff\xfe\xc0\x80",
		"emoji":                 "🚦👩‍👩‍👧‍👦",
		"right to left":         "\u202eמשתמש\u202c",
		"combining":             "e\u0301",
		"precomposed":           "\u00e9",
		"newline and CR":        "user\r\n1",
		"spaces":                " ",
		"lua pattern":           "%d+$^(.-)[%a]",
		"looks like a prefix":   "redlimit:fw:victim",
		"hash tag":              "{victim}",
		"longest":               strings.Repeat("k", MaxKeyBytes),
		"longest, last differs": strings.Repeat("k", MaxKeyBytes-1) + "j",
	}
}

// TestHostileKeys runs every algorithm, on miniredis and redis-server, with
// keys of any bytes: each is its own key, stored as exactly prefix + key,
// and exhausting it leaves every other key alone.
func TestHostileKeys(t *testing.T) {
	t.Parallel()
	const limit = 2
	forEachBackend(t, func(t *testing.T, b backend) {
		for _, alg := range algorithms {
			t.Run(alg.name, func(t *testing.T) {
				prefix := "hostile:" + alg.name + ":"
				l, err := alg.new(b.rdb, limit, forever, WithPrefix(prefix))
				require.NoError(t, err)
				// Keys over 64 KiB (none since keys are at most
				// MaxKeyBytes) would time out on miniredis.
				relHostile(t, b.rdb, l, prefix, limit, b.mini == nil)
			})
		}
	})
}

// relHostile exhausts each hostile key in turn and checks that it is stored
// under exactly prefix + key and that no other key moved.
func relHostile(t *testing.T, rdb *redis.Client, l Limiter, prefix string, limit int, huge bool) {
	t.Helper()
	ctx := context.Background()
	keys := hostileKeys()
	for name, key := range keys {
		if len(key) > 1<<16 && !huge {
			delete(keys, name)
		}
	}
	keys["victim"] = "victim"
	_, err := l.AllowN(ctx, "victim", 1)
	require.NoError(t, err)
	for name, key := range keys {
		if key == "victim" {
			continue
		}
		r, err := l.AllowN(ctx, key, limit)
		require.NoError(t, err, "%s: a key of any bytes is a key", name)
		require.True(t, r.Allowed, "%s: a fresh key has its whole limit", name)
		r, err = l.AllowN(ctx, key, 1)
		require.NoError(t, err, "%s", name)
		require.False(t, r.Allowed, "%s: exhausted", name)
		n, err := rdb.Exists(ctx, prefix+key).Result()
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "%s: state must live under exactly prefix + key", name)

		victim, err := l.AllowN(ctx, "victim", 0)
		require.NoError(t, err)
		require.Equal(t, limit-1, victim.Remaining, "%s: another key's state must not move", name)
	}
	// Keys differing in the last of a million bytes, or by normalisation
	// only, are different keys: every one was fresh above. Reset clears
	// exactly its own.
	for name, key := range keys {
		require.NoError(t, l.Reset(ctx, key), "%s: reset", name)
		n, err := rdb.Exists(ctx, prefix+key).Result()
		require.NoError(t, err)
		require.Zero(t, n, "%s: reset must delete prefix + key", name)
	}
}

// FuzzKeys: any key, under every algorithm, is decided on its own state
// and leaves a victim key alone; Reset removes exactly it.
func FuzzKeys(f *testing.F) {
	for _, k := range hostileKeys() {
		if len(k) < 1024 {
			f.Add(k)
		}
	}
	f.Add("")
	f.Add("victim")
	rdb, _ := fuzzRedis(f)
	limiters := newLimiters(f, rdb, 3, forever)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, key string) {
		for i, l := range limiters {
			name := algorithms[i].name
			require.NoError(t, l.Reset(ctx, "victim"))
			r, err := l.AllowN(ctx, "victim", 2)
			require.NoError(t, err)
			require.True(t, r.Allowed)

			r, err = l.AllowN(ctx, key, 1)
			if key == "" || len(key) > MaxKeyBytes {
				require.ErrorIs(t, err, ErrInvalidArgument, "%s: key of %d bytes", name, len(key))
				require.ErrorIs(t, l.Reset(ctx, key), ErrInvalidArgument, "%s: reset of a key of %d bytes", name, len(key))
				continue
			}
			require.NoError(t, err, "%s: key %q", name, key)
			victim, err := l.AllowN(ctx, "victim", 0)
			require.NoError(t, err)
			want := 1
			if key == "victim" {
				want = 0
			}
			require.Equal(t, want, victim.Remaining, "%s: key %q moved the victim's state", name, key)
			require.NoError(t, l.Reset(ctx, key), "%s: reset %q", name, key)
			if key != "victim" {
				victim, err = l.AllowN(ctx, "victim", 0)
				require.NoError(t, err)
				require.Equal(t, 1, victim.Remaining, "%s: Reset(%q) moved the victim's state", name, key)
			}
		}
	})
}

// fuzzLimiter builds a limiter of the registry's algorithm alg (mod 5)
// from fuzzed numbers, on a clock, and returns its limits, smallest first:
// limit per period a, shaped by b (the sliding algorithms' precision, the
// buckets' refill count 1 + b%1000).
func fuzzLimiter(rdb redis.Scripter, alg uint8, limit int, a, b int64, clock func() time.Time) (Limiter, []int, error) {
	algo := algorithms[alg%5]
	// One prefix per algorithm: the configuration-change targets mean two
	// configurations on one key, which default keys would keep apart.
	l, err := algo.shaped(rdb, limit, time.Duration(a), shape{precision: time.Duration(b), count: int(1 + b%1000)},
		WithClock(clock), WithPrefix(fmt.Sprintf("fuzz:%d:", alg%5)))
	return l, algo.limits(limit), err
}

// FuzzConfigChange: a key used under one configuration, then decided under
// another of the same algorithm (a deploy that changes limits), after the
// clock moved forward or back. State is clamped, never rejected, and the
// Result keeps every promise.
func FuzzConfigChange(f *testing.F) {
	sec, ms := int64(time.Second), int64(time.Millisecond)
	for alg := range uint8(5) {
		f.Add(alg, 10, sec, 100*ms, 10, 3, sec, 100*ms, 0, int64(0))
		f.Add(alg, 10, sec, 100*ms, 7, 3, 2*sec, 200*ms, 1, 50*ms)
		f.Add(alg, 3, sec, 100*ms, 3, 10, sec/2, 50*ms, 2, -sec)
		f.Add(alg, 5, 60*sec, sec, 5, 5, 60*sec, 10*sec, 1, -30*sec)
	}
	rdb, flush := fuzzRedis(f)
	f.Fuzz(func(t *testing.T, alg uint8, limit1 int, a1, b1 int64, used, limit2 int, a2, b2 int64, n int, step int64) {
		flush()
		clock := newClock()
		before, limits1, err := fuzzLimiter(rdb, alg, limit1, a1, b1, clock.Now)
		if err != nil {
			return // constructors are fuzzed on their own
		}
		after, limits2, err := fuzzLimiter(rdb, alg, limit2, a2, b2, clock.Now)
		if err != nil {
			return
		}
		ctx := context.Background()
		if used = min(max(used, 0), limits1[0]); used > 0 {
			r, err := before.AllowN(ctx, "k", used)
			require.NoError(t, err)
			require.True(t, r.Allowed, "%d of a fresh limit of %d", used, limits1[0])
		}
		clock.Advance(time.Duration(min(max(step, -int64(time.Hour)), int64(time.Hour))))
		fuzzCall(t, after, nil, limits2, "k", n)
	})
}
