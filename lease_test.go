package redlimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/engine"
	"github.com/redlimit/redlimit/internal/model"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/testseed"
)

// wantModel fails t unless res is what the model's want says.
func wantModel(t *testing.T, want model.Result, res Result, what string) {
	t.Helper()
	retry := time.Duration(want.RetryAfterUS) * us
	if want.RetryAfterUS == model.Never {
		retry = Never
	}
	got := Result{Allowed: res.Allowed, Limit: res.Limit, Remaining: res.Remaining, RetryAfter: res.RetryAfter, ResetAfter: res.ResetAfter}
	require.Equal(t, Result{
		Allowed:    want.Allowed,
		Limit:      int(want.Limit),
		Remaining:  int(want.Remaining),
		RetryAfter: retry,
		ResetAfter: time.Duration(want.ResetAfterUS) * us,
	}, got, "%s: the model's Result", what)
	require.Equal(t, want.Allowed && want.GrantID != 0, res.Grant.N() > 0, "%s: a Grant exactly when leases were taken", what)
}

// releaseGiven releases k leases of g through c's engine and returns how
// many places that freed, which Grant.Refund does not tell.
func releaseGiven(t *testing.T, c *Concurrency, g Grant, k int) int {
	t.Helper()
	_, key, token := engine.GrantParts(g)
	_, given, err := c.engine.Refund(context.Background(), key, token, k)
	require.NoError(t, err, "releasing %d of %v", k, g)
	return given
}

// TestConcurrencyAgreesWithModel runs random traces of grants, releases,
// extends and clock steps (forward, back within a lease, back by more: a
// clock gone wrong) against internal/model's Concurrency: every Result and
// every release's freed places must be the model's. Half the traces run
// with an observer; without one a release is bare, and replies the leases
// it removed, live or lapsed (at least the places it freed): its effect
// shows in the Results after it.
func TestConcurrencyAgreesWithModel(t *testing.T) {
	offset := testseed.Offset(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		b.keepKeys()
		ctx := context.Background()
		seen := map[string]int{} // what the traces did, so that a change of shape cannot hide it
		for trace := range 40 {
			seed := uint64(trace) + offset
			r := rand.New(rand.NewPCG(seed, 37))
			limit := 1 + r.IntN(4)
			lease := time.Duration(1+r.IntN(5)) * 10 * ms
			clock := newClock()
			observed := trace%2 == 0
			opts := []Option{WithClock(clock.Now)}
			if observed {
				opts = append(opts, WithObserver(func(Decision) {}))
			}
			c, err := NewConcurrency(b.rdb, limit, lease, opts...)
			require.NoError(t, err)
			m := model.NewConcurrency(int64(limit), lease.Microseconds())
			key := fmt.Sprintf("trace-%d", trace)
			grants := map[int64]Grant{} // by the model's grant id
			var ids []int64
			pick := func() (int64, Grant, bool) {
				if len(ids) == 0 {
					return 0, Grant{}, false
				}
				id := ids[r.IntN(len(ids))]
				return id, grants[id], true
			}
			for step := range 80 {
				now := clock.Now().UnixMicro()
				wrong := m.ClockWrong(now)
				if wrong {
					seen["clock gone wrong"]++
				}
				what := fmt.Sprintf("seed %d step %d at %dµs", seed, step, now-epoch.UnixMicro())
				switch op := r.IntN(10); {
				case op < 2:
					steps := []time.Duration{us, lease / 3, lease, 2 * lease, -lease / 2, -3 * lease}
					clock.Advance(steps[r.IntN(len(steps))] + time.Duration(r.IntN(3))*us)
				case op < 6:
					n := r.IntN(limit + 2)
					res, err := c.AllowN(ctx, key, n)
					require.NoError(t, err, what)
					want := m.Step(now, int64(n))
					wantModel(t, want, res, fmt.Sprintf("%s: AllowN(%d)", what, n))
					seen[fmt.Sprintf("AllowN allowed %v", want.Allowed)]++
					if want.GrantID != 0 && wrong {
						seen["grant on a clock gone wrong"]++
					}
					if want.GrantID != 0 {
						grants[want.GrantID] = res.Grant
						ids = append(ids, want.GrantID)
					}
				case op < 8:
					id, g, ok := pick()
					if !ok {
						continue
					}
					k := 1 + r.IntN(g.N())
					want := m.Refund(now, id, int64(k))
					given := releaseGiven(t, c, g, k)
					if observed {
						require.Equal(t, int(want), given, "%s: places freed by releasing %d of %v", what, k, g)
					} else {
						require.GreaterOrEqual(t, given, int(want), "%s: bare: leases removed by releasing %d of %v", what, k, g)
						require.LessOrEqual(t, given, k, "%s: bare: leases removed by releasing %d of %v", what, k, g)
					}
					seen[fmt.Sprintf("release freed some %v", want > 0)]++
					seen[fmt.Sprintf("release observed %v", observed)]++
				default:
					id, g, ok := pick()
					if !ok {
						continue
					}
					res, err := c.ExtendGrant(ctx, g)
					require.NoError(t, err, what)
					want, newID := m.Extend(now, id)
					wantModel(t, want, res, fmt.Sprintf("%s: ExtendGrant(%v)", what, g))
					seen[fmt.Sprintf("extend allowed %v, same grant %v", want.Allowed, newID == id)]++
					if want.Allowed && newID != id {
						grants[newID] = res.Grant
						ids = append(ids, newID)
					}
				}
			}
		}
		for _, outcome := range []string{"clock gone wrong", "AllowN allowed true", "AllowN allowed false",
			"release freed some true", "release freed some false", "extend allowed true, same grant true",
			"extend allowed true, same grant false", "extend allowed false, same grant true", "grant on a clock gone wrong",
			"release observed true", "release observed false"} {
			require.NotZero(t, seen[outcome], "the traces never saw %q: %v", outcome, seen)
		}
	})
}

