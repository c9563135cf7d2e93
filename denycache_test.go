package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/testseed"
	"github.com/stretchr/testify/require"
)

// cachePair is a limiter with a deny cache and the same limiter without,
// on one backend and one fake clock, each on its own Redis keys: the
// uncached one tells the truth the cached one must agree with.
type cachePair struct {
	cached, plain Limiter
	clock         *fakeClock
	counter       *commandRecorder

	mu   sync.Mutex
	last Decision // the cached limiter's latest decision
}

const (
	cachedPrefix = "cached:"
	plainPrefix  = "plain:"
)

func newCachePair(t *testing.T, b backend, alg algorithm, size int) *cachePair {
	t.Helper()
	p := &cachePair{clock: newClock(), counter: &commandRecorder{}}
	b.rdb.AddHook(p.counter)
	var err error
	p.cached, err = alg.new(b.rdb, 3, 10*time.Second, WithClock(p.clock.Now), WithPrefix(cachedPrefix), WithDenyCache(size),
		WithObserver(func(d Decision) {
			p.mu.Lock()
			p.last = d
			p.mu.Unlock()
		}))
	require.NoError(t, err, "build the cached %s", alg.name)
	p.plain, err = alg.new(b.rdb, 3, 10*time.Second, WithClock(p.clock.Now), WithPrefix(plainPrefix))
	require.NoError(t, err, "build the uncached %s", alg.name)
	return p
}

// outcome is one call on the cached limiter, next to the truth.
type outcome struct {
	got, truth Result
	redis      bool // the cached limiter's call reached Redis
}

// call asks both limiters for n permits on key and checks that the cached
// limiter decided as the uncached one did, with a RetryAfter never shorter
// than the truth, and that Decision.Local is set exactly when no round trip
// was made.
func (p *cachePair) call(t *testing.T, key string, n int, what string) outcome {
	t.Helper()
	ctx := context.Background()
	before := p.counter.decided(cachedPrefix + key)
	got, err := p.cached.AllowN(ctx, key, n)
	require.NoError(t, err, "%s: cached AllowN(%q, %d)", what, key, n)
	reached := p.counter.decided(cachedPrefix+key) - before
	truth, err := p.plain.AllowN(ctx, key, n)
	require.NoError(t, err, "%s: uncached AllowN(%q, %d)", what, key, n)

	require.LessOrEqual(t, reached, 1, "%s: one call makes at most one round trip", what)
	p.mu.Lock()
	last := p.last
	p.mu.Unlock()
	require.Equal(t, reached == 0, last.Local, "%s: Decision.Local should be set exactly when the deny cache answered (round trips: %d)", what, reached)
	requireAsTruthful(t, got, truth, what)
	return outcome{got: got, truth: truth, redis: reached == 1}
}

// requireAsTruthful checks a deny cache's Result against the uncached truth:
// the same Result, field for field (DESIGN: a locally answered request gets
// what Redis would have said).
func requireAsTruthful(t *testing.T, got, truth Result, what string) {
	t.Helper()
	require.Equal(t, withoutGrant(truth), withoutGrant(got), "%s: the cached limiter should answer as the uncached one", what)
}

// forEachCacheAlgorithm runs fn for every algorithm, at 3 permits per 10s,
// on every backend.
func forEachCacheAlgorithm(t *testing.T, fn func(t *testing.T, b backend, alg algorithm)) {
	t.Helper()
	t.Parallel()
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) { fn(t, b, alg) })
		})
	}
}

