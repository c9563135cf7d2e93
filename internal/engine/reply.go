package engine

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Never is the RetryAfter of a request that can never be allowed: the
// largest Duration, as redlimit.Never. Scripts reply -1 for it.
const Never time.Duration = math.MaxInt64

// Reply is one decision as a script reports it.
type Reply struct {
	Allowed    bool
	Remaining  int64
	RetryAfter time.Duration // Never when the request exceeds the capacity
	ResetAfter time.Duration
	Strategy   int // sliding log: index of the reported strategy; 0 otherwise
	// Stable is how long Remaining stays as it is if nothing is granted:
	// until then, the same request gets the same Result but for its
	// durations counting down. Never: until ResetAfter. Only a denial's
	// is read (the deny cache keeps denials alone), and an allowed reply
	// may say Never without it being so: a script spares the sprintf.
	Stable time.Duration
	// FromFallback reports a reply Config.Fallback made because Redis could
	// not: Limit and Grant are then the fallback's own, for the caller to
	// report as they are.
	FromFallback bool
	Limit        int
	Grant        Grant
	// Cause is, with FromFallback, the Redis error that sent the call there.
	Cause error
	// Token is the reply's seventh field: a grant's name in the key's
	// state, for its refunds (a decision allowed with n > 0), or the
	// permits a refund gave back, in decimal. "" when the script sent
	// none.
	Token string
}

// replyFields is the number of integers every script returns:
// allowed (0/1), remaining, retry-after µs (-1 = never), reset-after µs,
// strategy, stable µs (-1 = until reset).
const replyFields = 6

// maxDurationUS is the longest duration, in µs, a time.Duration holds.
const maxDurationUS = int64(1<<63-1) / int64(time.Microsecond)

// maxTokenBytes bounds a reply's token (see Reply.Token).
const maxTokenBytes = 100

// ParseReplyText parses a script's reply: six space-separated integers
// (replyFields), written canonically, then optionally a space and a token
// (Reply.Token) of 1 to maxTokenBytes bytes of letters, digits and . : _ + -.
func ParseReplyText(s string) (Reply, error) {
	var fields [replyFields]int64
	token := ""
	if i := nthSpace(s, replyFields); i >= 0 {
		s, token = s[:i], s[i+1:]
		if !validToken(token) {
			return Reply{}, fmt.Errorf("malformed script reply %q: bad token", s+" "+token)
		}
	}
	if err := parseFields(s, fields[:]); err != nil {
		return Reply{}, fmt.Errorf("malformed script reply %q: %w", s, err)
	}
	allowed, remaining, retryUS, resetUS, strategy, stableUS := fields[0], fields[1], fields[2], fields[3], fields[4], fields[5]
	switch {
	case allowed != 0 && allowed != 1,
		remaining < 0,
		retryUS < -1, retryUS > maxDurationUS, allowed == 1 && retryUS != 0,
		resetUS < 0, resetUS > maxDurationUS,
		strategy < 0 || strategy > 1<<16,
		stableUS < -1, stableUS > maxDurationUS:
		return Reply{}, fmt.Errorf("script reply %q out of range", s)
	}
	r := Reply{
		Allowed:    allowed == 1,
		Remaining:  remaining,
		RetryAfter: Never,
		ResetAfter: time.Duration(resetUS) * time.Microsecond,
		Strategy:   int(strategy),
		Stable:     Never,
		Token:      token,
	}
	if stableUS >= 0 {
		r.Stable = time.Duration(stableUS) * time.Microsecond
	}
	if retryUS >= 0 {
		r.RetryAfter = time.Duration(retryUS) * time.Microsecond
	}
	return r, nil
}

// parseFields parses len(fields) space-separated decimal integers, written
// canonically (no leading zero, no -0, no sign but -), that fill s.
func parseFields(s string, fields []int64) error {
	i := 0
	for f := range fields {
		if i >= len(s) {
			return fmt.Errorf("%d fields, want %d", f, len(fields))
		}
		neg := s[i] == '-'
		if neg {
			i++
		}
		start := i
		var x int64
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			if x > (1<<62)/10 {
				return errors.New("number out of range")
			}
			x = x*10 + int64(s[i]-'0')
			i++
		}
		if i == start || (s[start] == '0' && (i-start > 1 || neg)) {
			// Scripts write integers canonically: no leading zero, no -0.
			return fmt.Errorf("field %d is not a number", f+1)
		}
		if neg {
			x = -x
		}
		fields[f] = x
		if f < len(fields)-1 {
			if i >= len(s) || s[i] != ' ' {
				return fmt.Errorf("%d fields, want %d", f+1, len(fields))
			}
			i++
		}
	}
	if i != len(s) {
		return errors.New("trailing data")
	}
	return nil
}

// nthSpace returns the index of the nth space in s, or -1.
func nthSpace(s string, n int) int {
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			n--
			if n == 0 {
				return i
			}
		}
	}
	return -1
}

// validToken reports a token a script may send: 1 to maxTokenBytes bytes
// of letters, digits and . : _ + -.
func validToken(t string) bool {
	if t == "" || len(t) > maxTokenBytes {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c == '.' || c == ':' || c == '_' || c == '+' || c == '-':
		default:
			return false
		}
	}
	return true
}
