package inmem

import (
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/engine"
)

// DefaultMaxKeys is the number of keys a limiter holds at most unless
// WithMaxKeys says otherwise.
const DefaultMaxKeys = 100_000

// maxShards spreads keys over independent locks, so that goroutines
// deciding different keys rarely wait for each other; a small bound gets
// fewer shards, so that each still holds enough keys to choose among when
// room is needed.
const (
	maxShards    = 64
	minShardKeys = 16
)

// sample is the number of keys looked at to make room for a new one: a
// bounded cost per call, whatever the number of keys.
const sample = 8

// Option configures an in-process limiter.
type Option func(*options)

type options struct {
	now     func() time.Time
	maxKeys int
}

// WithClock makes the limiter decide on now, for tests with a fake clock.
// Without it the limiter decides on time.Now, and its views (OnClock) on
// theirs: as the fallback of a redlimit limiter built with
// redlimit.WithClock, it decides on that limiter's clock. With it, the
// limiter keeps now whatever OnClock is asked. A nil clock is
// ErrInvalidConfig.
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
// with the key's string, a sliding key more per nonempty bucket; keys are
// copied, so a key cut from a larger string never keeps it alive). The
// bound is kept per shard (up to 64 of them, each holding at least 16
// keys, the bound divided among them rounded up). When a shard is full, a
// new key makes room: among a sample of 8 of the shard's keys, those back
// in their initial state go, else the one nearest to it (the smallest
// share of its limit in use, then the soonest reset), which then starts
// afresh as after a Reset. A key whose permits are spent is thus the last
// to go, and a client cannot buy its denied key back by sending new keys.
// maxKeys < 1 is ErrInvalidConfig.
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

// store holds the keys of one limiter, and of its views (OnClock).
type store[S any] struct {
	seed maphash.Seed
	// used is the share of its limit a key's state has in use at a time,
	// between 0 (initial) and 1 (or more): what eviction goes by.
	used   func(s *S, nowUS int64) float64
	shards []shard[S]
}

func newStore[S any](o options, used func(s *S, nowUS int64) float64) *store[S] {
	st := &store[S]{seed: maphash.MakeSeed(), used: used}
	n := 1 // a power of two up to maxShards, each shard minShardKeys or more
	for n*2 <= maxShards && n*2*minShardKeys <= o.maxKeys {
		n *= 2
	}
	st.shards = make([]shard[S], n)
	perShard := (o.maxKeys + n - 1) / n
	for i := range st.shards {
		st.shards[i].max = perShard
		st.shards[i].m = make(map[string]*entry[S])
	}
	return st
}

func (st *store[S]) shard(key string) *shard[S] {
	return &st.shards[maphash.String(st.seed, key)%uint64(len(st.shards))]
}

// clock is what a limiter decides on: WithClock's, which is its own and
// which OnClock never replaces; else the clock OnClock gave its view (a
// redlimit limiter's, for its fallback); else time.Now. Every limiter
// here embeds one.
type clock struct {
	now func() time.Time // nil: time.Now
	own bool             // now is WithClock's
}

func newClock(o options) clock { return clock{now: o.now, own: o.now != nil} }

// clockOf lets onClock reach the clock of any limiter here.
func (c *clock) clockOf() *clock { return c }

// onClock is OnClock for every limiter here: a shallow copy of l, which
// shares l's store (a pointer) and immutable configuration and decides on
// now; or l itself when l has a clock of its own, when now is nil, or for
// a nil l (whose methods fail as before).
func onClock[L any, P interface {
	*L
	clockOf() *clock
}](l P, now func() time.Time) P {
	if l == nil || now == nil || l.clockOf().own {
		return l
	}
	view := *l
	P(&view).clockOf().now = now
	return &view
}

// nowUS is c in Unix µs. A clock outside what the scripts take (2001 to
// 2112) is ErrInvalidArgument, as it is for the Redis limiters; a limiter
// without a store is a zero value.
func (st *store[S]) nowUS(c clock, algorithm string) (int64, error) {
	if st == nil {
		return 0, errZeroValue(algorithm)
	}
	now := time.Now
	if c.now != nil {
		now = c.now
	}
	t := now()
	if err := engine.CheckClock(redlimit.ErrInvalidArgument, "inmem "+algorithm, t); err != nil {
		return 0, err
	}
	return t.UnixMicro(), nil
}

// put stores state for key after a decision at nowUS that changed it:
// updated in e when the key was there, added otherwise, unless resetUS ==
// 0 (the state is initial again). Such a key is kept, to go first when
// room is needed (evict): the clock may go back into the time it was in
// use, and a call that only looked must not have made it forget what it
// granted then. The caller holds sh.mu.
func (sh *shard[S]) put(st *store[S], key string, e *entry[S], state S, nowUS, resetUS int64) {
	switch {
	case resetUS == 0:
		if e != nil {
			e.state, e.expiresUS = state, nowUS
		}
	case e != nil:
		e.state, e.expiresUS = state, nowUS+resetUS
	default:
		if len(sh.m) >= sh.max {
			sh.evict(st, nowUS)
		}
		// A copy: a key cut from a larger string (a header line) must not
		// keep that string alive while the key is held.
		sh.m[strings.Clone(key)] = &entry[S]{state: state, expiresUS: nowUS + resetUS}
	}
}

// evict makes room for one key: it drops every sampled key whose state is
// back to initial, or else the sampled key nearest to it: the smallest
// share of its limit in use, then the soonest back to initial. A key
// whose permits are spent goes last, so that new keys never buy it back.
func (sh *shard[S]) evict(st *store[S], nowUS int64) {
	var victim string
	var victimUsed float64
	var victimAt int64
	seen, dropped := 0, false
	for k, e := range sh.m { // map order is random: a sample
		if e.expiresUS <= nowUS {
			delete(sh.m, k)
			dropped = true
		} else if !dropped {
			used := st.used(&e.state, nowUS)
			if seen == 0 || used < victimUsed || used == victimUsed && e.expiresUS < victimAt {
				victim, victimUsed, victimAt = k, used, e.expiresUS
			}
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
func (st *store[S]) reset(algorithm, key string) error {
	if st == nil {
		return errZeroValue(algorithm)
	}
	sh := st.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
	return nil
}

// errZeroValue is the error of a limiter that no constructor made: a zero
// value has no store for its keys (and, as a fallback, would otherwise
// fail only when Redis does).
func errZeroValue(algorithm string) error {
	if algorithm == "" {
		algorithm = "limiter"
	}
	return fmt.Errorf("redlimit: inmem %s is a zero value: make it with its constructor: %w", algorithm, redlimit.ErrInvalidConfig)
}

// len returns the number of keys held, for tests.
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
