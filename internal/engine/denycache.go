package engine

import (
	"container/list"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"time"
)

// denyCache remembers recent denials in process. State in Redis only
// recovers with time, so while a denial's RetryAfter has not passed, the
// same request would be denied too: it can be answered here without a round
// trip. Only a Reset from another process breaks that, and only until the
// entry runs out. (Another process's grant, or a clamp it writes after the
// clock went back, leaves a cached denial a denial, but its durations as
// they were: "unless something else consumes first".)
//
// A request for more permits than the cached denial is denied too, but its
// RetryAfter is longer and unknown here; rather than report a wait shorter
// than the truth, it goes to Redis, unless it exceeds the capacity, where
// the answer is Never whatever the state.
type denyCache struct {
	mu       sync.Mutex
	size     int
	capacity int                      // requests above it can never be allowed
	entries  map[string]*list.Element // key -> element holding *denial
	lru      list.List                // front: most recently stored
	// generations count the grants and Resets of each stripe of keys
	// (seed picks a key's stripe): a denial decided before one on its
	// stripe is stale, and is not stored.
	seed        maphash.Seed
	generations [denyStripes]uint64
	// bytes counts what the entries hold (entryBytes each); maxBytes bounds
	// it, whatever the length of the keys.
	bytes, maxBytes int
}

// denyStripes is how many stripes of keys the generations are kept for:
// a grant makes only the denials in flight on its stripe stale.
const denyStripes = 64

type denial struct {
	key     string
	n       int
	at      time.Time // when it was decided, on the limiter's clock
	until   time.Time // when the denial's RetryAfter passes or its Remaining changes
	retryAt time.Time // when the denial's RetryAfter passes
	resetAt time.Time
	reply   Reply
}

func newDenyCache(size, capacity int) *denyCache {
	c := &denyCache{size: size, capacity: capacity, entries: make(map[string]*list.Element), seed: maphash.MakeSeed()}
	c.maxBytes = int(min(int64(size)*maxEntryBytes, math.MaxInt))
	c.lru.Init()
	return c
}

// lookup returns the cached denial for a request of n permits on key at now,
// with its durations counted down to now.
func (c *denyCache) lookup(key string, n int, now time.Time) (Reply, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[key]
	if !ok {
		return Reply{}, false
	}
	d := el.Value.(*denial)
	if !now.Before(d.until) || now.Before(d.at) {
		// Run out, or the clock went back: the limiter clamps its state
		// then, and the cache must not hold the key longer than it would.
		c.remove(el)
		return Reply{}, false
	}
	r := d.reply
	switch {
	case n == d.n:
		r.RetryAfter = ceilMicro(d.retryAt.Sub(now))
	case n > c.capacity:
		// As the script answers it: Never, reported by the strategy with
		// the smallest limit (the first), whichever denied d.
		r.RetryAfter, r.Strategy = Never, 0
	default:
		return Reply{}, false
	}
	r.ResetAfter = ceilMicro(d.resetAt.Sub(now))
	if r.RetryAfter != Never && r.RetryAfter > r.ResetAfter {
		r.ResetAfter = r.RetryAfter
	}
	return r, true
}

func (c *denyCache) stripe(key string) int {
	return int(maphash.String(c.seed, key) % denyStripes)
}

// begin returns the generation a decision on key starts in, to pass to
// store.
func (c *denyCache) begin(key string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.generations[c.stripe(key)]
}

// store records the outcome of a request of n permits, begun at began in
// generation gen and answered at answered (on the limiter's clock: the
// same instant under WithClock). A denial is kept; a grant drops the key's
// denial, whose RetryAfter it has just made too short, and makes denials
// still in flight on its stripe stale: decided before it, they would be
// stored after it. Denials that can never be allowed carry no time to wait
// and are not kept, nor are stale ones.
//
// The script decided between began and answered: the denial runs out
// counted from began, so never later than the script's would, and its
// RetryAfter and ResetAfter are counted from answered, so never shorter
// than the script's however long the request took to reach Redis.
func (c *denyCache) store(key string, n int, r Reply, began, answered time.Time, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	stripe := c.stripe(key)
	if r.Allowed {
		if n > 0 {
			c.generations[stripe]++
			if el, ok := c.entries[key]; ok {
				c.remove(el)
			}
		}
		return
	}
	// The denial holds while its RetryAfter runs, and its Result while
	// Remaining stays as it is: the shorter of the two.
	hold := min(r.RetryAfter, r.Stable)
	if r.RetryAfter == Never || hold <= 0 || gen != c.generations[stripe] {
		return
	}
	d := &denial{n: n, at: began, until: began.Add(hold), retryAt: answered.Add(r.RetryAfter), resetAt: answered.Add(r.ResetAfter), reply: r}
	if el, ok := c.entries[key]; ok {
		d.key = el.Value.(*denial).key
		el.Value = d
		c.lru.MoveToFront(el)
		return
	}
	// A copy: the caller's key may be cut from a larger string (a header, a
	// request line), which the cache must not keep alive.
	d.key = strings.Clone(key)
	c.entries[d.key] = c.lru.PushFront(d)
	c.bytes += entryBytes(d.key)
	for c.lru.Len() > c.size || c.bytes > c.maxBytes {
		c.remove(c.lru.Back())
	}
}

// entryOverhead is what an entry takes on the heap besides its key: the map
// slot, the list element and the denial, rounded up from what amd64 uses
// (it varies with how full the map is). keyAllowance is the longest key
// every entry may have before the byte bound evicts older ones.
const (
	entryOverhead = 288
	keyAllowance  = 256
)

// maxEntryBytes is what a deny cache may hold on the heap per entry of its
// size: the entryBytes of a key of keyAllowance bytes, so that such keys
// always get size entries. WithDenyCache and the README state it.
const maxEntryBytes = entryOverhead + keyAllowance + keyAllowance/4

// entryBytes is what an entry for key is counted as.
func entryBytes(key string) int { return entryOverhead + keyBytes(len(key)) }

// keyBytes is at least what the heap takes for a key of n bytes. The
// allocator rounds an object up to its size class (4097 bytes take 4864)
// or, above 32 KiB, to whole 8 KiB pages (32769 take 40960): never by a
// quarter or more, but for a few bytes that entryOverhead's margin covers.
func keyBytes(n int) int { return n + n/4 }

// forget drops key's denial, after a Reset, and makes denials still in
// flight on its stripe stale.
func (c *denyCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.generations[c.stripe(key)]++
	if el, ok := c.entries[key]; ok {
		c.remove(el)
	}
}

func (c *denyCache) remove(el *list.Element) {
	c.lru.Remove(el)
	key := el.Value.(*denial).key
	delete(c.entries, key)
	c.bytes -= entryBytes(key)
}

// ceilMicro rounds d up to a whole microsecond, so that a caller who waits
// the reported time is never early.
func ceilMicro(d time.Duration) time.Duration {
	if r := d % time.Microsecond; r > 0 {
		d += time.Microsecond - r
	}
	return d
}
