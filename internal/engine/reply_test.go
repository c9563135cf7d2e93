package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// parseReply parses v as the engine parses a script's reply: a string (a single string costs one allocation in the client
// where an array of integers costs one per element), and anything else an
// error, never a panic: the reply may come from a server or proxy that
// misbehaves.
func parseReply(v any) (Reply, error) {
	s, ok := v.(string)
	if !ok {
		return Reply{}, fmt.Errorf("unexpected script reply %T, want a string", v)
	}
	return ParseReplyText(s)
}

// replyCases are parseReply's table and FuzzParseReply's seed corpus.
var replyCases = []struct {
	name    string
	in      any
	want    Reply
	wantErr bool
}{
	// Valid replies: allowed, remaining, retry-after µs, reset-after µs, strategy, stable µs.
	{name: "allowed", in: "1 2 0 1000 0 -1",
		want: Reply{Stable: Never, Allowed: true, Remaining: 2, ResetAfter: time.Millisecond}},
	{name: "a grant's token", in: "1 2 0 1000 0 -1 17.1764:3_a+b-C",
		want: Reply{Stable: Never, Allowed: true, Remaining: 2, ResetAfter: time.Millisecond, Token: "17.1764:3_a+b-C"}},
	{name: "allowed, nothing left", in: "1 0 0 1000000 0 -1",
		want: Reply{Stable: Never, Allowed: true, ResetAfter: time.Second}},
	{name: "zero state", in: "1 3 0 0 0 -1",
		want: Reply{Stable: Never, Allowed: true, Remaining: 3}},
	{name: "denied", in: "0 0 333334 1000000 0 -1",
		want: Reply{Stable: Never, Remaining: 0, RetryAfter: 333334 * time.Microsecond, ResetAfter: time.Second}},
	{name: "denied, never", in: "0 2 -1 500 0 -1",
		want: Reply{Stable: Never, Remaining: 2, RetryAfter: Never, ResetAfter: 500 * time.Microsecond}},
	{name: "sliding log strategy", in: "0 0 8950000 9850000 3 -1",
		want: Reply{Stable: Never, RetryAfter: 8950 * time.Millisecond, ResetAfter: 9850 * time.Millisecond, Strategy: 3}},
	{name: "largest strategy", in: "1 0 0 0 65536 -1",
		want: Reply{Stable: Never, Allowed: true, Strategy: 65536}},
	{name: "largest durations", in: "0 1099511627776 9223372036854775 9223372036854775 0 -1",
		want: Reply{Stable: Never, Remaining: 1 << 40, RetryAfter: 9223372036854775 * time.Microsecond, ResetAfter: 9223372036854775 * time.Microsecond}},

	{name: "stable", in: "0 1 5000 9000 0 2000",
		want: Reply{Remaining: 1, RetryAfter: 5 * time.Millisecond, ResetAfter: 9 * time.Millisecond, Stable: 2 * time.Millisecond}},
	{name: "stable 0", in: "0 1 5000 9000 0 0",
		want: Reply{Remaining: 1, RetryAfter: 5 * time.Millisecond, ResetAfter: 9 * time.Millisecond}},

	// The forms of earlier scripts (a stamped denial, a grant) are not replies.
	{name: "stamped denial", in: "~1800000000000250 !1800000000000000 1000 4000 9000 1", wantErr: true},
	{name: "grant", in: "=1800000000000250 1800000000000 1 0 1 0 1", wantErr: true},

	// Not a string: what a script returning a table or number would give.
	{name: "nil", in: nil, wantErr: true},
	{name: "int64", in: int64(1), wantErr: true},
	{name: "array", in: []interface{}{int64(1), int64(2), int64(0), int64(1000), int64(0)}, wantErr: true},
	{name: "bytes", in: []byte("1 2 0 1000 0"), wantErr: true},

	// Malformed strings.
	{name: "empty", in: "", wantErr: true},
	{name: "space", in: " ", wantErr: true},
	{name: "four fields", in: "1 2 0 1000", wantErr: true},
	{name: "four fields and a space", in: "1 2 0 1000 ", wantErr: true},
	{name: "five fields", in: "1 2 0 1000 0", wantErr: true},
	{name: "eight fields", in: "1 2 0 1000 0 0 0 0", wantErr: true},
	{name: "a token with a bad byte", in: "1 2 0 1000 0 0 a/b", wantErr: true},
	{name: "an empty token", in: "1 2 0 1000 0 0 ", wantErr: true},
	{name: "stable below -1", in: "1 2 0 1000 0 -2", wantErr: true},
	{name: "one field", in: "1", wantErr: true},
	{name: "letters", in: "1 2 0 abc 0", wantErr: true},
	{name: "exponent", in: "1 2 0 1e3 0", wantErr: true},
	{name: "decimal point", in: "1 2 0 1000.5 0", wantErr: true},
	{name: "plus sign", in: "+1 2 0 1000 0", wantErr: true},
	{name: "lone minus", in: "0 0 - 1000 0", wantErr: true},
	{name: "double minus", in: "0 0 --1 1000 0", wantErr: true},
	{name: "double space", in: "1  2 0 1000 0", wantErr: true},
	{name: "leading space", in: " 1 2 0 1000 0", wantErr: true},
	{name: "trailing space", in: "1 2 0 1000 0 ", wantErr: true},
	{name: "trailing newline", in: "1 2 0 1000 0\n", wantErr: true},
	{name: "tab", in: "1\t2 0 1000 0", wantErr: true},
	{name: "NUL", in: "1 2 0 1000 0\x00", wantErr: true},
	{name: "non-ASCII digit", in: "1 2 0 １ 0", wantErr: true},
	{name: "overflow int64", in: "0 99999999999999999999 0 0 0", wantErr: true},
	{name: "min int64", in: "0 0 -9223372036854775808 0 0", wantErr: true},
	{name: "retry longer than a Duration", in: "0 0 9223372036854776 0 0", wantErr: true},
	{name: "reset longer than a Duration", in: "0 0 1 9223372036854776 0", wantErr: true},
	{name: "allowed 2", in: "2 0 0 0 0", wantErr: true},
	{name: "allowed -1", in: "-1 0 0 0 0", wantErr: true},
	{name: "negative remaining", in: "0 -1 10 10 0", wantErr: true},
	{name: "retry -2", in: "0 0 -2 10 0", wantErr: true},
	{name: "allowed with retry", in: "1 0 5 10 0", wantErr: true},
	{name: "allowed with retry never", in: "1 0 -1 10 0", wantErr: true},
	{name: "negative reset", in: "1 0 0 -1 0", wantErr: true},
	{name: "negative strategy", in: "1 0 0 0 -1", wantErr: true},
	{name: "strategy too large", in: "1 0 0 0 65537", wantErr: true},

	// Scripts format with %d: a number with a leading zero or a "-0" is
	// not one of theirs, and accepting it would let two strings mean one reply.
	{name: "leading zero", in: "01 2 0 1000 0", wantErr: true},
	{name: "negative zero", in: "1 -0 0 1000 0", wantErr: true},
	{name: "padded never", in: "0 0 -01 1000 0", wantErr: true},
}

