package redlimit

// Faults, for every algorithm: a flushed script cache, a key holding a value
// redlimit did not write, Redis dead or hung, a ctx already done. Outages
// under load, with real servers killed and restarted, are in
// reliability_test.go; the circuit breaker in breaker_test.go.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// After SCRIPT FLUSH a decision costs one EVALSHA (answered NOSCRIPT) and
// one EVAL, and the state survives. Not parallel: see
// TestScripterWithoutProcess.
func TestFaultScriptFlush(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newClock()
				l, err := alg.new(b.rdb, stateBurst, time.Second, WithClock(clock.Now))
				require.NoError(t, err)
				cmds := &commandRecorder{}
				b.rdb.AddHook(cmds)

				for i := 1; i < stateBurst; i++ {
					r, err := l.AllowN(ctx, "flush", 1)
					require.NoError(t, err)
					require.True(t, r.Allowed, "permit %d of %d before the flush", i, stateBurst)
				}
				require.NoError(t, b.rdb.ScriptFlush(ctx).Err())
				cmds.take()

				r, err := l.AllowN(ctx, "flush", 1)
				require.NoError(t, err, "the first call after SCRIPT FLUSH must load the script again")
				require.Equal(t, Result{Allowed: true, Limit: stateBurst, Remaining: 0, ResetAfter: r.ResetAfter}, withoutGrant(r),
					"the last permit of the burst: the state must survive SCRIPT FLUSH")
				require.Equal(t, []string{"evalsha", "eval"}, cmds.names(),
					"after SCRIPT FLUSH: one EVALSHA answered NOSCRIPT, then exactly one EVAL")

				r, err = l.AllowN(ctx, "flush", 1)
				require.NoError(t, err)
				require.False(t, r.Allowed, "the burst was spent before and after the flush: %+v", r)
				require.Equal(t, []string{"evalsha"}, cmds.names(), "once loaded again, one EVALSHA per decision")
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
	t.Parallel()
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
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				ctx := context.Background()
				clock := newClock()
				placements := []struct {
					name string
					opts []Option
				}{
					{"default prefix", []Option{WithClock(clock.Now)}},
					{"empty prefix", []Option{WithClock(clock.Now), WithPrefix("")}},
				}
				for _, place := range placements {
					l, err := alg.new(b.rdb, stateBurst, time.Second, place.opts...)
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

							for _, n := range []int{1, 0, stateBurst + 1} {
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

// A key that holds something else is ErrForeignState, with a message that
// quotes the key with escapes and at most 64 of its bytes, whatever its size
// and content.
func TestForeignStateErrorText(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		for _, a := range algorithms {
			l, err := a.new(b.rdb, 3, 10*time.Second, WithPrefix(""))
			require.NoError(t, err)
			for _, key := range []string{strings.Repeat("k", MaxKeyBytes), "nul\x00key\nline"} {
				require.NoError(t, b.rdb.SAdd(ctx, key, "member").Err(), "a set: a type no limiter writes")
				_, err := l.Allow(ctx, key)
				require.ErrorIs(t, err, ErrForeignState, a.name)
				msg := err.Error()
				assert.Less(t, len(msg), 400, "%s: bounded message", a.name)
				assert.Equal(t, 1, strings.Count(msg, "redlimit:"), "%q", msg)
				assert.Contains(t, msg, a.name)
				assert.NotContains(t, msg, "\x00")
				assert.NotContains(t, msg, "\n")
				if len(key) > 64 {
					assert.Contains(t, msg, "1024 bytes", "says how long the key was")
				} else {
					assert.Contains(t, msg, `"nul\x00key\nline"`)
				}
				require.Equal(t, "set", b.rdb.Type(ctx, key).Val(), "left untouched")
				require.NoError(t, b.rdb.Del(ctx, key).Err())
			}
		}
	})
	assert.False(t, errors.Is(ErrForeignState, ErrAcquireFailed), "no decision is not a denial")
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

// Every call on a killed or hung Redis fails soon after its deadline, and
// no failure looks like a denial. Not parallel: it measures time.
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
			rdb := deadRedis(t, srv.addr(t), srv.readTimeout)
			type outcome struct {
				call    string
				err     error
				elapsed time.Duration
			}
			var calls []func(ctx context.Context) outcome
			for _, alg := range algorithms {
				l, err := alg.new(rdb, stateBurst, time.Second)
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
	t.Parallel()
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
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b backend) {
				l, err := alg.new(b.rdb, stateBurst, time.Second)
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
