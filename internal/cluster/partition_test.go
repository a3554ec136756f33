package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/internal/netpart"
	"github.com/ferrymq/ferry/internal/testenv"
)

// partitionTools returns the variables `services.sh netns` prints (it
// installs nftables when missing): FERRY_NATS_SERVER, FERRY_NFT.
func partitionTools(t *testing.T) map[string]string {
	t.Helper()
	out := services(t, "netns")
	env := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "="); ok {
			env[k] = v
		}
	}
	require.NotEmpty(t, env["FERRY_NATS_SERVER"], "services.sh netns printed no FERRY_NATS_SERVER:\n%s", out)
	return env
}

// natsInNamespaces starts a 3-node JetStream cluster on nw's nodes n1..n3,
// each nats-server in its node's namespace on the node's address (client
// 4222, routes 6222, monitor 8222), and returns the client URLs in node
// order once JetStream's meta group has a leader and all three peers.
// The servers die with the network (Close kills them).
func natsInNamespaces(t *testing.T, nw *netpart.Net, bin string) []string {
	t.Helper()
	const pass = "partition"
	dir := t.TempDir()
	nodes := nw.Nodes()
	urls := make([]string, len(nodes))
	for i, node := range nodes {
		ip := nw.IP(node).String()
		var routes []string
		for _, m := range nodes {
			if m != node {
				routes = append(routes, fmt.Sprintf("nats-route://%s:6222", nw.IP(m)))
			}
		}
		d := filepath.Join(dir, node)
		require.NoError(t, os.MkdirAll(d, 0o755))
		conf := fmt.Sprintf(`server_name: %s
listen: %s:4222
http: %s:8222
authorization { user: ferry, password: %q }
jetstream { store_dir: %q, max_mem: 64M, max_file: 1G }
cluster {
  name: partition
  listen: %s:6222
  routes: [ %s ]
}
`, node, ip, ip, pass, filepath.Join(d, "js"), ip, strings.Join(routes, ", "))
		cf := filepath.Join(d, "nats.conf")
		require.NoError(t, os.WriteFile(cf, []byte(conf), 0o644))
		logf, err := os.Create(filepath.Join(d, "log"))
		require.NoError(t, err)
		t.Cleanup(func() { logf.Close() })
		cmd, err := nw.Command(context.Background(), node, bin, "-c", cf)
		require.NoError(t, err)
		cmd.Stdout, cmd.Stderr = logf, logf
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		t.Cleanup(func() {
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				if len(b) > 4000 {
					b = b[len(b)-4000:]
				}
				t.Logf("%s's log (end):\n%s", node, b)
			}
		})
		urls[i] = fmt.Sprintf("nats://ferry:%s@%s:4222", pass, ip)
	}
	// Ready: every node's /jsz counts three peers and names a leader, and
	// the leader sees the two others current (cluster.sh's
	// nats_cl_meta_ready).
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if metaReady(nw) {
			return urls
		}
		require.True(t, time.Now().Before(deadline), "JetStream's meta group has no leader with all 3 servers after 2 minutes")
		time.Sleep(250 * time.Millisecond)
	}
}

func metaReady(nw *netpart.Net) bool {
	current := -1
	for _, node := range nw.Nodes() {
		var jsz struct {
			Meta *struct {
				Leader      string `json:"leader"`
				ClusterSize int    `json:"cluster_size"`
				Replicas    []struct {
					Current bool `json:"current"`
				} `json:"replicas"`
			} `json:"meta_cluster"`
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s:8222/jsz", nw.IP(node)), nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&jsz)
			resp.Body.Close()
		}
		cancel()
		if err != nil || jsz.Meta == nil || jsz.Meta.ClusterSize != 3 || jsz.Meta.Leader == "" {
			return false
		}
		if jsz.Meta.Leader == node {
			current = 0
			for _, r := range jsz.Meta.Replicas {
				if r.Current {
					current++
				}
			}
		}
	}
	return current >= 2
}

