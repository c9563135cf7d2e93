package engine

import (
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"weak"
)

// peerCaches groups the deny caches of the limiters in this process that
// read the same Redis keys: on one client, limiters given one WithPrefix,
// or made with one configuration (whose default keys are the same). A
// grant or a Reset through one of them changes what the others would be
// answered, so it drops their denial of that key too, as it drops its own.
// Other processes' grants and Resets stay unseen (see denyCache), and so do
// those of limiters on another client of the same Redis.
var peerCaches sync.Map // peerKey -> *peers

// peerKey names a group: the client, by its pointer (0 for a client that
// is not a pointer: such limiters are grouped by prefix alone, which only
// costs a cache some answers), and the prefix.
type peerKey struct {
	client uintptr
	prefix string
}

// newPeerKey returns the group name of limiters on rdb with prefix.
func newPeerKey(rdb any, prefix string) peerKey {
	k := peerKey{prefix: prefix}
	if v := reflect.ValueOf(rdb); v.Kind() == reflect.Pointer {
		k.client = v.Pointer()
	}
	return k
}

// peers are the deny caches of one prefix. A cache is held weakly, and
// leaves when its limiter is collected; a group left empty is dropped, and
// a later limiter starts a new one.
type peers struct {
	key     peerKey
	mu      sync.Mutex // held to change caches or dropped
	dropped bool       // no longer in peerCaches
	caches  atomic.Pointer[[]weak.Pointer[denyCache]]
}

// tellPeers drops key's denials from the deny caches of the other limiters
// on this engine's prefix, after a grant or around a Reset: whether or not
// this limiter has a cache of its own, the key changed for them too.
func (e *Engine) tellPeers(key string) {
	if v, ok := peerCaches.Load(e.peerKey); ok {
		v.(*peers).forget(key, e.cache)
	}
}

// joinPeers adds c to the group key.
func joinPeers(key peerKey, c *denyCache) {
	for {
		v, _ := peerCaches.LoadOrStore(key, &peers{key: key})
		g := v.(*peers)
		if g.update(c) {
			runtime.AddCleanup(c, func(g *peers) { g.update(nil) }, g)
			return
		}
		// g was left empty and dropped meanwhile: join the next one.
	}
}

// update keeps the group's live caches and adds add (if not nil). A group
// left empty is dropped from peerCaches; update then reports false, and
// adds nothing, ever after.
func (g *peers) update(add *denyCache) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dropped {
		return false
	}
	var live []weak.Pointer[denyCache]
	if old := g.caches.Load(); old != nil {
		for _, p := range *old {
			if p.Value() != nil {
				live = append(live, p)
			}
		}
	}
	if add != nil {
		live = append(live, weak.Make(add))
	}
	g.caches.Store(&live)
	if len(live) == 0 {
		g.dropped = true
		peerCaches.CompareAndDelete(g.key, g)
	}
	return true
}

// forget drops key's denial, and its denials in flight, from every cache
// of the group but self (nil: every cache).
func (g *peers) forget(key string, self *denyCache) {
	caches := g.caches.Load()
	if caches == nil {
		return // a group being made: its first cache has nothing to forget yet
	}
	for _, p := range *caches {
		if c := p.Value(); c != nil && c != self {
			c.forget(key)
		}
	}
}
