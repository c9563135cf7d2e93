package inmem

import (
	"hash/maphash"
	"sync"
	"time"
)

// DefaultMaxKeys is the number of keys a limiter holds at most unless
// WithMaxKeys says otherwise.
const DefaultMaxKeys = 100_000

// shards spreads keys over independent locks, so that goroutines deciding
// different keys rarely wait for each other.
const shards = 64

// Option configures an in-process limiter.
type Option func(*options)

type options struct {
	now     func() time.Time
	maxKeys int
}

// WithClock makes the limiter decide on now instead of time.Now: for tests
// with a fake clock. A nil clock is ErrInvalidConfig.
func WithClock(now func() time.Time) Option {
	return func(o *options) {
		o.now = now
		if now == nil {
			o.maxKeys = -1 // flags the error for newStore
		}
	}
}

// WithMaxKeys bounds the number of keys the limiter holds (default
// DefaultMaxKeys; a fixed window or bucket key costs about 100-150 bytes
// with the key's string, a sliding key more per nonempty bucket). A key is
// dropped as soon as a decision leaves it in its initial state; one that
// gets there with time alone stays until seen again or until room is
// needed. The bound is kept per shard (64 of them, each holding
// maxKeys/64 rounded up): when a shard is full, a new key first drops the
// sampled keys back in their initial state, else the sampled key nearest to
// it, which then starts afresh, as after a Reset. maxKeys < 1 is
// ErrInvalidConfig.
func WithMaxKeys(maxKeys int) Option {
	return func(o *options) { o.maxKeys = maxKeys }
}

// entry is one key's state. expiresUS is when the state is back to its
// initial state, on the limiter's clock.
type entry[S any] struct {
	state     S
	expiresUS int64
}

type shard[S any] struct {
	mu  sync.Mutex
	max int
	m   map[string]*entry[S]
}

// store holds the keys of one limiter.
type store[S any] struct {
	seed   maphash.Seed
	now    func() time.Time
	shards [shards]shard[S]
}

func newStore[S any](o options) *store[S] {
	st := &store[S]{}
	st.seed = maphash.MakeSeed()
	st.now = o.now
	if st.now == nil {
		st.now = time.Now
	}
	perShard := max(1, (o.maxKeys+shards-1)/shards)
	for i := range st.shards {
		st.shards[i].max = perShard
		st.shards[i].m = make(map[string]*entry[S])
	}
	return st
}

func (st *store[S]) shard(key string) *shard[S] {
	return &st.shards[maphash.String(st.seed, key)%shards]
}

// nowUS is the limiter's clock in Unix µs.
func (st *store[S]) nowUS() int64 { return st.now().UnixMicro() }

// put stores state for key after a decision at nowUS: dropped when
// resetUS == 0 (the state is initial again), updated in e when the key was
// there, added otherwise. The caller holds sh.mu.
func (sh *shard[S]) put(key string, e *entry[S], state S, nowUS, resetUS int64) {
	switch {
	case resetUS == 0:
		if e != nil {
			delete(sh.m, key)
		}
	case e != nil:
		e.state, e.expiresUS = state, nowUS+resetUS
	default:
		if len(sh.m) >= sh.max {
			sh.evict(nowUS)
		}
		sh.m[key] = &entry[S]{state: state, expiresUS: nowUS + resetUS}
	}
}

// evict makes room for one key: it drops every sampled key whose state is
// back to initial, or else the sampled key that gets there first.
func (sh *shard[S]) evict(nowUS int64) {
	const sample = 8
	var victim string
	victimAt, seen, dropped := int64(0), 0, false
	for k, e := range sh.m { // map order is random: a sample
		if e.expiresUS <= nowUS {
			delete(sh.m, k)
			dropped = true
		} else if seen == 0 || e.expiresUS < victimAt {
			victim, victimAt = k, e.expiresUS
		}
		if seen++; seen >= sample {
			break
		}
	}
	if !dropped {
		delete(sh.m, victim)
	}
}

// reset forgets key.
func (st *store[S]) reset(key string) {
	sh := st.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
}

// Len returns the number of keys held, for tests.
func (st *store[S]) len() int {
	total := 0
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		total += len(sh.m)
		sh.mu.Unlock()
	}
	return total
}
