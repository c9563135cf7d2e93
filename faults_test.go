package redlimit

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// faultAlg is one algorithm as the fault tests drive it: a small
// configuration with the numbers a test needs to know about it.
type faultAlg struct {
	name string
	make func(rdb redis.Scripter, opts ...Option) (Limiter, error)
	// burst is what a fresh key grants at one instant.
	burst int
	// recover is the time from exhausted (burst granted at one instant) to
	// fully available: the (longest) window, or capacity / rate.
	recover time.Duration
	// halfRemaining is Remaining half a recover after an exhausted state.
	halfRemaining int
	// hash: the state is a hash (sliding algorithms), else a string.
	hash bool
}

func faultAlgs() []faultAlg {
	return []faultAlg{
		{
			name: "fixed_window", burst: 4, recover: time.Second,
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewFixedWindow(rdb, 4, time.Second, opts...)
			},
		},
		{
			name: "sliding_window", burst: 4, recover: time.Second, hash: true,
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewSlidingWindow(rdb, 4, time.Second, 100*time.Millisecond, opts...)
			},
		},
		{
			// Half a recover (1s) in, the 1s strategy is clear and the 2s
			// one holds the burst: 10 - 4 left, so Remaining is 4.
			name: "sliding_log", burst: 4, recover: 2 * time.Second, halfRemaining: 4, hash: true,
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewSlidingLog(rdb, 100*time.Millisecond, []Strategy{{Limit: 10, Window: 2 * time.Second}, {Limit: 4, Window: time.Second}}, opts...)
			},
		},
		{
			name: "leaky_bucket", burst: 3, recover: time.Second, halfRemaining: 1,
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewLeakyBucket(rdb, 3, PerSecond(3), opts...)
			},
		},
		{
			name: "token_bucket", burst: 3, recover: time.Second, halfRemaining: 1,
			make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
				return NewTokenBucket(rdb, 3, PerSecond(3), opts...)
			},
		},
	}
}

// drainFault takes single permits from key until one is denied, at most
// limit+1 times, and returns how many were granted.
func drainFault(t *testing.T, l Limiter, key string, limit int) int {
	t.Helper()
	for granted := 0; granted <= limit; granted++ {
		r, err := l.AllowN(context.Background(), key, 1)
		require.NoError(t, err, "AllowN(%q, 1) after %d granted", key, granted)
		if !r.Allowed {
			require.Positive(t, r.RetryAfter, "a denial of one permit must say how long to wait: %+v", r)
			return granted
		}
	}
	return limit + 1
}

// requireFullyAvailable checks that key is back in its initial state: the
// full burst left and nothing to wait for.
func requireFullyAvailable(t *testing.T, l Limiter, key string, burst int, msgAndArgs ...any) {
	t.Helper()
	r, err := l.AllowN(context.Background(), key, 0)
	require.NoError(t, err, fmt.Sprint(msgAndArgs...))
	want := fmt.Sprintf("Allowed with Remaining %d and ResetAfter 0", burst)
	got := fmt.Sprintf("Allowed %v with Remaining %d and ResetAfter %v", r.Allowed, r.Remaining, r.ResetAfter)
	require.True(t, r.Allowed && r.Remaining == burst && r.ResetAfter == 0,
		"%s: want %s, got %s", fmt.Sprint(msgAndArgs...), want, got)
}

// requireTTLCovers checks that redisKey carries a TTL no shorter than
// r.ResetAfter (rounded down to the ms). The TTL was written by a call that
// started at or after since: a real server has counted it down in real time
// since then.
func requireTTLCovers(t *testing.T, b backend, redisKey string, r Result, since time.Time, msgAndArgs ...any) {
	t.Helper()
	pttl, err := b.rdb.PTTL(context.Background(), redisKey).Result()
	require.NoError(t, err)
	slack := time.Duration(0)
	if b.mini == nil {
		slack = time.Since(since).Truncate(time.Millisecond) + time.Millisecond
	}
	require.Positive(t, pttl, "%s: the key must carry a TTL after %+v", fmt.Sprint(msgAndArgs...), r)
	require.GreaterOrEqual(t, pttl+slack, r.ResetAfter.Truncate(time.Millisecond),
		"%s: the TTL must cover ResetAfter of %+v", fmt.Sprint(msgAndArgs...), r)
}

