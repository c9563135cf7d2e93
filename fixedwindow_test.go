package redlimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A default key holds the fixed window's short form: step by step, on
// either side of a count of 91 (where the value stops being one integer
// that Redis keeps in the least memory), the Result and the stored value
// are format 3's (format 2's), the TTL is never extended, and a full window denies
// until its end without writing.
func TestFixedWindowShortFormExact(t *testing.T) {
	t.Parallel()
	const limit = 120
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newClock()
		l, err := NewFixedWindow(b.rdb, limit, time.Minute, WithClock(clock.Now))
		require.NoError(t, err)
		key := keyPrefix(l) + "k"
		end := epoch.Add(time.Second + time.Minute) // the first grant is a second in
		count := 0
		// n of 1 and of more, across the count of 91.
		for _, n := range []int{1, 1, 3, 40, 1, 45, 1, 1, 2, 5, 1, 19} {
			clock.Advance(time.Second)
			ttlBefore := b.rdb.PTTL(ctx, key).Val()
			r, err := l.AllowN(ctx, "k", n)
			require.NoError(t, err)
			count += n
			require.True(t, r.Allowed, "n=%d at count %d", n, count-n)
			assert.Equal(t, limit-count, r.Remaining, "Remaining at count %d", count)
			assert.Equal(t, end.Sub(clock.now), r.ResetAfter, "ResetAfter at count %d", count)
			assert.Equal(t, fmt.Sprintf("%d%016d3", count, end.UnixMicro()), b.rdb.Get(ctx, key).Val(), "the short form at count %d", count)
			if ttlBefore > 0 {
				assert.LessOrEqual(t, b.rdb.PTTL(ctx, key).Val(), ttlBefore, "TTL not extended at count %d", count)
			}
		}
		require.Equal(t, limit, count)
		full := b.rdb.Get(ctx, key).Val()

		// Full: denied for one permit and for more, until the window ends.
		clock.Advance(10 * time.Second)
		for _, n := range []int{1, 2, 1} {
			r, err := l.AllowN(ctx, "k", n)
			require.NoError(t, err)
			assert.False(t, r.Allowed, "n=%d on a full window", n)
			assert.Equal(t, 0, r.Remaining)
			assert.Equal(t, end.Sub(clock.now), r.RetryAfter, "n=%d: RetryAfter is the window's end", n)
			assert.Equal(t, end.Sub(clock.now), r.ResetAfter, "n=%d", n)
			assert.Equal(t, full, b.rdb.Get(ctx, key).Val(), "a denial writes nothing")
		}
		r, err := l.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		assert.True(t, r.Allowed)
		assert.Equal(t, 0, r.Remaining)

		// The window ends: the next grant opens a new one.
		clock.now = end
		r, err = l.Allow(ctx, "k")
		require.NoError(t, err)
		assert.True(t, r.Allowed, "a new window at its end")
		assert.Equal(t, limit-1, r.Remaining)
		assert.Equal(t, fmt.Sprintf("1%016d3", end.Add(time.Minute).UnixMicro()), b.rdb.Get(ctx, key).Val())
	})
}

// A short form whose count is above this configuration's limit (a format 2
// value another limit wrote under a shared prefix) is denied like a full
// window, and its Remaining is 0.
func TestFixedWindowCountAboveLimitDenied(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newClock()
		l, err := NewFixedWindow(b.rdb, 10, time.Minute, WithPrefix("fw:"), WithClock(clock.Now))
		require.NoError(t, err)
		value := fmt.Sprintf("12%016d3", epoch.Add(30*time.Second).UnixMicro())
		require.NoError(t, b.rdb.Set(ctx, "fw:k", value, 30*time.Second).Err())
		r, err := l.Allow(ctx, "k")
		require.NoError(t, err)
		assert.False(t, r.Allowed, "count 12 of a limit of 10")
		assert.Equal(t, 0, r.Remaining)
		assert.Equal(t, 30*time.Second, r.RetryAfter)
		assert.Equal(t, value, b.rdb.Get(ctx, "fw:k").Val(), "a denial writes nothing")
	})
}
