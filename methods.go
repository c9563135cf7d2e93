package redlimit

import "context"

// The methods of the five limiters. Each forwards to the shared limiter
// (limiter.go), after one check that the methods promoted from an embedded
// field cannot make: a nil *FixedWindow, *TokenBucket, ... (a constructor's
// result whose error was ignored) returns an ErrInvalidConfig error naming
// the fix instead of panicking in front of every request.

// core returns the shared limiter, or one that refuses every call when l
// is nil.
func (l *FixedWindow) core() *limiter {
	if l == nil {
		return &limiter{nilType: "FixedWindow", nilConstructor: "NewFixedWindow"}
	}
	return &l.limiter
}

// TryAcquire takes one permit for key: nil when allowed, a
// *ViolationStrategyError when denied (it matches ErrAcquireFailed), any
// other error when no decision was made. See Limiter.
func (l *FixedWindow) TryAcquire(ctx context.Context, key string) error {
	return l.core().TryAcquire(ctx, key)
}

// Allow is AllowN(ctx, key, 1).
func (l *FixedWindow) Allow(ctx context.Context, key string) (Result, error) {
	return l.core().AllowN(ctx, key, 1)
}

// AllowN takes n permits for key if all n are available, else none; err is
// non-nil only when no decision was made. n == 0 reports the current state;
// n above the capacity is denied with RetryAfter == Never. See Limiter.
func (l *FixedWindow) AllowN(ctx context.Context, key string, n int) (Result, error) {
	return l.core().AllowN(ctx, key, n)
}

// Reset forgets all state of key, in Redis and in the deny cache.
func (l *FixedWindow) Reset(ctx context.Context, key string) error {
	return l.core().Reset(ctx, key)
}

// Close returns every permit the limiter's reservations hold
// (WithReservation) at once, in one round trip per Redis client (per 256
// keys), and stops reserving: later calls are decided one by one, as
// without the option, and Grants handed out before refund to Redis. Call
// it when the process stops taking requests (a deploy), so that other
// processes get the permits back now rather than after the hold. It
// returns the refunds' errors, if any (those permits then stay used until
// Redis no longer counts them). Without WithReservation it has nothing to
// return and returns nil. Safe to call more than once.
func (l *FixedWindow) Close(ctx context.Context) error {
	return l.core().closeReservations(ctx)
}

// RedisKey returns the Redis key that holds key's state: the limiter's
// prefix followed by key ("" for a nil limiter).
func (l *FixedWindow) RedisKey(key string) string {
	if l == nil {
		return ""
	}
	return l.limiter.RedisKey(key)
}

// core returns the shared limiter, or one that refuses every call when l
// is nil.
func (l *SlidingWindow) core() *limiter {
	if l == nil {
		return &limiter{nilType: "SlidingWindow", nilConstructor: "NewSlidingWindow"}
	}
	return &l.limiter
}

// TryAcquire takes one permit for key: nil when allowed, a
// *ViolationStrategyError when denied (it matches ErrAcquireFailed), any
// other error when no decision was made. See Limiter.
func (l *SlidingWindow) TryAcquire(ctx context.Context, key string) error {
	return l.core().TryAcquire(ctx, key)
}

// Allow is AllowN(ctx, key, 1).
func (l *SlidingWindow) Allow(ctx context.Context, key string) (Result, error) {
	return l.core().AllowN(ctx, key, 1)
}

// AllowN takes n permits for key if all n are available, else none; err is
// non-nil only when no decision was made. n == 0 reports the current state;
// n above the capacity is denied with RetryAfter == Never. See Limiter.
func (l *SlidingWindow) AllowN(ctx context.Context, key string, n int) (Result, error) {
	return l.core().AllowN(ctx, key, n)
}

// Reset forgets all state of key, in Redis and in the deny cache.
func (l *SlidingWindow) Reset(ctx context.Context, key string) error {
	return l.core().Reset(ctx, key)
}

// Close returns every permit the limiter's reservations hold
// (WithReservation) at once, in one round trip per Redis client (per 256
// keys), and stops reserving: later calls are decided one by one, as
// without the option, and Grants handed out before refund to Redis. Call
// it when the process stops taking requests (a deploy), so that other
// processes get the permits back now rather than after the hold. It
// returns the refunds' errors, if any (those permits then stay used until
// Redis no longer counts them). Without WithReservation it has nothing to
// return and returns nil. Safe to call more than once.
func (l *SlidingWindow) Close(ctx context.Context) error {
	return l.core().closeReservations(ctx)
}

// RedisKey returns the Redis key that holds key's state: the limiter's
// prefix followed by key ("" for a nil limiter).
func (l *SlidingWindow) RedisKey(key string) string {
	if l == nil {
		return ""
	}
	return l.limiter.RedisKey(key)
}

// core returns the shared limiter, or one that refuses every call when l
// is nil.
func (l *SlidingLog) core() *limiter {
	if l == nil {
		return &limiter{nilType: "SlidingLog", nilConstructor: "NewSlidingLog"}
	}
	return &l.limiter
}

// TryAcquire takes one permit for key: nil when allowed, a
// *ViolationStrategyError when denied (it matches ErrAcquireFailed), any
// other error when no decision was made. See Limiter.
func (l *SlidingLog) TryAcquire(ctx context.Context, key string) error {
	return l.core().TryAcquire(ctx, key)
}

// Allow is AllowN(ctx, key, 1).
func (l *SlidingLog) Allow(ctx context.Context, key string) (Result, error) {
	return l.core().AllowN(ctx, key, 1)
}