// commandLog records the commands a go-redis client sends, by hook.
type commandLog struct {
	mu    sync.Mutex
	names []string
	dials int
}

func (c *commandLog) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.mu.Lock()
		c.dials++
		c.mu.Unlock()
		return next(ctx, network, addr)
	}
}

func (c *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.mu.Lock()
		c.names = append(c.names, cmd.Name())
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (c *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.mu.Lock()
		for _, cmd := range cmds {
			c.names = append(c.names, cmd.Name())
		}
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

// take returns the commands recorded since the last take and forgets them.
func (c *commandLog) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := c.names
	c.names = nil
	return names
}

func TestFaultScriptFlush(t *testing.T) {
	for _, alg := range faultAlgs() {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := &fakeClock{now: epoch}
				l, err := alg.make(b.rdb, WithClock(clock.Now))
				require.NoError(t, err)
				cmds := &commandLog{}
				b.rdb.AddHook(cmds)

				for i := 1; i < alg.burst; i++ {
					r, err := l.AllowN(ctx, "flush", 1)
					require.NoError(t, err)
					require.True(t, r.Allowed, "permit %d of %d before the flush", i, alg.burst)
				}
				require.NoError(t, b.rdb.ScriptFlush(ctx).Err())
				cmds.take()

				r, err := l.AllowN(ctx, "flush", 1)
				require.NoError(t, err, "the first call after SCRIPT FLUSH must load the script again")
				require.Equal(t, Result{Allowed: true, Limit: alg.burst, Remaining: 0, ResetAfter: r.ResetAfter}, r,
					"the last permit of the burst: the state must survive SCRIPT FLUSH")
				require.Equal(t, []string{"evalsha", "eval"}, cmds.take(),
					"after SCRIPT FLUSH: one EVALSHA answered NOSCRIPT, then exactly one EVAL")

				r, err = l.AllowN(ctx, "flush", 1)
				require.NoError(t, err)
				require.False(t, r.Allowed, "the burst was spent before and after the flush: %+v", r)
				require.Equal(t, []string{"evalsha"}, cmds.take(), "once loaded again, one EVALSHA per decision")
			})
		})
	}
}

// keySnapshot is everything observable about a key: its type, its value
// read by type, its TTL, and on a real server its DUMP.
type keySnapshot struct {
	typ   string
	value string
	pttl  time.Duration
	dump  string
}

func snapshotKey(t *testing.T, b backend, key string) keySnapshot {
	t.Helper()
	ctx := context.Background()
	rdb := b.rdb
	typ, err := rdb.Type(ctx, key).Result()
	require.NoError(t, err)
	var value any
	switch typ {
	case "string":
		value, err = rdb.Get(ctx, key).Result()
	case "list":
		value, err = rdb.LRange(ctx, key, 0, -1).Result()
	case "hash":
		value, err = rdb.HGetAll(ctx, key).Result()
	case "set":
		var members []string
		members, err = rdb.SMembers(ctx, key).Result()
		slices.Sort(members)
		value = members
	case "zset":
		value, err = rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
	default:
		t.Fatalf("key %q has unexpected type %q", key, typ)
	}
	require.NoError(t, err)
	pttl, err := rdb.PTTL(ctx, key).Result()
	require.NoError(t, err)
	s := keySnapshot{typ: typ, value: fmt.Sprint(value), pttl: pttl}
	if b.mini == nil { // miniredis DUMPs strings only
		s.dump, err = rdb.Dump(ctx, key).Result()
		require.NoError(t, err)
	}
	return s
}

