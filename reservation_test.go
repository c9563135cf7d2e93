package redlimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// atomicClock is a fake clock for WithClock that many goroutines read
// while a test moves it.
type atomicClock struct{ us atomic.Int64 }

func newAtomicClock() *atomicClock {
	c := &atomicClock{}
	c.us.Store(epoch.UnixMicro())
	return c
}

func (c *atomicClock) Now() time.Time          { return time.UnixMicro(c.us.Load()) }
func (c *atomicClock) Advance(d time.Duration) { c.us.Add(d.Microseconds()) }

// sameServer returns another client of b's server and database: another
// process, as far as the limiters on it know.
func sameServer(t *testing.T, b backend) *redis.Client {
	if b.mini != nil {
		return newMiniClient(t, b.mini)
	}
	o := b.rdb.Options()
	return newClient(t, o.Addr, o.DB)
}

// reserving is a limiter with WithReservation: Close is its way to give
// back what it holds.
type reserving interface {
	Limiter
	Close(ctx context.Context) error
}

// reserverOf returns l's reservations, to run the timer's sweep at a
// time of the test's choosing.
func reserverOf(l Limiter) *reserver {
	return l.(redisLimiter).redisCore().reserve
}

// granted counts what the test's processes were granted, step by step of
// a fake clock, and checks every span of steps against what the
// algorithm grants in it.
type stepCounts struct {
	mu     sync.Mutex
	counts []int
}

func (s *stepCounts) add(step int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.counts) <= step {
		s.counts = append(s.counts, 0)
	}
	s.counts[step]++
}

// span returns the permits granted in steps from to to (inclusive).
func (s *stepCounts) span(from, to int) int {
	total := 0
	for i := max(from, 0); i <= to && i < len(s.counts); i++ {
		total += s.counts[i]
	}
	return total
}

// reservePeriod is the period of the tests that keep a fake clock still
// and count on a key staying (the calendar's is its day): a real Redis
// expires keys on its own clock by the TTLs the scripts set from the fake
// one. A period of a second let a fixed window's key, or a bucket's
// holding one permit (1 ms at 1,000 a second), expire between two calls on
// a loaded machine, and the key looked fresh.
const reservePeriod = 24 * time.Hour

// reservedAlgorithms are the algorithms WithReservation supports, as the
// exactness test builds and checks them: each grants limit per period,
// and allowed says the most a single caller may get in steps from to to
// of stepsPer steps a period (the clock at epoch + step × period /
// stepsPer).
var reservedAlgorithms = []struct {
	name    string
	period  time.Duration
	new     func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error)
	allowed func(limit, stepsPer, from, to int) int
}{
	{"fixed_window", time.Second, func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error) {
		return NewFixedWindow(rdb, limit, period, opts...)
	}, func(limit, stepsPer, from, to int) int {
		// Traffic never stops, so windows open at epoch + k periods.
		if from/stepsPer != to/stepsPer {
			return 1 << 30
		}
		return limit
	}},
	{"calendar_window", 24 * time.Hour, func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error) {
		return NewCalendarWindow(rdb, limit, Daily(time.UTC), opts...)
	}, func(limit, stepsPer, from, to int) int {
		// Days begin at UTC midnight, which the steps from epoch cross
		// between two steps.
		day := func(step int) time.Time {
			return epoch.Add(time.Duration(step) * 24 * time.Hour / time.Duration(stepsPer)).UTC().Truncate(24 * time.Hour)
		}
		if !day(from).Equal(day(to)) {
			return 1 << 30
		}
		return limit
	}},
	{"sliding_window", time.Second, func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error) {
		return NewSlidingWindow(rdb, limit, period, period/10, opts...)
	}, func(limit, stepsPer, from, to int) int {
		if to-from+1 > stepsPer {
			return 1 << 30
		}
		return limit
	}},
	{"sliding_log", time.Second, func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error) {
		return NewSlidingLog(rdb, period/10, []Strategy{{Limit: limit, Window: period}, {Limit: 2 * limit, Window: 10 * period}}, opts...)
	}, func(limit, stepsPer, from, to int) int {
		switch {
		case to-from+1 <= stepsPer:
			return limit
		case to-from+1 <= 10*stepsPer:
			return 2 * limit
		}
		return 1 << 30
	}},
	{"leaky_bucket", time.Second, func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error) {
		return NewLeakyBucket(rdb, limit, Rate{Count: limit, Per: period}, opts...)
	}, bucketAllowed},
	{"token_bucket", time.Second, func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error) {
		return NewTokenBucket(rdb, limit, Rate{Count: limit, Per: period}, opts...)
	}, bucketAllowed},
}

