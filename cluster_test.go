package redlimit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// clusterScripts orders the tests of the shared cluster: TestClusterScriptFlush
// flushes its script caches and counts the NOSCRIPT answers that follow, so
// it holds the lock alone; the others share it.
var clusterScripts sync.RWMutex

// dialCluster returns a client of the shared 3-master test cluster.
func dialCluster(t *testing.T) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t)})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// keyPlacement says which master serves a key, as the cluster itself reports
// it (CLUSTER SLOTS, CLUSTER KEYSLOT), not as go-redis computes it, and
// holds a direct client of every master to look at keys where they live.
type keyPlacement struct {
	cc      *redis.ClusterClient
	slots   []redis.ClusterSlot
	masters map[string]*redis.Client // by address
}

func newKeyPlacement(t *testing.T, cc *redis.ClusterClient) *keyPlacement {
	t.Helper()
	//lint:ignore SA1019 CLUSTER SLOTS answers on every Redis we support; CLUSTER SHARDS needs 7.0.
	slots, err := cc.ClusterSlots(context.Background()).Result()
	require.NoError(t, err, "CLUSTER SLOTS")
	p := &keyPlacement{cc: cc, slots: slots, masters: map[string]*redis.Client{}}
	for _, s := range slots {
		require.NotEmpty(t, s.Nodes, "CLUSTER SLOTS: slots %d-%d must have a master", s.Start, s.End)
		addr := s.Nodes[0].Addr
		if p.masters[addr] == nil {
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { rdb.Close() })
			p.masters[addr] = rdb
		}
	}
	require.Len(t, p.masters, 3, "the test cluster must have 3 masters")
	return p
}

// master returns the address of the master serving the Redis key redisKey.
func (p *keyPlacement) master(t *testing.T, redisKey string) string {
	t.Helper()
	slot, err := p.cc.ClusterKeySlot(context.Background(), redisKey).Result()
	require.NoError(t, err, "CLUSTER KEYSLOT %s", redisKey)
	for _, s := range p.slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) {
			return s.Nodes[0].Addr
		}
	}
	require.FailNow(t, "slot not covered", "CLUSTER SLOTS covers no range with slot %d of %s", slot, redisKey)
	return ""
}

// TestClusterExactLimitPerKey: through one ClusterClient, 60 keys spread over
// the 3 masters, each asked limit+3 times (keys concurrently, each key's
// calls in order), and every key grants exactly its first limit calls. Each
// key's state lives, with a TTL, on the master that serves its slot.
func TestClusterExactLimitPerKey(t *testing.T) {
	skipShort(t, "cluster test: starts a 3-master Redis Cluster")
	t.Parallel()
	clusterScripts.RLock()
	defer clusterScripts.RUnlock()
	const (
		keyCount = 60
		limit    = 5
		attempts = limit + 3
	)
	ctx := context.Background()
	cc := dialCluster(t)
	placement := newKeyPlacement(t, cc)
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			l, err := alg.new(cc, limit, forever)
			require.NoError(t, err, "constructing %s on a ClusterClient", alg.name)

			keys := make([]string, keyCount)
			keyMaster := make([]string, keyCount)
			perMaster := map[string]int{}
			for i := range keys {
				keys[i] = fmt.Sprintf("%s:user:%d", t.Name(), i)
				keyMaster[i] = placement.master(t, keyPrefix(l)+keys[i])
				perMaster[keyMaster[i]]++
				require.NoError(t, l.Reset(ctx, keys[i]), "resetting %q before the test", keys[i])
			}
			require.Len(t, perMaster, 3, "the %d keys must land on all 3 masters, got %v", keyCount, perMaster)

			results := make([][]attempt, keyCount)
			var wg sync.WaitGroup
			for i, key := range keys {
				wg.Go(func() {
					for range attempts {
						r, err := l.Allow(ctx, key)
						results[i] = append(results[i], attempt{n: 1, result: r, err: err})
					}
				})
			}
			wg.Wait()

			for i, key := range keys {
				for j, c := range results[i] {
					require.NoError(t, c.err, "key %q (master %s) call %d: every call must be decided", key, keyMaster[i], j)
					require.Equal(t, j < limit, c.result.Allowed, "key %q (master %s) call %d: exactly the first %d calls are allowed", key, keyMaster[i], j, limit)
					require.Equal(t, max(limit-j-1, 0), c.result.Remaining, "key %q call %d: Remaining counts down to 0", key, j)
				}
				redisKey := keyPrefix(l) + key
				ttl, err := placement.masters[keyMaster[i]].PTTL(ctx, redisKey).Result()
				require.NoError(t, err, "PTTL %s on its master %s", redisKey, keyMaster[i])
				require.Positive(t, ttl, "%s must exist on master %s, with a TTL", redisKey, keyMaster[i])
			}
		})
	}
}

