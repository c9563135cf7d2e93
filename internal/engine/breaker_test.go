package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// testBreaker is a breaker on a settable clock that records its changes.
type testBreaker struct {
	*Breaker
	now     time.Time
	changes []string
}

func newTestBreaker(failures int, cooldown time.Duration) *testBreaker {
	tb := &testBreaker{now: time.Unix(1_800_000_000, 0)}
	tb.Breaker = NewBreaker(BreakerConfig{
		Failures: failures, Cooldown: cooldown,
		Now:      func() time.Time { return tb.now },
		OnChange: func(c BreakerChange) { tb.changes = append(tb.changes, c.From.String()+">"+c.To.String()) },
	})
	return tb
}

// call runs one round trip through the breaker that ends with o, and
// returns the error admit gave, if any.
func (tb *testBreaker) call(o outcome) error {
	probe, err := tb.admit()
	if err != nil {
		return err
	}
	tb.record(probe, o, errRefused)
	return nil
}

var errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

func TestBreakerOpensAfterConsecutiveFailures(t *testing.T) {
	tb := newTestBreaker(3, time.Second)
	require.NoError(t, tb.call(failed))
	require.NoError(t, tb.call(failed))
	require.NoError(t, tb.call(answered), "an answer in between starts the count again")
	require.NoError(t, tb.call(failed))
	require.NoError(t, tb.call(failed))
	require.Equal(t, BreakerClosed, tb.State(), "2 consecutive failures of 3")
	require.NoError(t, tb.call(failed))
	require.Equal(t, BreakerOpen, tb.State())
	require.Equal(t, []string{"closed>open"}, tb.changes)

	err := tb.call(answered)
	require.Error(t, err, "open: calls fail at once")
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "the error wraps the Redis error that opened it")
	var withRetry interface{ RetryAfter() time.Duration }
	require.True(t, errors.As(err, &withRetry))
	require.Equal(t, time.Second, withRetry.RetryAfter())

	tb.now = tb.now.Add(400 * time.Millisecond)
	err = tb.call(answered)
	require.True(t, errors.As(err, &withRetry))
	require.Equal(t, 600*time.Millisecond, withRetry.RetryAfter(), "the rest of the cooldown")
}

func TestBreakerProbe(t *testing.T) {
	tb := newTestBreaker(1, time.Second)
	require.NoError(t, tb.call(failed))
	require.Equal(t, BreakerOpen, tb.State())

	tb.now = tb.now.Add(time.Second - time.Nanosecond)
	require.Error(t, tb.call(answered), "1ns before the cooldown ends")
	tb.now = tb.now.Add(time.Nanosecond)

	// Exactly one probe; every other call fails fast while it is in flight.
	probe, err := tb.admit()
	require.NoError(t, err)
	require.True(t, probe)
	require.Equal(t, BreakerHalfOpen, tb.State())
	for range 3 {
		_, err := tb.admit()
		require.ErrorIs(t, err, ErrUnavailable, "a second call while the probe is in flight")
	}
	// The probe fails: open for another cooldown.
	tb.record(true, failed, errRefused)
	require.Equal(t, BreakerOpen, tb.State())
	require.Error(t, tb.call(answered))
	tb.now = tb.now.Add(time.Second)

	// A probe whose caller gave up says nothing: the next call probes.
	probe, err = tb.admit()
	require.NoError(t, err)
	require.True(t, probe)
	tb.record(true, neutral, context.Canceled)
	require.Equal(t, BreakerHalfOpen, tb.State())
	probe, err = tb.admit()
	require.NoError(t, err)
	require.True(t, probe, "the next call after a neutral probe probes again")
	tb.record(true, answered, nil)
	require.Equal(t, BreakerClosed, tb.State())
	require.NoError(t, tb.call(answered))
	require.Equal(t, []string{"closed>open", "open>half-open", "half-open>open", "open>half-open", "half-open>closed"}, tb.changes)
}

func TestBreakerIgnoresNeutralAndStaleOutcomes(t *testing.T) {
	tb := newTestBreaker(2, time.Second)
	for range 10 {
		require.NoError(t, tb.call(neutral))
	}
	require.Equal(t, BreakerClosed, tb.State(), "cancelled calls never open it")

	// A call admitted while closed that succeeds after the breaker opened
	// does not close it: only the probe does.
	probe, err := tb.admit()
	require.NoError(t, err)
	require.NoError(t, tb.call(failed))
	require.NoError(t, tb.call(failed))
	require.Equal(t, BreakerOpen, tb.State())
	tb.record(probe, answered, nil)
	require.Equal(t, BreakerOpen, tb.State())
}

func TestBreakerConcurrentProbe(t *testing.T) {
	tb := newTestBreaker(1, time.Millisecond)
	tb.OnChangeOff()
	require.NoError(t, tb.call(failed))
	tb.now = tb.now.Add(time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	probes := 0
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			probe, err := tb.admit()
			if err == nil {
				mu.Lock()
				probes++
				mu.Unlock()
			}
			_ = probe
		}()
	}
	wg.Wait()
	require.Equal(t, 1, probes, "exactly one of 32 concurrent calls probes")
}

// OnChangeOff drops the recording callback, which is not safe for
// concurrent use.
func (tb *testBreaker) OnChangeOff() { tb.cfg.OnChange = nil }