// bucketAllowed is a bucket's most in steps from to to: its capacity,
// and what it regains between the first step and the last.
func bucketAllowed(limit, stepsPer, from, to int) int {
	return limit + limit*(to-from)/stepsPer
}

// TestReservationNeverExceedsTheLimit runs 64 goroutines in 4 processes
// (limiters on clients of their own) on one hot key, on a fake clock
// moved in steps, and counts every grant at the step it was made in:
// no span of steps gets more than the algorithm grants a single caller,
// and the processes still get close to the limit.
func TestReservationNeverExceedsTheLimit(t *testing.T) {
	t.Parallel()
	for _, alg := range reservedAlgorithms {
		t.Run(alg.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, b backend) {
				period := alg.period
				const (
					limit      = 100
					stepsPer   = 10
					processes  = 4
					goroutines = 16 // per process
				)
				// Two periods under -short cross a window's and a day's
				// end; the full suite's four also see the sliding log's
				// second limit (2 × limit per ten periods) bind.
				steps := shortOr(2*stepsPer, 4*stepsPer)
				// Calls per goroutine per step: either way many times the
				// permits a step regains, on many goroutines at once.
				calls := shortOr(2, 4)
				clock := newAtomicClock()
				var ls []reserving
				for p := 0; p < processes; p++ {
					rdb := sameServer(t, b)
					if b.mini == nil {
						keepTTL(rdb, time.Hour)
					}
					l, err := alg.new(rdb, limit, period, WithClock(clock.Now), WithReservation(16, period))
					require.NoError(t, err)
					ls = append(ls, l.(reserving))
				}
				var counts stepCounts
				for step := 0; step < steps; step++ {
					var wg sync.WaitGroup
					errs := make(chan error, processes*goroutines)
					for _, l := range ls {
						for g := 0; g < goroutines; g++ {
							wg.Add(1)
							go func() {
								defer wg.Done()
								for c := 0; c < calls; c++ {
									res, err := l.Allow(context.Background(), "hot")
									if err != nil {
										errs <- err
										return
									}
									if res.Allowed {
										counts.add(step)
									}
								}
							}()
						}
					}
					wg.Wait()
					close(errs)
					for err := range errs {
						require.NoError(t, err)
					}
					clock.Advance(period / stepsPer)
				}
				for from := 0; from < steps; from++ {
					for to := from; to < steps; to++ {
						most := alg.allowed(limit, stepsPer, from, to)
						require.LessOrEqual(t, counts.span(from, to), most,
							"steps %d to %d (of %d a period): granted more than %s grants a single caller; per step: %v", from, to, stepsPer, alg.name, counts.counts)
					}
				}
				// Stricter by at most what is held: over the run the
				// processes got most of what the limit allows.
				run := min(alg.allowed(limit, stepsPer, 0, steps-1), limit*steps/stepsPer)
				require.Greater(t, counts.span(0, steps-1), run/2, "per step: %v", counts.counts)
				t.Logf("granted per step: %v", counts.counts)
				for _, l := range ls {
					require.NoError(t, l.Close(context.Background()))
				}
			})
		})
	}
}