// TestConcurrencyHoldersNeverExceedLimit: 200 goroutines over 4 clients
// (4 processes' worth of connection pools and limiters) take leases on one
// key and hold them for random times. The number in flight, counted by the
// test itself between Acquire's return and the Release, never exceeds the
// limit; and no lease is lost: at rest the key admits limit again.
func TestConcurrencyHoldersNeverExceedLimit(t *testing.T) {
	const (
		limit      = 7
		clients    = 4
		goroutines = 50 // per client
		attempts   = 5  // per goroutine
	)
	offset := testseed.Offset(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		limiters := make([]*Concurrency, clients)
		for i := range limiters {
			rdb := redis.NewClient(b.rdb.Options())
			t.Cleanup(func() { rdb.Close() })
			c, err := NewConcurrency(rdb, limit, time.Minute)
			require.NoError(t, err)
			limiters[i] = c
		}
		var inFlight, most, granted atomic.Int64
		errs := make(chan error, clients*goroutines*attempts)
		var wg sync.WaitGroup
		for i, c := range limiters {
			for g := range goroutines {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(offset, uint64(i*goroutines+g)))
					for range attempts {
						lease, err := c.Acquire(ctx, "hot")
						if err != nil {
							if !errors.Is(err, ErrAcquireFailed) {
								errs <- err
							}
							// Real time: the holders below hold in real
							// time, and the leases last a minute, so a
							// loaded machine only slows the churn.
							time.Sleep(time.Duration(r.IntN(500)) * us) // a denied caller's back-off
							continue
						}
						granted.Add(1)
						now := inFlight.Add(1)
						for seen := most.Load(); now > seen && !most.CompareAndSwap(seen, now); seen = most.Load() {
						}
						time.Sleep(time.Duration(r.IntN(2000)) * us) // a holder's work, far inside its minute's lease
						inFlight.Add(-1)
						if err := lease.Release(ctx); err != nil {
							errs <- err
						}
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err, "every Acquire and Release must be decided")
		}
		require.LessOrEqual(t, most.Load(), int64(limit), "leases in flight at once")
		require.Greater(t, granted.Load(), int64(limit), "released places must be taken again")
		res, err := limiters[0].AllowN(ctx, "hot", limit)
		require.NoError(t, err)
		require.True(t, res.Allowed, "at rest, every place released: the key admits %d leases again, got %+v", limit, res)
	})
}

// TestConcurrencyCrashedHolderComesBack: leases of a client that closed
// without releasing them hold their places until their lease period
// passes, then no longer; a release or extend of a lapsed lease never
// frees or takes another holder's place.
func TestConcurrencyCrashedHolderComesBack(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		b.keepKeys()
		ctx := context.Background()
		clock := newClock()
		crashed := redis.NewClient(b.rdb.Options())
		gone, err := NewConcurrency(crashed, 3, time.Second, WithClock(clock.Now))
		require.NoError(t, err)
		for range 3 {
			_, err := gone.Acquire(ctx, "k")
			require.NoError(t, err)
		}
		require.NoError(t, crashed.Close())

		c, err := NewConcurrency(b.rdb, 3, time.Second, WithClock(clock.Now))
		require.NoError(t, err)
		_, err = c.Acquire(ctx, "k")
		var denial *ViolationStrategyError
		require.ErrorAs(t, err, &denial, "the crashed client's leases still hold their places")
		require.Equal(t, ViolationStrategyError{Limit: 3, RetryAfter: time.Second}, *denial)
		clock.Advance(time.Second - us)
		_, err = c.Acquire(ctx, "k")
		require.ErrorAs(t, err, &denial, "a microsecond before the leases lapse")
		require.Equal(t, us, denial.RetryAfter)
		clock.Advance(us)

		old, err := c.Acquire(ctx, "k")
		require.NoError(t, err, "the crashed client's places came back after one lease")
		clock.Advance(time.Second) // old lapses too
		for range 3 {
			_, err := c.Acquire(ctx, "k")
			require.NoError(t, err, "a full key again, of live holders")
		}
		require.NoError(t, old.Release(ctx), "releasing a lapsed lease is not an error")
		res, err := c.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Zero(t, res.Remaining, "releasing a lapsed lease freed another holder's place")
		err = old.Extend(ctx)
		require.ErrorIs(t, err, ErrInvalidArgument, "Extend after Release never takes a place")
	})
}

