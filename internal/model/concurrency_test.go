package model

import "testing"

// TestConcurrencyLeases walks one key of 2 leases of 100µs through grants,
// lapses, releases, extends and clock steps, by hand.
func TestConcurrencyLeases(t *testing.T) {
	const t0 = int64(1_800_000_000_000_000)
	m := NewConcurrency(2, 100)
	step := func(what string, now, n int64, allowed bool, remaining, retry, reset int64) int64 {
		t.Helper()
		r := m.Step(t0+now, n)
		if r.Allowed != allowed || r.Remaining != remaining || r.RetryAfterUS != retry || r.ResetAfterUS != reset {
			t.Fatalf("%s: got %+v, want allowed %v remaining %d retry %d reset %d", what, r, allowed, remaining, retry, reset)
		}
		return r.GrantID
	}
	a := step("first lease", 0, 1, true, 1, 0, 100)
	b := step("second lease", 10, 1, true, 0, 0, 100)
	step("full: wait for the earliest to lapse", 20, 1, false, 0, 80, 90)
	step("more than the limit: never", 20, 3, false, 0, Never, 90)
	if given := m.Refund(t0+30, a, 1); given != 1 {
		t.Fatalf("releasing a live lease freed %d places, want 1", given)
	}
	if given := m.Refund(t0+30, a, 1); given != 0 {
		t.Fatalf("releasing it again freed %d places, want 0", given)
	}
	c := step("a place freed by the release", 30, 1, true, 0, 0, 100)
	if given := m.Refund(t0+200, b, 1); given != 0 {
		t.Fatalf("releasing a lapsed lease freed %d places, want 0", given)
	}
	if r, id := m.Extend(t0+120, c); !r.Allowed || id != c || r.ResetAfterUS != 100 {
		t.Fatalf("extending a live lease: got %+v, grant %d; want allowed, the same grant, lapsing in 100µs", r, id)
	}
	step("the extended lease is live: one place", 200, 1, true, 0, 0, 100)
	// The clock goes back 1000µs: the key's time stays at its latest
	// grant (200) for the leases, which are both live...
	step("clock back, beyond a lease: denied", -800, 1, false, 0, 100, 100)
	// ...and a grant there writes on the caller's timeline: every lease
	// lapses within one lease of the caller's clock.
	if given := m.Refund(t0-800, c, 1); given != 1 {
		t.Fatalf("releasing a live lease on a clock gone back freed %d, want 1", given)
	}
	step("clock back: a grant rebases", -800, 1, true, 0, 0, 100)
	step("a lease later, on the caller's clock, all lapsed", -700, 2, true, 0, 0, 100)
}

// TestConcurrencyExtendLapsed: a lapsed lease is taken afresh when there
// is room, and denied when there is none.
func TestConcurrencyExtendLapsed(t *testing.T) {
	const t0 = int64(1_800_000_000_000_000)
	m := NewConcurrency(1, 100)
	a := m.Step(t0, 1).GrantID
	r, id := m.Extend(t0+150, a)
	if !r.Allowed || id == a {
		t.Fatalf("extending a lapsed lease with room: got %+v, grant %d; want allowed with a new grant", r, id)
	}
	if r, _ := m.Extend(t0+150, a); r.Allowed || r.RetryAfterUS != 100 {
		t.Fatalf("extending the old, lapsed lease of a full key: got %+v; want denied for 100µs", r)
	}
	if m.Live(t0+150) != 1 {
		t.Fatalf("live leases %d, want 1", m.Live(t0+150))
	}
}