// TestReservationRoundTrips counts the decisions Redis makes for 64
// goroutines on one hot key: with a batch of 64, at most one call in 8
// reaches Redis, for every algorithm; every call is allowed. The key is
// kept hot whatever the machine's load: each decision waits (in a hook,
// before it is sent) until every goroutine still running is inside a
// call, as on a machine fast enough for the 64 to pile up. Left to the
// scheduler, a busy machine ran them nearly one at a time, and each small
// batch was sized to the little demand it saw.
func TestReservationRoundTrips(t *testing.T) {
	for _, alg := range reservedAlgorithms {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				rec := &commandRecorder{}
				rdb := sameServer(t, b)
				rdb.AddHook(rec)
				pile := &pileUp{}
				pile.cond = sync.NewCond(&pile.mu)
				rdb.AddHook(beforeDecision{do: pile.wait})
				clock := newAtomicClock()
				l, err := alg.new(rdb, 1_000_000, reservePeriod, WithClock(clock.Now), WithReservation(64, time.Minute))
				require.NoError(t, err)
				// Half used: a bucket far from full (one about to be full
				// is decided call by call, see TestReservationFullBucket).
				half, err := l.AllowN(context.Background(), "hot", 500_000)
				require.NoError(t, err)
				require.True(t, half.Allowed)
				rec.take()
				const goroutines, calls = 64, 20
				var wg sync.WaitGroup
				var allowed atomic.Int64
				pile.start(goroutines)
				for g := 0; g < goroutines; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						defer pile.stop()
						for c := 0; c < calls; c++ {
							pile.enter()
							res, err := l.Allow(context.Background(), "hot")
							pile.leave()
							if err == nil && res.Allowed {
								allowed.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				require.EqualValues(t, goroutines*calls, allowed.Load(), "every call is allowed")
				decided := rec.decided(keyPrefix(l) + "hot")
				require.LessOrEqual(t, decided, goroutines*calls/8, "Redis decisions for %d calls", goroutines*calls)
				t.Logf("%d calls, %d Redis decisions", goroutines*calls, decided)
				require.NoError(t, l.(reserving).Close(context.Background()))
			})
		})
	}
}

// pileUp holds each decision sent until every goroutine of a test still
// running is inside a call: see TestReservationRoundTrips. Before start,
// and after every goroutine stopped, it holds nothing.
type pileUp struct {
	mu      sync.Mutex
	cond    *sync.Cond
	running int // goroutines started and not stopped
	inCall  int // of them, inside a call
}

func (p *pileUp) start(goroutines int) { p.update(func() { p.running = goroutines }) }
func (p *pileUp) stop()                { p.update(func() { p.running-- }) }
func (p *pileUp) enter()               { p.update(func() { p.inCall++ }) }
func (p *pileUp) leave()               { p.update(func() { p.inCall-- }) }

func (p *pileUp) update(change func()) {
	p.mu.Lock()
	change()
	p.mu.Unlock()
	p.cond.Broadcast()
}

// wait is the hook's: it returns once every running goroutine is inside
// a call (the one sending this decision among them).
func (p *pileUp) wait() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.inCall < p.running {
		p.cond.Wait()
	}
}

// TestReservationNotBusy: calls on a key one at a time cost what they
// cost without the option: one decision each, nothing held, nothing to
// refund, and another process sees the key exactly.
func TestReservationNotBusy(t *testing.T) {
	for _, alg := range reservedAlgorithms {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				rec := &commandRecorder{}
				rdb, otherRdb := sameServer(t, b), sameServer(t, b)
				rdb.AddHook(rec)
				clock := newAtomicClock()
				a, err := alg.new(rdb, 1000, reservePeriod, WithClock(clock.Now), WithReservation(64, time.Minute))
				require.NoError(t, err)
				other, err := alg.new(otherRdb, 1000, reservePeriod, WithClock(clock.Now))
				require.NoError(t, err)
				for i := 0; i < 50; i++ {
					res, err := a.Allow(context.Background(), "calm")
					require.NoError(t, err)
					require.True(t, res.Allowed)
					require.Equal(t, 1000-i-1, res.Remaining, "call %d: Redis's own Result", i)
				}
				require.Equal(t, 50, rec.decided(keyPrefix(a)+"calm"), "one round trip per call, and no refund")
				res, err := other.AllowN(context.Background(), "calm", 0)
				require.NoError(t, err)
				require.Equal(t, 950, res.Remaining, "nothing held: another process sees what was granted")
				require.NoError(t, a.(reserving).Close(context.Background()))
				require.Equal(t, 50, rec.decided(keyPrefix(a)+"calm"), "Close had nothing to return")
			})
		})
	}
}

// gate is a go-redis hook that holds the next decision sent after arm
// until release: a call in flight, for the test to make the key busy.
type gate struct {
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	release chan struct{}
}

func (g *gate) arm() (entered, release chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.entered, g.release = true, make(chan struct{}), make(chan struct{})
	return g.entered, g.release
}

