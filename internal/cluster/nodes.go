package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/brokers/nats"
)

// ErrNoLeader is wrapped by Nodes.Leader's error when no node answered
// with a leader before its context ended.
var ErrNoLeader = errors.New("cluster: no leader found")

// Nodes names the nodes of one clustered broker, in node order: node 1 is
// URLs[0], and services.sh's `node ROLE 1 …` acts on it.
type Nodes struct {
	// Broker is "rabbitmq", "kafka" or "nats".
	Broker string
	// URLs are the nodes' client addresses: amqp:// URLs (RabbitMQ),
	// host:port (Kafka), nats:// URLs (NATS).
	URLs []string
	// Management are RabbitMQ's management API base URLs, one per node in
	// the order of URLs (http://user:password@host:port): the leader of a
	// quorum queue is read there. Unused by the other brokers.
	Management []string
}

// NodesFromEnv reads broker's nodes from the variables that
// `services.sh env ROLE` prints for its cluster roles:
// FERRY_RABBITMQ_CLUSTER_URL and FERRY_RABBITMQ_CLUSTER_MANAGEMENT_URL,
// FERRY_KAFKA_CLUSTER_BROKERS, FERRY_NATS_CLUSTER_URL (comma lists in node
// order). It fails when a variable is missing.
func NodesFromEnv(brokerName string, env map[string]string) (Nodes, error) {
	n := Nodes{Broker: brokerName}
	need := func(k string) ([]string, error) {
		v := env[k]
		if v == "" {
			return nil, fmt.Errorf("cluster: %s: not set (services.sh env %s-cluster prints it while the cluster runs)", k, brokerName)
		}
		return strings.Split(v, ","), nil
	}
	var err error
	switch brokerName {
	case "rabbitmq":
		if n.URLs, err = need("FERRY_RABBITMQ_CLUSTER_URL"); err == nil {
			n.Management, err = need("FERRY_RABBITMQ_CLUSTER_MANAGEMENT_URL")
		}
	case "kafka":
		n.URLs, err = need("FERRY_KAFKA_CLUSTER_BROKERS")
	case "nats":
		n.URLs, err = need("FERRY_NATS_CLUSTER_URL")
	default:
		err = fmt.Errorf("cluster: broker %q has no cluster role (rabbitmq, kafka, nats)", brokerName)
	}
	return n, err
}

// Ports returns each node's client port, in node order: what finds a
// node's process (the listener of that port).
func (n Nodes) Ports() ([]int, error) {
	ports := make([]int, len(n.URLs))
	for i, u := range n.URLs {
		host := u
		if strings.Contains(u, "://") {
			pu, err := url.Parse(u)
			if err != nil {
				return nil, fmt.Errorf("cluster: node %d: %w", i+1, err)
			}
			host = pu.Host
		}
		_, p, err := net.SplitHostPort(host)
		if err != nil {
			return nil, fmt.Errorf("cluster: node %d: no port in %q", i+1, redact(u))
		}
		if ports[i], err = strconv.Atoi(p); err != nil {
			return nil, fmt.Errorf("cluster: node %d: port %q: %w", i+1, p, err)
		}
	}
	return ports, nil
}

// Leader returns the node (1..len(URLs)) that leads tp's first queue: the
// leader of the quorum queue (RabbitMQ, from the management API), of
// partition 0 of the exchange's topic (Kafka, from the metadata of the
// first broker that answers) or of the exchange's stream (NATS, JetStream's
// stream info). It asks every 250 ms until a node answers with a leader
// that is one of the nodes, and returns an error wrapping ErrNoLeader
// with the last answer when ctx ends first (give it a deadline).
func (n Nodes) Leader(ctx context.Context, tp broker.Topology) (int, error) {
	if len(tp.Queues) == 0 {
		return 0, fmt.Errorf("cluster: topology %q has no queue", tp.Exchange)
	}
	var ask func(ctx context.Context, try int) (int, error)
	switch n.Broker {
	case "rabbitmq":
		if len(n.Management) != len(n.URLs) {
			return 0, fmt.Errorf("cluster: rabbitmq: %d management URLs for %d nodes", len(n.Management), len(n.URLs))
		}
		ask = func(ctx context.Context, try int) (int, error) { return n.rabbitLeader(ctx, try, tp.Queues[0].Name) }
	case "kafka":
		ask = func(ctx context.Context, try int) (int, error) {
			return n.kafkaLeader(ctx, try, kafka.TopicName(tp.Exchange))
		}
	case "nats":
		ask = func(ctx context.Context, _ int) (int, error) { return n.natsLeader(ctx, nats.StreamName(tp.Exchange)) }
	default:
		return 0, fmt.Errorf("cluster: broker %q: no leader lookup (rabbitmq, kafka, nats)", n.Broker)
	}
	return n.askUntil(ctx, ask)
}

