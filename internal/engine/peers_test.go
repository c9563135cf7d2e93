package engine

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// group returns the group key names, nil when there is none.
func group(key peerKey) *peers {
	v, ok := peerCaches.Load(key)
	if !ok {
		return nil
	}
	return v.(*peers)
}

// size returns how many caches g holds.
func (g *peers) size() int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return len(g.caches)
}

// peerEngine returns an engine with a deny cache, in the group key.
func peerEngine(key peerKey) *Engine {
	e := &Engine{peerKey: key, cache: newDenyCache(4, 10)}
	joinPeers(key, e, e.cache)
	return e
}

// collect runs the collector until done reports true, for 5s at most.
func collect(done func() bool) {
	for end := time.Now().Add(5 * time.Second); !done() && time.Now().Before(end); {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

// A group of deny caches forgets the cache of a limiter that is gone, and
// is dropped with its last one: limiters built and let go at run time (per
// tenant, per test) leave nothing behind.
func TestPeersLeaveWithTheirCaches(t *testing.T) {
	key := newPeerKey(new(int), "peers-test:")
	kept := peerEngine(key)
	func() { _ = peerEngine(key) }()
	collect(func() bool { return group(key).size() == 1 })
	require.Equal(t, 1, group(key).size(), "the collected limiter's cache left its group")

	runtime.KeepAlive(kept)
	kept = nil
	collect(func() bool { return group(key) == nil })
	require.Nil(t, group(key), "the group left with its last cache")
}

// Limiters let go while the group is walked all the time (a busy process
// grants on every request) are still collected, and joining stays cheap.
// The group once held its caches by weak pointers, and reading one while
// the collector marks keeps it alive for that cycle: with grants running,
// 10,000 limiters made and dropped took seconds, each join copying a list
// of thousands that collections no longer emptied.
func TestPeersLeaveWhileGranting(t *testing.T) {
	key := newPeerKey(new(int), "peers-granting:")
	kept := peerEngine(key)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			kept.tellPeers("k", kept.cache)   // what each grant through kept does
			time.Sleep(20 * time.Microsecond) // about a round trip
		}
	}()
	for range 10000 {
		e := &Engine{peerKey: key, cache: newDenyCache(1000, 10)}
		joinPeers(key, e, e.cache)
	}
	for range 3 {
		runtime.GC()
	}
	// Cleanups run on a goroutine of their own, after the collection.
	for end := time.Now().Add(time.Second); group(key).size() > 1 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	size := group(key).size()
	stop.Store(true)
	wg.Wait()
	require.Equal(t, 1, size, "limiters let go while grants ran are collected")
	runtime.KeepAlive(kept)
}

// Limiters joining, granting and being collected at once: no race, and a
// grant never meets a group half made.
func TestPeersConcurrent(t *testing.T) {
	key := newPeerKey(new(int), "peers-concurrent:")
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				e := peerEngine(key)
				e.tellPeers("k", e.cache)
				if i%50 == 0 {
					runtime.GC()
				}
			}
		}()
	}
	wg.Wait()
}