func (g *gate) do() {
	g.mu.Lock()
	if !g.armed {
		g.mu.Unlock()
		return
	}
	g.armed = false
	entered, release := g.entered, g.release
	g.mu.Unlock()
	close(entered)
	<-release
}

// makeBusy makes key busy on l: a call held in flight by g while two
// more arrive. Nothing is known of the key yet, so they wait for the
// first call's reply; then one of them takes its permit with a batch of
// 3 (the demand seen: three calls), and the other a permit of that
// batch. Redis then counts 5 permits: 3 handed out, 2 held.
func makeBusy(t *testing.T, l Limiter, g *gate, key string) {
	t.Helper()
	entered, release := g.arm()
	done := make(chan error, 3)
	call := func() {
		res, err := l.Allow(context.Background(), key)
		if err == nil && !res.Allowed {
			err = fmt.Errorf("denied: %+v", res)
		}
		done <- err
	}
	go call()
	<-entered
	go call()
	go call()
	rs := reserverOf(l)
	require.Eventually(t, func() bool { return rs.waitingOn(key) == 2 }, 5*time.Second, time.Millisecond,
		"the two calls wait for the first one's reply")
	close(release)
	for i := 0; i < 3; i++ {
		require.NoError(t, <-done)
	}
}

// waitingOn returns how many calls wait for a reply on key.
func (rs *reserver) waitingOn(key string) int {
	sh := rs.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if r := sh.m[key]; r != nil {
		return r.waiting
	}
	return 0
}

// TestReservationBounds: another process finds the key stricter by the
// permits held, and no more; it gets them back when the hold passes, and
// at once on Close. Calls answered from held permits make no round trip,
// are Decision.Local, and report what Redis reports of the key. Every
// algorithm, on a period long enough that the clock's steps regain
// nothing.
func TestReservationBounds(t *testing.T) {
	for _, alg := range reservedAlgorithms {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newAtomicClock()
				g := &gate{}
				rec := &commandRecorder{}
				rdb := sameServer(t, b)
				rdb.AddHook(beforeDecision{do: g.do})
				rdb.AddHook(rec)
				var mu sync.Mutex
				var seen []Decision
				l, err := alg.new(rdb, 100, forever, WithClock(clock.Now), WithReservation(10, time.Second),
					WithObserver(func(d Decision) { mu.Lock(); seen = append(seen, d); mu.Unlock() }))
				require.NoError(t, err)
				a := l.(reserving)
				other, err := alg.new(sameServer(t, b), 100, forever, WithClock(clock.Now))
				require.NoError(t, err)

				makeBusy(t, a, g, "k")
				require.Equal(t, 95, remaining(t, other, "k"), "3 handed out, 2 held: stricter by the 2 held")
				redis, err := other.AllowN(ctx, "k", 0)
				require.NoError(t, err)

				rec.take()
				mu.Lock()
				seen = nil
				mu.Unlock()
				for i := 0; i < 2; i++ {
					res, err := a.Allow(ctx, "k")
					require.NoError(t, err)
					require.Equal(t, Result{Allowed: true, Limit: redis.Limit, Remaining: redis.Remaining, ResetAfter: redis.ResetAfter}, withoutGrant(res),
						"from the held permits: what Redis says of the key")
				}
				require.Zero(t, rec.scripts(), "held permits answer without a round trip")
				mu.Lock()
				require.Len(t, seen, 2)
				for _, d := range seen {
					require.True(t, d.Local, "observers see a call answered from held permits as Local: %+v", d)
				}
				mu.Unlock()
				require.Equal(t, 95, remaining(t, other, "k"), "all 5 handed out: exact")

				// Busy still (its batch ran out within the hold): the next
				// call takes a batch sized to the demand seen, 2 calls and
				// itself.
				res, err := a.Allow(ctx, "k")
				require.NoError(t, err)
				require.Equal(t, 91, res.Remaining, "a batch of 1 + 3")
				require.Equal(t, 91, remaining(t, other, "k"), "6 handed out, 3 held")

				clock.Advance(time.Second)
				reserverOf(a).sweep() // the timer, at its time
				require.Equal(t, 94, remaining(t, other, "k"), "the hold passed: the 3 held are back")

				makeBusy(t, a, g, "k")
				require.Equal(t, 89, remaining(t, other, "k"), "9 handed out, 2 held")
				require.NoError(t, a.Close(ctx))
				require.Equal(t, 91, remaining(t, other, "k"), "Close gives the 2 held back at once")
				res, err = a.Allow(ctx, "k")
				require.NoError(t, err)
				require.Equal(t, 90, res.Remaining, "closed: decided by Redis")
			})
		})
	}
}

