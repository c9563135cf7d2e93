package redlimittest_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/redlimittest"
)

// A test of a handler's 429 path, without a Redis server and without
// sleeping: in a test, redlimittest.New(t) replaces Run and Close.
func Example() {
	env, err := redlimittest.Run()
	if err != nil {
		panic(err)
	}
	defer env.Close()

	limiter, err := redlimit.NewFixedWindow(env.Client(), 2, time.Hour, env.Options()...)
	if err != nil {
		panic(err)
	}
	api := httplimit.Middleware(limiter)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	get := func() {
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Printf("%d Retry-After=%q\n", rec.Code, rec.Header().Get("Retry-After"))
	}
	get()
	get()
	get()
	env.Advance(time.Hour) // an hour passes in no time
	get()
	// Output:
	// 200 Retry-After=""
	// 200 Retry-After=""
	// 429 Retry-After="3600"
	// 200 Retry-After=""
}