func TestDenyCacheHotKey(t *testing.T) {
	forEachCacheAlgorithm(t, func(t *testing.T, b backend, alg algorithm) {
		p := newCachePair(t, b, alg, 16)
		first := p.call(t, "hot", 3, "exhaust at once")
		require.True(t, first.truth.Allowed && first.redis, "3 permits should be granted by Redis")

		// Many denials within one RetryAfter: one round trip.
		denials := shortOr(100, 1000)
		var last outcome
		for i := range denials {
			p.clock.Advance(100 * time.Microsecond)
			last = p.call(t, "hot", 1, fmt.Sprintf("denial %d", i))
			require.False(t, last.truth.Allowed, "denial %d: the test wants a key denied throughout", i)
			require.Equal(t, i == 0, last.redis, "denial %d: only the first denial should reach Redis", i)
		}
		require.Equal(t, 2, p.counter.decided(cachedPrefix+"hot"), "1 grant + %d denials within one RetryAfter should cost 2 round trips", denials)
		require.Equal(t, 1+denials, p.counter.decided(plainPrefix+"hot"), "the uncached limiter makes one round trip per call")

		// A microsecond before RetryAfter passes the cache still answers;
		// once it has passed, the request goes to Redis and is allowed.
		p.clock.Advance(last.got.RetryAfter - time.Microsecond)
		early := p.call(t, "hot", 1, "a µs before RetryAfter passes")
		require.False(t, early.redis, "a µs before RetryAfter passes the cache should answer")
		require.Equal(t, time.Microsecond, early.got.RetryAfter, "a µs before RetryAfter passes")
		p.clock.Advance(time.Microsecond)
		due := p.call(t, "hot", 1, "when RetryAfter has passed")
		require.True(t, due.redis, "once RetryAfter has passed the request should go to Redis")
		require.True(t, due.got.Allowed, "a caller who waited RetryAfter should be allowed")

		// A long abuse: a call every 250ms for 50s of fake time.
		cachedBefore, plainBefore := p.counter.decided(cachedPrefix+"hot"), p.counter.decided(plainPrefix+"hot")
		allowed := 0
		for i := range 200 {
			p.clock.Advance(250 * time.Millisecond)
			if p.call(t, "hot", 1, fmt.Sprintf("abuse call %d", i)).got.Allowed {
				allowed++
			}
		}
		cachedCalls := p.counter.decided(cachedPrefix+"hot") - cachedBefore
		plainCalls := p.counter.decided(plainPrefix+"hot") - plainBefore
		require.Equal(t, 200, plainCalls, "the uncached limiter makes one round trip per call")
		t.Logf("abuse: %d grants; round trips: %d cached, %d uncached", allowed, cachedCalls, plainCalls)
		// Every grant costs a round trip, and so does the first denial after it.
		require.LessOrEqual(t, cachedCalls, 2*allowed+1, "under abuse Redis should see about one call per grant and one per denial period (%d grants)", allowed)
	})
}

func TestDenyCacheFewerPermitsGoToRedis(t *testing.T) {
	forEachCacheAlgorithm(t, func(t *testing.T, b backend, alg algorithm) {
		p := newCachePair(t, b, alg, 16)
		p.call(t, "k", 2, "take 2 of 3")
		p.clock.Advance(time.Millisecond)
		denial := p.call(t, "k", 2, "ask for 2 of the 1 left")
		require.False(t, denial.got.Allowed, "2 of the 1 left should be denied")
		require.True(t, denial.redis, "the first denial should come from Redis")
		p.clock.Advance(time.Millisecond)
		fewer := p.call(t, "k", 1, "ask for 1 while a denial of 2 is cached")
		require.True(t, fewer.redis, "a request for fewer permits than the cached denial should go to Redis")
		require.True(t, fewer.got.Allowed, "the 1 permit left should be granted")
		zero := p.call(t, "k", 0, "n == 0 while a denial of 2 is cached")
		require.True(t, zero.redis, "n == 0 should go to Redis")
		require.True(t, zero.got.Allowed, "n == 0 is always allowed")
	})
}

func TestDenyCacheAfterOwnGrant(t *testing.T) {
	// A denial of 2 is cached; a request for 1 then goes to Redis and is
	// granted. The cached denial still denies rightly, but its RetryAfter
	// was computed before that grant: it must not be reported as is.
	forEachCacheAlgorithm(t, func(t *testing.T, b backend, alg algorithm) {
		p := newCachePair(t, b, alg, 16)
		p.call(t, "k", 2, "take 2 of 3")
		p.clock.Advance(time.Millisecond)
		p.call(t, "k", 2, "ask for 2 of the 1 left")
		p.clock.Advance(time.Millisecond)
		p.call(t, "k", 1, "take the last one")
		p.clock.Advance(time.Millisecond)
		p.call(t, "k", 2, "ask for 2 again, after the grant")
	})
}

func TestDenyCacheLargerRequest(t *testing.T) {
	// A denial of 1 is cached; a request for 2 is rightly denied locally,
	// but must not be told it can retry when 1 permit would be back.
	forEachCacheAlgorithm(t, func(t *testing.T, b backend, alg algorithm) {
		p := newCachePair(t, b, alg, 16)
		p.call(t, "k", 3, "exhaust")
		p.clock.Advance(time.Millisecond)
		p.call(t, "k", 1, "ask for 1")
		p.clock.Advance(time.Millisecond)
		p.call(t, "k", 2, "ask for 2 while a denial of 1 is cached")
	})
}