// TestReservationHoldTimer: without a fake clock, the limiter's timer
// gives back what is held once the hold passes, with no call on the key.
func TestReservationHoldTimer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		g := &gate{}
		rdb := sameServer(t, b)
		rdb.AddHook(beforeDecision{do: g.do})
		a, err := NewFixedWindow(rdb, 100, time.Hour, WithReservation(10, 50*time.Millisecond))
		require.NoError(t, err)
		other, err := NewFixedWindow(sameServer(t, b), 100, time.Hour)
		require.NoError(t, err)
		makeBusy(t, a, g, "k")
		require.Equal(t, 95, remaining(t, other, "k"))
		require.Eventually(t, func() bool { return remaining(t, other, "k") == 97 }, 5*time.Second, 5*time.Millisecond,
			"the held permits come back after the hold")
	})
}

// TestReservationRefunds: a Grant handed out from held permits refunds
// into them while the reservation holds, without a round trip, and to
// Redis through the batch's grant once it does not; in all, never more
// than it took, however often it is refunded.
func TestReservationRefunds(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newAtomicClock()
		g := &gate{}
		rec := &commandRecorder{}
		rdb := sameServer(t, b)
		rdb.AddHook(beforeDecision{do: g.do})
		rdb.AddHook(rec)
		a, err := NewFixedWindow(rdb, 100, time.Minute, WithClock(clock.Now), WithReservation(10, time.Second))
		require.NoError(t, err)
		other, err := NewFixedWindow(sameServer(t, b), 100, time.Minute, WithClock(clock.Now))
		require.NoError(t, err)

		makeBusy(t, a, g, "k") // Redis counts 5: 3 handed out, 2 held
		rec.take()
		first, err := a.Allow(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, 1, first.Grant.N())
		require.NoError(t, first.Grant.Refund(ctx, 1), "into the reservation")
		require.NoError(t, first.Grant.Refund(ctx, 1), "again: gives nothing more")
		require.Zero(t, rec.scripts(), "refunds into held permits make no round trip")
		require.Equal(t, 95, remaining(t, other, "k"), "Redis still counts the held permits")

		second, err := a.Allow(ctx, "k")
		require.NoError(t, err)
		require.NoError(t, a.Close(ctx))
		require.Equal(t, 96, remaining(t, other, "k"), "4 handed out in all: Close gave back the one held")

		require.NoError(t, second.Grant.Refund(ctx, 1), "after Close: to Redis")
		require.Equal(t, 97, remaining(t, other, "k"))
		require.NoError(t, second.Grant.Refund(ctx, 1), "a retry")
		require.NoError(t, first.Grant.Refund(ctx, 1), "the first again, whose permit Close gave back")
		require.Equal(t, 97, remaining(t, other, "k"), "never more than each took")
		require.ErrorIs(t, second.Grant.Refund(ctx, 2), ErrInvalidArgument, "more than it took")
	})
}

// TestReservationBreaker: permits held when the breaker opens are not
// handed out while it is open: calls get ErrUnavailable (or the
// fallback's decision), as without the option.
func TestReservationBreaker(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := newMiniClient(t, m)
	g := &gate{}
	rdb.AddHook(beforeDecision{do: g.do})
	breaker, err := NewBreaker(BreakerConfig{Failures: 1, Cooldown: time.Hour})
	require.NoError(t, err)
	a, err := NewFixedWindow(rdb, 100, time.Minute, WithBreaker(breaker), WithReservation(10, time.Hour))
	require.NoError(t, err)
	ctx := context.Background()
	makeBusy(t, a, g, "k")
	res, err := a.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Allowed, "from the 2 held")

	m.Close()
	_, err = a.AllowN(ctx, "k", 0)
	require.Error(t, err, "Redis is gone")
	require.Equal(t, BreakerOpen, breaker.State())
	_, err = a.Allow(ctx, "k")
	require.ErrorIs(t, err, ErrUnavailable, "the permit still held is not handed out past an open breaker")
}

