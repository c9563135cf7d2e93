package redlimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// The fixed and the calendar window take refunds that no observer reads
// as the bare "=": on the server's clock such a refund reads no TIME and
// decides at the key's time as the key records it (scripts/fixedwindow.lua,
// scripts/calendar.lua).

// windowLimiters builds a fixed window and a calendar window of limit
// permits (a minute; a UTC day) on rdb, with opts.
func windowLimiters(t *testing.T, rdb redis.Scripter, limit int, opts ...Option) map[string]Limiter {
	t.Helper()
	fixed, err := NewFixedWindow(rdb, limit, time.Minute, opts...)
	require.NoError(t, err)
	cal, err := NewCalendarWindow(rdb, limit, Daily(time.UTC), opts...)
	require.NoError(t, err)
	return map[string]Limiter{"fixed_window": fixed, "calendar_window": cal}
}

// TestWindowBareRefundReadsNoClock: on the server's clock a refund that no
// observer reads sends no TIME and gives back exactly, at most once; one
// an observer reads sends TIME and is observed with the key's state. On a
// server of its own: INFO commandstats counts TIME.
func TestWindowBareRefundReadsNoClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := newClient(t, redistest.Start(t).Addr(), 0)
	times := func() int64 {
		calls, _ := commandStats(t, rdb, "time")
		return calls
	}
	for _, observed := range []bool{false, true} {
		var seen []Decision
		var opts []Option
		if observed {
			opts = append(opts, WithObserver(func(d Decision) { seen = append(seen, d) }))
		}
		for name, l := range windowLimiters(t, rdb, 3, opts...) {
			key := fmt.Sprintf("observed %v", observed)
			r, err := l.AllowN(ctx, key, 3)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			before := times()
			require.NoError(t, r.Grant.Refund(ctx, 2))
			require.NoError(t, r.Grant.Refund(ctx, 2), "a retried refund gives nothing more")
			if observed {
				require.Equal(t, before+2, times(), "%s: an observed refund reads TIME", name)
				last := seen[len(seen)-1]
				require.True(t, last.Refund, name)
				require.Equal(t, 2, last.Result.Remaining, "%s: the key's state after the refunds", name)
			} else {
				require.Equal(t, before, times(), "%s: the bare refund reads no TIME", name)
			}
			r, err = l.AllowN(ctx, key, 2)
			require.NoError(t, err)
			require.True(t, r.Allowed, "%s: the 2 given back", name)
			r, err = l.Allow(ctx, key)
			require.NoError(t, err)
			require.False(t, r.Allowed, "%s: and no more", name)
		}
	}
}

// TestWindowBareRefundScript calls the scripts with "=" on the server's
// clock: a missing key gives nothing and is not created; a grant gives
// back what it took, once, and "-" then reads the state it left; a token
// of another window gives nothing; a foreign value is an error and is
// left as it was.
func TestWindowBareRefundScript(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		for name, l := range windowLimiters(t, b.rdb, 5) {
			run := func(key, what string) (any, error) {
				keys := []string{redisKey(l, key)}
				if name == "fixed_window" {
					return fixedWindowScript.Run(ctx, b.rdb, keys, "", what, 5, time.Minute.Microseconds()).Result()
				}
				return calendarScript.Run(ctx, b.rdb, keys, append(append([]any{"", what},
					periodArgs(Daily(time.UTC))(time.Now())...), 5)...).Result()
			}
			refund := func(key, what string) string {
				v, err := run(key, what)
				require.NoError(t, err, "%s: %s", name, what)
				return v.(string)
			}
			r, err := l.AllowN(ctx, "k", 3)
			require.NoError(t, err)
			token := grantToken(r.Grant)
			require.Equal(t, "1 0 0 0 0 -1 0", refund("none", "=2:"+token), name)
			require.Zero(t, b.rdb.Exists(ctx, redisKey(l, "none")).Val(), "%s: a refund creates no key", name)
			require.Equal(t, "1 0 0 0 0 -1 2", refund("k", "=2:"+token), name)
			require.Equal(t, "1 0 0 0 0 -1 0", refund("k", "=2:"+token), "%s: given back already", name)
			v := refund("k", "-2:"+token)
			require.Regexp(t, `^1 4 0 [1-9]\d* 0 -1 0$`, v, "%s: the state the bare refund left", name)
			require.Equal(t, "1 0 0 0 0 -1 1", refund("k", "=3:"+token), name)

			_, err = l.AllowN(ctx, "other", 1)
			require.NoError(t, err)
			require.Equal(t, "1 0 0 0 0 -1 0", refund("other", "=3:"+token), "%s: another window's grant", name)

			require.NoError(t, b.rdb.Set(ctx, redisKey(l, "foreign"), "foreign", time.Hour).Err())
			_, err = run("foreign", "=1:"+token)
			require.ErrorContains(t, err, "NOTOURS", name)
			require.Equal(t, "foreign", b.rdb.Get(ctx, redisKey(l, "foreign")).Val(), name)
		}
	})
}

// TestWindowBareRefundAtTheKeysTime: a bare refund on the server's clock
// decides at the key's time as the key records it. On a server whose
// clock went back more than a window after a grant, it gives back into the
// window that counted the grant, which the clock gone wrong counts as used
// (never more than the grant took); an observed refund reads the clock
// gone wrong and gives nothing (stricter). A calendar refund on a server a
// day behind the host, of a grant in the server's day, gives nothing: it
// takes the host's day for the clock's, which the key's period is before
// (stricter); an observed one gives back. miniredis: its clock is set.
func TestWindowBareRefundAtTheKeysTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, observed := range []bool{false, true} {
		m := miniredis.RunT(t)
		rdb := newMiniClient(t, m)
		var opts []Option
		if observed {
			opts = append(opts, WithObserver(func(Decision) {}))
		}
		fixed, err := NewFixedWindow(rdb, 3, time.Minute, opts...)
		require.NoError(t, err)
		now := time.Now()
		m.SetTime(now)
		r, err := fixed.AllowN(ctx, "k", 3)
		require.NoError(t, err)
		m.SetTime(now.Add(-2 * time.Minute))
		require.NoError(t, r.Grant.Refund(ctx, 2))
		r, err = fixed.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		if observed {
			require.Equal(t, 0, r.Remaining, "observed: a clock gone wrong, nothing given back")
		} else {
			require.Equal(t, 2, r.Remaining, "bare: given back in the key's window, which the clock gone wrong counts")
		}

		cal, err := NewCalendarWindow(rdb, 3, Daily(time.UTC), opts...)
		require.NoError(t, err)
		m.SetTime(now.Add(-day))
		r, err = cal.AllowN(ctx, "k", 3)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.NoError(t, r.Grant.Refund(ctx, 2))
		r, err = cal.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		if observed {
			require.Equal(t, 2, r.Remaining, "observed: the server's day, given back")
		} else {
			require.Equal(t, 0, r.Remaining, "bare: the host's day is after the key's, nothing given back")
		}
	}
}