func TestFaultForeignValue(t *testing.T) {
	type foreign struct {
		name    string
		hashAlg bool // only for the sliding algorithms
		ttl     time.Duration
		write   func(ctx context.Context, rdb *redis.Client, key string) error
	}
	setString := func(v string) func(ctx context.Context, rdb *redis.Client, key string) error {
		return func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.Set(ctx, key, v, 0).Err()
		}
	}
	setHash := func(fields ...string) func(ctx context.Context, rdb *redis.Client, key string) error {
		return func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.HSet(ctx, key, fields).Err()
		}
	}
	// Bucket index of epoch at the sliding algorithms' 100ms precision.
	b0 := epoch.UnixMicro() / 100_000
	foreigns := []foreign{
		{name: "list", write: func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.RPush(ctx, key, "a", "b").Err()
		}},
		{name: "hash", write: setHash("user", "1", "name", "ann")},
		{name: "set", write: func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.SAdd(ctx, key, "a", "b").Err()
		}},
		{name: "zset", write: func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.ZAdd(ctx, key, redis.Z{Score: 1, Member: "a"}, redis.Z{Score: 2.5, Member: "b"}).Err()
		}},
		{name: "hello", write: setString("hello")},
		{name: "json", write: setString(`{"user":1}`)},
		{name: "12abc", write: setString("12abc")},
		{name: "-5", write: setString("-5")},
		{name: "1.5", write: setString("1.5")},
		{name: "empty string", write: setString("")},
		{name: "string with TTL", ttl: time.Hour, write: func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.Set(ctx, key, "hello", time.Hour).Err()
		}},
		{name: "hash with TTL", ttl: time.Hour, write: func(ctx context.Context, rdb *redis.Client, key string) error {
			if err := rdb.HSet(ctx, key, "user", "1").Err(); err != nil {
				return err
			}
			return rdb.Expire(ctx, key, time.Hour).Err()
		}},
		{name: "hash with malformed m", hashAlg: true, write: setHash("m", "hello")},
		{name: "hash with empty m", hashAlg: true, write: setHash("m", "")},
		{name: "hash with m of too few fields", hashAlg: true, write: setHash("m", "100000 1 10")},
		{name: "hash with m of precision 0", hashAlg: true, write: setHash("m", "0 1 10 -1 0 -1 0")},
		// Well-formed meta naming a bucket the hash does not hold: once with
		// the limiter's own configuration (the bucket is read as it leaves
		// the window), once with another (read to rebuild the log).
		{name: "hash whose m names a missing bucket", hashAlg: true,
			write: setHash("m", fmt.Sprintf("100000 1 10 %d 2 %d 2", b0-20, b0-20), "other", "x")},
		{name: "hash whose m of another config names a missing bucket", hashAlg: true,
			write: setHash("m", fmt.Sprintf("100000 1 7 %d 2 %d 2", b0-3, b0-3), "other", "x")},
	}
	for _, alg := range faultAlgs() {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := &fakeClock{now: epoch}
				placements := []struct {
					name string
					opts []Option
				}{
					{"default prefix", []Option{WithClock(clock.Now)}},
					{"empty prefix", []Option{WithClock(clock.Now), WithPrefix("")}},
				}
				for _, place := range placements {
					l, err := alg.make(b.rdb, place.opts...)
					require.NoError(t, err)
					for _, f := range foreigns {
						if f.hashAlg && !alg.hash {
							continue
						}
						t.Run(place.name+"/"+f.name, func(t *testing.T) {
							key := "foreign:" + f.name
							redisKey := keyPrefix(l) + key
							require.NoError(t, f.write(ctx, b.rdb, redisKey), "write the foreign value")
							t.Cleanup(func() { b.rdb.Del(context.Background(), redisKey) })
							before := snapshotKey(t, b, redisKey)

							for _, n := range []int{1, 0, alg.burst + 1} {
								_, err := l.AllowN(ctx, key, n)
								require.Error(t, err, "AllowN(%d) on a key holding %s must fail", n, f.name)
								require.NotErrorIs(t, err, ErrAcquireFailed, "a foreign value is no denial")
								msg := err.Error()
								require.True(t, strings.Contains(msg, "not redlimit state") || strings.Contains(msg, "WRONGTYPE"),
									"the error must say the key does not hold redlimit state (or WRONGTYPE), got %q", msg)
							}
							err := l.TryAcquire(ctx, key)
							require.Error(t, err, "TryAcquire on a key holding %s must fail", f.name)
							require.NotErrorIs(t, err, ErrAcquireFailed, "a foreign value is no denial")

							after := snapshotKey(t, b, redisKey)
							require.Equal(t, before.typ, after.typ, "the foreign key's type must be unchanged")
							require.Equal(t, before.value, after.value, "the foreign key's value must be unchanged")
							require.Equal(t, before.dump, after.dump, "the foreign key's DUMP must be unchanged")
							if f.ttl == 0 {
								require.Equal(t, time.Duration(-1), after.pttl, "a foreign key without TTL must keep none")
							} else {
								require.LessOrEqual(t, after.pttl, before.pttl, "the foreign key's TTL must not be extended")
								require.Greater(t, after.pttl, before.pttl-time.Second, "the foreign key's TTL must not be shortened")
							}
						})
					}
				}
			})
		})
	}
}

