package engine

import "errors"

// The sentinels callers branch on, defined once here and exported by the
// root package under the same names (redlimit.ErrAcquireFailed, ...), so
// that the engine, the in-process limiters and the middlewares return
// errors matching them without having them passed in.
var (
	ErrAcquireFailed   = errors.New("redlimit: rate limit exceeded")
	ErrInvalidConfig   = errors.New("redlimit: invalid configuration")
	ErrInvalidArgument = errors.New("redlimit: invalid argument")
	ErrForeignState    = errors.New("redlimit: key holds a value redlimit did not write")
	ErrUnavailable     = errors.New("redlimit: Redis unavailable")
)
