package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/netpart"
)

// runNodes starts role's nodes on nw's nodes, each in its node's
// namespace with `services.sh run-node ROLE N DIR ADDRS` (cluster.sh: the
// configuration of the role's cluster, on the node's address and the
// role's default ports; the script execs the server, so the process the
// test holds is the server's), all at once. Each logs to DIR/out, whose
// end is printed when the test fails; the servers die with the test
// (and, whatever they forked, with the network: Close kills what runs in
// the namespaces). It returns each node's out file, in node order.
func runNodes(t *testing.T, nw *netpart.Net, role string) []string {
	t.Helper()
	dir := t.TempDir()
	var ips []string
	for _, node := range nw.Nodes() {
		ips = append(ips, nw.IP(node).String())
	}
	logs := make([]string, len(ips))
	for i, node := range nw.Nodes() {
		d := filepath.Join(dir, node)
		require.NoError(t, os.MkdirAll(d, 0o755))
		logs[i] = filepath.Join(d, "out")
		logf, err := os.Create(logs[i])
		require.NoError(t, err)
		t.Cleanup(func() { logf.Close() })
		cmd, err := nw.Command(context.Background(), node, "bash", script.Path, "run-node", role, strconv.Itoa(i+1), d, strings.Join(ips, ","))
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
				t.Logf("%s's output (end):\n%s", node, b)
			}
		})
	}
	return logs
}

// kafkaInNamespaces starts a 3-broker KRaft cluster (each broker a
// controller too; replication factor 3, min.insync.replicas 2, as
// services.sh's kafka-cluster) on nw's nodes, each broker on its node's
// address (clients 9092, KRaft 9093), and returns the brokers'
// host:port in node order once each says it started and the metadata of
// every broker lists all three.
func kafkaInNamespaces(t *testing.T, nw *netpart.Net) []string {
	t.Helper()
	start := time.Now()
	logs := runNodes(t, nw, "kafka-cluster")
	addrs := make([]string, len(logs))
	for i, node := range nw.Nodes() {
		addrs[i] = net.JoinHostPort(nw.IP(node).String(), "9092")
	}
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; i < len(addrs); {
		b, _ := os.ReadFile(logs[i])
		if strings.Contains(string(b), "Kafka Server started") && kafkaSeesBrokers(addrs[i], len(addrs)) {
			i++
			continue
		}
		require.True(t, time.Now().Before(deadline), "kafka broker %d is not up with %d brokers after 2 minutes", i+1, len(addrs))
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("kafka: 3 brokers in namespaces up in %v", time.Since(start).Round(100*time.Millisecond))
	return addrs
}

// kafkaSeesBrokers: the broker at addr answers metadata with n brokers.
func kafkaSeesBrokers(addr string, n int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var d kafkago.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	bs, err := conn.Brokers()
	return err == nil && len(bs) == n
}

// TestPartitionKafka: a 3-broker KRaft cluster, each broker in a network
// namespace of its own, a topic of one partition with 3 replicas and
// min.insync.replicas=2 (the adapter produces with acks=all); the relay
// bootstraps from the partition's leader alone, the worker from all
// three. While the load runs, the leader is cut from the two others
// (both ways; the test's side still reaches every broker) for longer
// than the brokers' session timeout (6 s): the majority's controllers
// fence it and elect a new leader among the in-sync followers, while the
// old leader can no longer reach min.insync.replicas, so no write it
// takes is acknowledged. Then the cut heals. The counts are the failover
// tests'; it prints first publish and first handled after the fault and
// after the heal.
func TestPartitionKafka(t *testing.T) {
	partitionTools(t)
	nw := netpart.Start(t, "k1", "k2", "k3")
	addrs := kafkaInNamespaces(t, nw)
	rg, leader := leaderRig(t, Nodes{Broker: "kafka", URLs: addrs}, func(brokers ...string) opener {
		return func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
			return kafka.New(ctx, kafka.Config{Brokers: brokers, Partitions: 1, ReplicationFactor: 3, Logger: log})
		}
	})
	// Held beyond the session timeout (6 s) and the election after it.
	partitionLeader(t, nw, rg, "kafka", leader, max(phase(t), 10*time.Second), func(ctx context.Context, cut int) (int, error) {
		return Nodes{Broker: "kafka", URLs: without(addrs, cut-1)}.Leader(ctx, rg.topo)
	})
}

// without returns s without its element i.
func without(s []string, i int) []string {
	return append(append([]string(nil), s[:i]...), s[i+1:]...)
}

