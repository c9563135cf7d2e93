// Package engine is the machinery every redlimit limiter shares: argument
// checks, key prefixing, running an algorithm's script in one round trip
// (EVALSHA, and EVAL once on NOSCRIPT), parsing its reply, the deny cache,
// the circuit breaker and fallback, and telling the observer. An algorithm
// supplies only its script, its ARGV and its limits (Config).
//
// Where things are, in the order a decision passes through them:
// engine.go checks the call, asks the deny cache (denycache.go), and hands
// the request to the round trip; roundtrip.go sends it behind the circuit
// breaker (breaker.go) and ends it at the caller's deadline; reply.go
// parses the script's reply; fallback.go decides a call Redis could not.
// grant.go is what an allowed call took and how it is given back;
// sentinels.go and errors.go are the errors callers branch on. Nothing here
// is shared between limiters but what the caller hands them (a client, a
// Breaker): there is no package-level state.
package engine
