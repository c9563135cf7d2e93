// Package engine is the machinery every redlimit limiter shares: argument
// checks, key prefixing, the deny cache, running a script in one round trip,
// parsing its reply and telling the observer. An algorithm supplies only its
// script, its ARGV and its capacity.
package engine

import "errors"

// The sentinels the root package re-exports. They live here so that the
// shared machinery can return errors that match them.
var (
	ErrAcquireFailed   = errors.New("redlimit: rate limit exceeded")
	ErrInvalidConfig   = errors.New("redlimit: invalid configuration")
	ErrInvalidArgument = errors.New("redlimit: invalid argument")
)
