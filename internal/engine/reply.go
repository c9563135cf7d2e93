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
	// Cause is, with Fallback, the Redis error that sent the call there.
	Cause error
}

// replyFields is the number of integers every script returns:
// allowed (0/1), remaining, retry-after µs (-1 = never), reset-after µs,
// strategy, stable µs (-1 = until reset).
const replyFields = 6

// maxDurationUS is the longest duration, in µs, a time.Duration holds.
const maxDurationUS = int64(1<<63-1) / int64(time.Microsecond)

// Log is what a sliding limiter's grant replies count on: its bucket length
// in µs, and each strategy's limit and window in buckets, by window
// ascending (the scripts' ARGV).
type Log struct {
	Precision int64
	Limits    []int64
	Sizes     []int64
}

// ParseReplyText parses the six integers of a reply, a stamped denial or,
// when log describes the limiter, a grant in the tail's bucket.
//
// A stamped denial is "~now !from till retry reset strategy[ owner]". The
// sliding scripts send it for a denial they read from a denial stamp (see
// scripts/sliding.lua): the time they decided at (Unix µs), a space, and the
// stamp as stored, whose durations count from its time from and whose
// owner, letters and digits, names the configuration that wrote it.
//
// A grant is "=now tail count (cursor total)*S", S being len(log.Limits):
// the time the script decided at and the rest of the meta it wrote
// (scripts/buckets.lua describes it), for a grant in the bucket of now, the
// tail. Remaining, the strategy reported and ResetAfter follow from log.
//
// In both the script formats no number it need not write; this side does
// the arithmetic.
func ParseReplyText(s string, log *Log) (Reply, error) {
	var fields [replyFields]int64
	if len(s) > 0 && s[0] == '=' && log != nil {
		r, err := parseGrant(s[1:], log)
		if err != nil {
			return Reply{}, fmt.Errorf("malformed script reply %q: %w", s, err)
		}
		return r, nil
	}
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

// parseGrant parses a grant after its "=" (ParseReplyText) and checks that
// it is one: now in the tail's bucket, every cursor inside its window, the
// tail's count within every total and every total within its limit. Then
// Remaining is the fewest permits left, the strategy reported the first
// with that many, and ResetAfter the time the tail leaves the longest
// window, as the scripts' general path reports a grant.
func parseGrant(s string, log *Log) (Reply, error) {
	S := len(log.Limits)
	if S == 0 || len(log.Sizes) != S || log.Precision < 1 {
		return Reply{}, errors.New("no strategies to count a grant on")
	}
	want := 3 + 2*S // now, tail, count, then (cursor, total) per strategy
	r := Reply{Allowed: true, Stable: Never}
	var now, tail, count, cursor, resetUS int64
	k := 0
	for at := 0; at <= len(s); k++ {
		end := len(s)
		if i := strings.IndexByte(s[at:], ' '); i >= 0 {
			end = at + i
		}
		if k == want {
			return Reply{}, errors.New("trailing data")
		}
		var x [1]int64
		if err := parseFields(s[at:end], x[:]); err != nil {
			return Reply{}, fmt.Errorf("field %d: %w", k+1, err)
		}
		at = end + 1
		switch {
		case k == 0:
			now = x[0]
		case k == 1:
			tail = x[0]
		case k == 2:
			count = x[0]
			if now < 0 || tail < 0 || now/log.Precision != tail || count < 1 {
				return Reply{}, errors.New("not a grant in the tail's bucket")
			}
		case k%2 == 1:
			cursor = x[0]
		default:
			i, total := (k-3)/2, x[0]
			if cursor < 0 || cursor >= log.Sizes[i] || total < count || total > log.Limits[i] {
				return Reply{}, fmt.Errorf("strategy %d out of range", i)
			}
			if left := log.Limits[i] - total; i == 0 || left < r.Remaining {
				r.Remaining, r.Strategy = left, i
			}
			// Below 2^63: now/Precision is tail, and a window is at most
			// about 2^44µs (the Go side's limits).
			resetUS = max(resetUS, (tail+log.Sizes[i])*log.Precision-now)
		}
	}
	if k != want {
		return Reply{}, fmt.Errorf("%d fields, want %d", k, want)
	}
	if resetUS > maxDurationUS {
		return Reply{}, errors.New("reset out of range")
	}
	r.ResetAfter = time.Duration(resetUS) * time.Microsecond
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