// deadRedisClient returns a client for addr with short timeouts that
// honours ctx deadlines.
func deadRedisClient(t *testing.T, addr string, readTimeout time.Duration) *redis.Client {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  addr,
		DialTimeout:           100 * time.Millisecond,
		ReadTimeout:           readTimeout,
		WriteTimeout:          readTimeout,
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// hungListener accepts connections and never answers: a Redis that hangs.
func hungListener(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				_, _ = io.Copy(io.Discard, conn) // until the client hangs up
			}()
		}
	}()
	return ln.Addr().String()
}

func TestFaultDeadRedis(t *testing.T) {
	servers := []struct {
		name string
		addr func(t *testing.T) string
		// readTimeout is long for the hung server, so that only the ctx
		// deadline can end the call in time.
		readTimeout time.Duration
	}{
		{"killed", func(t *testing.T) string {
			s := redistest.Start(t)
			addr := s.Addr()
			require.NoError(t, s.Kill(), "kill the dedicated redis-server")
			return addr
		}, 100 * time.Millisecond},
		{"hung", hungListener, time.Minute},
	}
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			rdb := deadRedisClient(t, srv.addr(t), srv.readTimeout)
			type outcome struct {
				call    string
				err     error
				elapsed time.Duration
			}
			var calls []func(ctx context.Context) outcome
			for _, alg := range faultAlgs() {
				l, err := alg.make(rdb)
				require.NoError(t, err)
				calls = append(calls,
					func(ctx context.Context) outcome {
						r, err := l.AllowN(ctx, "dead", 1)
						if err == nil {
							err = fmt.Errorf("decided %+v", r)
						}
						return outcome{call: alg.name + ".AllowN", err: err}
					},
					func(ctx context.Context) outcome {
						return outcome{call: alg.name + ".TryAcquire", err: l.TryAcquire(ctx, "dead")}
					},
					func(ctx context.Context) outcome {
						return outcome{call: alg.name + ".Reset", err: l.Reset(ctx, "dead")}
					})
			}
			// All at once, so the test waits for one deadline, not fifteen.
			outcomes := make([]outcome, len(calls))
			var wg sync.WaitGroup
			for i, call := range calls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
					defer cancel()
					start := time.Now()
					outcomes[i] = call(ctx)
					outcomes[i].elapsed = time.Since(start)
				}()
			}
			wg.Wait()
			for _, o := range outcomes {
				require.Error(t, o.err, "%s on a dead Redis must fail", o.call)
				require.NotErrorIs(t, o.err, ErrAcquireFailed, "%s: a dead Redis is no denial", o.call)
				require.Less(t, o.elapsed, time.Second, "%s must return soon after its 200ms deadline: %v", o.call, o.err)
				if srv.name == "hung" {
					// Only the deadline ended the call: the error says so.
					require.ErrorIs(t, o.err, context.DeadlineExceeded, "%s on a hung Redis", o.call)
				}
			}
		})
	}
}