func TestDenyCacheNever(t *testing.T) {
	forEachCacheAlgorithm(t, func(t *testing.T, b backend, alg algorithm) {
		t.Run("not cached", func(t *testing.T) {
			p := newCachePair(t, b, alg, 16)
			for i := range 3 {
				o := p.call(t, "fresh", 4, fmt.Sprintf("ask a fresh key for 4 of 3, call %d", i))
				require.Equal(t, Never, o.got.RetryAfter, "4 of 3 can never be allowed")
				require.True(t, o.redis, "call %d: a Never denial should not be cached", i)
			}
		})
		t.Run("after a cached denial", func(t *testing.T) {
			p := newCachePair(t, b, alg, 16)
			p.call(t, "k", 3, "exhaust")
			p.clock.Advance(time.Millisecond)
			p.call(t, "k", 1, "ask for 1")
			p.clock.Advance(time.Millisecond)
			p.call(t, "k", 4, "ask for 4 of 3 while a denial of 1 is cached")
		})
	})
}

func TestDenyCacheReset(t *testing.T) {
	forEachCacheAlgorithm(t, func(t *testing.T, b backend, alg algorithm) {
		p := newCachePair(t, b, alg, 16)
		ctx := context.Background()
		p.call(t, "k", 3, "exhaust")
		p.clock.Advance(time.Millisecond)
		p.call(t, "k", 1, "deny, and cache the denial")
		require.NoError(t, p.cached.Reset(ctx, "k"), "Reset the cached limiter's key")
		require.NoError(t, p.plain.Reset(ctx, "k"), "Reset the uncached limiter's key")
		o := p.call(t, "k", 1, "ask for 1 after Reset")
		require.True(t, o.redis, "after Reset the request should go to Redis")
		require.True(t, o.got.Allowed, "after Reset the key is fresh: allowed")
	})
}

// replyGate holds back, once armed, the reply to the next decision on one
// Redis key until released: a decision in flight while others run.
type replyGate struct {
	t                 *testing.T
	armed             atomic.Bool
	replied, released chan struct{}
	once              sync.Once
}

func newReplyGate(t *testing.T, b backend, redisKey string) *replyGate {
	g := &replyGate{t: t, replied: make(chan struct{}), released: make(chan struct{})}
	b.rdb.AddHook(&commandRecorder{afterReply: func(c recordedCmd) {
		if c.decision && c.key == redisKey && c.err == nil && g.armed.CompareAndSwap(true, false) {
			close(g.replied)
			<-g.released
		}
	}})
	t.Cleanup(g.release) // never leave the in-flight call blocked, even on failure
	return g
}

// hold runs call in a goroutine, returns once Redis has answered it, and
// sends its Result when released.
func (g *replyGate) hold(call func() (Result, error)) <-chan Result {
	g.armed.Store(true)
	out := make(chan Result, 1)
	go func() {
		r, err := call()
		if err != nil {
			g.t.Errorf("in-flight call: %v", err)
		}
		out <- r
	}()
	select {
	case <-g.replied:
	case <-time.After(10 * time.Second):
		g.t.Fatal("the in-flight call never reached Redis")
	}
	return out
}

func (g *replyGate) release() { g.once.Do(func() { close(g.released) }) }

func TestDenyCacheResetDuringDenial(t *testing.T) {
	// A denial in flight when Reset runs was decided on the state Reset
	// deleted: it must not be cached after Reset has returned.
	forEachCacheAlgorithm(t, func(t *testing.T, b backend, alg algorithm) {
		ctx := context.Background()
		g := newReplyGate(t, b, cachedPrefix+"k")
		clock := newClock()
		l, err := alg.new(b.rdb, 3, 10*time.Second, WithClock(clock.Now), WithPrefix(cachedPrefix), WithDenyCache(16))
		require.NoError(t, err)
		r, err := l.AllowN(ctx, "k", 3)
		require.NoError(t, err)
		require.True(t, r.Allowed, "exhaust the key")

		inFlight := g.hold(func() (Result, error) { return l.AllowN(ctx, "k", 1) })
		require.NoError(t, l.Reset(ctx, "k"), "Reset while a denial is in flight")
		g.release()
		require.False(t, (<-inFlight).Allowed, "the in-flight request was decided before Reset: denied")

		r, err = l.AllowN(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, r.Allowed, "Reset has returned, so the key is fresh and 1 permit should be granted; got %+v (answered by a denial cached after Reset?)", r)
	})
}