// TestReservationAllowAll: a part whose limiter holds permits for its key
// is answered from them, without a round trip, and a denial by another
// part gives its permit back to the reservation.
func TestReservationAllowAll(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newAtomicClock()
		g := &gate{}
		rec := &commandRecorder{}
		rdb := sameServer(t, b)
		rdb.AddHook(beforeDecision{do: g.do})
		a, err := NewFixedWindow(rdb, 100, time.Minute, WithClock(clock.Now), WithReservation(10, time.Hour))
		require.NoError(t, err)
		once, err := NewFixedWindow(rdb, 1, time.Minute, WithClock(clock.Now))
		require.NoError(t, err)
		other, err := NewFixedWindow(sameServer(t, b), 100, time.Minute, WithClock(clock.Now))
		require.NoError(t, err)
		makeBusy(t, a, g, "k") // 3 handed out, 2 held
		rdb.AddHook(rec)

		res, err := AllowAll(ctx, 1, Part{a, "k"}, Part{once, "x"})
		require.NoError(t, err)
		require.True(t, res.Allowed)
		require.Equal(t, 1, rec.decided(keyPrefix(once)+"x"))
		require.Zero(t, rec.decided(keyPrefix(a)+"k"), "the reserved part answered from held permits")

		res, err = AllowAll(ctx, 1, Part{a, "k"}, Part{once, "x"})
		require.NoError(t, err)
		require.False(t, res.Allowed, "the other part denies")
		require.Equal(t, 1, res.Part)
		require.Zero(t, rec.decided(keyPrefix(a)+"k"), "the reserved part's permit went back to the reservation")

		require.NoError(t, a.Close(ctx))
		require.Equal(t, 96, remaining(t, other, "k"), "4 handed out: the denied call took nothing")
	})
}

// TestReservationConfig: WithReservation's arguments are checked, and a
// Concurrency, whose permits are leases, refuses it.
func TestReservationConfig(t *testing.T) {
	rdb := newMiniClient(t, miniredis.RunT(t))
	for _, c := range []struct {
		name string
		new  func() error
		want string
	}{
		{"batch 1", func() error {
			_, err := NewFixedWindow(rdb, 10, time.Second, WithReservation(1, time.Second))
			return err
		}, "batch 1: must be at least 2"},
		{"hold 0", func() error { _, err := NewTokenBucket(rdb, 10, PerSecond(10), WithReservation(8, 0)); return err }, "hold 0s: must be at least 1ms"},
		{"concurrency", func() error {
			_, err := NewConcurrency(rdb, 10, time.Second, WithReservation(8, time.Second))
			return err
		}, "leases"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.new()
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.ErrorContains(t, err, c.want)
		})
	}
	l, err := NewSlidingWindow(rdb, 10, time.Second, 100*time.Millisecond)
	require.NoError(t, err)
	require.NoError(t, l.Close(context.Background()), "without a reservation Close has nothing to return")
}

// recordingLimiter is a fallback that allows everything and records the
// n of each call.
type recordingLimiter struct {
	mu sync.Mutex
	ns []int
}

func (r *recordingLimiter) AllowN(_ context.Context, _ string, n int) (Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ns = append(r.ns, n)
	return Result{Allowed: true, Limit: 1000, Remaining: 1000}, nil
}

func (r *recordingLimiter) Allow(ctx context.Context, key string) (Result, error) {
	return r.AllowN(ctx, key, 1)
}

func (r *recordingLimiter) TryAcquire(ctx context.Context, key string) error {
	_, err := r.AllowN(ctx, key, 1)
	return err
}

func (r *recordingLimiter) Reset(context.Context, string) error { return nil }

