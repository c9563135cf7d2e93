package engine

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// t0 is an arbitrary instant the cache tests count from.
var t0 = time.Unix(1_800_000_000, 0)

// denied is a denial as a script would report it.
func denied(remaining int64, retry, reset time.Duration, strategy int) Reply {
	return Reply{Remaining: remaining, RetryAfter: retry, ResetAfter: reset, Strategy: strategy, Stable: Never}
}

func TestDenyCacheLookup(t *testing.T) {
	c := newDenyCache(4, 3)
	_, ok := c.lookup("k", 1, t0)
	require.False(t, ok, "an empty cache should answer nothing")

	stored := denied(1, 100*time.Millisecond, 300*time.Millisecond, 2)
	c.store("k", 2, stored, t0, t0, c.begin("k"))

	tests := []struct {
		name   string
		key    string
		n      int
		at     time.Duration // after t0
		hit    bool
		retry  time.Duration
		resetA time.Duration
	}{
		{name: "same n at once", key: "k", n: 2, hit: true, retry: 100 * time.Millisecond, resetA: 300 * time.Millisecond},
		{name: "fewer permits go to Redis", key: "k", n: 1},
		{name: "n == 0 goes to Redis", key: "k", n: 0},
		{name: "other key", key: "other", n: 2},
		{name: "more permits go to Redis: only it knows their longer wait", key: "k", n: 3},
		{name: "counted down", key: "k", n: 2, at: 40 * time.Millisecond, hit: true, retry: 60 * time.Millisecond, resetA: 260 * time.Millisecond},
		{name: "rounded up to the µs", key: "k", n: 2, at: 1500 * time.Nanosecond, hit: true,
			retry: 100*time.Millisecond - time.Microsecond, resetA: 300*time.Millisecond - time.Microsecond},
		{name: "a nanosecond in", key: "k", n: 2, at: time.Nanosecond, hit: true, retry: 100 * time.Millisecond, resetA: 300 * time.Millisecond},
		{name: "last nanosecond", key: "k", n: 2, at: 100*time.Millisecond - time.Nanosecond, hit: true, retry: time.Microsecond, resetA: 200*time.Millisecond + time.Microsecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := c.lookup(tc.key, tc.n, t0.Add(tc.at))
			require.Equal(t, tc.hit, ok, "lookup(%q, n=%d) at t0+%v: hit", tc.key, tc.n, tc.at)
			if !tc.hit {
				require.Equal(t, Reply{}, got, "a miss should return a zero Reply")
				return
			}
			want := stored
			want.RetryAfter, want.ResetAfter = tc.retry, tc.resetA
			require.Equal(t, want, got, "lookup(%q, n=%d) at t0+%v: the stored denial, durations counted down and rounded up to the µs", tc.key, tc.n, tc.at)
		})
	}
}

func TestDenyCacheExpiry(t *testing.T) {
	c := newDenyCache(4, 3)
	c.store("k", 1, denied(0, 100*time.Millisecond, 100*time.Millisecond, 0), t0, t0, c.begin("k"))
	_, ok := c.lookup("k", 1, t0.Add(100*time.Millisecond))
	require.False(t, ok, "once RetryAfter has passed the request should go to Redis")
	require.Empty(t, c.entries, "an expired entry should be dropped on lookup")
	require.Zero(t, c.lru.Len(), "an expired entry should leave the LRU list too")
}

func TestDenyCacheResetAfterNotBelowRetryAfter(t *testing.T) {
	// A reply whose ResetAfter is shorter than its RetryAfter must not make
	// the cache report a key back to its initial state before it may retry.
	c := newDenyCache(4, 3)
	c.store("k", 1, denied(0, 100*time.Millisecond, 50*time.Millisecond, 0), t0, t0, c.begin("k"))
	got, ok := c.lookup("k", 1, t0.Add(10*time.Millisecond))
	require.True(t, ok, "the denial should be cached")
	require.Equal(t, 90*time.Millisecond, got.RetryAfter, "RetryAfter counted down")
	require.Equal(t, 90*time.Millisecond, got.ResetAfter, "ResetAfter should be raised to RetryAfter")
}