func TestClassify(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	bg := context.Background()
	for _, tc := range []struct {
		ctx  context.Context
		err  error
		want outcome
	}{
		{bg, nil, answered},
		{bg, errRefused, failed},
		{bg, io.EOF, failed},
		{bg, fmt.Errorf("read: %w", os.ErrDeadlineExceeded), failed},
		{expired, context.DeadlineExceeded, failed},
		{cancelled, context.Canceled, neutral},
		{cancelled, io.EOF, neutral},
		{bg, redis.ErrPoolTimeout, failed},
		{bg, redisError("LOADING Redis is loading the dataset in memory"), failed},
		{bg, redisError("OOM command not allowed when used memory > 'maxmemory'."), answered},
		{bg, redisError("READONLY You can't write against a read only replica."), answered},
		{bg, redisError("BUSY Redis is busy running a script"), failed},
		{bg, redisError("redlimit: key k holds a string that is not a fixed window"), answered},
		{bg, redisError("ERR user_script:1: bad"), answered},
	} {
		require.Equal(t, tc.want, Classify(tc.ctx, tc.err), "%v", tc.err)
	}
}

// redisError is an error reply as go-redis returns it.
func redisError(msg string) error {
	var err error
	cmd := redis.NewCmd(context.Background())
	cmd.SetErr(errorReply(msg))
	err = cmd.Err()
	return err
}

type errorReply string

func (e errorReply) Error() string { return string(e) }
func (errorReply) RedisError()     {}

// BenchmarkBreakerClosed is what the breaker adds to a call while Redis
// answers: admit and record.
func BenchmarkBreakerClosed(b *testing.B) {
	br := NewBreaker(BreakerConfig{Failures: 5, Cooldown: time.Second})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			probe, err := br.admit()
			if err != nil {
				b.Fatal(err)
			}
			br.record(probe, answered, nil)
		}
	})
}

// BenchmarkBreakerOpen is the cost of a call the open breaker answers.
func BenchmarkBreakerOpen(b *testing.B) {
	br := NewBreaker(BreakerConfig{Failures: 1, Cooldown: time.Hour})
	br.record(false, failed, errRefused)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := br.admit(); err == nil {
				b.Fatal("open breaker admitted a call")
			}
		}
	})
}

// A call cut short by its own ctx deadline counts as a failure only when
// that deadline left it at least MinDeadline; an error that is not the
// deadline's counts whatever the deadline.
func TestBreakerClassifyCallersDeadline(t *testing.T) {
	b := NewBreaker(BreakerConfig{Failures: 1, Cooldown: time.Second, MinDeadline: 20 * time.Millisecond})
	timeout := fmt.Errorf("read: %w", os.ErrDeadlineExceeded)
	for _, tc := range []struct {
		name   string
		left   time.Duration // until the deadline, when the call returns (negative: passed); 0: no deadline
		budget time.Duration // the deadline's distance from the call's start
		err    error
		want   outcome
	}{
		{"150µs deadline passed: the caller's", -time.Microsecond, 150 * time.Microsecond, timeout, neutral},
		{"1.5ms deadline passed, ctx error", -time.Millisecond, 1500 * time.Microsecond, context.DeadlineExceeded, neutral},
		{"19ms deadline passed", -time.Microsecond, 19 * time.Millisecond, timeout, neutral},
		{"20ms deadline passed: Redis's", -time.Microsecond, 20 * time.Millisecond, timeout, failed},
		{"1s deadline passed: Redis's", -time.Microsecond, time.Second, context.DeadlineExceeded, failed},
		{"1ms deadline, refused before it: Redis's", time.Hour, 1 * time.Millisecond, errRefused, failed},
		{"1ms deadline, i/o timeout before it: Redis's", time.Hour, 1 * time.Millisecond, timeout, failed},
		{"no deadline, i/o timeout (ReadTimeout): Redis's", 0, 0, timeout, failed},
		{"1ms deadline, answered", -time.Microsecond, time.Millisecond, nil, answered},
		{"1ms deadline, error reply about the request", -time.Microsecond, time.Millisecond, redisError("ERR user_script:1: bad"), answered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, start := context.Background(), time.Now()
			if tc.left != 0 {
				deadline := time.Now().Add(tc.left)
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, deadline)
				defer cancel()
				start = deadline.Add(-tc.budget)
			}
			require.Equal(t, tc.want, b.classify(ctx, tc.err, start))
		})
	}
}

// clientBound says how long a client may hold a call past its ctx's
// deadline: runWithin watches the ctx itself only when a deadline is
// sooner than that.
func TestClientBound(t *testing.T) {
	client := func(o *redis.Options) *redis.Client {
		o.Addr = "127.0.0.1:1"
		c := redis.NewClient(o)
		t.Cleanup(func() { c.Close() })
		return c
	}
	ap, err := client(&redis.Options{ContextTimeoutEnabled: true}).AutoPipeline()
	require.NoError(t, err)
	unbounded := time.Duration(math.MaxInt64)
	for _, tc := range []struct {
		name string
		rdb  redis.Scripter
		want time.Duration
	}{
		{"ContextTimeoutEnabled", client(&redis.Options{ContextTimeoutEnabled: true}), 0},
		{"go-redis defaults: 4 tries of 5s writes and reads, 1s backoffs", client(&redis.Options{}), 2 * 4 * (10*time.Second + time.Second)},
		{"one try of 500ms", client(&redis.Options{MaxRetries: -1, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond, MaxRetryBackoff: -1}), 2 * time.Second},
		{"ReadTimeout -1: none", client(&redis.Options{ReadTimeout: -1}), unbounded},
		{"ReadTimeout -2: no deadlines", client(&redis.Options{ReadTimeout: -2}), unbounded},
		{"AutoPipeliner", ap, unbounded},
		{"cluster without the option", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), unbounded},
		{"cluster with it", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true}), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, clientBound(tc.rdb))
		})
	}
}
