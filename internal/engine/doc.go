// Package engine is the machinery every redlimit limiter shares: argument
// checks, key prefixing, running an algorithm's script in one round trip
// (EVALSHA, and EVAL once on NOSCRIPT), parsing its reply, the deny cache,
// the circuit breaker and fallback, and telling the observer. An algorithm
// supplies only its script, its ARGV and its limits (Config).
//
// Where things are: engine.go runs a decision (Engine.Decide, Reset);
// reply.go parses a script's reply; denycache.go keeps recent denials;
// breaker.go is the circuit breaker and decides which errors count as
// failures; errors.go builds errors that match the root package's sentinels.
package engine
