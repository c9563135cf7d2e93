package main

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Floors: per algorithm and workload, a script that runs the Redis commands
// of that algorithm's common path (the same commands, on a key of the same
// type holding a value of the same shape) and no logic around them: no
// parsing, no arithmetic, a constant reply of the usual length. No script
// that decides with those commands can cost Redis less, so a row's script
// µs minus its floor's is what its Lua costs, and a target below a floor
// is out of reach for any script on this Redis. See BENCHMARKS.md.
//
// Where the workload writes only now and then (hot: a window or bucket
// that refills a few times a second), the floor writes only when the key
// is missing, so it is a little below the real path.

// stringHot is the hot path of the three string states: TIME, GET, a
// denial (no write).
const stringHot = `redis.call('TIME')
if not redis.call('GET', KEYS[1]) then redis.call('SET', KEYS[1], ARGV[1], 'PX', 1000) end
return ARGV[2]`

// slidingHot is the hot path of the sliding state (format 11): a key full
// since its last grant denies one permit from its note, read with the aux
// in one ZRANGE after TIME, and writes nothing. The key holds a note and a
// bucket, written when it is missing.
const slidingHot = `redis.call('TIME')
if #redis.call('ZRANGE', KEYS[1], '0', '1') == 0 then
  redis.call('ZADD', KEYS[1], 0, ARGV[1], 1000999, '7') redis.call('PEXPIRE', KEYS[1], 1000)
end
return ARGV[2]`

// slidingAllow is a grant in the tail's bucket with k strategies, on a key
// that holds a bucket: TIME, the note and the aux, the count before each
// strategy's window (a key holding its note alone skips these), the note of
// the new count (a ZADD of a new member: ARGV[1] and ARGV[1] .. 'x' in
// turn) and the old one's ZREM.
func slidingAllow(k int) string {
	return fmt.Sprintf(`redis.call('TIME')
local note = redis.call('ZRANGE', KEYS[1], '0', '1')[1]
if not note then
  redis.call('ZADD', KEYS[1], 0, ARGV[1]) redis.call('PEXPIRE', KEYS[1], 60000)
  note = ARGV[1]
end
for i = 1, %d do
  redis.call('ZREVRANGEBYSCORE', KEYS[1], '(2000000', 2, 'LIMIT', '0', '1')
end
local new = ARGV[1]
if note == new then new = ARGV[1] .. 'x' end
redis.call('ZADD', KEYS[1], 0, new)
redis.call('ZREM', KEYS[1], note)
return ARGV[2]`, k)
}

// slidingNote is a string of the length of a sliding key's note after a
// dozen grants (the floors never read it as state).
const slidingNote = "w:12 1800000000299166"

// slidingFullNote is that of a key full since its last grant.
const slidingFullNote = slidingNote + "|1:900000"

// floorScripts maps algorithm → workload → floor script. ARGV[1] is a
// value of the state's shape, ARGV[2] the reply.
var floorScripts = map[string]map[string]struct {
	src         string
	value, resp string
}{
	"fixed_window": {
		// An open window: GET, then SET KEEPTTL (PX when the window opens).
		"allow": {`redis.call('TIME')
if redis.call('GET', KEYS[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000)
end
return ARGV[2]`, "123451795000000000000003", "1 987654 0 59999999 0 59999999"},
		"hot": {stringHot, "1001795000000000000003", "0 0 412345 412345 0 412345"},
	},
	"leaky_bucket": {
		// A bucket that drained since the key's last call (its key expired):
		// GET finds nothing, SET PX stores the new time.
		"allow": {`redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', 1)
return ARGV[2]`, "17950000000000001", "1 999999 0 60 0 60"},
		"hot": {stringHot, "17950000000000001", "0 0 9876 999999 0 9876"},
	},
	"token_bucket": {
		"allow": {`redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', 1)
return ARGV[2]`, "17950000000000002", "1 999999 0 60 0 60"},
		"hot": {stringHot, "17950000000000002", "0 0 9876 999999 0 9876"},
	},
	// A grant's reply carries its token.
	"sliding_window": {
		"allow": {slidingAllow(1), slidingNote, "1 999988 0 60000000 0 0 1800000000999999.13.1"},
		"hot":   {slidingHot, slidingFullNote, "0 0 59211562 59211562 0 211562"},
	},
	"sliding_log": {
		"allow": {slidingAllow(2), slidingNote, "1 999988 0 600000000 0 0 1800000000999999.13.1"},
		"hot":   {slidingHot, slidingFullNote, "0 0 59211562 590211562 0 211562"},
	},
}

// floorContenders returns one floor row per redlimit algorithm for
// workload ("allow" or "hot").
func floorContenders(workload string) []contender {
	var out []contender
	for _, rc := range redlimitConstructors {
		f, ok := floorScripts[rc.algorithm][workload]
		if !ok {
			continue
		}
		script := redis.NewScript(f.src)
		out = append(out, contender{
			name: "floor " + rc.algorithm, kind: "floor", algorithm: rc.algorithm,
			build: func(c redis.Scripter, _ limit) (decider, error) {
				return func(ctx context.Context, key string) (bool, error) {
					return true, script.Run(ctx, c, []string{key}, f.value, f.resp).Err()
				}, nil
			},
		})
	}
	if len(out) != len(redlimitConstructors) {
		panic(fmt.Sprintf("bench: %d floors for %s, want one per algorithm", len(out), workload))
	}
	return out
}
