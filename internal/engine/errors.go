package engine

import "fmt"

// Errorf returns an error whose text is the formatted message alone and
// which matches sentinel (errors.Is), so that a message says "redlimit:"
// once and still matches the root package's sentinel. A %w in format is
// matched too.
func Errorf(sentinel error, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &sentinelError{msg: err.Error(), sentinel: sentinel, cause: err}
}

type sentinelError struct {
	msg      string
	sentinel error
	cause    error
}

func (e *sentinelError) Error() string   { return e.msg }
func (e *sentinelError) Unwrap() []error { return []error{e.sentinel, e.cause} }