// TestLeaseReleaseAndExtend: Extend keeps a lease live another period from
// now; Release frees its place once, however often it is called; a lapsed
// lease extended is taken afresh when there is room, denied when not.
func TestLeaseReleaseAndExtend(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		b.keepKeys()
		ctx := context.Background()
		clock := newClock()
		c, err := NewConcurrency(b.rdb, 1, 100*ms, WithClock(clock.Now))
		require.NoError(t, err)
		first, err := c.Acquire(ctx, "k")
		require.NoError(t, err)
		clock.Advance(60 * ms)
		require.NoError(t, first.Extend(ctx))
		clock.Advance(60 * ms) // past the first period, within the extended one
		_, err = c.Acquire(ctx, "k")
		var denial *ViolationStrategyError
		require.ErrorAs(t, err, &denial, "the extended lease is live")
		require.Equal(t, 40*ms, denial.RetryAfter, "it lapses a period after the Extend")

		require.NoError(t, first.Release(ctx))
		require.NoError(t, first.Release(ctx), "Release is idempotent")
		second, err := c.Acquire(ctx, "k")
		require.NoError(t, err, "the released place is free")
		res, err := c.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Zero(t, res.Remaining, "a second Release freed nothing more")

		clock.Advance(100 * ms) // second lapses
		require.NoError(t, second.Extend(ctx), "a lapsed lease is taken afresh when there is room")
		_, err = c.Acquire(ctx, "k")
		require.ErrorIs(t, err, ErrAcquireFailed, "the lease taken afresh holds the place")

		other, err := NewConcurrency(b.rdb, 1, 100*ms, WithClock(clock.Now))
		require.NoError(t, err)
		clock.Advance(100 * ms)
		third, err := other.Acquire(ctx, "k")
		require.NoError(t, err)
		err = second.Extend(ctx)
		require.ErrorAs(t, err, &denial, "a lapsed lease of a full key")
		require.Equal(t, ViolationStrategyError{Limit: 1, RetryAfter: 100 * ms}, *denial)
		require.NoError(t, third.Release(ctx))
		_, err = c.Acquire(ctx, "k")
		require.NoError(t, err, "only the third lease held the place")
	})
}

// TestConcurrencyExtendAfterLapseKeepsOthers: extending a grant whose
// leases lapsed, on a key whose lapsed leases were not all trimmed yet,
// takes the grant afresh and trims lapsed leases, never another holder's
// live one.
func TestConcurrencyExtendAfterLapseKeepsOthers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newClock()
		c, err := NewConcurrency(b.rdb, 30, time.Second, WithClock(clock.Now))
		require.NoError(t, err)
		many, err := c.AllowN(ctx, "k", 20)
		require.NoError(t, err)
		require.True(t, many.Allowed)
		lapsing, err := c.AllowN(ctx, "k", 10)
		require.NoError(t, err)
		require.True(t, lapsing.Allowed)
		clock.Advance(2 * time.Second) // all 30 lapse; a grant trims 9 of them
		_, err = c.Acquire(ctx, "k")
		require.NoError(t, err)

		res, err := c.ExtendGrant(ctx, lapsing.Grant)
		require.NoError(t, err)
		require.True(t, res.Allowed, "the lapsed grant is taken afresh")
		require.Equal(t, 19, res.Remaining, "the lease acquired and the grant's 10 are live")
		require.Equal(t, 19, remaining(t, c, "k"), "the key still holds the lease acquired and the grant's 10")
	})
}

