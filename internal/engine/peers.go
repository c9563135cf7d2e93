package engine

import (
	"reflect"
	"runtime"
	"sync"
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

// peers are the deny caches of one group. A cache is held until the engine
// that owns it is collected (a cache does not point back to its engine);
// a group left empty is dropped, and a later limiter starts a new one.
//
// The caches are held strongly, not through weak pointers: reading a weak
// pointer while the collector marks keeps its object alive for that cycle,
// so a process granting all the time, walking the group on every grant,
// would never let a dropped limiter go.
type peers struct {
	key     peerKey
	mu      sync.RWMutex // written to join, leave or drop; read to walk caches
	dropped bool         // no longer in peerCaches
	caches  map[*denyCache]struct{}
}

// tellPeers drops key's denials from the deny caches of the limiters on
// this engine's prefix but skip (nil: all of them, this one's too), after
// a grant or around a Reset: whether or not this limiter has a cache of
// its own, the key changed for them too. A cache of this engine is always
// in the group, which lives as long as the engine does.
func (e *Engine) tellPeers(key string, skip *denyCache) {
	if v, ok := peerCaches.Load(e.peerKey); ok {
		v.(*peers).forget(key, skip)
	}
}

// joinPeers adds c, the deny cache of owner, to the group key until owner
// is collected.
func joinPeers(key peerKey, owner *Engine, c *denyCache) {
	for {
		v, _ := peerCaches.LoadOrStore(key, &peers{key: key, caches: map[*denyCache]struct{}{}})
		g := v.(*peers)
		if g.join(c) {
			runtime.AddCleanup(owner, g.leave, c)
			return
		}
		// g was left empty and dropped meanwhile: join the next one.
	}
}

// join adds c to the group, unless the group was dropped.
func (g *peers) join(c *denyCache) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dropped {
		return false
	}
	g.caches[c] = struct{}{}
	return true
}

// leave removes c from the group, and drops the group if it is left empty:
// nothing joins it ever after.
func (g *peers) leave(c *denyCache) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.caches, c)
	if len(g.caches) == 0 {
		g.dropped = true
		peerCaches.CompareAndDelete(g.key, g)
	}
}

// forget drops key's denial, and its denials in flight, from every cache
// of the group but self (nil: every cache).
func (g *peers) forget(key string, self *denyCache) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for c := range g.caches {
		if c != self {
			c.forget(key)
		}
	}
}
