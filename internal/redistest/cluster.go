package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

const (
	// clusterMasters is the number of master nodes of the shared cluster.
	clusterMasters = 3
	// clusterSlots is the number of hash slots of a Redis Cluster.
	clusterSlots = 16384
	// clusterReadyTimeout bounds creating the cluster and waiting for it to
	// be usable, once its nodes answer PING: long, so that only a cluster
	// that never forms fails, however loaded the machine.
	clusterReadyTimeout = 2 * time.Minute
	// clusterAttempts is how many times a whole cluster start is tried.
	clusterAttempts = 2
)

// clusterNodeArgs are appended to the command line of every cluster node.
var clusterNodeArgs = []string{
	"--cluster-enabled", "yes",
	"--cluster-config-file", "nodes.conf",
	"--cluster-node-timeout", "2000",
}

// cluster is a set of redis-server nodes forming one Redis Cluster.
type cluster struct {
	nodes []*Server
}

// addrs returns the addresses of the nodes.
func (c *cluster) addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// close stops all nodes and removes their directories.
func (c *cluster) close() error {
	var errs []error
	for _, n := range c.nodes {
		if err := n.close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// startCluster starts a 3-master cluster and returns once every node reports
// cluster_state:ok, all slots are covered and a ClusterClient can write to
// every master.
func startCluster() (*cluster, error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("find redis-cli: %w", err)
	}
	var errs []error
	for attempt := 1; attempt <= clusterAttempts; attempt++ {
		c, err := tryStartCluster(cli)
		if err == nil {
			return c, nil
		}
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
	}
	return nil, fmt.Errorf("start redis cluster: %w", errors.Join(errs...))
}

func tryStartCluster(cli string) (*cluster, error) {
	c := &cluster{}
	for range clusterMasters {
		n, err := startServer(clusterNodeArgs, true)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("cluster node: %w", err), c.close())
		}
		c.nodes = append(c.nodes, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	if err := c.setUp(ctx, cli); err != nil {
		return nil, errors.Join(err, c.close())
	}
	return c, nil
}

// setUp joins the nodes into a cluster and waits until it is usable.
func (c *cluster) setUp(ctx context.Context, cli string) error {
	if err := c.create(ctx, cli); err != nil {
		return err
	}
	ranges, err := c.waitConsistent(ctx)
	if err != nil {
		return err
	}
	return c.probe(ctx, ranges)
}

// create runs redis-cli --cluster create over the nodes.
func (c *cluster) create(ctx context.Context, cli string) error {
	args := []string{"--cluster", "create"}
	args = append(args, c.addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	setProcAttr(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-cli --cluster create: %w\n%s", err, bytes.TrimSpace(out))
	}
	return nil
}

// slotRange is a range of hash slots served by one master.
type slotRange struct {
	start, end int
	master     string
}

// waitConsistent waits until every node reports cluster_state:ok, knows all
// nodes and its CLUSTER SLOTS covers every slot with one range per master.
// It returns the slot ranges.
func (c *cluster) waitConsistent(ctx context.Context) ([]slotRange, error) {
	clients := make([]*redis.Client, len(c.nodes))
	for i, n := range c.nodes {
		clients[i] = newClient(n.Addr())
		defer clients[i].Close()
	}
	var lastErr error
	for {
		var ranges []slotRange
		lastErr = nil
		for i, client := range clients {
			r, err := checkNode(ctx, client, len(c.nodes))
			if err != nil {
				lastErr = fmt.Errorf("node %s: %w", c.nodes[i].Addr(), err)
				break
			}
			ranges = r
		}
		if lastErr == nil {
			return ranges, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cluster not ready after %v: %w", clusterReadyTimeout, lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// checkNode checks one node's view of the cluster and returns its slot ranges.
func checkNode(ctx context.Context, client *redis.Client, nodes int) ([]slotRange, error) {
	info, err := client.ClusterInfo(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER INFO: %w", err)
	}
	for _, want := range []string{
		"cluster_state:ok",
		fmt.Sprintf("cluster_slots_ok:%d", clusterSlots),
		fmt.Sprintf("cluster_known_nodes:%d", nodes),
	} {
		if !hasInfoLine(info, want) {
			return nil, fmt.Errorf("CLUSTER INFO lacks %q", want)
		}
	}
	//lint:ignore SA1019 CLUSTER SLOTS answers on every Redis we support; CLUSTER SHARDS needs 7.0.
	slots, err := client.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER SLOTS: %w", err)
	}
	var covered [clusterSlots]bool
	masters := map[string]bool{}
	ranges := make([]slotRange, 0, len(slots))
	for _, s := range slots {
		if s.Start < 0 || s.End >= clusterSlots || s.Start > s.End || len(s.Nodes) == 0 {
			return nil, fmt.Errorf("CLUSTER SLOTS: bad range %d-%d with %d nodes", s.Start, s.End, len(s.Nodes))
		}
		for slot := s.Start; slot <= s.End; slot++ {
			covered[slot] = true
		}
		masters[s.Nodes[0].Addr] = true
		ranges = append(ranges, slotRange{start: s.Start, end: s.End, master: s.Nodes[0].Addr})
	}
	for slot, ok := range covered {
		if !ok {
			return nil, fmt.Errorf("CLUSTER SLOTS: slot %d not covered", slot)
		}
	}
	if len(masters) != nodes {
		return nil, fmt.Errorf("CLUSTER SLOTS: %d masters, want %d", len(masters), nodes)
	}
	return ranges, nil
}

// hasInfoLine reports whether an INFO-style reply contains line.
func hasInfoLine(info, line string) bool {
	for l := range strings.Lines(info) {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// probe checks that a ClusterClient can SET and GET a key in every slot
// range, that is on every master.
func (c *cluster) probe(ctx context.Context, ranges []slotRange) error {
	keys := make([]string, len(ranges))
	for i, r := range ranges {
		key, err := keyInSlots(r.start, r.end)
		if err != nil {
			return err
		}
		keys[i] = key
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                    c.addrs(),
		DialTimeout:              500 * time.Millisecond,
		ReadTimeout:              time.Second,
		WriteTimeout:             time.Second,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	defer client.Close()
	for {
		err := probeKeys(ctx, client, keys)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster client probe failed until %v timeout: %w", clusterReadyTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// probeKeys writes, reads back and deletes each key.
func probeKeys(ctx context.Context, client *redis.ClusterClient, keys []string) error {
	for _, key := range keys {
		const value = "ok"
		if err := client.Set(ctx, key, value, time.Minute).Err(); err != nil {
			return fmt.Errorf("SET %s: %w", key, err)
		}
		got, err := client.Get(ctx, key).Result()
		if err != nil {
			return fmt.Errorf("GET %s: %w", key, err)
		}
		if got != value {
			return fmt.Errorf("GET %s = %q, want %q", key, got, value)
		}
		if err := client.Del(ctx, key).Err(); err != nil {
			return fmt.Errorf("DEL %s: %w", key, err)
		}
	}
	return nil
}

// keyInSlots returns a key whose hash slot is in [start, end].
func keyInSlots(start, end int) (string, error) {
	for i := range 1 << 20 {
		key := fmt.Sprintf("redistest:probe:%d", i)
		if slot := keySlot(key); slot >= start && slot <= end {
			return key, nil
		}
	}
	return "", fmt.Errorf("no probe key found for slots %d-%d", start, end)
}

// keySlot returns the Redis Cluster hash slot of key, honouring hash tags.
func keySlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			key = key[open+1 : open+1+n]
		}
	}
	return int(crc16([]byte(key))) % clusterSlots
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster uses for key slots.
func crc16(data []byte) uint16 {
	var crc uint16
	for _, b := range data {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
