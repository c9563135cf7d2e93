package testseed

import "testing"

func TestFromEnv(t *testing.T) {
	t.Setenv(Env, "")
	if got := Offset(t); got != 0 {
		t.Fatalf("unset: %d, want 0", got)
	}
	t.Setenv(Env, "42")
	if got := Offset(t); got != 42 {
		t.Fatalf("42: %d", got)
	}
}
