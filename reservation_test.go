package redlimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// reservedAlgorithms are the algorithms WithReservation supports, as the
// exactness test builds and checks them: each grants limit per period,
// and allowed says the most a single caller may get in steps from to to
// of stepsPer steps a period (the clock at epoch + step × period /
// stepsPer).
var reservedAlgorithms = []struct {
	name    string
	new     func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error)
	allowed func(limit, stepsPer, from, to int) int
}{
	{"fixed_window", func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error) {
		return NewFixedWindow(rdb, limit, period, opts...)
	}, func(limit, stepsPer, from, to int) int {
		// Traffic never stops, so windows open at epoch + k periods.
		if from/stepsPer != to/stepsPer {
			return 1 << 30
		}
		return limit
	}},
	{"calendar_window", func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error) {
		return NewCalendarWindow(rdb, limit, Daily(time.UTC), opts...)
	}, nil},
	{"sliding_window", func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error) {
		return NewSlidingWindow(rdb, limit, period, period/10, opts...)
	}, func(limit, stepsPer, from, to int) int {
		if to-from+1 > stepsPer {
			return 1 << 30
		}
		return limit
	}},
	{"sliding_log", func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error) {
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
	{"leaky_bucket", func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error) {
		return NewLeakyBucket(rdb, limit, Rate{Count: limit, Per: period}, opts...)
	}, bucketAllowed},
	{"token_bucket", func(rdb redis.Scripter, limit int, period time.Duration, opts ...Option) (Limiter, error) {
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
	for _, alg := range reservedAlgorithms {
		if alg.allowed == nil {
			continue // the calendar window has its own test
		}
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				b.keepKeys()
				const (
					limit      = 100
					period     = time.Second
					stepsPer   = 10
					steps      = 40
					processes  = 4
					goroutines = 16 // per process
					calls      = 4  // per goroutine per step
				)
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

var _ = errors.Is
var _ = fmt.Sprint