// askUntil calls ask every 250 ms, each call bounded by 5 s, until it
// answers, and returns an error wrapping ErrNoLeader with the last answer
// when ctx ends first.
func (n Nodes) askUntil(ctx context.Context, ask func(ctx context.Context, try int) (int, error)) (int, error) {
	var last error
	for try := 0; ; try++ {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		node, err := ask(actx, try)
		cancel()
		if err == nil {
			return node, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: %s: %v", ErrNoLeader, n.Broker, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// kafkaLeader: the broker that leads partition 0 of topic, matched to a
// node by its advertised host:port (exactly as in URLs).
func (n Nodes) kafkaLeader(ctx context.Context, try int, topic string) (int, error) {
	var d kafkago.Dialer
	conn, err := d.DialContext(ctx, "tcp", n.URLs[try%len(n.URLs)])
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	parts, err := conn.ReadPartitions(topic)
	if err != nil {
		return 0, err
	}
	for _, p := range parts {
		if p.ID != 0 {
			continue
		}
		// The exact host:port: the partition tests' brokers share a port
		// on addresses of their own.
		leader := net.JoinHostPort(p.Leader.Host, strconv.Itoa(p.Leader.Port))
		for i, b := range n.URLs {
			if b == leader {
				return i + 1, nil
			}
		}
		return 0, fmt.Errorf("topic %s partition 0: leader %s:%d is none of %s", topic, p.Leader.Host, p.Leader.Port, strings.Join(n.URLs, ","))
	}
	return 0, fmt.Errorf("topic %s: no partition 0", topic)
}

// ConsumerLeader returns the node (1..len(URLs)) that leads the JetStream
// consumer of tp's first queue (NATS only: a consumer has a Raft group of
// its own, whose leader is placed independently of its stream's, so a node
// that does not lead the stream may still lead the consumer, and losing it
// stops deliveries for one consumer election). It asks every 250 ms until
// a node answers, and returns an error wrapping ErrNoLeader when ctx ends
// first (give it a deadline). Other brokers: an error.
func (n Nodes) ConsumerLeader(ctx context.Context, tp broker.Topology) (int, error) {
	if n.Broker != "nats" {
		return 0, fmt.Errorf("cluster: broker %q: consumer leaders are a JetStream notion (nats)", n.Broker)
	}
	if len(tp.Queues) == 0 {
		return 0, fmt.Errorf("cluster: topology %q has no queue", tp.Exchange)
	}
	stream, consumer := nats.StreamName(tp.Exchange), nats.ConsumerName(tp.Queues[0].Name)
	return n.askUntil(ctx, func(ctx context.Context, _ int) (int, error) {
		return n.natsLeaderOf(ctx, "consumer "+stream+"/"+consumer, func(js jetstream.JetStream) (*jetstream.ClusterInfo, error) {
			c, err := js.Consumer(ctx, stream, consumer)
			if err != nil {
				return nil, err
			}
			info, err := c.Info(ctx)
			if err != nil {
				return nil, err
			}
			return info.Cluster, nil
		})
	})
}

// natsLeader: the server that leads stream, matched to a node by the
// server name each node's URL answers with.
func (n Nodes) natsLeader(ctx context.Context, stream string) (int, error) {
	return n.natsLeaderOf(ctx, "stream "+stream, func(js jetstream.JetStream) (*jetstream.ClusterInfo, error) {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return nil, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return nil, err
		}
		return info.Cluster, nil
	})
}

// natsLeaderOf asks every node for its server name and the first node that
// answers for the leader that cluster reports, and matches the two.
func (n Nodes) natsLeaderOf(ctx context.Context, what string, cluster func(jetstream.JetStream) (*jetstream.ClusterInfo, error)) (int, error) {
	names := make([]string, len(n.URLs))
	var leader string
	var last error
	for i, u := range n.URLs {
		nc, err := natsgo.Connect(u, natsgo.Timeout(2*time.Second), natsgo.NoReconnect(), natsgo.DontRandomize())
		if err != nil {
			last = err
			continue
		}
		names[i] = nc.ConnectedServerName()
		if leader == "" {
			if js, err := jetstream.New(nc); err != nil {
				last = err
			} else if ci, err := cluster(js); err != nil {
				last = err
			} else if ci != nil {
				leader = ci.Leader
			}
		}
		nc.Close()
	}
	if leader == "" {
		return 0, fmt.Errorf("%s: no leader: %v", what, last)
	}
	if i := slices.Index(names, leader); i >= 0 {
		return i + 1, nil
	}
	return 0, fmt.Errorf("%s: leader %s is none of the servers that answered (%s)", what, leader, strings.Join(names, ","))
}

// rabbitLeader: the node that leads quorum queue q, from the management
// API of node try (round robin), matched to a node by the node name each
// management API reports.
func (n Nodes) rabbitLeader(ctx context.Context, try int, q string) (int, error) {
	var leader struct{ Leader, Node string }
	if err := mgmtGet(ctx, n.Management[try%len(n.Management)], "/api/queues/%2F/"+url.PathEscape(q), &leader); err != nil {
		return 0, err
	}
	if leader.Leader == "" {
		leader.Leader = leader.Node
	}
	if leader.Leader == "" {
		return 0, fmt.Errorf("queue %s: no leader yet", q)
	}
	var last error
	for i, m := range n.Management {
		var ov struct{ Node string }
		if err := mgmtGet(ctx, m, "/api/overview", &ov); err != nil {
			last = err
			continue
		}
		if ov.Node == leader.Leader {
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("queue %s: leader %s is no node whose management API answered (%v)", q, leader.Leader, last)
}

// mgmtGet reads path of RabbitMQ's management API at base into v.
func mgmtGet(ctx context.Context, base, path string, v any) error {
	u, err := url.Parse(base)
	if err != nil {
		return fmt.Errorf("management URL: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.Scheme+"://"+u.Host+path, nil)
	if err != nil {
		return err
	}
	if u.User != nil {
		pass, _ := u.User.Password()
		req.SetBasicAuth(u.User.Username(), pass)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s on %s: %s", path, u.Host, resp.Status)
	}
	return json.Unmarshal(body, v)
}

// redact drops the password of a URL for an error message.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		return u.Redacted()
	}
	return s
}