func TestDenyCacheStoreSkips(t *testing.T) {
	tests := []struct {
		name  string
		reply Reply
	}{
		{name: "allowed", reply: Reply{Allowed: true, Remaining: 1, ResetAfter: time.Second}},
		{name: "never", reply: denied(3, Never, time.Second, 0)},
		{name: "no wait", reply: denied(0, 0, time.Second, 0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newDenyCache(4, 3)
			c.store("k", 1, tc.reply, t0, t0, c.begin("k"))
			_, ok := c.lookup("k", 1, t0)
			require.False(t, ok, "a reply %+v should not be cached", tc.reply)
			require.Empty(t, c.entries, "nothing should be stored")
		})
	}
}

func TestDenyCacheStoreReplaces(t *testing.T) {
	c := newDenyCache(4, 3)
	c.store("k", 3, denied(0, time.Second, time.Second, 0), t0, t0, c.begin("k"))
	c.store("k", 1, denied(0, 10*time.Millisecond, time.Second, 0), t0, t0, c.begin("k"))
	require.Len(t, c.entries, 1, "one entry per key")
	require.Equal(t, 1, c.lru.Len(), "one list element per key")
	got, ok := c.lookup("k", 1, t0)
	require.True(t, ok, "the newer denial, for 1 permit, should answer a request for 1")
	require.Equal(t, 10*time.Millisecond, got.RetryAfter, "the newer denial's RetryAfter")
}

func TestDenyCacheForget(t *testing.T) {
	c := newDenyCache(4, 3)
	c.store("a", 1, denied(0, time.Second, time.Second, 0), t0, t0, c.begin("a"))
	c.store("b", 1, denied(0, time.Second, time.Second, 0), t0, t0, c.begin("b"))
	c.forget("a")
	c.forget("missing") // a no-op
	_, ok := c.lookup("a", 1, t0)
	require.False(t, ok, "a forgotten key should go to Redis")
	_, ok = c.lookup("b", 1, t0)
	require.True(t, ok, "forget should leave other keys alone")
	require.Len(t, c.entries, 1, "one entry left")
	require.Equal(t, 1, c.lru.Len(), "one list element left")
}

func TestDenyCacheEviction(t *testing.T) {
	c := newDenyCache(2, 3)
	deny := denied(0, time.Second, time.Second, 0)
	has := func(key string) bool {
		_, ok := c.lookup(key, 1, t0)
		return ok
	}
	c.store("a", 1, deny, t0, t0, c.begin("a"))
	c.store("b", 1, deny, t0, t0, c.begin("b"))
	c.store("c", 1, deny, t0, t0, c.begin("c"))
	require.False(t, has("a"), "the oldest entry should be evicted by the third key")
	require.True(t, has("b"), "b should stay")
	require.True(t, has("c"), "c should stay")

	c.store("b", 1, deny, t0, t0, c.begin("b")) // stored again: now the newest
	c.store("d", 1, deny, t0, t0, c.begin("d"))
	require.False(t, has("c"), "c, now the least recently stored, should be evicted")
	require.True(t, has("b"), "b was stored again and should stay")
	require.True(t, has("d"), "d should stay")
	require.Len(t, c.entries, 2, "never more entries than the size")
	require.Equal(t, 2, c.lru.Len(), "never more list elements than the size")
}

func TestDenyCacheSizeIsABoundNotAnAllocation(t *testing.T) {
	// WithDenyCache(size) caps the entries; a generous cap should cost
	// nothing until denials fill it.
	const size = 1 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := newDenyCache(size, 3)
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	require.Less(t, allocated, uint64(1<<20), "newDenyCache(%d, 3) allocated %d bytes up front; want the map to grow with its entries", size, allocated)
	runtime.KeepAlive(c)
}

func TestDenyCacheClockBackwards(t *testing.T) {
	// A WithClock clock may go back. A cached denial must then never tell a
	// caller to wait longer than the denial it was made from: the limiters
	// themselves clamp their state so that a key is never locked out for
	// longer than its configuration allows.
	c := newDenyCache(4, 3)
	c.store("k", 1, denied(0, 100*time.Millisecond, 100*time.Millisecond, 0), t0, t0, c.begin("k"))
	got, ok := c.lookup("k", 1, t0.Add(-time.Hour))
	if ok {
		require.LessOrEqual(t, got.RetryAfter, 100*time.Millisecond,
			"with the clock an hour back, a cached denial of RetryAfter 100ms should go to Redis or wait at most 100ms, not %v", got.RetryAfter)
	}
}

