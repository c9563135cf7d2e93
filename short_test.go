package redlimit

import "testing"

// go test -short ./... is the quick run while working: unit tests, and
// every script test on one server (forEachBackend: the real redis-server
// when it is on PATH, else miniredis). go test ./... (and CI) runs
// everything: the script tests on both, and the tests below.

// skipShort skips a slow test under -short, saying why it is slow.
func skipShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow: " + why + "; runs without -short")
	}
}

// shortOr is quick under -short and full otherwise: a randomized test then
// checks its property on fewer traces while you work, and on all of them in
// the full suite.
func shortOr(quick, full int) int {
	if testing.Short() {
		return quick
	}
	return full
}