// partitionLeader runs rg's load with one fault: node leader (1..3) cut
// from the two others, both ways, for hold, then healed; it logs which
// node the majority names as leader during the cut (majorityLeader: the
// leader among the nodes without cut, 1..2 in their order), then
// prints the PARTITION line (partitionFault).
func partitionLeader(t *testing.T, nw *netpart.Net, rg *rig, brokerName string, leader int, hold time.Duration,
	majorityLeader func(ctx context.Context, cut int) (int, error)) {
	t.Helper()
	lname := nw.Nodes()[leader-1]
	others := without(nw.Nodes(), leader-1)
	partitionFault(t, rg, brokerName, "leader-cut", hold,
		fmt.Sprintf("cut node %d (%s, the leader; the relay's only server) from the two others", leader, lname),
		func(ctx context.Context) error {
			for _, other := range others {
				if err := nw.Cut(ctx, lname, other); err != nil {
					return err
				}
			}
			return nil
		},
		func() {
			lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			during, err := majorityLeader(lctx, leader)
			cancel()
			if err == nil {
				t.Logf("during the cut the majority side's leader is %s", others[during-1])
			} else {
				t.Logf("during the cut the majority side names no leader: %v", err)
			}
		}, nw.Heal)
}

// partitionFault runs rg's load with one network fault: strike starts it
// (it returns once the fault is in place, or runs it until its ctx ends:
// a flap), hold later during (may be nil) looks at the cluster, and heal
// ends it. Then it prints the PARTITION line: rg.run's counts (it fails
// the test on a lost event, a duplicate effect or a charged row) and the
// first publish and first handled after the fault and after the heal.
func partitionFault(t *testing.T, rg *rig, brokerName, fault string, hold time.Duration, what string,
	strike func(ctx context.Context) error, during func(), heal func(ctx context.Context) error) {
	t.Helper()
	var faultAt, healAt time.Time
	var seqAtHeal int64
	res := rg.run(func(mark func()) {
		t.Logf("%s for %v", what, hold)
		ctx, stop := context.WithTimeout(context.Background(), hold)
		defer stop()
		struck := make(chan error, 1)
		go func() { struck <- strike(ctx) }()
		mark()
		faultAt = time.Now()
		<-ctx.Done()
		require.NoError(t, <-struck, "%s", fault)
		if during != nil {
			during()
		}
		healAt, seqAtHeal = time.Now(), rg.seq.Load()
		require.NoError(t, heal(context.Background()))
		t.Log("healed")
	})
	bg := context.Background()
	var handled, published *time.Time
	require.NoError(t, rg.pool.QueryRow(bg, `SELECT min(at) FROM effects WHERE seq > $1`, seqAtHeal).Scan(&handled))
	require.NoError(t, rg.pool.QueryRow(bg, `SELECT min(processed_at) FROM outbox WHERE (convert_from(payload, 'UTF8')::json->>'Seq')::bigint > $1`, seqAtHeal).Scan(&published))
	require.NotNil(t, handled, "no event enqueued after the heal was handled")
	require.NotNil(t, published, "no event enqueued after the heal was published")
	t.Logf("PARTITION %s %s: lost=%d duplicate_effects=%d redeliveries_absorbed=%d redelivered=%d | after the fault: first publish %v, first handled %v | after the heal (%v after the fault): first publish %v, first handled %v",
		brokerName, fault, res.Lost, res.Duplicates, res.Absorbed, res.Redelivered,
		res.PublishRecovery.Round(time.Millisecond), res.Recovery.Round(time.Millisecond),
		healAt.Sub(faultAt).Round(time.Millisecond), published.Sub(healAt).Round(time.Millisecond), handled.Sub(healAt).Round(time.Millisecond))
}

