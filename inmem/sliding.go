package inmem

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/engine"
)

// SlidingWindow grants at most limit permits in any window, in process,
// counted in buckets of precision aligned to the Unix epoch. It decides,
// and its Grants refund, as redlimit.SlidingWindow does.
type SlidingWindow struct{ log }

// SlidingLog enforces several sliding-window limits at once over one shared
// set of buckets, in process. It decides, reports, and its Grants refund, as
// redlimit.SlidingLog does.
type SlidingLog struct{ log }

var (
	_ redlimit.Limiter = (*SlidingWindow)(nil)
	_ redlimit.Limiter = (*SlidingLog)(nil)
	_ engine.Refunder  = (*SlidingWindow)(nil)
	_ engine.Refunder  = (*SlidingLog)(nil)
)

// NewSlidingWindow returns an in-process limiter granting at most limit
// permits in any window, counted in buckets of precision. The bounds are
// redlimit.NewSlidingWindow's; bad values are redlimit.ErrInvalidConfig.
func NewSlidingWindow(limit int, window, precision time.Duration, opts ...Option) (*SlidingWindow, error) {
	l, err := newLog("sliding_window", precision, []redlimit.Strategy{{Limit: limit, Window: window}}, opts)
	if err != nil {
		return nil, err
	}
	return &SlidingWindow{l}, nil
}

// NewSlidingLog returns an in-process limiter enforcing every strategy at
// once, counted in buckets of precision. The rules are
// redlimit.NewSlidingLog's; bad values are redlimit.ErrInvalidConfig.
func NewSlidingLog(precision time.Duration, strategies []redlimit.Strategy, opts ...Option) (*SlidingLog, error) {
	l, err := newLog("sliding_log", precision, strategies, opts)
	if err != nil {
		return nil, err
	}
	return &SlidingLog{l}, nil
}

// Strategies returns the limiter's strategies, by window ascending.
func (l *SlidingLog) Strategies() []redlimit.Strategy { return slices.Clone(l.strategies) }

// log is both sliding limiters: strategies (limit_i, size_i buckets) over
// one queue of nonempty buckets per key.
type log struct {
	algorithm   string
	precisionUS int64
	strategies  []redlimit.Strategy // by window ascending
	limits      []int64
	sizes       []int64
	store       *store[logState]
	clock       // what it decides on (store.go): WithClock's, or OnClock's
}

// logState is one key: its nonempty buckets, oldest first, and for each
// strategy the position of the oldest bucket inside its window and the
// permits the window holds. Only the buckets that leave a window are read.
// The key keeps its time as the script does (DESIGN "A key's time"): it
// records the time of its last grant, and a call decides at the later of
// its clock and that time.
type logState struct {
	buckets    []logBucket
	cursor     []int // into buckets
	total      []int64
	lastB      int64 // the bucket of the last decision
	tail       int64 // the bucket of the last grant, once granted is set
	granted    bool
	recordedUS int64 // the key's time as of its last grant
	// count is every permit the key granted: a grant of n is named by the
	// count after it, and by its bucket; its positions are [count-n, count).
	// refunded is what refunds gave back.
	count    int64
	refunded logRanges
}

// maxLogRanges is the most ranges of refunded positions a sliding key
// keeps, as in the script.
const maxLogRanges = 16

// logRanges is what refunds gave back, as the script keeps it: the
// refunded positions as disjoint ranges [lo, hi), sorted, touching ones
// merged, at most maxLogRanges of them, and the horizon below which a
// grant gives nothing more (stricter, never looser).
type logRanges struct {
	ranges  []logRange
	horizon int64
}

type logRange struct{ lo, hi int64 }

// in is how many of the positions [lo, hi) are refunded.
func (r *logRanges) in(lo, hi int64) int64 {
	sum := int64(0)
	for _, x := range r.ranges {
		if from, to := max(x.lo, lo), min(x.hi, hi); to > from {
			sum += to - from
		}
	}
	return sum
}

// add refunds the positions [lo, hi), merging the ranges it touches; a
// range more than maxLogRanges drops the lowest and raises the horizon to
// its end. The ranges are copied: a state is a value that shares them with
// the stored one until it is put.
func (r *logRanges) add(lo, hi int64) {
	kept := make([]logRange, 0, len(r.ranges)+1)
	for _, x := range r.ranges {
		if x.hi < lo || x.lo > hi {
			kept = append(kept, x)
		} else {
			lo, hi = min(lo, x.lo), max(hi, x.hi)
		}
	}
	kept = append(kept, logRange{lo, hi})
	slices.SortFunc(kept, func(a, b logRange) int { return cmp.Compare(a.lo, b.lo) })
	if len(kept) > maxLogRanges {
		r.horizon = max(r.horizon, kept[0].hi)
		kept = kept[1:]
	}
	r.ranges = kept
}