func TestParseReply(t *testing.T) {
	for _, tc := range replyCases {
		t.Run(tc.name, func(t *testing.T) {
			var got Reply
			var err error
			require.NotPanics(t, func() { got, err = parseReply(tc.in) }, "parseReply(%#v) must never panic", tc.in)
			if tc.wantErr {
				require.Error(t, err, "parseReply(%#v) should reject the reply, got %+v", tc.in, got)
				require.Equal(t, Reply{}, got, "a rejected reply should come with a zero Reply")
				require.NotContains(t, err.Error(), "redlimit:", "the engine prefixes redlimit: <algorithm>: once")
				return
			}
			require.NoError(t, err, "parseReply(%#v) should accept a valid reply", tc.in)
			require.Equal(t, tc.want, got, "parseReply(%#v)", tc.in)
			requireFormatsBack(t, tc.in.(string), got)
		})
	}
}

// formatReply writes r the way every script does (six integers, %d each).
func formatReply(r Reply) string {
	allowed, retryUS := 0, int64(-1)
	if r.Allowed {
		allowed = 1
	}
	if r.RetryAfter != Never {
		retryUS = int64(r.RetryAfter / time.Microsecond)
	}
	stableUS := int64(-1)
	if r.Stable != Never {
		stableUS = int64(r.Stable / time.Microsecond)
	}
	s := fmt.Sprintf("%d %d %d %d %d %d", allowed, r.Remaining, retryUS, int64(r.ResetAfter/time.Microsecond), r.Strategy, stableUS)
	if r.Token != "" {
		s += " " + r.Token
	}
	return s
}

// FuzzParseReply checks that parseReply never panics, and that whatever it
// accepts is a reply a script could have written: in range, and written in
// exactly one way.
func FuzzParseReply(f *testing.F) {
	for _, tc := range replyCases {
		if s, ok := tc.in.(string); ok {
			f.Add(s)
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := parseReply(s)
		if err != nil {
			require.Equal(t, Reply{}, r, "parseReply(%q) failed with a non-zero Reply", s)
			return
		}
		require.GreaterOrEqual(t, r.Remaining, int64(0), "parseReply(%q): Remaining must not be negative", s)
		require.GreaterOrEqual(t, r.ResetAfter, time.Duration(0), "parseReply(%q): ResetAfter must not be negative", s)
		require.True(t, r.RetryAfter == Never || r.RetryAfter >= 0, "parseReply(%q): RetryAfter %v must be Never or >= 0", s, r.RetryAfter)
		require.True(t, !r.Allowed || r.RetryAfter == 0, "parseReply(%q): allowed with RetryAfter %v, want 0", s, r.RetryAfter)
		require.True(t, r.Strategy >= 0 && r.Strategy <= 1<<16, "parseReply(%q): strategy %d out of range", s, r.Strategy)
		requireFormatsBack(t, s, r)
	})
}

// requireFormatsBack requires that s, which parsed to r, is r as a script
// writes it.
func requireFormatsBack(t *testing.T, s string, r Reply) {
	t.Helper()
	require.Equal(t, s, formatReply(r), "parseReply(%q) accepted a reply that does not re-format to itself", s)
}