// TestConcurrencyBadConfig: bad limits and leases are ErrInvalidConfig
// naming the field, and so is a fallback that cannot extend leases.
func TestConcurrencyBadConfig(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, tc := range []struct {
		limit int
		lease time.Duration
		opts  []Option
		field string
	}{
		{0, time.Second, nil, "limit 0"},
		{-1, time.Second, nil, "limit -1"},
		{MaxConcurrencyLimit + 1, time.Second, nil, "limit 10001"},
		{1, time.Millisecond - time.Microsecond, nil, "lease 999µs"},
		{1, 0, nil, "lease 0s"},
		{1, time.Second, []Option{WithFallback(&FixedWindow{})}, "WithFallback(*redlimit.FixedWindow)"},
	} {
		_, err := NewConcurrency(rdb, tc.limit, tc.lease, tc.opts...)
		require.ErrorIs(t, err, ErrInvalidConfig, tc.field)
		require.ErrorContains(t, err, tc.field)
	}
}

// A release drops the cached denials of the limiter it goes through: the
// next Acquire there goes to Redis and finds the place free. (A deny cache
// hears its own limiter only, as WithDenyCache says: another limiter's
// cached denial runs out at its RetryAfter, as after another process's
// release.)
func TestConcurrencyDenyCacheDropsOnRelease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		var local atomic.Int64
		observe := WithObserver(func(d Decision) {
			if d.Local {
				local.Add(1)
			}
		})
		c, err := NewConcurrency(b.rdb, 1, time.Minute, WithDenyCache(10), observe)
		require.NoError(t, err)

		held, err := c.Acquire(ctx, "k")
		require.NoError(t, err)
		for range 2 {
			_, err := c.Acquire(ctx, "k")
			require.ErrorIs(t, err, ErrAcquireFailed)
		}
		require.EqualValues(t, 1, local.Load(), "the second denial is the cache's")

		require.NoError(t, held.Release(ctx))
		_, err = c.Acquire(ctx, "k")
		require.NoError(t, err, "the cached denial went with the release")
		require.EqualValues(t, 1, local.Load())
	})
}

// evalshaMicros returns the calls of EVALSHA and the µs Redis spent in
// them (INFO commandstats).
func evalshaMicros(t *testing.T, rdb *redis.Client) (calls, usec int64) {
	t.Helper()
	return commandStats(t, rdb, "evalsha")
}

// commandStats returns the calls of the command named (lower case) and the
// µs Redis spent in them (INFO commandstats), scripts' calls included.
func commandStats(t *testing.T, rdb *redis.Client, name string) (calls, usec int64) {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_"+name+":")
		if !ok {
			continue
		}
		for _, field := range strings.Split(rest, ",") {
			name, value, _ := strings.Cut(field, "=")
			switch name {
			case "calls":
				calls, _ = strconv.ParseInt(value, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(value, 10, 64)
			}
		}
	}
	return calls, usec
}

// TestConcurrencyLapsedLeasesCostNothing: a key holding 100,000 lapsed
// leases (more than a key ever keeps: every grant trims some) counts none
// of them, and an Acquire and Release on it costs Redis at most 3× what
// they cost on a key of a few leases. On a server of its own: INFO
// commandstats counts every client's commands.
func TestConcurrencyLapsedLeasesCostNothing(t *testing.T) {
	skipShort(t, "starts a redis-server and builds a key of 100,000 leases")
	t.Parallel()
	const lapsed = 100_000
	rdb := newClient(t, redistest.Start(t).Addr(), 0)
	ctx := context.Background()
	clock := newClock()
	c, err := NewConcurrency(rdb, 10, time.Minute, WithClock(clock.Now))
	require.NoError(t, err)

	// The state of docs/internals.md, written by hand: no sequence of
	// calls leaves this many lapsed leases.
	key, past := c.redisKey("lapsed"), epoch.Add(-time.Minute).UnixMicro()
	pipe := rdb.Pipeline()
	pipe.ZAdd(ctx, key, redis.Z{Score: 0, Member: fmt.Sprintf("#%d:%d", past-time.Minute.Microseconds(), lapsed)})
	for id := 1; id <= lapsed; id += 1000 {
		members := make([]redis.Z, 0, 1000)
		for i := id; i < id+1000; i++ {
			members = append(members, redis.Z{Score: float64(past), Member: strconv.Itoa(i)})
		}
		pipe.ZAdd(ctx, key, members...)
	}
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)

	cost := func(key string) float64 {
		const rounds = 300
		held, err := c.Acquire(ctx, key) // a live lease besides, as on a busy key
		require.NoError(t, err)
		calls0, usec0 := evalshaMicros(t, rdb)
		for range rounds {
			lease, err := c.Acquire(ctx, key)
			require.NoError(t, err, "lapsed leases count for nothing")
			require.NoError(t, lease.Release(ctx))
		}
		calls, usec := evalshaMicros(t, rdb)
		require.Equal(t, int64(2*rounds), calls-calls0, "one round trip per Acquire and per Release")
		require.NoError(t, held.Release(ctx))
		return float64(usec-usec0) / float64(calls-calls0)
	}
	res, err := c.AllowN(ctx, "lapsed", 0)
	require.NoError(t, err)
	require.Equal(t, 10, res.Remaining, "100,000 lapsed leases hold no place")
	normal, onLapsed := cost("normal"), cost("lapsed")
	t.Logf("Redis µs per call: %.1f on a key of a few leases, %.1f beside %d lapsed ones", normal, onLapsed, lapsed)
	require.LessOrEqual(t, onLapsed, 3*normal, "a call beside 100,000 lapsed leases costs at most 3× a normal one")
}