// TestClusterScriptFlush: with the script cache of every master flushed
// before each round, each call still gets its decision: EVALSHA meets
// NOSCRIPT on each node, EVAL runs the script there and caches it, and the
// next key on that node runs EVALSHA again. No SCRIPT command is ever sent.
// It runs in parallel with the tests of other servers, not with those of
// the shared cluster (clusterScripts): it flushes the cluster's script
// caches. (Were it not parallel, the cluster would start, for seconds,
// while nothing else runs.)
func TestClusterScriptFlush(t *testing.T) {
	skipShort(t, "cluster test: starts a 3-master Redis Cluster")
	t.Parallel()
	clusterScripts.Lock()
	defer clusterScripts.Unlock()
	const (
		limit         = 3
		rounds        = limit + 1 // the last round is denied
		keysPerMaster = 2
	)
	ctx := context.Background()
	redistest.ClusterAddrs(t) // skip once, not per algorithm, without a cluster
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			cc := dialCluster(t) // its own, so the hook below sees only this subtest
			placement := newKeyPlacement(t, cc)
			l, err := alg.new(cc, limit, forever)
			require.NoError(t, err, "constructing %s on a ClusterClient", alg.name)

			var keys []string
			keyMaster := map[string]string{} // Redis key -> master
			perMaster := map[string]int{}
			for i := 0; len(keys) < 3*keysPerMaster; i++ {
				require.Less(t, i, 1000, "no keys found for every master: %v", perMaster)
				key := fmt.Sprintf("%s:user:%d", t.Name(), i)
				master := placement.master(t, keyPrefix(l)+key)
				if perMaster[master] == keysPerMaster {
					continue
				}
				perMaster[master]++
				keys = append(keys, key)
				keyMaster[keyPrefix(l)+key] = master
				require.NoError(t, l.Reset(ctx, key), "resetting %q before the test", key)
			}

			log := &commandRecorder{}
			cc.AddHook(log)
			for round := range rounds {
				err := cc.ForEachMaster(ctx, func(ctx context.Context, master *redis.Client) error {
					return master.ScriptFlush(ctx).Err()
				})
				require.NoError(t, err, "round %d: SCRIPT FLUSH on every master", round)
				log.take()

				for _, key := range keys {
					r, err := l.Allow(ctx, key)
					require.NoError(t, err, "round %d key %q: a flushed script cache must fall back to EVAL, not fail", round, key)
					require.Equal(t, round < limit, r.Allowed, "round %d key %q: the first %d rounds are allowed, then denied", round, key, limit)
				}

				type counts struct{ evalSHA, noScript, eval int }
				got := map[string]counts{}
				for _, c := range log.take() {
					if !strings.HasPrefix(c.name, "eval") && c.name != "script" {
						continue
					}
					master, ok := keyMaster[c.key]
					require.True(t, ok, "round %d: %s of an unexpected key %q (only EVALSHA and EVAL of the test's keys are expected)", round, c.name, c.key)
					n := got[master]
					switch c.name {
					case "evalsha":
						n.evalSHA++
						if c.noScript {
							n.noScript++
						}
					case "eval":
						n.eval++
					}
					got[master] = n
				}
				want := map[string]counts{}
				for master := range perMaster {
					want[master] = counts{evalSHA: keysPerMaster, noScript: 1, eval: 1}
				}
				require.Equal(t, want, got,
					"round %d: per master, every call tries EVALSHA once, the first meets NOSCRIPT and falls back to one EVAL", round)
			}
		})
	}
}