func TestDenyCacheSize(t *testing.T) {
	forEachCacheAlgorithm(t, func(t *testing.T, b backend, alg algorithm) {
		p := newCachePair(t, b, alg, 2)
		for _, key := range []string{"a", "b", "c"} {
			p.call(t, key, 3, "exhaust "+key)
			o := p.call(t, key, 1, "deny "+key)
			require.True(t, o.redis, "the first denial of %s should come from Redis", key)
			p.clock.Advance(time.Millisecond)
		}
		// Lookups store nothing, so checking b and c first leaves the cache as it is.
		for _, key := range []string{"b", "c"} {
			o := p.call(t, key, 1, "deny "+key+" again")
			require.False(t, o.redis, "%s is among the 2 newest denials and should be answered by the cache", key)
		}
		o := p.call(t, "a", 1, "deny a again")
		require.True(t, o.redis, "a, the oldest of 3 denials in a cache of 2, should have been evicted")
	})
}

func TestDenyCacheClockBackwards(t *testing.T) {
	// The limiters clamp their state when the clock goes back, so that no key
	// is locked out for longer than its configuration allows; the deny cache
	// must not lock it out for longer either.
	forEachCacheAlgorithm(t, func(t *testing.T, b backend, alg algorithm) {
		p := newCachePair(t, b, alg, 16)
		p.call(t, "k", 3, "exhaust")
		p.clock.Advance(time.Millisecond)
		p.call(t, "k", 1, "deny, and cache the denial")
		p.clock.Advance(-time.Hour)
		for i := range 120 {
			p.call(t, "k", 1, fmt.Sprintf("%v after the clock went back an hour", time.Duration(i)*100*time.Millisecond))
			p.clock.Advance(100 * time.Millisecond)
		}
	})
}

func TestDenyCacheInvalidSize(t *testing.T) {
	t.Parallel()
	rdb := deadRedis(t, "", 0) // never dialled: construction makes no call
	for _, size := range []int{0, -1} {
		for _, alg := range algorithms {
			t.Run(fmt.Sprintf("%s/%d", alg.name, size), func(t *testing.T) {
				_, err := alg.new(rdb, 3, 10*time.Second, WithDenyCache(size))
				require.ErrorIs(t, err, ErrInvalidConfig, "WithDenyCache(%d) should be ErrInvalidConfig", size)
			})
		}
	}
}

// Over random traces (n from 0 to above the capacity, time steps from 0 to
// a window) the cached limiter's every Result equals the uncached one's,
// field for field, while the cache answers most denials. It used to answer
// a request above the capacity with the cached denial's Limit (a sliding
// log's larger one), and to repeat a Remaining that had since grown.
func TestDenyCacheSameResultAsRedis(t *testing.T) {
	forEachCacheAlgorithm(t, func(t *testing.T, b backend, alg algorithm) {
		p := newCachePair(t, b, alg, 16)
		rng := rand.New(rand.NewPCG(42+testseed.Offset(t), uint64(len(alg.name))))
		local := 0
		calls := shortOr(200, 600)
		for i := range calls {
			switch r := rng.IntN(10); {
			case r < 5:
				p.clock.Advance(time.Duration(rng.Int64N(int64(50 * time.Millisecond))))
			case r < 8:
			default:
				p.clock.Advance(time.Duration(rng.Int64N(int64(5 * time.Second))))
			}
			n := []int{0, 1, 1, 1, 2, 3, 4, 7}[rng.IntN(8)]
			if !p.call(t, "k", n, fmt.Sprintf("call %d, n=%d at +%v", i, n, p.clock.now.Sub(epoch))).redis {
				local++
			}
		}
		t.Logf("%s: %d of %d calls answered locally", alg.name, local, calls)
		require.Positive(t, local, "the cache answers some denials")
	})
}