// TestConcurrencyNil: a nil *Concurrency (a constructor's error ignored)
// and a nil *Lease return errors naming the fix instead of panicking.
func TestConcurrencyNil(t *testing.T) {
	ctx := context.Background()
	var c *Concurrency
	_, err := c.Acquire(ctx, "k")
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "NewConcurrency")
	_, err = c.ExtendGrant(ctx, Grant{})
	require.ErrorIs(t, err, ErrInvalidConfig)
	var l *Lease
	require.ErrorIs(t, l.Release(ctx), ErrInvalidArgument)
	require.ErrorIs(t, l.Extend(ctx), ErrInvalidArgument)
}

// TestConcurrencySharedKeyLongerLease: under one WithPrefix, a
// configuration of short leases whose clock is behind by more than its
// own lease reads another's long lease as live for as long as it was
// granted, not as a clock gone wrong that ends it within the short lease.
func TestConcurrencySharedKeyLongerLease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		b.keepKeys()
		ctx := context.Background()
		clock, behind := newClock(), newClock()
		behind.Advance(-2 * time.Second)
		long, short := hourAndSecond(t, b, 1, "shared:", clock.Now, behind.Now)
		held, err := long.Acquire(ctx, "k")
		require.NoError(t, err)
		_, err = short.Acquire(ctx, "k")
		var denial *ViolationStrategyError
		require.ErrorAs(t, err, &denial, "the hour-long lease is live")
		require.Equal(t, time.Hour+2*time.Second, denial.RetryAfter, "until it lapses, on the short configuration's clock")
		require.NoError(t, held.Release(ctx))
		_, err = short.Acquire(ctx, "k")
		require.NoError(t, err, "released, the place is the short configuration's")
	})
}

// TestConcurrencyTTLFollowsLatestLease: under one WithPrefix, a grant's
// ResetAfter and the key's TTL reach the latest live lease, another
// configuration's longer one included, and once that one is released, a
// grant's reach no further than its own.
func TestConcurrencyTTLFollowsLatestLease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := newClock()
		long, short := hourAndSecond(t, b, 3, "ttl:", clock.Now, clock.Now)
		res, err := short.Allow(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, time.Second, res.ResetAfter, "the short lease alone")
		held, err := long.Acquire(ctx, "k")
		require.NoError(t, err)
		clock.Advance(time.Millisecond)
		res, err = short.Allow(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, time.Hour-time.Millisecond, res.ResetAfter, "the long lease is the latest")
		requireTTL(t, b, "ttl:k", time.Hour-time.Millisecond, "the key lasts as long")
		require.NoError(t, held.Release(ctx))
		clock.Advance(time.Millisecond)
		res, err = short.Allow(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, time.Second, res.ResetAfter, "released, the long lease no longer counts")
		requireTTL(t, b, "ttl:k", 2*time.Second-2*ms, "nor keeps the key: it lasts to the end of the second its latest lease lapses in")
	})
}

// onFakeClock returns a Concurrency of limit leases of lease on b, on a
// fake clock of its own, keeping b's keys: the clock's TTLs would pass in
// real time.
func onFakeClock(t *testing.T, b backend, limit int, lease time.Duration) (*Concurrency, *fakeClock) {
	t.Helper()
	b.keepKeys()
	clock := newClock()
	c, err := NewConcurrency(b.rdb, limit, lease, WithClock(clock.Now))
	require.NoError(t, err)
	return c, clock
}

