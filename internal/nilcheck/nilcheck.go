// Package nilcheck tells a nil value hidden in an interface, for the
// packages that refuse one at construction (the root's constructors and
// Wait, httplimit, grpclimit).
package nilcheck

import "reflect"

// IsNil reports whether v is nil, or a typed nil in an interface: a nil
// *redis.Client passed as a redis.Scripter, a nil *redlimit.TokenBucket
// passed as a redlimit.Limiter. Such a value is not == nil, yet it panics
// on first use.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Func, reflect.Slice, reflect.Chan:
		return rv.IsNil()
	}
	return false
}