// A denial in flight when the same limiter grants on the key was decided
// before that grant, but is stored after it: it must not be, or a later
// request answered from the cache reports the Remaining and RetryAfter of
// before the grant (a RetryAfter shorter than the truth).
func TestDenyCacheGrantDuringDenial(t *testing.T) {
	forEachCacheAlgorithm(t, func(t *testing.T, b backend, alg algorithm) {
		ctx := context.Background()
		g := newReplyGate(t, b, cachedPrefix+"k")
		p := newCachePair(t, b, alg, 16)
		p.call(t, "k", 1, "take 1 of 3")

		inFlight := g.hold(func() (Result, error) { return p.cached.AllowN(ctx, "k", 3) })
		r, err := p.cached.AllowN(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, r.Allowed, "1 of the 2 left, granted while the denial of 3 is in flight")
		g.release()
		require.False(t, (<-inFlight).Allowed, "3 of the 2 left: denied")
		_, err = p.plain.AllowN(ctx, "k", 3)
		require.NoError(t, err)
		_, err = p.plain.AllowN(ctx, "k", 1)
		require.NoError(t, err)

		p.clock.Advance(time.Millisecond)
		p.call(t, "k", 3, "ask for 3 again, after the grant")
	})
}

// Without WithClock, a cached denial's RetryAfter counts from when the
// reply came back, not from when the request left: the script decided in
// between, so a request slow to reach Redis (20ms here) must not make the
// cached RetryAfter shorter than Redis's (a caller who sleeps it would be
// denied again).
func TestDenyCacheSlowRequest(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		slow := redis.NewClient(b.rdb.Options())
		t.Cleanup(func() { slow.Close() })
		// Real time, as the limiter's clock is: a loaded machine only adds
		// to the delay, which makes Redis's later answer shorter still.
		slow.AddHook(beforeDecision{func() { time.Sleep(20 * time.Millisecond) }})
		prefix := fmt.Sprintf("slow:%d:", time.Now().UnixNano())
		cached, err := NewTokenBucket(slow, 1, PerSecond(1), WithPrefix(prefix), WithDenyCache(8))
		require.NoError(t, err)
		plain, err := NewTokenBucket(b.rdb, 1, PerSecond(1), WithPrefix(prefix))
		require.NoError(t, err)
		r, err := plain.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, r.Allowed, "the one token")
		r, err = cached.Allow(ctx, "k")
		require.NoError(t, err)
		require.False(t, r.Allowed, "denied by Redis, and cached")
		got, err := cached.Allow(ctx, "k")
		require.NoError(t, err)
		truth, err := plain.Allow(ctx, "k")
		require.NoError(t, err)
		require.False(t, got.Allowed || truth.Allowed, "both denied")
		require.GreaterOrEqual(t, got.RetryAfter, truth.RetryAfter, "the cached RetryAfter, asked first, is never shorter than Redis's")
		require.GreaterOrEqual(t, got.ResetAfter, truth.ResetAfter, "nor its ResetAfter")
	})
}

// A deny cache hears its own limiter only: limiters in one process that
// share keys (one client, one WithPrefix) keep no registry of each other,
// so A = 5 per 1s, having cached a denial, keeps answering it after B = 10
// per 3s grants on the key or resets it, as it would after another
// process's grant or Reset, until its RetryAfter runs out; a Reset or a
// refund through A itself drops it at once.
func TestDenyCacheHearsItsOwnLimiter(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		clock, opts := prefixClock(be, "peers")
		a, err := NewFixedWindow(be.rdb, 5, time.Second, append(opts, WithDenyCache(16))...)
		require.NoError(t, err)
		b, err := NewFixedWindow(be.rdb, 10, 3*time.Second, append(opts, WithDenyCache(16))...)
		require.NoError(t, err)
		r, err := a.AllowN(ctx, "k", 5)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		r, err = a.Allow(ctx, "k")
		require.NoError(t, err)
		require.False(t, r.Allowed, "denied, and cached")

		clock.Advance(100 * time.Millisecond)
		require.NoError(t, b.Reset(ctx, "k"))
		got, err := a.Allow(ctx, "k")
		require.NoError(t, err)
		require.False(t, got.Allowed, "A's cached denial outlives a Reset through B")
		require.Equal(t, 900*time.Millisecond, got.RetryAfter, "the cached denial counts down")

		require.NoError(t, a.Reset(ctx, "k"))
		got, err = a.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, got.Allowed, "a Reset through A drops its cached denial")
	})
}
