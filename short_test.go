package redlimit

import "testing"

// go test -short ./... is the quick run while working: unit tests, the
// miniredis tests and a real-Redis check of every algorithm. go test ./...
// (and CI) runs everything, the tests below included.

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