// TestPartitionNATS: a 3-node JetStream cluster, each nats-server in a
// network namespace of its own (package netpart); the relay connects to
// the stream's leader only, the worker to all three. While the load runs,
// the leader is cut from the two others (nftables drops, both ways; the
// test's side still reaches every node), so the relay publishes to a
// server that lost its quorum; after a hold beyond JetStream's election
// the cut heals. The counts are the failover tests' (lost, duplicate
// effects, charged rows); it prints first publish and first handled after
// the fault and after the heal.
func TestPartitionNATS(t *testing.T) {
	tools := partitionTools(t)
	nw := netpart.Start(t, "n1", "n2", "n3")
	urls := natsInNamespaces(t, nw, tools["FERRY_NATS_SERVER"])
	nodes := Nodes{Broker: "nats", URLs: urls}
	rg, leader := leaderRig(t, nodes, func(urls ...string) opener {
		return func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
			return nats.New(ctx, nats.Config{URL: strings.Join(urls, ","), Logger: log})
		}
	})
	consumer := consumerLeaderOf(nodes)(t, rg)
	t.Logf("the stream's leader is node %d, the consumer's leader node %d", leader, consumer)
	// Held beyond JetStream's Raft election (4-9 s), so that the majority
	// elects a new leader while the old one is cut off.
	partitionLeader(t, nw, rg, "nats", leader, max(phase(t), 10*time.Second), func(ctx context.Context, cut int) (int, error) {
		return Nodes{Broker: "nats", URLs: without(urls, cut-1)}.Leader(ctx, rg.topo)
	})
}

// opener opens a broker for a rig.
type opener = func(ctx context.Context, log *slog.Logger) (broker.Broker, error)

// leaderRig is newRigSplit (ordered) whose relay talks to the leader of
// the rig's topology alone: it declares the topology through every node
// (open(nodes.URLs...)), asks nodes for its leader (within 30 s) and
// opens that node only; the worker uses every node. It returns the rig
// and the leader's node number (1-based).
func leaderRig(t *testing.T, nodes Nodes, open func(urls ...string) opener) (*rig, int) {
	t.Helper()
	rg, leader, _ := pinnedRig(t, nodes, open, func(leader int) int { return leader })
	return rg, leader
}

// pinnedRig is leaderRig whose relay talks to node pick(leader) alone
// (1-based); it returns the rig, the leader and the relay's node.
func pinnedRig(t *testing.T, nodes Nodes, open func(urls ...string) opener, pick func(leader int) int) (*rig, int, int) {
	t.Helper()
	pool, _ := testenv.NewPool(t)
	var leader, pinned int
	rg := newRigSplit(t, pool, func(ctx context.Context, log *slog.Logger, tp broker.Topology) (broker.Broker, error) {
		admin, err := open(nodes.URLs...)(ctx, log)
		if err != nil {
			return nil, err
		}
		defer admin.Close()
		if err := admin.Declare(ctx, tp); err != nil {
			return nil, err
		}
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if leader, err = nodes.Leader(lctx, tp); err != nil {
			return nil, err
		}
		pinned = pick(leader)
		return open(nodes.URLs[pinned-1])(ctx, log)
	}, open(nodes.URLs...), true)
	return rg, leader, pinned
}

// partitionLongEnv makes the partition fault tests hold each fault 3x
// longer (make test-cluster sets it) and runs the Kafka and RabbitMQ
// ones, which make test leaves out for its time budget.
const partitionLongEnv = "FERRY_PARTITION_LONG"

// partitionLong reports whether partitionLongEnv is set.
func partitionLong() bool { return os.Getenv(partitionLongEnv) == "1" }

// TestPartitionNATSFaults: partitionFaults on a 3-node JetStream cluster,
// each nats-server in a namespace of its own, R3 streams. It is in make
// test (83 s here).
func TestPartitionNATSFaults(t *testing.T) {
	tools := partitionTools(t)
	nw := netpart.Start(t, "n1", "n2", "n3")
	urls := natsInNamespaces(t, nw, tools["FERRY_NATS_SERVER"])
	partitionFaults(t, nw, Nodes{Broker: "nats", URLs: urls}, func(urls ...string) opener {
		return func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
			return nats.New(ctx, nats.Config{URL: strings.Join(urls, ","), Logger: log})
		}
	})
}

