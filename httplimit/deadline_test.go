package httplimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/redlimittest"
)

// clientDeadline is a server that passes a client-chosen deadline down to
// its handlers (an X-Timeout header, as a gRPC server does with
// grpc-timeout).
func clientDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d, err := time.ParseDuration(r.Header.Get("X-Timeout")); err == nil {
			ctx, cancel := context.WithTimeout(r.Context(), d)
			defer cancel()
			r = r.WithContext(ctx)
		}
		next.ServeHTTP(w, r)
	})
}

// Attackers whose requests carry deadlines of 20µs to 320µs, shorter than a
// round trip to Redis, neither open the limiter's circuit breaker nor get
// an honest client's limit failed open: the honest client gets exactly its
// 5, then 429, with fail open and with fail closed, on miniredis and on a
// real redis-server.
func TestMiddlewareClientDeadlinesCannotOpenTheBreaker(t *testing.T) {
	backends := map[string]func(t *testing.T) (*redis.Client, []redlimit.Option){
		"miniredis": func(t *testing.T) (*redis.Client, []redlimit.Option) {
			env := redlimittest.New(t)
			client := redis.NewClient(&redis.Options{Addr: env.Server().Addr(), ContextTimeoutEnabled: true, MaxRetries: -1,
				DialTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute, PoolTimeout: time.Minute})
			t.Cleanup(func() { client.Close() })
			return client, env.Options()
		},
		"redis-server": func(t *testing.T) (*redis.Client, []redlimit.Option) {
			srv := redistest.Start(t)
			client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1,
				DialTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute, PoolTimeout: time.Minute})
			t.Cleanup(func() { client.Close() })
			return client, nil
		},
	}
	for name, backend := range backends {
		for _, failClosed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/failClosed=%v", name, failClosed), func(t *testing.T) {
				client, opts := backend(t)
				var opened atomic.Int32
				breaker, err := redlimit.NewBreaker(redlimit.BreakerConfig{OnChange: func(_, to redlimit.BreakerState, err error) {
					if to == redlimit.BreakerOpen {
						t.Logf("breaker opened: %v", err)
						opened.Add(1)
					}
				}})
				require.NoError(t, err)
				l, err := redlimit.NewFixedWindow(client, 5, time.Minute, append(opts, redlimit.WithBreaker(breaker))...)
				require.NoError(t, err)
				// A decision deadline and client timeouts far above what a
				// loaded test machine needs, so that only the attackers'
				// deadlines could fail calls.
				mwOpts := []Option{WithKeyFunc(Header("X-Client")), WithTimeout(time.Minute)}
				if failClosed {
					mwOpts = append(mwOpts, WithFailClosed())
				}
				h := clientDeadline(Middleware(l, mwOpts...)(ok))

				stop := make(chan struct{})
				var wg sync.WaitGroup
				var attacks atomic.Int64
				for i := range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for n := 0; ; n++ {
							select {
							case <-stop:
								return
							default:
							}
							req := httptest.NewRequest(http.MethodGet, "/", nil)
							req.Header.Set("X-Client", fmt.Sprintf("attacker-%d-%d", i, n))
							req.Header.Set("X-Timeout", fmt.Sprintf("%dus", 20+rand.IntN(300)))
							h.ServeHTTP(httptest.NewRecorder(), req)
							attacks.Add(1)
						}
					}()
				}
				codes := map[int]int{}
				for range 20 {
					req := httptest.NewRequest(http.MethodGet, "/", nil)
					req.Header.Set("X-Client", "honest")
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					codes[rec.Code]++
					time.Sleep(2 * time.Millisecond) // spread over the attack: pacing, which no assertion times
				}
				close(stop)
				wg.Wait()
				t.Logf("%d attacking requests", attacks.Load())
				assert.Equal(t, map[int]int{200: 5, 429: 15}, codes, "the honest client gets its 5, then 429")
				assert.Zero(t, opened.Load(), "the breaker never opened")
				assert.Equal(t, redlimit.BreakerClosed, breaker.State())
			})
		}
	}
}