// TestConcurrencyReleaseNamesOnlyItsGrant: a release names the first k
// leases of its grant, and the script frees none when k is more than the
// grant took (the ids after it are other holders') or the token claims
// more leases than a grant can take. Go refuses both before a round trip
// (Refund's checks), so the script is called directly.
func TestConcurrencyReleaseNamesOnlyItsGrant(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		c, clock := onFakeClock(t, b, 5, time.Minute)
		mine, err := c.Allow(ctx, "k")
		require.NoError(t, err)
		_, err = c.Allow(ctx, "k") // another holder's lease: the next id
		require.NoError(t, err)
		token := grantToken(mine.Grant)
		first, _, ok := strings.Cut(token, ".")
		require.True(t, ok, token)
		run := func(key, what string) (any, error) {
			return concurrencyScript.Run(ctx, b.rdb, []string{c.redisKey(key)},
				fmt.Sprint(clock.now.UnixMicro()), what, 5, time.Minute.Microseconds()).Result()
		}
		release := func(what string) string {
			v, err := run("k", what)
			require.NoError(t, err)
			return v.(string)
		}
		reset := fmt.Sprint(time.Minute.Microseconds())
		require.Equal(t, "1 3 0 "+reset+" 0 -1 0", release("-2:"+token), "two of a grant of one: nothing")
		require.Equal(t, "1 3 0 "+reset+" 0 -1 0", release("-1:"+first+".10001"), "more than a grant takes: nothing")
		require.Equal(t, "1 4 0 "+reset+" 0 -1 1", release("-1:"+token), "its own lease; the other holder's still counts")

		// "=" releases as "-" does and replies only what it gave.
		third, err := c.Allow(ctx, "k")
		require.NoError(t, err)
		token = grantToken(third.Grant)
		require.Equal(t, "1 0 0 0 0 -1 0", release("=2:"+token), "two of a grant of one: nothing")
		thirdFirst, _, _ := strings.Cut(token, ".")
		require.Equal(t, "1 0 0 0 0 -1 0", release("=1:"+thirdFirst+".10001"), "more than a grant takes: nothing")
		require.Equal(t, "1 0 0 0 0 -1 1", release("=1:"+token))
		require.Equal(t, "1 0 0 0 0 -1 0", release("=1:"+token), "released already")
		require.Equal(t, "1 4 0 "+reset+" 0 -1 0", release("-1:"+token), "what the bare release left")
		require.Equal(t, "1 0 0 0 0 -1 0", release("=1:x"), "a token the script did not make")
		v, err := run("none", "=1:"+token)
		require.NoError(t, err, "a missing key is no foreign state")
		require.Equal(t, "1 0 0 0 0 -1 0", v)
		require.Zero(t, b.rdb.Exists(ctx, c.redisKey("none")).Val(), "a release creates no key")

		// A sorted set whose members all score after now has no meta the
		// read returns: not ours, and left as it is.
		foreign := c.redisKey("foreign")
		require.NoError(t, b.rdb.ZAdd(ctx, foreign, redis.Z{Score: 1e16, Member: first}).Err())
		_, err = run("foreign", "=1:"+first+".1")
		require.ErrorContains(t, err, "NOTOURS")
		require.EqualValues(t, 1, b.rdb.ZCard(ctx, foreign).Val())
		// One whose first member is named like a meta but scores other than 0.
		require.NoError(t, b.rdb.ZAdd(ctx, foreign, redis.Z{Score: 5, Member: "#" + first + ":" + first + ":60000000"}).Err())
		for _, what := range []string{"=1:" + first + ".1", "-1:" + first + ".1", "1"} {
			_, err = run("foreign", what)
			require.ErrorContains(t, err, "NOTOURS", what)
		}
		require.EqualValues(t, 2, b.rdb.ZCard(ctx, foreign).Val())

		// A bare release reads no clock: it removes a lapsed lease's id
		// too, and replies so; that frees no place (a lapsed lease holds
		// none), where "-" reads the lease as lapsed and replies 0.
		lapsing, err := c.Allow(ctx, "lapse")
		require.NoError(t, err)
		lapsed, err := c.Allow(ctx, "lapse")
		require.NoError(t, err)
		clock.Advance(50 * time.Second)
		_, err = c.Allow(ctx, "lapse") // another holder's, live until the end
		require.NoError(t, err)
		clock.Advance(20 * time.Second) // the first two lapsed, not trimmed
		v, err = run("lapse", "-1:"+grantToken(lapsing.Grant))
		require.NoError(t, err)
		require.Equal(t, "1 4 0 40000000 0 -1 0", v, "a lapsed lease frees nothing")
		v, err = run("lapse", "=1:"+grantToken(lapsed.Grant))
		require.NoError(t, err)
		require.Equal(t, "1 0 0 0 0 -1 1", v, "removed, lapsed")
		r, err := c.AllowN(ctx, "lapse", 0)
		require.NoError(t, err)
		require.Equal(t, 4, r.Remaining, "the other holder's lease still counts")
	})
}