// partitionFaults runs the partition faults other than the leader's cut
// on the cluster nodes (in nw's namespaces), each subtest with a topology
// and a database of its own and the load of the failover tests (200
// events/s):
//   - minority: the relay talks to a follower alone, and that follower is
//     cut from the two others (it can no longer reach the leader);
//   - one-way: the leader's packets to the two others are dropped, theirs
//     to it still pass (every TCP connection between them fails, as
//     SYN-ACKs and ACKs are lost), the relay on the leader;
//   - flap: the leader's links to the two others are cut and healed every
//     2 s, the relay on the leader;
//   - delay-loss: 200 ms each way between every two nodes, and 5 % of
//     their packets dropped. Without netem in the kernel (this machine)
//     the delay is netpart's userspace proxy: the nodes' connections to
//     each other are reset once as it starts and pass it from then on, a
//     TCP chunk held 200 ms each way; the loss is on the real packets.
//
// Each prints its PARTITION line and fails on a lost event, a duplicate
// effect or a charged row. Holds are 6-10 s (3x with
// FERRY_PARTITION_LONG=1, make test-cluster).
func partitionFaults(t *testing.T, nw *netpart.Net, nodes Nodes, open func(urls ...string) opener) {
	long := time.Duration(1)
	if partitionLong() {
		long = 3
	}
	name := func(i int) string { return nw.Nodes()[i-1] }
	othersOf := func(i int) []string { return without(nw.Nodes(), i-1) }
	cutFrom := func(node int, cut func(ctx context.Context, a, b string) error) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			for _, o := range othersOf(node) {
				if err := cut(ctx, name(node), o); err != nil {
					return err
				}
			}
			return nil
		}
	}
	t.Run("minority", func(t *testing.T) {
		rg, leader, relay := pinnedRig(t, nodes, open, func(leader int) int { return leader%3 + 1 })
		t.Logf("the leader is node %d; the relay talks to node %d", leader, relay)
		partitionFault(t, rg, nodes.Broker, "minority", long*6*time.Second,
			fmt.Sprintf("cut node %d (%s, a follower; the relay's only server) from the two others", relay, name(relay)),
			cutFrom(relay, nw.Cut), nil, nw.Heal)
	})
	t.Run("one-way", func(t *testing.T) {
		rg, leader := leaderRig(t, nodes, open)
		partitionFault(t, rg, nodes.Broker, "one-way", long*10*time.Second,
			fmt.Sprintf("drop the packets of node %d (%s, the leader; the relay's only server) to the two others, one way", leader, name(leader)),
			cutFrom(leader, nw.CutOneWay), nil, nw.Heal)
	})
	t.Run("flap", func(t *testing.T) {
		rg, leader := leaderRig(t, nodes, open)
		partitionFault(t, rg, nodes.Broker, "flap", long*8*time.Second,
			fmt.Sprintf("cut and heal node %d's (%s, the leader; the relay's only server) links to the two others every 2 s", leader, name(leader)),
			func(ctx context.Context) error {
				errs := make(chan error, 2)
				for _, o := range othersOf(leader) {
					go func() { errs <- nw.Flap(ctx, name(leader), o, 2*time.Second) }()
				}
				return errors.Join(<-errs, <-errs)
			}, nil, nw.Heal)
	})
	t.Run("delay-loss", func(t *testing.T) {
		rg, leader := leaderRig(t, nodes, open)
		t.Logf("the leader is node %d (the relay's only server)", leader)
		partitionFault(t, rg, nodes.Broker, "delay-200ms-loss-5%", long*8*time.Second,
			"delay by 200 ms each way and drop 5% of the packets between every two nodes",
			func(ctx context.Context) error {
				ns := nw.Nodes()
				for i := range ns {
					for j := i + 1; j < len(ns); j++ {
						if err := errors.Join(nw.Delay(ctx, ns[i], ns[j], 200*time.Millisecond), nw.Loss(ctx, ns[i], ns[j], 5)); err != nil {
							return err
						}
					}
				}
				return nil
			}, func() {
				if !nw.Netem() {
					// The nodes' links to each other passed the userspace delay.
					t.Logf("%d node-to-node connections passed the delay proxy", nw.DelayedConns())
					require.Positive(t, nw.DelayedConns(), "no connection between the nodes passed the delay")
				}
			}, nw.Heal)
	})
}
