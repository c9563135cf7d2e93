package redlimit

import (
	"time"

	"github.com/redis/go-redis/v9"
)

var fixedWindowScript = loadScript("refunds.lua", "fixedwindow.lua")

// FixedWindow grants at most limit permits per window. A window opens at the
// first request that finds none open and lasts for the window's length; a
// denied request, or one for zero permits, opens none. It is the cheapest
// algorithm, in Redis memory and time, but lets a client spend up to 2×limit
// across the boundary between two windows.
//
// Result.ResetAfter is the time until the window closes, and a denied
// request's RetryAfter is the same. A Result's Grant gives its permits back
// into the window that counted them while that window is open, and nothing
// once it has closed; a window emptied by refunds still closes at its end.
type FixedWindow struct {
	limiter
}

// NewFixedWindow returns a limiter granting at most limit permits per window.
// limit must be between 1 and 2^40; window at least 1ms, at most about 203
// days, in whole microseconds. Bad values are ErrInvalidConfig. Keys are
// redlimit:fw:<config>:<key> unless WithPrefix says otherwise.
func NewFixedWindow(rdb redis.Scripter, limit int, window time.Duration, opts ...Option) (*FixedWindow, error) {
	const algorithm = "fixed_window"
	if err := permits(algorithm, "limit", limit); err != nil {
		return nil, err
	}
	windowUS, err := micros(algorithm, "window", window)
	if err != nil {
		return nil, err
	}
	l, err := newLimiter(rdb, spec{
		algorithm: algorithm,
		code:      "fw",
		// Format 3: a window lasts its stored length for every
		// configuration, and refunds are kept (docs/internals.md).
		format: 3,
		script: fixedWindowScript,
		// A refund no observer reads is the bare "=": on the server's
		// clock it reads no TIME (scripts/fixedwindow.lua).
		bareRefunds: true,
		args:        []any{limit, windowUS},
		// With a WithPrefix prefix the window's length is stored, so that
		// every configuration sharing a key reads the window alike (see
		// scripts/fixedwindow.lua).
		sharedArgs: []any{1},
		limits:     []int{limit},
		windows:    []time.Duration{window},
	}, opts)
	if err != nil {
		return nil, err
	}
	return &FixedWindow{l}, nil
}
