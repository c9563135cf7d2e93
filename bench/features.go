package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	_ "time/tzdata" // the calendar windows' zone, on a machine without zoneinfo too

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/faultproxy"
)

// The rows of issues 37, 38 and 39, run in the same rounds as the rows
// they are held against: a calendar window beside the fixed window (allow
// and hot), AllowAll of three parts beside its parts alone, and a
// Concurrency's Acquire beside the sliding window's grant. Refunds are
// measured apart (refunds.go): INFO cannot tell a refund from the grant
// before it, both being calls of one script.

// Names of the feature rows, as -rows matches them after their workload.
const (
	calendarRow       = "redlimit calendar_window"
	allowAllRow       = "redlimit AllowAll 3 parts"
	acquireReleaseRow = "redlimit concurrency Acquire+Release"
	acquireLapseRow   = "redlimit concurrency Acquire, leases lapse"
)

// allowAllParts is the number of parts of the AllowAll row.
const allowAllParts = 3

// calendarPeriod is the calendar windows' period: days in a zone with
// daylight saving, as a billing team would cut them. The script's cost
// does not depend on the zone: the host sends the boundaries.
func calendarPeriod() (redlimit.Period, error) {
	loc, err := time.LoadLocation("America/New_York")
	if err != nil {
		return redlimit.Period{}, err
	}
	return redlimit.Daily(loc), nil
}

// calendarContender is a calendar window of lim.count permits a day
// (lim.per is not used: the period is the day).
func calendarContender(period redlimit.Period) contender {
	return contender{name: calendarRow, kind: "redlimit", algorithm: "calendar_window",
		build: func(c redis.Scripter, lim limit) (decider, error) {
			l, err := redlimit.NewCalendarWindow(c, lim.count, period)
			if err != nil {
				return nil, err
			}
			return tryAcquire(l), nil
		}}
}

// allowAllContender decides "per user, per tenant, and a burst" as one
// AllowAll of three parts, each at lim: a fixed window on the user's key,
// a sliding window on the tenant's (the key less its last two digits: ten
// users a tenant) and a token bucket on the user's key. Substrings
// allocate nothing, so the row's allocations are AllowAll's and the
// parts' slice's.
var allowAllContender = contender{name: allowAllRow, kind: "redlimit", algorithm: "allowall",
	build: func(c redis.Scripter, lim limit) (decider, error) {
		var parts [allowAllParts]redlimit.Limiter
		for i, algorithm := range []string{"fixed_window", "sliding_window", "token_bucket"} {
			l, err := newRedlimitLimiter(algorithm, c, lim)
			if err != nil {
				return nil, err
			}
			parts[i] = l
		}
		return func(ctx context.Context, key string) (bool, error) {
			res, err := redlimit.AllowAll(ctx, 1,
				redlimit.Part{Limiter: parts[0], Key: key},
				redlimit.Part{Limiter: parts[1], Key: key[:len(key)-2]},
				redlimit.Part{Limiter: parts[2], Key: key})
			return res.Allowed, err
		}, nil
	}}

// allowAllSingles are the rows AllowAll's latency is held against: its
// parts' algorithms alone, in the same workload.
var allowAllSingles = []string{"fixed_window", "sliding_window", "token_bucket"}

// linkDelay is what the link rows' proxy adds to every reply, to stand
// for a network between client and Redis, where loopback has almost none.
// Over a link the round trip, not Redis's time, is most of a call's
// latency, and it is what AllowAll's one round trip saves: on loopback,
// three parts' scripts run one after the other cost about three times one
// part's, whatever the client does. Go's timers wake the proxy late (on a
// loaded machine, after about a millisecond): the link's round trip is
// what its "ceiling EVALSHA return 1" row measures, not linkDelay.
const linkDelay = 200 * time.Microsecond

// linkSuffix ends the names of the rows measured over the link.
const linkSuffix = ", link"

// linkContenders are AllowAll, its parts alone and the return-1 ceiling,
// to be run over the link. The proxy runs in the bench's process: its
// buffers count in these rows' allocations.
func linkContenders() []contender {
	all := allowAllContender
	all.name += linkSuffix
	out := []contender{all}
	for _, c := range redlimitContenders(linkSuffix) {
		if slices.Contains(allowAllSingles, c.algorithm) {
			out = append(out, c)
		}
	}
	for _, c := range ceilings {
		if c.algorithm == "return1" {
			c.name += linkSuffix
			out = append(out, c)
		}
	}
	return out
}

