package engine

import (
	"errors"
	"fmt"
	"math"
	"strings"
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
	// Fallback is non-nil when Config.Fallback decided instead of Redis: its
	// own result, for the caller to report as it is.
	Fallback any
}

// replyFields is the number of integers every script returns:
// allowed (0/1), remaining, retry-after µs (-1 = never), reset-after µs,
// strategy, stable µs (-1 = until reset).
const replyFields = 6

// maxDurationUS is the longest duration, in µs, a time.Duration holds.
const maxDurationUS = int64(1<<63-1) / int64(time.Microsecond)

// parseReply parses a script's reply: one bulk string of six space-separated
// decimal integers, or a stamped denial (ParseReplyText). A single string
// costs one allocation in the client where an array of integers costs one
// per element. Anything else is an error, never a panic: the reply may come
// from a server or proxy that misbehaves.
func parseReply(v any) (Reply, error) {
	s, ok := v.(string)
	if !ok {
		return Reply{}, fmt.Errorf("unexpected script reply %T, want a string", v)
	}
	return ParseReplyText(s)
}

// ParseReplyText parses the six integers of a reply, or a stamped denial:
// "~now !from till retry reset strategy[ owner]". The sliding scripts send
// it for a denial they read from a denial stamp (see scripts/sliding.lua):
// the time they decided at (Unix µs), a space, and the stamp as stored,
// whose durations count from its time from and whose owner, letters and
// digits, names the configuration that wrote it. The script formats no
// number; this side subtracts.
func ParseReplyText(s string) (Reply, error) {
	var fields [replyFields]int64
	if len(s) > 0 && s[0] == '~' {
		if err := parseStamp(s[1:], &fields); err != nil {
			return Reply{}, fmt.Errorf("malformed script reply %q: %w", s, err)
		}
		now, from, till, retryUS, resetUS, strategy := fields[0], fields[1], fields[2], fields[3], fields[4], fields[5]
		elapsed := now - from
		if now < 0 || from < 0 || elapsed < 0 || till <= elapsed || retryUS < till || resetUS < retryUS ||
			resetUS > maxDurationUS || strategy < 0 || strategy > 1<<16 {
			return Reply{}, fmt.Errorf("script reply %q out of range", s)
		}
		// A denial, nothing left: the stamp holds for one permit.
		fields = [replyFields]int64{0, 0, retryUS - elapsed, resetUS - elapsed, strategy, till - elapsed}
	} else if err := parseFields(s, fields[:]); err != nil {
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
	}
	if stableUS >= 0 {
		r.Stable = time.Duration(stableUS) * time.Microsecond
	}
	if retryUS >= 0 {
		r.RetryAfter = time.Duration(retryUS) * time.Microsecond
	}
	return r, nil
}

// parseStamp parses a stamped denial after its "~": now, " !", the stamp's
// five integers, and an owner or none, into fields.
func parseStamp(s string, fields *[replyFields]int64) error {
	sp := strings.IndexByte(s, ' ')
	if sp < 0 || sp+1 >= len(s) || s[sp+1] != '!' {
		return errors.New("no stamp")
	}
	stamp := s[sp+2:]
	// The owner follows the fifth space of the stamp.
	for i, spaces := 0, 0; i < len(stamp); i++ {
		if stamp[i] != ' ' {
			continue
		}
		if spaces++; spaces == 5 {
			owner := stamp[i+1:]
			if owner == "" {
				return errors.New("empty owner")
			}
			for j := 0; j < len(owner); j++ {
				if c := owner[j]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
					return errors.New("owner is not a name")
				}
			}
			stamp = stamp[:i]
			break
		}
	}
	if err := parseFields(s[:sp], fields[:1]); err != nil {
		return err
	}
	return parseFields(stamp, fields[1:])
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