// TestConcurrencyBareReleaseCountsNothing: without an observer a release
// is the bare "=", which reads no clock (TIME), counts nothing (ZCARD,
// ZCOUNT) and looks up no lease (ZSCORE): it reads the key's first member
// (ZRANGE 0 0) and removes its ids (ZREM). With an observer it reads all
// of them, and the latest lease (ZRANGE). On a server of its own: INFO
// commandstats counts every client's commands.
func TestConcurrencyBareReleaseCountsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := newClient(t, redistest.Start(t).Addr(), 0)
	names := []string{"time", "zrangebyscore", "zcard", "zcount", "zscore", "zrange", "zrem"}
	counts := func() map[string]int64 {
		out := map[string]int64{}
		for _, name := range names {
			out[name], _ = commandStats(t, rdb, name)
		}
		return out
	}
	for _, observed := range []bool{false, true} {
		var opts []Option
		if observed {
			opts = append(opts, WithObserver(func(Decision) {}))
		}
		c, err := NewConcurrency(rdb, 3, time.Minute, opts...)
		require.NoError(t, err)
		_, err = c.Acquire(ctx, "k")
		require.NoError(t, err)
		lease, err := c.Acquire(ctx, "k")
		require.NoError(t, err)
		before := counts()
		require.NoError(t, lease.Release(ctx))
		after := counts()
		sent := map[string]int64{}
		for _, name := range names {
			if d := after[name] - before[name]; d != 0 {
				sent[name] = d
			}
		}
		if observed {
			require.Equal(t, map[string]int64{"time": 1, "zrangebyscore": 1, "zcard": 1, "zscore": 1, "zrange": 1, "zrem": 1}, sent,
				"observed: the clock, the count, the lease's score and the latest lease")
		} else {
			require.Equal(t, map[string]int64{"zrange": 1, "zrem": 1}, sent, "no observer: the first member, and the ids removed")
		}
		r, err := c.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Equal(t, 2, r.Remaining, "observed %v: the released lease's place is free", observed)
		_, err = c.Acquire(ctx, "k")
		require.NoError(t, err)
		require.NoError(t, rdb.Del(ctx, c.redisKey("k")).Err())
	}
}

// TestConcurrencyReleaseObserved: a release through a Concurrency with an
// observer is observed with the key's state after it (as n == 0 would see
// it); one without sends the bare "=" and replies only what it gave.
func TestConcurrencyReleaseObserved(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		b.keepKeys() // a fake clock: its TTLs would pass in real time
		ctx := context.Background()
		clock := newClock()
		var seen []Decision
		c, err := NewConcurrency(b.rdb, 3, time.Minute, WithClock(clock.Now),
			WithObserver(func(d Decision) { seen = append(seen, d) }))
		require.NoError(t, err)
		_, err = c.Acquire(ctx, "k")
		require.NoError(t, err)
		clock.Advance(time.Second)
		held, err := c.Acquire(ctx, "k")
		require.NoError(t, err)
		clock.Advance(time.Second)
		seen = nil
		require.NoError(t, held.Release(ctx))
		require.Len(t, seen, 1)
		require.True(t, seen[0].Refund)
		require.Equal(t, 2, seen[0].Result.Remaining, "one lease left of three")
		require.Equal(t, time.Minute-2*time.Second, seen[0].Result.ResetAfter, "until the first lease lapses")
	})
}

// TestConcurrencyGrantTrimsWhatItAdds: a grant of n trims up to n + 8
// lapsed leases, so a key whose leases all lapsed between two full grants
// holds the second's alone, and lapsed leases never outnumber about twice
// the limit (docs/internals.md).
func TestConcurrencyGrantTrimsWhatItAdds(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		c, clock := onFakeClock(t, b, 20, time.Second)
		for range 3 {
			_, err := c.AllowN(ctx, "k", 20)
			require.NoError(t, err)
			require.EqualValues(t, 21, b.rdb.ZCard(ctx, c.redisKey("k")).Val(), "the meta and the 20 live leases")
			clock.Advance(2 * time.Second)
		}
	})
}

// TestConcurrencyExtendKeepsALongerLease: an extend sets each lease's
// expiry to the later of its own and a lease from the key's time, so a
// configuration of shorter leases sharing the key (WithPrefix) never
// shortens another's. The script is called directly: a Lease extends
// through the Concurrency that granted it.
func TestConcurrencyExtendKeepsALongerLease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		b.keepKeys() // a fake clock: its TTLs would pass in real time
		ctx := context.Background()
		clock := newClock()
		long, _ := hourAndSecond(t, b, 3, "extend:", clock.Now, clock.Now)
		res, err := long.Allow(ctx, "k")
		require.NoError(t, err)
		token := grantToken(res.Grant)
		clock.Advance(time.Minute)
		v, err := concurrencyScript.Run(ctx, b.rdb, []string{"extend:k"},
			fmt.Sprint(clock.now.UnixMicro()), "+"+token, 3, time.Second.Microseconds()).Result()
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("1 2 0 %d 0 -1 %s", (time.Hour-time.Minute).Microseconds(), token), v,
			"extended by a second's lease, the hour's still holds")
		first, _, _ := strings.Cut(token, ".")
		require.Equal(t, float64(epoch.Add(time.Hour).UnixMicro()), b.rdb.ZScore(ctx, "extend:k", first).Val())
	})
}