// linkClient returns the client of the link rows, started on first use: a
// client of Redis through a proxy that holds every reply for linkDelay
// (internal/faultproxy), counted by the same hook as e.rdb.
func (e *environment) linkClient() (*redis.Client, error) {
	if e.link != nil {
		return e.link, nil
	}
	p, err := faultproxy.Start(e.rdb.Options().Addr)
	if err != nil {
		return nil, err
	}
	p.SetDelay(linkDelay)
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), PoolSize: e.f.goroutines, MinIdleConns: e.f.goroutines})
	c.AddHook(e.hook)
	e.link, e.proxy = c, p
	return c, nil
}

// close closes the link rows' client and proxy, if started.
func (e *environment) close() {
	if e.link != nil {
		e.link.Close()
		e.proxy.Close()
	}
}

// concurrencyContender runs a Concurrency of lim.count leases of lim.per
// each. With release, a decision is an Acquire and its Release (two round
// trips); without, an Acquire whose lease is left to lapse.
func concurrencyContender(name string, release bool) contender {
	return contender{name: name, kind: "redlimit", algorithm: "concurrency",
		build: func(c redis.Scripter, lim limit) (decider, error) {
			cc, err := redlimit.NewConcurrency(c, lim.count, lim.per)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, key string) (bool, error) {
				lease, err := cc.Acquire(ctx, key)
				if errors.Is(err, redlimit.ErrAcquireFailed) {
					return false, nil
				}
				if err != nil || !release {
					return err == nil, err
				}
				return true, lease.Release(ctx)
			}, nil
		}}
}

// featureRows builds the rows of features.go, warmed up as buildRows
// warms its own, keeping -rows's filter.
func (e *environment) featureRows() ([]*row, error) {
	period, err := calendarPeriod()
	if err != nil {
		return nil, fmt.Errorf("calendar period: %w", err)
	}
	type entry struct {
		c     contender
		lim   limit
		nkeys int
		link  bool // over the link (linkClient), not loopback
	}
	workloads := []struct {
		name    string
		entries []entry
	}{
		{"allow", []entry{
			// A day of allowLimit's rate: nearly every call granted.
			{calendarContender(period), limit{count: 1_000_000 * 24 * 60}, 1000, false},
			{allowAllContender, allowLimit, 1000, false},
			// 64 goroutines hold at most 64 leases at once.
			{concurrencyContender(acquireReleaseRow, true), limit{count: 100, per: time.Minute}, 1000, false},
			// Leases of 1s on 100 keys: a few dozen live on a key, and
			// each Acquire finds about one lapsed to trim.
			{concurrencyContender(acquireLapseRow, false), limit{count: redlimit.MaxConcurrencyLimit, per: time.Second}, 100, false},
		}},
		// hotLimit's 100 a day on one key: every call but the first 100 denied.
		{"hot", []entry{{calendarContender(period), limit{count: hotLimit.count}, 1, false}}},
	}
	for _, c := range linkContenders() {
		workloads[0].entries = append(workloads[0].entries, entry{c, allowLimit, 1000, true})
	}
	var rows []*row
	for _, w := range workloads {
		for i, en := range w.entries {
			if e.f.rows != nil && !e.f.rows.MatchString(w.name+" "+en.c.name) {
				continue
			}
			var client redis.Scripter = e.rdb
			if en.link {
				if client, err = e.linkClient(); err != nil {
					return nil, fmt.Errorf("%s: %s: %w", w.name, en.c.name, err)
				}
			}
			decide, err := en.c.build(client, en.lim)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", w.name, en.c.name, err)
			}
			r := &row{workload: w.name, c: en.c, decide: decide}
			for k := 0; k < en.nkeys; k++ {
				r.keys = append(r.keys, fmt.Sprintf("%sx%d:%s:%04d", w.name[:1], i, e.run, k))
			}
			r.seqKeys = r.keys
			for k := 0; k < 50; k++ {
				if _, err := decide(e.ctx, r.keys[k%len(r.keys)]); err != nil {
					return nil, fmt.Errorf("%s: %s: warm-up: %w", w.name, en.c.name, err)
				}
			}
			rows = append(rows, r)
		}
	}
	return rows, nil
}