func TestDenyCacheConcurrent(t *testing.T) {
	c := newDenyCache(8, 3)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				key := fmt.Sprintf("k%d", (g+i)%16)
				now := t0.Add(time.Duration(i) * time.Millisecond)
				switch i % 3 {
				case 0:
					c.store(key, 1, denied(0, 5*time.Millisecond, 10*time.Millisecond, 0), now, now, c.begin(key))
				case 1:
					if r, ok := c.lookup(key, 1, now); ok && (r.Allowed || r.RetryAfter <= 0) {
						t.Errorf("lookup(%q) returned %+v, want a denial with a time to wait", key, r)
					}
				default:
					c.forget(key)
				}
			}
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, len(c.entries), 8, "never more entries than the size")
	require.Equal(t, len(c.entries), c.lru.Len(), "map and list should agree")
}

func TestCeilMicro(t *testing.T) {
	tests := []struct{ in, want time.Duration }{
		{0, 0},
		{time.Nanosecond, time.Microsecond},
		{999 * time.Nanosecond, time.Microsecond},
		{time.Microsecond, time.Microsecond},
		{time.Microsecond + time.Nanosecond, 2 * time.Microsecond},
		{time.Second - time.Nanosecond, time.Second},
		{time.Second, time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.in.String(), func(t *testing.T) {
			require.Equal(t, tc.want, ceilMicro(tc.in), "ceilMicro(%v) rounds up to the µs", tc.in)
		})
	}
}

// heapAlloc returns the live heap after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// The cache is bounded in bytes whatever the keys' length: an attacker who
// picks the keys (10 KiB each, all different) cannot grow it past
// size × maxEntryBytes (608). It used to keep size entries of any
// length: 100,000 denials on 10 KiB keys held about 1 GiB.
func TestDenyCacheMemoryBound(t *testing.T) {
	const size = 20_000
	c := newDenyCache(size, 3)
	before := heapAlloc()
	long := make([]byte, 10<<10)
	for i := range size {
		copy(long, fmt.Sprintf("%08d", i))
		c.store(string(long), 1, denied(0, time.Minute, time.Minute, 0), t0, t0, c.begin(string(long)))
	}
	grown := int64(heapAlloc()) - int64(before)
	bound := int64(size * maxEntryBytes)
	t.Logf("%d denials on 10 KiB keys: heap +%.1f MiB, %d entries kept; bound %.1f MiB (unbounded: %.0f MiB of keys alone)",
		size, float64(grown)/(1<<20), c.lru.Len(), float64(bound)/(1<<20), float64(size*len(long))/(1<<20))
	require.LessOrEqual(t, grown, bound+bound/2, "heap growth within the byte bound (and some slack for the map)")
	require.LessOrEqual(t, c.bytes, c.maxBytes)
	runtime.KeepAlive(c)

	// Short keys: the byte bound never shrinks the cache below size entries.
	c = newDenyCache(size, 3)
	for i := range size + 10 {
		key := fmt.Sprintf("203.0.113.%d:%d", i%256, i)
		c.store(key, 1, denied(0, time.Minute, time.Minute, 0), t0, t0, c.begin(key))
	}
	require.Equal(t, size, c.lru.Len(), "short keys: size entries")
}

// A key cut from a larger string (a header) must not keep that string
// alive: the cache stores a copy.
func TestDenyCacheCopiesKeys(t *testing.T) {
	const entries = 1000
	c := newDenyCache(entries, 3)
	before := heapAlloc()
	for i := range entries {
		header := make([]byte, 64<<10)
		copy(header, fmt.Sprintf("%016d", i))
		c.store(string(header)[:16], 1, denied(0, time.Minute, time.Minute, 0), t0, t0, c.begin(string(header)[:16]))
	}
	grown := int64(heapAlloc()) - int64(before)
	require.Less(t, grown, int64(entries*maxEntryBytes), "1000 entries of 16-byte keys, not 1000 × 64 KiB")
	require.Equal(t, entries, c.lru.Len())
	runtime.KeepAlive(c)
}