// TestReservationFallback: a batch asked of a Redis that fails is decided
// by the fallback for its caller's n alone: nothing is held from a
// fallback.
func TestReservationFallback(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := newMiniClient(t, m)
	g := &gate{}
	rdb.AddHook(beforeDecision{do: g.do})
	fb := &recordingLimiter{}
	var fellBack atomic.Int64
	a, err := NewFixedWindow(rdb, 100, time.Minute, WithFallback(fb), WithReservation(10, time.Hour),
		WithObserver(func(d Decision) {
			if d.Fallback {
				fellBack.Add(1)
			}
		}))
	require.NoError(t, err)

	// Redis answers the first call, then fails: the batch the next call
	// asks for is decided by the fallback.
	var once sync.Once
	rec := &commandRecorder{afterReply: func(c recordedCmd) {
		if c.decision && !c.noScript {
			once.Do(func() { m.SetError("simulated outage") })
		}
	}}
	rdb.AddHook(rec)
	makeBusy(t, a, g, "k")
	fb.mu.Lock()
	require.Equal(t, []int{1, 1}, fb.ns, "the fallback decides each call's own n, never a batch")
	fb.mu.Unlock()
	require.EqualValues(t, 2, fellBack.Load(), "observers see both calls decided by the fallback")
}

// TestReservationDenyCache: with a deny cache, a hot key's grants come
// from batches, never past the limit, and its denials from the cache.
func TestReservationDenyCache(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		rec := &commandRecorder{}
		rdb := sameServer(t, b)
		rdb.AddHook(rec)
		clock := newAtomicClock()
		l, err := NewFixedWindow(rdb, 50, time.Minute, WithClock(clock.Now), WithDenyCache(16), WithReservation(16, time.Minute))
		require.NoError(t, err)
		var wg sync.WaitGroup
		var allowed atomic.Int64
		for g := 0; g < 32; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for c := 0; c < 20; c++ {
					if res, err := l.Allow(context.Background(), "hot"); err == nil && res.Allowed {
						allowed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		require.LessOrEqual(t, allowed.Load(), int64(50), "never past the limit")
		require.Greater(t, allowed.Load(), int64(30), "stricter by at most what was held")
		rec.take()
		res, err := l.Allow(context.Background(), "hot")
		require.NoError(t, err)
		if !res.Allowed {
			require.Zero(t, rec.decided(keyPrefix(l)+"hot"), "a denial the cache holds costs no round trip")
		}
		require.NoError(t, l.Close(context.Background()))
	})
}

// TestReservationCluster: on a Cluster, batches and their refunds are
// single-key scripts like any call.
func TestReservationCluster(t *testing.T) {
	skipShort(t, "cluster test: starts a 3-master Redis Cluster")
	clusterScripts.RLock()
	defer clusterScripts.RUnlock()
	cc := dialCluster(t)
	l, err := NewFixedWindow(cc, 10_000, time.Hour, WithReservation(32, time.Minute))
	require.NoError(t, err)
	other, err := NewFixedWindow(cc, 10_000, time.Hour)
	require.NoError(t, err)
	ctx := context.Background()
	key := fmt.Sprintf("%s:%d", t.Name(), time.Now().UnixNano())
	var wg sync.WaitGroup
	var allowed atomic.Int64
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := 0; c < 20; c++ {
				if res, err := l.Allow(ctx, key); err == nil && res.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 640, allowed.Load())
	require.NoError(t, l.Close(ctx))
	require.Equal(t, 10_000-640, remaining(t, other, key), "Close gave back every permit held")
}

// TestReservationFullBucket: permits taken early from a bucket about to
// be full would cost the refill they stop, so a bucket calls keep full is
// decided call by call: no batch, nothing held, as without the option.
func TestReservationFullBucket(t *testing.T) {
	for _, alg := range reservedAlgorithms {
		if alg.name != "token_bucket" && alg.name != "leaky_bucket" {
			continue
		}
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				clock := newAtomicClock()
				g := &gate{}
				rdb := sameServer(t, b)
				rdb.AddHook(beforeDecision{do: g.do})
				otherRdb := sameServer(t, b)
				if b.mini == nil { // the key's TTL is fake time: µs
					keepTTL(rdb, time.Hour)
					keepTTL(otherRdb, time.Hour)
				}
				// 10,000 a second: a permit refills in 100µs, less than
				// a batch must be able to hand out for.
				a, err := alg.new(rdb, 10_000, time.Second, WithClock(clock.Now), WithReservation(10, time.Second))
				require.NoError(t, err)
				other, err := alg.new(otherRdb, 10_000, time.Second, WithClock(clock.Now))
				require.NoError(t, err)
				makeBusy(t, a, g, "k")
				require.Equal(t, 9997, remaining(t, other, "k"), "three calls, three permits: nothing held")
			})
		})
	}
}
