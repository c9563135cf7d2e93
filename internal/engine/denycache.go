package engine

import (
	"container/list"
	"sync"
	"time"
)

// denyCache remembers recent denials in process. State in Redis only
// recovers with time, so while a denial's RetryAfter has not passed, a new
// request for at least as many permits would be denied too: it can be
// answered here without a round trip. Only a Reset from another process
// breaks that, and only until the entry runs out.
type denyCache struct {
	mu      sync.Mutex
	size    int
	entries map[string]*list.Element // key -> element holding *denial
	lru     list.List                // front: most recently stored
}

type denial struct {
	key     string
	n       int
	until   time.Time // when the denial's RetryAfter passes
	resetAt time.Time
	reply   Reply
}

func newDenyCache(size int) *denyCache {
	c := &denyCache{size: size, entries: make(map[string]*list.Element, size)}
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
	if !now.Before(d.until) {
		c.lru.Remove(el)
		delete(c.entries, key)
		return Reply{}, false
	}
	if n < d.n {
		return Reply{}, false
	}
	r := d.reply
	r.RetryAfter = ceilMicro(d.until.Sub(now))
	r.ResetAfter = max(ceilMicro(d.resetAt.Sub(now)), r.RetryAfter)
	return r, true
}

// store records a denial of n permits decided at now. Denials that can never
// be allowed carry no time to wait and are not cached.
func (c *denyCache) store(key string, n int, r Reply, now time.Time) {
	if r.Allowed || r.RetryAfter <= 0 {
		return
	}
	d := &denial{key: key, n: n, until: now.Add(r.RetryAfter), resetAt: now.Add(r.ResetAfter), reply: r}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[key]; ok {
		el.Value = d
		c.lru.MoveToFront(el)
		return
	}
	if c.lru.Len() >= c.size {
		oldest := c.lru.Back()
		c.lru.Remove(oldest)
		delete(c.entries, oldest.Value.(*denial).key)
	}
	c.entries[key] = c.lru.PushFront(d)
}

// forget drops key's denial, after a Reset.
func (c *denyCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[key]; ok {
		c.lru.Remove(el)
		delete(c.entries, key)
	}
}

// ceilMicro rounds d up to a whole microsecond, so that a caller who waits
// the reported time is never early.
func ceilMicro(d time.Duration) time.Duration {
	if r := d % time.Microsecond; r > 0 {
		d += time.Microsecond - r
	}
	return d
}