type logBucket struct{ index, count int64 }

func newLog(algorithm string, precision time.Duration, strategies []redlimit.Strategy, opts []Option) (log, error) {
	if len(strategies) == 0 {
		return log{}, fmt.Errorf("redlimit: inmem %s: no strategies: %w", algorithm, redlimit.ErrInvalidConfig)
	}
	precisionUS, err := micros(algorithm, "precision", precision)
	if err != nil {
		return log{}, err
	}
	sorted := slices.Clone(strategies)
	slices.SortStableFunc(sorted, func(a, b redlimit.Strategy) int { return cmp.Compare(a.Window, b.Window) })
	l := log{algorithm: algorithm, precisionUS: precisionUS, strategies: sorted}
	for i, s := range sorted {
		if err := permits(algorithm, "limit", s.Limit); err != nil {
			return log{}, err
		}
		windowUS, err := micros(algorithm, "window", s.Window)
		if err != nil {
			return log{}, err
		}
		if windowUS%precisionUS != 0 {
			return log{}, fmt.Errorf("redlimit: inmem %s: window %v: must be a multiple of the precision %v: %w", algorithm, s.Window, precision, redlimit.ErrInvalidConfig)
		}
		if i > 0 && (s.Window == sorted[i-1].Window || s.Limit <= sorted[i-1].Limit) {
			return log{}, fmt.Errorf("redlimit: inmem %s: strategy %d per %v after %d per %v: windows must differ and a longer one needs a larger limit: %w",
				algorithm, s.Limit, s.Window, sorted[i-1].Limit, sorted[i-1].Window, redlimit.ErrInvalidConfig)
		}
		l.limits = append(l.limits, int64(s.Limit))
		l.sizes = append(l.sizes, windowUS/precisionUS)
	}
	o, err := newOptions(algorithm, opts)
	if err != nil {
		return log{}, err
	}
	l.clock = newClock(o)
	l.store = newStore(o, l.used)
	return l, nil
}

// AllowN takes n permits for key if every strategy has them, else none.
// err is non-nil only for a key that is empty or longer than
// redlimit.MaxKeyBytes, n < 0, a nil ctx or a clock outside 2001 to 2112
// (redlimit.ErrInvalidArgument). n == 0 reports the state; n above the
// smallest limit is denied with RetryAfter redlimit.Never.
func (l *log) AllowN(ctx context.Context, key string, n int) (redlimit.Result, error) {
	if err := checkCall(ctx, l.algorithm, key, n); err != nil {
		return redlimit.Result{}, err
	}
	now, err := l.store.nowUS(l.clock, l.algorithm)
	if err != nil {
		return redlimit.Result{}, err
	}
	sh := l.store.shard(key)
	sh.mu.Lock()
	e := sh.m[key]
	var s logState
	if e != nil {
		s = e.state
	} else {
		var cursor [4]int
		var total [4]int64
		if len(l.sizes) <= len(cursor) {
			s.cursor, s.total = cursor[:len(l.sizes)], total[:len(l.sizes)]
		} else {
			s.cursor, s.total = make([]int, len(l.sizes)), make([]int64, len(l.sizes))
		}
	}
	r, resetUS := l.decide(&s, now, int64(n))
	if r.Allowed && n > 0 {
		r.Grant = engine.NewGrant(l, key, n, fmt.Sprintf("%d.%d.%d", s.tail, s.count, n))
	}
	if e == nil && resetUS > 0 {
		// The state escapes to the store: give it its own arrays.
		s.cursor, s.total = slices.Clone(s.cursor), slices.Clone(s.total)
	}
	sh.put(l.store, key, e, s, now, resetUS)
	sh.mu.Unlock()
	return r, nil
}

