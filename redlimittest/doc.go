// Package redlimittest helps you test code that uses redlimit, without a
// Redis server and without sleeping.
//
// An [Env] is a miniredis server (an in-process Redis, with a Lua
// interpreter), a go-redis client of it, and a fake clock. Limiters built on
// it run the same scripts they run on Redis, so they make the same decisions;
// only the server is in process. The fake clock reaches them through
// redlimit.WithClock: build every limiter with env.Options(), and it decides
// on the Env's clock.
//
//	env := redlimittest.New(t) // closed when the test ends
//	limiter, err := redlimit.NewFixedWindow(env.Client(), 2, time.Minute, env.Options()...)
//	// ... two requests pass, the third is denied ...
//	env.Advance(time.Minute) // instant: moves the clock and the server's TTLs together
//	// ... and the next one passes again.
//
// A test of a handler's 429 path, or of what happens once the limit
// recovers, then runs in microseconds.
//
// Decisions do not depend on the machine's speed either. httplimit and
// grpclimit decide under a deadline of 100ms (WithTimeout) and let a
// request through undecided when it passes, and a CI machine running other
// jobs can take longer for a round trip: a test that expects 429 would
// then see 200. The Env's client gives every command at least
// DecisionDeadline (10s) whatever its ctx's deadline says, so the limit
// always decides. To test what a service does when no decision comes in
// time, make Redis fail rather than slow (below).
//
// To test the path where no decision is made, make Redis fail:
// env.Server().SetError("...") fails every command until SetError(""), and
// env.Server().Close() takes the server down for good. A limiter with a
// fallback (redlimit.WithFallback) then decides on the fallback, which reads
// the same fake clock.
//
// Limiters that share keys in one test should all be built with
// env.Options(), so that they decide on the same clock. Run starts an Env
// outside a test, for examples and simulations.
package redlimittest
