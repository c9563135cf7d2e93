package engine

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A group of deny caches forgets a cache whose limiter is gone, and is
// dropped with its last one: limiters built and let go at run time (per
// tenant, per test) leave nothing behind.
func TestPeersLeaveWithTheirCaches(t *testing.T) {
	key := newPeerKey(new(int), "peers-test:")
	kept := newDenyCache(4, 10)
	joinPeers(key, kept)
	func() {
		gone := newDenyCache(4, 10)
		joinPeers(key, gone)
	}()
	group := func() *peers {
		v, ok := peerCaches.Load(key)
		if !ok {
			return nil
		}
		return v.(*peers)
	}
	for end := time.Now().Add(5 * time.Second); len(*group().caches.Load()) != 1 && time.Now().Before(end); {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	require.Len(t, *group().caches.Load(), 1, "the collected cache left its group")

	runtime.KeepAlive(kept)
	kept = nil
	for end := time.Now().Add(5 * time.Second); group() != nil && time.Now().Before(end); {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	require.Nil(t, group(), "the group left with its last cache")
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
				c := newDenyCache(2, 3)
				joinPeers(key, c)
				e := &Engine{peerKey: key, cache: c}
				e.tellPeers("k")
				if i%50 == 0 {
					runtime.GC()
				}
			}
		}()
	}
	wg.Wait()
}