// rabbitInNamespaces starts 3 RabbitMQ nodes of one cluster (quorum
// queues; cluster_partition_handling = pause_minority and net_ticktime
// 10 s, as services.sh's rabbitmq-cluster) on nw's nodes, each node named
// rabbit@IP with its own epmd, AMQP 5672 and management 15672 on its
// node's address, and returns the AMQP URLs and the management URLs in
// node order once node 1's management API lists three running nodes and
// every node's API answers with its own name.
func rabbitInNamespaces(t *testing.T, nw *netpart.Net) (urls, mgmt []string) {
	t.Helper()
	start := time.Now()
	runNodes(t, nw, "rabbitmq-cluster")
	for _, node := range nw.Nodes() {
		ip := nw.IP(node).String()
		urls = append(urls, "amqp://ferry:ferry@"+net.JoinHostPort(ip, "5672")+"/")
		mgmt = append(mgmt, "http://ferry:ferry@"+net.JoinHostPort(ip, "15672"))
	}
	deadline := time.Now().Add(3 * time.Minute)
	for !rabbitReady(nw, mgmt) {
		require.True(t, time.Now().Before(deadline), "the RabbitMQ cluster in namespaces is not up with 3 running nodes after 3 minutes")
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("rabbitmq: 3 nodes in namespaces up in %v", time.Since(start).Round(100*time.Millisecond))
	return urls, mgmt
}

func rabbitReady(nw *netpart.Net, mgmt []string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for i, node := range nw.Nodes() {
		var ov struct{ Node string }
		if mgmtGet(ctx, mgmt[i], "/api/overview", &ov) != nil || ov.Node != "rabbit@"+nw.IP(node).String() {
			return false
		}
	}
	var nodes []struct {
		Name    string
		Running bool
	}
	if mgmtGet(ctx, mgmt[0], "/api/nodes", &nodes) != nil || len(nodes) != 3 {
		return false
	}
	for _, n := range nodes {
		if !n.Running {
			return false
		}
	}
	return true
}

// partitionRabbitMQEnv opts in to TestPartitionRabbitMQ.
const partitionRabbitMQEnv = "FERRY_PARTITION_RABBITMQ"

// TestPartitionRabbitMQ: 3 RabbitMQ nodes, each in a network namespace of
// its own, a quorum queue with 3 replicas; the relay connects to the
// queue's leader alone, the worker to all three. While the load runs, the
// leader is cut from the two others (both ways; the test's side still
// reaches every node) for longer than net_ticktime (10 s) and the
// quorum queue's election: the majority elects a new leader, and the cut
// node, alone on its side, pauses (pause_minority, which RabbitMQ's
// partitions page recommends with quorum queues: a minority node stops
// serving clients instead of going on alone) and closes the relay's
// connection, whose unconfirmed publishes the relay sends again after the
// heal. The counts are the failover tests'; it prints first publish and
// first handled after the fault and after the heal.
//
// It runs only with FERRY_PARTITION_RABBITMQ=1 (make test-cluster sets
// it): it takes 43-49 s, 20 of them forming the cluster, and in one of
// five runs, on a loaded machine (make test on a clean clone), the cut
// node stayed paused for more than 3 minutes after the heal, so the
// relay, pinned to that node, published nothing again (2,670 rows left
// unpublished, none lost by the broker). Until that is understood it is
// a finding for make test-cluster, not a gate of make test.
func TestPartitionRabbitMQ(t *testing.T) {
	nw, nodes, open := rabbitPartitioned(t, "a 3-node RabbitMQ cluster in namespaces (about 45 s)")
	rg, leader := leaderRig(t, nodes, open)
	partitionLeader(t, nw, rg, "rabbitmq", leader, max(phase(t), 10*time.Second), func(ctx context.Context, cut int) (int, error) {
		return Nodes{Broker: "rabbitmq", URLs: without(nodes.URLs, cut-1), Management: without(nodes.Management, cut-1)}.Leader(ctx, rg.topo)
	})
}

// rabbitPartitioned skips t, saying it is what (its cost), unless
// FERRY_PARTITION_RABBITMQ=1; else it starts 3 RabbitMQ nodes in
// namespaces (rabbitInNamespaces) and returns the network, the nodes and
// an opener of quorum queues with 3 replicas on given nodes.
func rabbitPartitioned(t *testing.T, what string) (*netpart.Net, Nodes, func(urls ...string) opener) {
	if os.Getenv(partitionRabbitMQEnv) == "" {
		t.Skipf("%s; set %s=1 (make test-cluster)", what, partitionRabbitMQEnv)
	}
	partitionTools(t)
	nw := netpart.Start(t, "r1", "r2", "r3")
	urls, mgmt := rabbitInNamespaces(t, nw)
	return nw, Nodes{Broker: "rabbitmq", URLs: urls, Management: mgmt}, func(urls ...string) opener {
		return func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
			return rabbitmq.New(ctx, rabbitmq.Config{URL: strings.Join(urls, ","), QueueType: rabbitmq.QueueTypeQuorum, QuorumReplicas: 3, Logger: log})
		}
	}
}

// TestPartitionKafkaFaults: partitionFaults on a 3-broker KRaft cluster in
// namespaces (topics of one partition, RF 3, min.insync.replicas 2). Only
// with FERRY_PARTITION_LONG=1 (make test-cluster): the cluster's JVMs
// take 30-90 s to start on this machine, beyond make test's budget, which
// keeps TestPartitionKafka (the leader's cut) and TestPartitionNATSFaults.
func TestPartitionKafkaFaults(t *testing.T) {
	if !partitionLong() {
		t.Skipf("a 3-broker KRaft cluster in namespaces and four faults (about 2.5 minutes); set %s=1 (make test-cluster)", partitionLongEnv)
	}
	partitionTools(t)
	nw := netpart.Start(t, "k1", "k2", "k3")
	addrs := kafkaInNamespaces(t, nw)
	partitionFaults(t, nw, Nodes{Broker: "kafka", URLs: addrs}, func(brokers ...string) opener {
		return func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
			return kafka.New(ctx, kafka.Config{Brokers: brokers, Partitions: 1, ReplicationFactor: 3, Logger: log})
		}
	})
}

// TestPartitionRabbitMQFaults: partitionFaults on 3 RabbitMQ nodes in
// namespaces (quorum queues, pause_minority). Only with
// FERRY_PARTITION_RABBITMQ=1 (make test-cluster), as TestPartitionRabbitMQ.
func TestPartitionRabbitMQFaults(t *testing.T) {
	nw, nodes, open := rabbitPartitioned(t, "a 3-node RabbitMQ cluster in namespaces and four faults (about 1.5 minutes)")
	partitionFaults(t, nw, nodes, open)
}
