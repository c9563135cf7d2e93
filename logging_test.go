package redlimit

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A limiter writes to no global logger (log's or slog's default), even on
// a client without ContextTimeoutEnabled and calls that fail; WithLogger
// gets its one warning, once per limiter. Not parallel: it swaps the
// process's loggers.
func TestNoGlobalLogging(t *testing.T) {
	var global, globalSlog bytes.Buffer
	oldLog, oldSlog := log.Writer(), slog.Default()
	log.SetOutput(&global)
	slog.SetDefault(slog.New(slog.NewTextHandler(&globalSlog, nil)))
	defer func() {
		slog.SetDefault(oldSlog) // also points log's output back at slog's handler
		log.SetOutput(oldLog)
	}()

	m := miniredis.RunT(t)
	// ContextTimeoutEnabled: false. The calls' deadline is shorter than
	// what the client's timeouts let a call take (2 × (10m + 10m)), so
	// the engine watches it, and long, so that a loaded machine meets it.
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1,
		ReadTimeout: 10 * time.Minute, WriteTimeout: 10 * time.Minute})
	t.Cleanup(func() { rdb.Close() })
	var own bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&own, nil))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, alg := range algorithms {
		quiet, err := alg.new(rdb, 2, time.Minute)
		require.NoError(t, err)
		told, err := alg.new(rdb, 2, time.Minute, WithLogger(logger))
		require.NoError(t, err)
		for range 3 {
			for _, l := range []Limiter{quiet, told} {
				_, err := l.Allow(ctx, "k")
				require.NoError(t, err)
				_, err = l.Allow(ctx, "")
				require.Error(t, err)
			}
		}
	}
	m.SetError("simulated outage")
	for _, alg := range algorithms {
		l, err := alg.new(rdb, 2, time.Minute)
		require.NoError(t, err)
		_, err = l.Allow(ctx, "k")
		require.Error(t, err)
	}
	require.Empty(t, global.String(), "nothing may be written to log's global logger")
	require.Empty(t, globalSlog.String(), "nothing may be written to slog's default logger")
	warnings := strings.Count(own.String(), "ContextTimeoutEnabled is false")
	require.Equal(t, len(algorithms), warnings, "WithLogger gets one warning per limiter, at construction:\n%s", own.String())
	require.Contains(t, own.String(), "ClientOptions", "the warning names the fix")
}