// advance moves the queue to bucket b, never before the tail's: each
// strategy's cursor and total follow its window. When b is before the last
// decision's bucket (the clock went back, and the key's time with it, to
// the tail's bucket at the earliest), a shorter window takes back buckets
// it had let go: they are kept until they leave the longest window as of
// the tail.
func (l *log) advance(s *logState, b int64) {
	S := len(l.sizes)
	back := b < s.lastB
	s.lastB = b
	if back {
		for i := range S {
			s.cursor[i], s.total[i] = 0, 0
		}
		for i := range S {
			for _, bk := range s.buckets {
				if bk.index > b-l.sizes[i] {
					s.total[i] += bk.count
				}
			}
			s.cursor[i] = len(s.buckets)
			for j, bk := range s.buckets {
				if bk.index > b-l.sizes[i] {
					s.cursor[i] = j
					break
				}
			}
		}
	}
	for i := range S {
		for s.cursor[i] < len(s.buckets) && s.buckets[s.cursor[i]].index <= b-l.sizes[i] {
			s.total[i] -= s.buckets[s.cursor[i]].count
			s.cursor[i]++
		}
	}
	// Drop what left the longest window as of the tail: no window of the
	// key's time, which never goes back before the tail, reaches it again.
	head := 0
	for head < len(s.buckets) && s.buckets[head].index <= s.tail-l.sizes[S-1] {
		head++
	}
	if head > 0 {
		kept := copy(s.buckets, s.buckets[head:])
		s.buckets = s.buckets[:kept]
		for i := range S {
			s.cursor[i] -= head
		}
	}
}

// decide decides at the key's time: the later of now and the time the key
// recorded at its last grant. A recorded time ahead of now by more than
// the longest window is a clock gone wrong: the call decides on now, on a
// view of the key whose buckets are all it holds, in now's bucket, and
// only a grant keeps that view.
func (l *log) decide(s *logState, now, n int64) (redlimit.Result, int64) {
	t := now
	if s.granted && s.recordedUS > now {
		t = s.recordedUS
		if s.recordedUS-now > l.sizes[len(l.sizes)-1]*l.precisionUS {
			view := l.carried(s, now)
			r, resetUS := l.decideAt(&view, now, now, n)
			if r.Allowed && n > 0 {
				*s = view
			}
			return r, resetUS
		}
	}
	return l.decideAt(s, t, now, n)
}

// carried is the view of s from a clock gone wrong at now: all s holds
// (its longest window as of its last grant) in now's bucket. No earlier
// grant refunds on it.
func (l *log) carried(s *logState, now int64) logState {
	S := len(l.sizes)
	b := floorDiv(now, l.precisionUS)
	view := logState{cursor: make([]int, S), total: make([]int64, S), lastB: b, tail: b, count: s.count}
	view.refunded.horizon = s.count
	held := int64(0)
	for _, bk := range s.buckets {
		if bk.index > s.tail-l.sizes[S-1] {
			held += bk.count
		}
	}
	if held > 0 {
		view.buckets = []logBucket{{index: b, count: held}}
		for i := range S {
			view.total[i] = held
		}
	}
	return view
}

// decideAt decides at the key's time t; durations are from now.
func (l *log) decideAt(s *logState, t, now, n int64) (redlimit.Result, int64) {
	P := l.precisionUS
	b := floorDiv(t, P)
	l.advance(s, b)
	S := len(l.sizes)

	var r redlimit.Result
	reported := 0
	switch {
	case n > l.limits[0]:
		r.RetryAfter = redlimit.Never
	case n == 0:
		r.Allowed = true
	default:
		worst, worstRetry := -1, int64(0)
		for i := range S {
			excess := s.total[i] + n - l.limits[i]
			if excess <= 0 {
				continue
			}
			var acc, retry int64
			for _, bk := range s.buckets[s.cursor[i]:] {
				acc += bk.count
				if acc >= excess {
					retry = (bk.index+l.sizes[i])*P - now
					break
				}
			}
			if worst < 0 || retry > worstRetry {
				worst, worstRetry = i, retry
			}
		}
		if worst >= 0 {
			reported = worst
			r.RetryAfter = microsDuration(worstRetry)
			break
		}
		r.Allowed = true
		s.tail, s.granted, s.recordedUS = b, true, t
		s.count += n
		if k := len(s.buckets); k > 0 && s.buckets[k-1].index == b {
			s.buckets[k-1].count += n
		} else {
			s.buckets = append(s.buckets, logBucket{index: b, count: n})
		}
		for i := range S {
			s.total[i] += n
		}
	}
	minAt := 0
	for i := 1; i < S; i++ {
		if max(0, l.limits[i]-s.total[i]) < max(0, l.limits[minAt]-s.total[minAt]) {
			minAt = i
		}
	}
	r.Remaining = int(max(0, l.limits[minAt]-s.total[minAt]))
	if r.Allowed {
		reported = minAt
	}
	r.Limit = int(l.limits[reported])
	resetUS := int64(0)
	if k := len(s.buckets); k > 0 {
		resetUS = max(0, (s.buckets[k-1].index+l.sizes[S-1])*P-now)
	}
	if !r.Allowed && r.RetryAfter != redlimit.Never && microsDuration(resetUS) < r.RetryAfter {
		resetUS = int64(r.RetryAfter / time.Microsecond) // never before the retry, as the script says
	}
	r.ResetAfter = microsDuration(resetUS)
	return r, resetUS
}