func TestFaultCancelledContext(t *testing.T) {
	expired := func() (context.Context, context.CancelFunc) {
		return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	}
	cancelled := func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx, cancel
	}
	ctxs := []struct {
		name string
		make func() (context.Context, context.CancelFunc)
		want error
	}{
		{"cancelled", cancelled, context.Canceled},
		{"expired deadline", expired, context.DeadlineExceeded},
	}
	for _, alg := range faultAlgs() {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				l, err := alg.make(b.rdb)
				require.NoError(t, err)
				for _, c := range ctxs {
					ctx, cancel := c.make()
					defer cancel()
					_, err := l.AllowN(ctx, "ctx", 1)
					require.ErrorIs(t, err, c.want, "AllowN with a %s ctx", c.name)
					require.NotErrorIs(t, err, ErrAcquireFailed)
					_, err = l.Allow(ctx, "ctx")
					require.ErrorIs(t, err, c.want, "Allow with a %s ctx", c.name)
					err = l.TryAcquire(ctx, "ctx")
					require.ErrorIs(t, err, c.want, "TryAcquire with a %s ctx", c.name)
					require.NotErrorIs(t, err, ErrAcquireFailed)
					require.ErrorIs(t, l.Reset(ctx, "ctx"), c.want, "Reset with a %s ctx", c.name)
					n, err := b.rdb.Exists(context.Background(), keyPrefix(l)+"ctx").Result()
					require.NoError(t, err)
					require.Zero(t, n, "a call that made no decision must write nothing")
				}
			})
		})
	}
}

func TestFaultClockBackward(t *testing.T) {
	const year = 365 * 24 * time.Hour
	for _, alg := range faultAlgs() {
		moves := []time.Duration{-time.Microsecond, -alg.recover / 2, -time.Hour, -year, 2 * year, -2 * year}
		for _, denyCache := range []bool{false, true} {
			name := alg.name
			if denyCache {
				name += "/deny_cache"
			}
			t.Run(name, func(t *testing.T) {
				forEachBackend(t, func(t *testing.T, b backend) {
					clock := &fakeClock{now: epoch}
					opts := []Option{WithClock(clock.Now)}
					if denyCache {
						opts = append(opts, WithDenyCache(8))
					}
					l, err := alg.make(b.rdb, opts...)
					require.NoError(t, err)
					const key = "backward"
					// The start of the last call that may have written the key.
					lastWrite := time.Now()
					granted := drainFault(t, l, key, alg.burst)
					require.Equal(t, alg.burst, granted, "a fresh key grants one burst")

					for _, move := range moves {
						clock.Advance(move)
						if move > 0 {
							requireFullyAvailable(t, l, key, alg.burst, "a clock moved ", move, " forward, past every window")
							lastWrite = time.Now()
							got := drainFault(t, l, key, alg.burst)
							require.Equal(t, alg.burst, got, "after the clock moved %v forward: one burst", move)
							granted += got
							continue
						}
						r, err := l.AllowN(context.Background(), key, 1)
						require.NoError(t, err)
						require.False(t, r.Allowed, "the clock moved %v back: an exhausted key must grant nothing: %+v", move, r)
						if !denyCache { // else Redis has not seen the clock go back yet
							requireTTLCovers(t, b, keyPrefix(l)+key, r, lastWrite, "after the clock moved ", move, " back")
						}
						require.LessOrEqual(t, r.RetryAfter, alg.recover,
							"the clock moved %v back: no wait may be longer than the configuration's %v: %+v", move, alg.recover, r)
						require.LessOrEqual(t, r.ResetAfter, alg.recover,
							"the clock moved %v back: no reset may be further than the configuration's %v: %+v", move, alg.recover, r)
						got := drainFault(t, l, key, alg.burst)
						require.Zero(t, got, "the clock moved %v back: an exhausted key must grant nothing", move)

						clock.Advance(alg.recover / 2)
						r, err = l.AllowN(context.Background(), key, 0)
						require.NoError(t, err)
						require.Equal(t, alg.halfRemaining, r.Remaining,
							"half a recovery (%v) after the clock moved %v back: %+v", alg.recover/2, move, r)
						require.Positive(t, r.ResetAfter,
							"half a recovery after the clock moved %v back, the key is not yet reset: %+v", move, r)

						clock.Advance(alg.recover - alg.recover/2)
						requireFullyAvailable(t, l, key, alg.burst,
							"one recovery (", alg.recover, ") after the clock moved ", move, " back, the lockout must be over")
						lastWrite = time.Now()
						got = drainFault(t, l, key, alg.burst)
						require.Equal(t, alg.burst, got, "one recovery after the clock moved %v back: one burst", move)
						granted += got
					}
					// One burst at the start and one per recovery or
					// forward jump: a backward jump adds nothing.
					require.Equal(t, alg.burst*(1+len(moves)), granted, "permits granted over the whole run")
				})
			})
		}
	}
}

