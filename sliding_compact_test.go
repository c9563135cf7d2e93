package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSlidingKeysStayCompact: every member of a sliding key stays within
// the 64 bytes of Redis's compact encoding (listpack, ziplist before 7.0)
// for limits up to 10^9 a window and counts to 10^8, so a key costs Redis
// about 150 bytes and not the kilobyte of a skiplist. Real Redis only:
// miniredis has no encodings.
func TestSlidingKeysStayCompact(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backend) {
		if be.name != "redis" {
			t.Skip("encodings and MEMORY USAGE are real Redis's")
		}
		ctx := context.Background()
		build := map[string]func(opts ...Option) (Limiter, error){
			"window": func(opts ...Option) (Limiter, error) {
				return NewSlidingWindow(be.rdb, 1_000_000_000, time.Minute, time.Second, opts...)
			},
			"log of two": func(opts ...Option) (Limiter, error) {
				return NewSlidingLog(be.rdb, time.Second, []Strategy{{1_000_000_000, time.Minute}, {2_000_000_000, time.Hour}}, opts...)
			},
		}
		for name, newLimiter := range build {
			for _, shared := range []bool{false, true} {
				clock := newClock()
				opts := []Option{WithClock(clock.Now)}
				if shared {
					opts = append(opts, WithPrefix("compact:"+name+":"))
				}
				l, err := newLimiter(opts...)
				require.NoError(t, err)
				key := redisKey(l, "k")
				r, err := l.AllowN(ctx, "k", 1)
				require.NoError(t, err)
				require.True(t, r.Allowed)
				used, err := be.rdb.MemoryUsage(ctx, key).Result()
				require.NoError(t, err)
				require.LessOrEqual(t, used, int64(256), "%s (shared %v): bytes after one grant", name, shared)
				// Ninety seconds of large grants: counts past 10^7, buckets
				// trimmed, windows remembered.
				for s := 0; s < 90; s++ {
					r, err := l.AllowN(ctx, "k", 1_000_000)
					require.NoError(t, err)
					require.True(t, r.Allowed, "%s at %ds", name, s)
					clock.Advance(time.Second)
				}
				encoding, err := be.rdb.ObjectEncoding(ctx, key).Result()
				require.NoError(t, err)
				require.Contains(t, []string{"listpack", "ziplist"}, encoding, "%s (shared %v): %v", name, shared,
					be.rdb.ZRangeWithScores(ctx, key, -4, -1).Val())
			}
		}
	})
}