// TestConcurrencyTTLStepsBySecond: on the server's clock, a key's TTL
// runs to the end of the second its latest lease lapses in, so a grant
// whose latest lease lapses in the second the last one's did leaves the
// TTL as it is (no PEXPIRE), while a TTL set on another clock is set
// afresh. On a miniredis, whose TIME is set by hand and whose TTLs stand
// still, exactly; on a real server of its own, by counting PEXPIRE (INFO
// commandstats counts every client's commands).
func TestConcurrencyTTLStepsBySecond(t *testing.T) {
	ctx := context.Background()
	t.Run("miniredis", func(t *testing.T) {
		t.Parallel()
		m := miniredis.RunT(t)
		rdb := newMiniClient(t, m)
		c, err := NewConcurrency(rdb, 10, time.Second, WithPrefix("ttl:"))
		require.NoError(t, err)
		acquireAt := func(d time.Duration) time.Duration {
			m.SetTime(epoch.Add(d))
			_, err := c.Acquire(ctx, "k")
			require.NoError(t, err)
			return rdb.PTTL(ctx, "ttl:k").Val()
		}
		require.Equal(t, 1800*ms, acquireAt(200*ms), "its lease lapses at 1.2s: the TTL ends at 2s")
		require.Equal(t, 1800*ms, acquireAt(500*ms), "lapsing at 1.5s, in the same second: the TTL is left")
		require.Equal(t, 1800*ms, acquireAt(900*ms), "and at 1.9s")
		require.Equal(t, 1900*ms, acquireAt(1100*ms), "lapsing at 2.1s: the TTL ends at 3s")
		require.Equal(t, 1900*ms, acquireAt(1000*ms),
			"the server's clock stepped back: its lease lapses at 2.1s, the key's time, and the TTL is left: "+
				"it ends at 3s on the server's clock, which counts it")

		// A TTL set on another clock ends where that clock says: a grant on
		// the server's clock sets it afresh.
		ahead := newClock()
		ahead.Advance(1200 * ms)
		other, err := NewConcurrency(rdb, 10, time.Second, WithPrefix("ttl:"), WithClock(ahead.Now))
		require.NoError(t, err)
		_, err = other.Acquire(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, 1800*ms, rdb.PTTL(ctx, "ttl:k").Val(), "on its own clock, 1.2s: the TTL ends at 3s")
		require.Equal(t, 1700*ms, acquireAt(1300*ms), "on the server's, 1.3s: it ends at 3s there")
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		rdb := newClient(t, redistest.Start(t).Addr(), 0)
		c, err := NewConcurrency(rdb, 1000, time.Minute)
		require.NoError(t, err)
		const grants = 300
		calls0, _ := commandStats(t, rdb, "pexpire")
		started := time.Now()
		for range grants {
			_, err := c.Acquire(ctx, "k")
			require.NoError(t, err)
		}
		ttl := rdb.PTTL(ctx, c.redisKey("k")).Val()
		calls, _ := commandStats(t, rdb, "pexpire")
		took := time.Since(started) // a busy machine only loosens the bounds below
		// One PEXPIRE for the first grant, then one per second the latest
		// lease's expiry moved into: at most one per second the grants took.
		require.LessOrEqual(t, calls-calls0, int64(took/time.Second)+2,
			"%d grants in %v: the TTL is set once a second, not once a grant", grants, took)
		require.Greater(t, ttl, time.Minute-took, "the key outlives its latest lease")
		require.LessOrEqual(t, ttl, time.Minute+time.Second, "by at most a second")
	})
}

// hourAndSecond returns two Concurrency limiters of limit leases sharing
// keys under prefix: one of hour-long leases on clock long, one of
// second-long leases on clock short.
func hourAndSecond(t *testing.T, b backend, limit int, prefix string, long, short func() time.Time) (*Concurrency, *Concurrency) {
	t.Helper()
	hour, err := NewConcurrency(b.rdb, limit, time.Hour, WithClock(long), WithPrefix(prefix))
	require.NoError(t, err)
	second, err := NewConcurrency(b.rdb, limit, time.Second, WithClock(short), WithPrefix(prefix))
	require.NoError(t, err)
	return hour, second
}

// requireTTL checks key's TTL on b: want on a miniredis (its clock stands
// still), at most 100ms less on a real server (its clock ran on since the
// grant).
func requireTTL(t *testing.T, b backend, key string, want time.Duration, what string) {
	t.Helper()
	got := b.rdb.PTTL(context.Background(), key).Val()
	if b.mini != nil {
		require.Equal(t, want, got, what)
		return
	}
	require.LessOrEqual(t, got, want, what)
	require.Greater(t, got, want-100*ms, what)
}