func TestFaultTTL(t *testing.T) {
	for _, alg := range faultAlgs() {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := &fakeClock{now: epoch}
				l, err := alg.make(b.rdb, WithClock(clock.Now))
				require.NoError(t, err)
				const key = "ttl"
				redisKey := keyPrefix(l) + key

				// A few calls spread over one recovery; every allowed
				// call writes, and must leave a TTL covering ResetAfter.
				steps := []struct {
					at time.Duration
					n  int
				}{{0, 1}, {alg.recover / 4, 2}, {alg.recover / 2, 1}, {alg.recover / 2, 1}, {alg.recover * 3 / 4, 1}}
				writes := 0
				var lastWrite time.Time // the start of the last call that wrote
				for _, s := range steps {
					clock.now = epoch.Add(s.at)
					start := time.Now()
					r, err := l.AllowN(ctx, key, s.n)
					require.NoError(t, err)
					if r.Allowed {
						writes++
						lastWrite = start
					}
					requireTTLCovers(t, b, redisKey, r, lastWrite, "at ", s.at)
				}
				require.GreaterOrEqual(t, writes, 3, "the steps must include writes")

				if b.mini != nil {
					// Expiry looks like a reset: the next call is that of a
					// fresh key at the same clock.
					pttl, err := b.rdb.PTTL(ctx, redisKey).Result()
					require.NoError(t, err)
					b.mini.FastForward(pttl + time.Millisecond)
					require.False(t, b.mini.Exists(redisKey), "the key must be gone after its TTL")
					got, err := l.AllowN(ctx, key, 1)
					require.NoError(t, err)
					want, err := l.AllowN(ctx, "ttl-fresh", 1)
					require.NoError(t, err)
					require.Equal(t, want, got, "after expiry the key must behave like a fresh key")
					require.Equal(t, alg.burst-1, got.Remaining, "a fresh key has one burst")
				}
			})
		})
	}
}

func TestFaultNoExpiryNeeded(t *testing.T) {
	for _, alg := range faultAlgs() {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := &fakeClock{now: epoch}
				l, err := alg.make(b.rdb, WithClock(clock.Now))
				require.NoError(t, err)
				const key = "stale"
				require.Equal(t, alg.burst, drainFault(t, l, key, alg.burst))
				clock.Advance(alg.recover / 3)
				_, err = l.AllowN(ctx, key, 0)
				require.NoError(t, err)

				// As if expiry never ran: the key's TTL is pushed far out (a
				// key without one is foreign), and only the fake clock
				// moves, far past every window.
				extended, err := b.rdb.PExpire(ctx, keyPrefix(l)+key, 24*time.Hour).Result()
				require.NoError(t, err)
				require.True(t, extended, "the key must exist for this test to mean anything")
				clock.Advance(10 * alg.recover)
				for _, n := range []int{0, 1, alg.burst - 1} {
					got, err := l.AllowN(ctx, key, n)
					require.NoError(t, err)
					want, err := l.AllowN(ctx, "stale-fresh", n)
					require.NoError(t, err)
					require.Equal(t, want, got, "AllowN(%d) on a stale key must decide as on a fresh key", n)
				}
				got, err := l.AllowN(ctx, key, 1)
				require.NoError(t, err)
				require.False(t, got.Allowed, "the burst is spent again: %+v", got)
			})
		})
	}
}