// AllowN takes n permits for key if all n are available, else none; err is
// non-nil only when no decision was made. n == 0 reports the current state;
// n above the capacity is denied with RetryAfter == Never. See Limiter.
func (l *SlidingLog) AllowN(ctx context.Context, key string, n int) (Result, error) {
	return l.core().AllowN(ctx, key, n)
}

// Reset forgets all state of key, in Redis and in the deny cache.
func (l *SlidingLog) Reset(ctx context.Context, key string) error {
	return l.core().Reset(ctx, key)
}

// Close returns every permit the limiter's reservations hold
// (WithReservation) at once, in one round trip per Redis client (per 256
// keys), and stops reserving: later calls are decided one by one, as
// without the option, and Grants handed out before refund to Redis. Call
// it when the process stops taking requests (a deploy), so that other
// processes get the permits back now rather than after the hold. It
// returns the refunds' errors, if any (those permits then stay used until
// Redis no longer counts them). Without WithReservation it has nothing to
// return and returns nil. Safe to call more than once.
func (l *SlidingLog) Close(ctx context.Context) error {
	return l.core().closeReservations(ctx)
}

// RedisKey returns the Redis key that holds key's state: the limiter's
// prefix followed by key ("" for a nil limiter).
func (l *SlidingLog) RedisKey(key string) string {
	if l == nil {
		return ""
	}
	return l.limiter.RedisKey(key)
}

// core returns the shared limiter, or one that refuses every call when l
// is nil.
func (l *LeakyBucket) core() *limiter {
	if l == nil {
		return &limiter{nilType: "LeakyBucket", nilConstructor: "NewLeakyBucket"}
	}
	return &l.limiter
}

// TryAcquire takes one permit for key: nil when allowed, a
// *ViolationStrategyError when denied (it matches ErrAcquireFailed), any
// other error when no decision was made. See Limiter.
func (l *LeakyBucket) TryAcquire(ctx context.Context, key string) error {
	return l.core().TryAcquire(ctx, key)
}

// Allow is AllowN(ctx, key, 1).
func (l *LeakyBucket) Allow(ctx context.Context, key string) (Result, error) {
	return l.core().AllowN(ctx, key, 1)
}

// AllowN takes n permits for key if all n are available, else none; err is
// non-nil only when no decision was made. n == 0 reports the current state;
// n above the capacity is denied with RetryAfter == Never. See Limiter.
func (l *LeakyBucket) AllowN(ctx context.Context, key string, n int) (Result, error) {
	return l.core().AllowN(ctx, key, n)
}

// Reset forgets all state of key, in Redis and in the deny cache.
func (l *LeakyBucket) Reset(ctx context.Context, key string) error {
	return l.core().Reset(ctx, key)
}

// Close returns every permit the limiter's reservations hold
// (WithReservation) at once, in one round trip per Redis client (per 256
// keys), and stops reserving: later calls are decided one by one, as
// without the option, and Grants handed out before refund to Redis. Call
// it when the process stops taking requests (a deploy), so that other
// processes get the permits back now rather than after the hold. It
// returns the refunds' errors, if any (those permits then stay used until
// Redis no longer counts them). Without WithReservation it has nothing to
// return and returns nil. Safe to call more than once.
func (l *LeakyBucket) Close(ctx context.Context) error {
	return l.core().closeReservations(ctx)
}

// RedisKey returns the Redis key that holds key's state: the limiter's
// prefix followed by key ("" for a nil limiter).
func (l *LeakyBucket) RedisKey(key string) string {
	if l == nil {
		return ""
	}
	return l.limiter.RedisKey(key)
}

// core returns the shared limiter, or one that refuses every call when l
// is nil.
func (l *TokenBucket) core() *limiter {
	if l == nil {
		return &limiter{nilType: "TokenBucket", nilConstructor: "NewTokenBucket"}
	}
	return &l.limiter
}

// TryAcquire takes one permit for key: nil when allowed, a
// *ViolationStrategyError when denied (it matches ErrAcquireFailed), any
// other error when no decision was made. See Limiter.
func (l *TokenBucket) TryAcquire(ctx context.Context, key string) error {
	return l.core().TryAcquire(ctx, key)
}

// Allow is AllowN(ctx, key, 1).
func (l *TokenBucket) Allow(ctx context.Context, key string) (Result, error) {
	return l.core().AllowN(ctx, key, 1)
}

// AllowN takes n permits for key if all n are available, else none; err is
// non-nil only when no decision was made. n == 0 reports the current state;
// n above the capacity is denied with RetryAfter == Never. See Limiter.
func (l *TokenBucket) AllowN(ctx context.Context, key string, n int) (Result, error) {
	return l.core().AllowN(ctx, key, n)
}

// Reset forgets all state of key, in Redis and in the deny cache.
func (l *TokenBucket) Reset(ctx context.Context, key string) error {
	return l.core().Reset(ctx, key)
}

// Close returns every permit the limiter's reservations hold
// (WithReservation) at once, in one round trip per Redis client (per 256
// keys), and stops reserving: later calls are decided one by one, as
// without the option, and Grants handed out before refund to Redis. Call
// it when the process stops taking requests (a deploy), so that other
// processes get the permits back now rather than after the hold. It
// returns the refunds' errors, if any (those permits then stay used until
// Redis no longer counts them). Without WithReservation it has nothing to
// return and returns nil. Safe to call more than once.
func (l *TokenBucket) Close(ctx context.Context) error {
	return l.core().closeReservations(ctx)
}

// RedisKey returns the Redis key that holds key's state: the limiter's
// prefix followed by key ("" for a nil limiter).
func (l *TokenBucket) RedisKey(key string) string {
	if l == nil {
		return ""
	}
	return l.limiter.RedisKey(key)
}