// refund gives back permits of the grant the token names ("bucket.count.n":
// its positions are [count-n, count)) until k of them in all were given
// back, while its bucket is kept, at or past the horizon and not on a clock
// gone wrong: the script's rule. It returns the permits given.
func (l *log) refund(s *logState, now int64, token string, k int64) int64 {
	var bucket, at, took int64
	if _, err := fmt.Sscanf(token, "%d.%d.%d", &bucket, &at, &took); err != nil || took < 1 || at > s.count {
		return 0
	}
	if s.recordedUS-now > l.sizes[len(l.sizes)-1]*l.precisionUS {
		return 0
	}
	first := at - took
	if first < s.refunded.horizon {
		return 0
	}
	kept := s.refunded.in(first, at)
	i := slices.IndexFunc(s.buckets, func(bk logBucket) bool { return bk.index == bucket })
	if i < 0 {
		return 0
	}
	back := min(k, took, kept+s.buckets[i].count) - kept
	if back <= 0 {
		return 0
	}
	// A bucket refunded to nothing stays until it leaves the window, as
	// the script keeps it (ResetAfter).
	s.buckets[i].count -= back
	for j := range s.total {
		if i >= s.cursor[j] {
			s.total[j] -= back
		}
	}
	s.refunded.add(first+kept, first+kept+back)
	return back
}

// RefundGrant gives back permits of a grant this limiter made (see
// redlimit.Grant): until n of them in all have been given back.
func (l *log) RefundGrant(ctx context.Context, key, token string, took, n int) error {
	if err := checkCall(ctx, l.algorithm, key, 0); err != nil {
		return err
	}
	now, err := l.store.nowUS(l.clock, l.algorithm)
	if err != nil {
		return err
	}
	sh := l.store.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[key]; e != nil {
		l.refund(&e.state, now, token, int64(n))
	}
	return nil
}

// used is the largest share of a strategy's limit s has in use, as of its
// last decision: buckets that left a window since still count, so that a
// key is never taken for nearer its initial state than it is.
func (l *log) used(s *logState, _ int64) float64 {
	most := 0.0
	for i, total := range s.total {
		most = max(most, float64(total)/float64(l.limits[i]))
	}
	return most
}

// Allow is AllowN(ctx, key, 1).
func (l *log) Allow(ctx context.Context, key string) (redlimit.Result, error) {
	return l.AllowN(ctx, key, 1)
}

// TryAcquire takes one permit for key: nil when allowed, a
// *redlimit.ViolationStrategyError naming the strategy with the longest
// RetryAfter when denied (it matches redlimit.ErrAcquireFailed).
func (l *log) TryAcquire(ctx context.Context, key string) error {
	return tryAcquire(ctx, l, key, func(r redlimit.Result) time.Duration {
		for _, s := range l.strategies {
			if s.Limit == r.Limit {
				return s.Window
			}
		}
		return l.strategies[0].Window
	})
}

// OnClock returns a view of l that decides on now: the same
// configuration and the same keys (what either grants, the other sees),
// on another clock. The view's Grants refund through the view, on
// now. When l was built with WithClock (its own clock wins), or now is
// nil, OnClock returns l. redlimit.WithFallback calls it with the Redis
// limiter's clock (redlimit.WithClock).
func (l *SlidingWindow) OnClock(now func() time.Time) redlimit.Limiter { return onClock(l, now) }

// OnClock returns a view of l that decides on now: the same
// configuration and the same keys (what either grants, the other sees),
// on another clock. The view's Grants refund through the view, on
// now. When l was built with WithClock (its own clock wins), or now is
// nil, OnClock returns l. redlimit.WithFallback calls it with the Redis
// limiter's clock (redlimit.WithClock).
func (l *SlidingLog) OnClock(now func() time.Time) redlimit.Limiter { return onClock(l, now) }

// Reset forgets all state of key.
func (l *log) Reset(ctx context.Context, key string) error {
	if err := checkCall(ctx, l.algorithm, key, 0); err != nil {
		return err
	}
	return l.store.reset(l.algorithm, key)
}