func TestFaultConfigChange(t *testing.T) {
	type config struct {
		make    func(rdb redis.Scripter, opts ...Option) (Limiter, error)
		burst   int           // what a fresh key grants at one instant
		recover time.Duration // from exhausted to fully available
	}
	fw := func(limit int, window time.Duration) config {
		return config{func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewFixedWindow(rdb, limit, window, opts...)
		}, limit, window}
	}
	sw := func(limit int, window, precision time.Duration) config {
		return config{func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingWindow(rdb, limit, window, precision, opts...)
		}, limit, window}
	}
	sl := func(precision time.Duration, strategies ...Strategy) config {
		c := config{make: func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewSlidingLog(rdb, precision, strategies, opts...)
		}, burst: strategies[0].Limit}
		for _, s := range strategies {
			c.burst = min(c.burst, s.Limit)
			c.recover = max(c.recover, s.Window)
		}
		return c
	}
	// capacity × Per / Count, rounded up to the microsecond.
	bucket := func(capacity int, rate Rate) time.Duration {
		need := int64(capacity) * int64(rate.Per/time.Microsecond)
		return time.Duration((need+int64(rate.Count)-1)/int64(rate.Count)) * time.Microsecond
	}
	lb := func(capacity int, rate Rate) config {
		return config{func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewLeakyBucket(rdb, capacity, rate, opts...)
		}, capacity, bucket(capacity, rate)}
	}
	tb := func(capacity int, rate Rate) config {
		return config{func(rdb redis.Scripter, opts ...Option) (Limiter, error) {
			return NewTokenBucket(rdb, capacity, rate, opts...)
		}, capacity, bucket(capacity, rate)}
	}
	const ms = time.Millisecond
	// A real server expires keys in real time, and expiry looks like a
	// reset: every TTL here is at least a second, far longer than a test step.
	changes := []struct {
		name    string
		before  config
		consume int // permits taken under before
		after   config
	}{
		{"fixed_window/limit 100 to 10", fw(100, time.Second), 60, fw(10, time.Second)},
		{"fixed_window/window 1h to 1s", fw(100, time.Hour), 60, fw(10, time.Second)},
		{"fixed_window/window 1s to 1h", fw(100, time.Second), 60, fw(10, time.Hour)},
		{"fixed_window/limit 10 to 100", fw(10, time.Second), 10, fw(100, time.Second)},
		{"sliding_window/limit 100 to 10", sw(100, time.Second, 100*ms), 60, sw(10, time.Second, 100*ms)},
		{"sliding_window/window 1h to 1s", sw(100, time.Hour, time.Second), 60, sw(10, time.Second, 100*ms)},
		{"sliding_window/window 1s to 2s", sw(100, time.Second, 100*ms), 60, sw(10, 2*time.Second, 100*ms)},
		{"sliding_window/precision 100ms to 10ms", sw(100, time.Second, 100*ms), 60, sw(10, time.Second, 10*ms)},
		{"sliding_window/precision 10ms to 250ms", sw(100, time.Second, 10*ms), 60, sw(10, time.Second, 250*ms)},
		{"sliding_log/fewer strategies", sl(100*ms, Strategy{10, time.Second}, Strategy{100, time.Hour}), 10, sl(100*ms, Strategy{5, time.Second})},
		{"sliding_log/more strategies", sl(100*ms, Strategy{100, time.Second}), 60, sl(50*ms, Strategy{3, 100 * ms}, Strategy{10, time.Second}, Strategy{50, time.Minute})},
		{"sliding_log/precision 100ms to 1s", sl(100*ms, Strategy{100, time.Second}), 60, sl(time.Second, Strategy{5, time.Second}, Strategy{20, 10 * time.Second})},
		{"sliding_log/limits only", sl(100*ms, Strategy{100, time.Second}, Strategy{1000, time.Minute}), 60, sl(100*ms, Strategy{10, time.Second}, Strategy{20, time.Minute})},
		{"leaky_bucket/capacity 100 to 10", lb(100, PerSecond(10)), 60, lb(10, PerSecond(10))},
		{"leaky_bucket/rate 50/s to 10/s", lb(100, PerSecond(50)), 60, lb(10, PerSecond(10))},
		{"leaky_bucket/rate 3/s to 7/min", lb(100, PerSecond(3)), 61, lb(10, PerMinute(7))},
		{"leaky_bucket/capacity 10 to 100", lb(10, PerSecond(10)), 10, lb(100, PerSecond(3))},
		{"token_bucket/capacity 100 to 10", tb(100, PerSecond(10)), 60, tb(10, PerSecond(10))},
		{"token_bucket/rate 50/s to 10/s", tb(100, PerSecond(50)), 60, tb(10, PerSecond(10))},
		{"token_bucket/rate 3/s to 7/min", tb(100, PerSecond(3)), 61, tb(10, PerMinute(7))},
		{"token_bucket/capacity 10 to 100", tb(10, PerSecond(10)), 10, tb(100, PerSecond(3))},
	}
	for _, c := range changes {
		t.Run(c.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := &fakeClock{now: epoch}
				before, err := c.before.make(b.rdb, WithClock(clock.Now))
				require.NoError(t, err)
				after, err := c.after.make(b.rdb, WithClock(clock.Now))
				require.NoError(t, err)
				const key = "reconfigured"

				r, err := before.AllowN(ctx, key, c.consume)
				require.NoError(t, err)
				require.True(t, r.Allowed, "the old configuration grants %d: %+v", c.consume, r)

				clock.Advance(30 * time.Millisecond)
				r, err = after.AllowN(ctx, key, 0)
				require.NoError(t, err, "the new configuration must read the old state")
				require.LessOrEqual(t, r.Remaining, c.after.burst, "Remaining under the new configuration: %+v", r)
				got := drainFault(t, after, key, c.after.burst)
				require.LessOrEqual(t, got, c.after.burst, "permits granted at once under the new configuration")

				clock.Advance(c.after.recover)
				requireFullyAvailable(t, after, key, c.after.burst,
					"one recovery (", c.after.recover, ") of the new configuration after the change")
				require.Equal(t, c.after.burst, drainFault(t, after, key, c.after.burst),
					"one burst of the new configuration")
			})
		})
	}
}

func TestFaultReset(t *testing.T) {
	for _, alg := range faultAlgs() {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := &fakeClock{now: epoch}
				l, err := alg.make(b.rdb, WithClock(clock.Now), WithDenyCache(4))
				require.NoError(t, err)
				const key = "reset"
				redisKey := keyPrefix(l) + key

				require.Equal(t, alg.burst, drainFault(t, l, key, alg.burst), "a fresh key grants one burst")
				require.NoError(t, l.Reset(ctx, key))
				n, err := b.rdb.Exists(ctx, redisKey).Result()
				require.NoError(t, err)
				require.Zero(t, n, "Reset must delete the key")
				requireFullyAvailable(t, l, key, alg.burst, "after Reset")
				require.Equal(t, alg.burst, drainFault(t, l, key, alg.burst),
					"after Reset a full burst again, the cached denial forgotten")

				require.NoError(t, l.Reset(ctx, "never-used"), "Reset of a missing key")
				n, err = b.rdb.Exists(ctx, keyPrefix(l)+"never-used").Result()
				require.NoError(t, err)
				require.Zero(t, n, "Reset of a missing key must not create it")
				requireFullyAvailable(t, l, "never-used", alg.burst, "a missing key after Reset")
			})
		})
	}
}
