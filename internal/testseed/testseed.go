// Package testseed lets the tests that draw random traces draw other ones
// than CI's: REDLIMIT_SEED=N. The shared-key pair tests take N as their
// seed (CI's is 1), the others add it to theirs (CI's traces: 0). Each
// prints it when set, so that a failure says how to repeat it.
// CONTRIBUTING.md shows a search.
package testseed

import (
	"os"
	"strconv"
	"testing"
)

// Env is the variable's name.
const Env = "REDLIMIT_SEED"

// FromEnv returns REDLIMIT_SEED, 0 when unset. A value that is not an
// unsigned integer fails t.
func FromEnv(t testing.TB) uint64 {
	t.Helper()
	raw := os.Getenv(Env)
	if raw == "" {
		return 0
	}
	seed, err := strconv.ParseUint(raw, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: want an unsigned integer", Env, raw)
	}
	return seed
}

// Offset returns what a random-trace test adds to its seeds: REDLIMIT_SEED,
// 0 when unset (CI's traces). It logs a value that is set, so that a
// failure says how to repeat it.
func Offset(t testing.TB) uint64 {
	t.Helper()
	seed := FromEnv(t)
	if seed != 0 {
		t.Logf("%s=%d: other traces than CI's", Env, seed)
	}
	return seed
}
