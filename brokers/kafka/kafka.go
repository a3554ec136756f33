package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ferrymq/ferry/broker"
)

// writerBatchSize is the most records of one partition that go in one
// produce request (see produce); more are sent as further requests of that
// partition, one after the other, so per-key order holds, and a write
// returns only when all are acknowledged. 256 holds the relay's default
// batch (100) in one request per partition, and a 500-row batch spread
// over 3 partitions. (With kafka-go's Writer, which the adapter used
// before, the former BatchSize of 100000 cost 15 MB of zeroed memory per
// partition per Publish.)
const writerBatchSize = 256

// recordOverheadBytes is what the adapter keeps back from the broker's
// message.max.bytes for the record batch framing and the headers it adds
// itself (its own header names, the retry and DLQ headers with a reason of
// up to broker.MaxReasonBytes, the queue and topic names), so that a
// message accepted by Publish still fits when it is retried or
// dead-lettered.
const recordOverheadBytes = 4096

// defaultMessageMaxBytes is Kafka's default message.max.bytes (1 MiB + 12
// bytes of batch framing), used when the broker does not report its value.
const defaultMessageMaxBytes = 1048588

type kafkaBroker struct {
	cfg         Config
	log         *slog.Logger
	addr        net.Addr
	transport   *kafkago.Transport
	client      *kafkago.Client
	dialer      *kafkago.Dialer
	balancer    kafkago.Murmur2Balancer // the partitioner of produce
	caps        broker.Capabilities
	maxBytes    int // the broker's message.max.bytes
	replication int

	closed   atomic.Bool
	done     chan struct{}
	closeCtx context.Context // ends at Close
	closeFn  context.CancelFunc
	declMu   sync.Mutex // one Declare at a time
	mu       sync.Mutex
	current  string                // exchange of the last Declare: Publish's target
	topos    map[string]*declared  // by exchange
	queues   map[string]*queueInfo // by queue name
	subs     map[*subscription]struct{}
}

// declared is what Declare created for one exchange (the union of the
// queues of every Declare on it).
type declared struct {
	topology broker.Topology
}

// queueInfo is one declared queue with its topic names.
type queueInfo struct {
	queue       broker.Queue
	exchange    string
	topic       string   // work topic
	retryTopics []string // one per delay level
	dlqTopic    string
}

var _ broker.Broker = (*kafkaBroker)(nil)
var _ broker.HistoryReplayer = (*kafkaBroker)(nil)

// New connects to the Kafka cluster of cfg.Brokers and reads the broker
// settings the adapter depends on (message.max.bytes,
// default.replication.factor). It returns an error wrapping
// broker.ErrInvalidConfig, before connecting, when Config.Validate refuses
// cfg, and an error when no broker answers before ctx ends (or within
// Config.DialTimeout×2 when ctx has no deadline). The adapter speaks
// PLAINTEXT only, so no server refuses it for its credentials.
func New(ctx context.Context, cfg Config) (broker.Broker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	transport := &kafkago.Transport{
		DialTimeout: cfg.DialTimeout,
		IdleTimeout: 30 * time.Second,
		MetadataTTL: 2 * time.Second,
		ClientID:    cfg.ClientID,
	}
	addr := kafkago.TCP(cfg.Brokers...)
	b := &kafkaBroker{
		cfg:       cfg,
		log:       cfg.Logger.With("broker", "kafka"),
		addr:      addr,
		transport: transport,
		client:    &kafkago.Client{Addr: addr, Transport: transport, Timeout: cfg.PublishTimeout},
		dialer:    &kafkago.Dialer{Timeout: cfg.DialTimeout, DualStack: true, ClientID: cfg.ClientID},
		done:      make(chan struct{}),
		topos:     map[string]*declared{},
		queues:    map[string]*queueInfo{},
		subs:      map[*subscription]struct{}{},
	}
	b.closeCtx, b.closeFn = context.WithCancel(context.Background())
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*cfg.DialTimeout)
		defer cancel()
	}
	if err := b.readBrokerConfig(ctx); err != nil {
		transport.CloseIdleConnections()
		return nil, err
	}
	b.caps = broker.Capabilities{
		Name:            "kafka",
		NativeDelay:     false,
		Ordering:        broker.OrderingKey,
		MaxMessageBytes: b.maxBytes - recordOverheadBytes,
		Replay:          true,
		Wildcards:       true,
	}
	return b, nil
}

// readBrokerConfig reads message.max.bytes and default.replication.factor
// from one broker of the cluster.
func (b *kafkaBroker) readBrokerConfig(ctx context.Context) error {
	md, err := b.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{}})
	if err != nil {
		return fmt.Errorf("kafka: connect %s: %w", strings.Join(b.cfg.Brokers, ","), err)
	}
	if len(md.Brokers) == 0 {
		return fmt.Errorf("kafka: connect %s: the cluster reports no brokers", strings.Join(b.cfg.Brokers, ","))
	}
	id := strconv.Itoa(md.Brokers[0].ID)
	b.maxBytes = defaultMessageMaxBytes
	b.replication = 1
	minISR, unclean := 1, false
	res, err := b.client.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{Resources: []kafkago.DescribeConfigRequestResource{{
		ResourceType: kafkago.ResourceTypeBroker, ResourceName: id,
		ConfigNames: []string{"message.max.bytes", "default.replication.factor", "min.insync.replicas", "unclean.leader.election.enable"},
	}}})
	if err != nil {
		return fmt.Errorf("kafka: read the configuration of broker %s: %w", id, err)
	}
	for _, r := range res.Resources {
		if r.Error != nil {
			return fmt.Errorf("kafka: read the configuration of broker %s: %w", id, r.Error)
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName == "unclean.leader.election.enable" {
				unclean = e.ConfigValue == "true"
				continue
			}
			n, err := strconv.Atoi(e.ConfigValue)
			if err != nil {
				continue
			}
			switch e.ConfigName {
			case "message.max.bytes":
				b.maxBytes = n
			case "default.replication.factor":
				b.replication = n
			case "min.insync.replicas":
				minISR = n
			}
		}
	}
	if b.cfg.ReplicationFactor > 0 {
		b.replication = b.cfg.ReplicationFactor
	}
	if err := b.checkReplication(len(md.Brokers), minISR, unclean); err != nil {
		return err
	}
	if b.maxBytes <= 2*recordOverheadBytes {
		return fmt.Errorf("kafka: broker %s: message.max.bytes %d is too small for ferry (want more than %d)", id, b.maxBytes, 2*recordOverheadBytes)
	}
	return nil
}

// checkReplication checks, on a cluster of brokers brokers, that a write
// ferry's producer (acks=all) sees confirmed survives a broker's loss:
//   - unclean.leader.election.enable=true is refused: an out-of-sync replica
//     may then become leader and drop writes that were acknowledged
//     (https://kafka.apache.org/documentation/#design_uncleanleader);
//   - a replication factor below 3 on 3 or more brokers, and
//     min.insync.replicas below 2 with a replication factor of 2 or more,
//     are logged as a WARN naming the setting: acks=all waits for the
//     in-sync replicas only, so with min.insync.replicas=1 the leader alone
//     may confirm a write it then loses (https://kafka.apache.org/documentation/#brokerconfigs_min.insync.replicas,
//     "use min.insync.replicas and acks to enforce greater durability
//     guarantees ... replication factor of 3, min.insync.replicas to 2").
//
// It returns an error wrapping broker.ErrInvalidConfig for the refusal.
func (b *kafkaBroker) checkReplication(brokers, minISR int, unclean bool) error {
	if brokers < 2 {
		return nil
	}
	if unclean {
		return fmt.Errorf("%w: kafka: the cluster has unclean.leader.election.enable=true: a replica that missed writes may become leader and drop messages ferry saw confirmed; set it to false", broker.ErrInvalidConfig)
	}
	if brokers >= 3 && b.replication < 3 {
		setting := "default.replication.factor"
		if b.cfg.ReplicationFactor > 0 {
			setting = "ReplicationFactor"
		}
		b.log.Warn("kafka: topics get fewer than 3 replicas on a cluster of 3 or more brokers: a broker's loss can lose or block confirmed messages; use 3",
			"setting", setting, "replication_factor", b.replication, "brokers", brokers)
	}
	if b.replication >= 2 && minISR < 2 {
		b.log.Warn("kafka: min.insync.replicas is 1: a write is confirmed once the leader alone has it, and lost if the leader dies before a follower copied it; set min.insync.replicas=2 on the brokers or the topics",
			"setting", "min.insync.replicas", "value", minISR, "brokers", brokers)
	}
	return nil
}

// Capabilities: no native delay (retry levels are topics), per-key order
// (one partition per key), wildcards matched by the adapter, replay of the
// log, and the broker's message.max.bytes less the adapter's overhead.
func (b *kafkaBroker) Capabilities() broker.Capabilities { return b.caps }

// topicSpec is one topic Declare wants.
type topicSpec struct {
	name       string
	partitions int
	compact    bool
	retention  time.Duration // retention.ms set at creation; 0: the broker's
}

// minRetryRetention is the least retention.ms of a retry topic: a
// retried message must outlive its delay, and a worker outage too.
const minRetryRetention = 7 * 24 * time.Hour

func (b *kafkaBroker) specsFor(t broker.Topology) []topicSpec {
	specs := []topicSpec{{name: TopicName(t.Exchange), partitions: b.cfg.Partitions}}
	for _, q := range t.Queues {
		for i, d := range q.Delays() {
			specs = append(specs, topicSpec{name: RetryTopicName(q.Name, i), partitions: b.cfg.Partitions,
				retention: max(minRetryRetention, 4*d)})
		}
		// One partition: List returns the DLQ oldest first by reading one
		// log; compacted, keyed by message ID, so a tombstone removes one
		// message.
		specs = append(specs, topicSpec{name: DLQTopicName(q.Name), partitions: 1, compact: true})
	}
	return specs
}

// Declare creates the work topic of t.Exchange, and per queue its retry
// topics and its compacted DLQ topic, with Config.Partitions partitions
// (the DLQ: one) and the replication factor. An existing topic with
// another partition count, replication factor or cleanup.policy is an
// error wrapping broker.ErrTopologyMismatch. Queues are consumer groups:
// nothing is created for them until a subscription joins.
func (b *kafkaBroker) Declare(ctx context.Context, t broker.Topology) error {
	if b.closed.Load() {
		return broker.ErrClosed
	}
	if err := t.Validate(); err != nil {
		return fmt.Errorf("kafka: declare: %w", err)
	}
	// A queue with priorities is a queue per level (broker.Queue.Priorities).
	t = t.Expanded()
	for _, q := range t.Queues {
		if q.Name == t.Exchange {
			return fmt.Errorf("kafka: declare: queue %s: a queue may not be named like its exchange (both are Kafka names)", q.Name)
		}
	}
	b.declMu.Lock()
	defer b.declMu.Unlock()
	b.mu.Lock()
	for _, q := range t.Queues {
		if qi, ok := b.queues[q.Name]; ok && qi.exchange != t.Exchange {
			b.mu.Unlock()
			return fmt.Errorf("kafka: declare: queue %s is already declared on exchange %s, not %s", q.Name, qi.exchange, t.Exchange)
		}
	}
	b.mu.Unlock()
	ctx, cancel := b.opContext(ctx)
	defer cancel()
	if err := b.ensureTopics(ctx, b.specsFor(t)); err != nil {
		if b.closed.Load() {
			return broker.ErrClosed
		}
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.topos[t.Exchange]
	if d == nil {
		d = &declared{topology: broker.Topology{Exchange: t.Exchange}}
		b.topos[t.Exchange] = d
	}
	for _, q := range t.Queues {
		replaced := false
		for i, old := range d.topology.Queues {
			if old.Name == q.Name {
				d.topology.Queues[i] = q
				replaced = true
			}
		}
		if !replaced {
			d.topology.Queues = append(d.topology.Queues, q)
		}
		qi := &queueInfo{queue: q, exchange: t.Exchange, topic: TopicName(t.Exchange), dlqTopic: DLQTopicName(q.Name)}
		for i := range q.Delays() {
			qi.retryTopics = append(qi.retryTopics, RetryTopicName(q.Name, i))
		}
		b.queues[q.Name] = qi
	}
	b.current = t.Exchange
	return nil
}

// ensureTopics creates the missing topics of specs and checks the settings
// of the existing ones.
func (b *kafkaBroker) ensureTopics(ctx context.Context, specs []topicSpec) error {
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.name
	}
	existing, err := b.topics(ctx, names)
	if err != nil {
		return fmt.Errorf("kafka: declare: %w", err)
	}
	var create []kafkago.TopicConfig
	for _, s := range specs {
		if _, ok := existing[s.name]; ok {
			continue
		}
		tc := kafkago.TopicConfig{Topic: s.name, NumPartitions: s.partitions, ReplicationFactor: b.replication}
		if s.compact {
			tc.ConfigEntries = []kafkago.ConfigEntry{{ConfigName: "cleanup.policy", ConfigValue: "compact"}}
		}
		if s.retention > 0 {
			tc.ConfigEntries = append(tc.ConfigEntries, kafkago.ConfigEntry{ConfigName: "retention.ms", ConfigValue: strconv.FormatInt(s.retention.Milliseconds(), 10)})
		}
		create = append(create, tc)
	}
	if len(create) > 0 {
		res, err := b.client.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: create})
		if err != nil {
			return fmt.Errorf("kafka: declare: create topics: %w", err)
		}
		for name, terr := range res.Errors {
			if terr != nil && !errors.Is(terr, kafkago.TopicAlreadyExists) {
				return fmt.Errorf("kafka: declare: create topic %s: %w", name, terr)
			}
		}
		// Wait until the new topics have leaders, so the first write does
		// not race their creation.
		for {
			existing, err = b.topics(ctx, names)
			if err == nil && len(existing) == len(names) && allLed(existing) && b.leadersServe(ctx, create) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("kafka: declare: topics not ready: %w", ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	// Check the settings of every topic, also those created just now by
	// another process with other settings.
	var res []kafkago.DescribeConfigRequestResource
	for _, s := range specs {
		t := existing[s.name]
		if len(t.Partitions) != s.partitions {
			return fmt.Errorf("%w: kafka: topic %s has %d partitions, ferry declares %d (Config.Partitions; the DLQ topic has 1)",
				broker.ErrTopologyMismatch, s.name, len(t.Partitions), s.partitions)
		}
		if len(t.Partitions) > 0 && len(t.Partitions[0].Replicas) != b.replication {
			return fmt.Errorf("%w: kafka: topic %s has replication factor %d, ferry declares %d (Config.ReplicationFactor)",
				broker.ErrTopologyMismatch, s.name, len(t.Partitions[0].Replicas), b.replication)
		}
		res = append(res, kafkago.DescribeConfigRequestResource{ResourceType: kafkago.ResourceTypeTopic, ResourceName: s.name, ConfigNames: []string{"cleanup.policy"}})
	}
	dc, err := b.client.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{Resources: res})
	if err != nil {
		return fmt.Errorf("kafka: declare: describe topics: %w", err)
	}
	want := map[string]string{}
	for _, s := range specs {
		want[s.name] = "delete"
		if s.compact {
			want[s.name] = "compact"
		}
	}
	for _, r := range dc.Resources {
		if r.Error != nil {
			return fmt.Errorf("kafka: declare: describe topic %s: %w", r.ResourceName, r.Error)
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName == "cleanup.policy" && e.ConfigValue != want[r.ResourceName] {
				return fmt.Errorf("%w: kafka: topic %s has cleanup.policy=%s, ferry declares %s",
					broker.ErrTopologyMismatch, r.ResourceName, e.ConfigValue, want[r.ResourceName])
			}
		}
	}
	return nil
}

func allLed(ts map[string]kafkago.Topic) bool {
	for _, t := range ts {
		if len(t.Partitions) == 0 {
			return false
		}
		for _, p := range t.Partitions {
			if p.Leader.Host == "" || p.Error != nil {
				return false
			}
		}
	}
	return true
}

// leadersServe reports whether every partition of the topics answers a
// ListOffsets: metadata names a leader a moment before it serves.
func (b *kafkaBroker) leadersServe(ctx context.Context, topics []kafkago.TopicConfig) bool {
	req := map[string][]kafkago.OffsetRequest{}
	for _, t := range topics {
		for p := 0; p < t.NumPartitions; p++ {
			req[t.Topic] = append(req[t.Topic], kafkago.LastOffsetOf(p))
		}
	}
	res, err := b.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: req})
	if err != nil {
		return false
	}
	for _, ps := range res.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return false
			}
		}
	}
	return true
}

// topics returns the metadata of the named topics that exist, asked of
// the cluster now: kafka-go's Transport answers metadata requests from a
// cache refreshed every MetadataTTL, which would miss a topic another
// process created a moment ago, so this uses a transport of its own for
// the one request. The request never creates a topic.
func (b *kafkaBroker) topics(ctx context.Context, names []string) (map[string]kafkago.Topic, error) {
	t := &kafkago.Transport{DialTimeout: b.cfg.DialTimeout, ClientID: b.cfg.ClientID, MetadataTopics: names}
	defer t.CloseIdleConnections()
	c := &kafkago.Client{Addr: b.addr, Transport: t, Timeout: b.cfg.PublishTimeout}
	md, err := c.Metadata(ctx, &kafkago.MetadataRequest{Topics: names})
	if err != nil {
		return nil, err
	}
	out := map[string]kafkago.Topic{}
	for _, t := range md.Topics {
		if t.Error != nil {
			if errors.Is(t.Error, kafkago.UnknownTopicOrPartition) {
				continue
			}
			if errors.Is(t.Error, kafkago.LeaderNotAvailable) {
				continue
			}
			return nil, fmt.Errorf("topic %s: %w", t.Name, t.Error)
		}
		out[t.Name] = t
	}
	return out, nil
}

// topicExists reports whether the topic exists on the cluster.
func (b *kafkaBroker) topicExists(ctx context.Context, name string) (bool, error) {
	ts, err := b.topics(ctx, []string{name})
	if err != nil {
		return false, fmt.Errorf("kafka: look up topic %s: %w", name, err)
	}
	_, ok := ts[name]
	return ok, nil
}

// redeclare creates the topics of the exchange's declared topology again
// (after an operator or a test deleted them).
func (b *kafkaBroker) redeclare(ctx context.Context, exchange string) error {
	b.mu.Lock()
	d := b.topos[exchange]
	var t broker.Topology
	if d != nil {
		t = d.topology
		t.Queues = append([]broker.Queue(nil), d.topology.Queues...)
	}
	b.mu.Unlock()
	if d == nil {
		return fmt.Errorf("kafka: exchange %s is not declared", exchange)
	}
	b.declMu.Lock()
	defer b.declMu.Unlock()
	b.log.Warn("topics missing; declaring them again", "exchange", exchange)
	err := b.ensureTopics(ctx, b.specsFor(t))
	// Drop the transport's cached metadata, so produce sees the topics at
	// once.
	b.transport.CloseIdleConnections()
	return err
}

func (b *kafkaBroker) queueInfo(name string) (*queueInfo, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	qi, ok := b.queues[name]
	return qi, ok
}

// opContext applies Config.PublishTimeout when ctx has no deadline, and
// ends the context when the broker is closed.
func (b *kafkaBroker) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	var cancel context.CancelFunc
	if _, ok := ctx.Deadline(); ok {
		ctx, cancel = context.WithCancel(ctx)
	} else {
		ctx, cancel = context.WithTimeout(ctx, b.cfg.PublishTimeout)
	}
	stop := context.AfterFunc(b.closeCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

// Close closes every subscription's consumer group (leaving the group, so
// unsettled messages go to another member at once) and ends the writes
// in flight (their produce requests are bound to a context Close ends;
// nothing is flushed later). It returns within about 5s even when the
// cluster is unreachable.
func (b *kafkaBroker) Close() error {
	if !b.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(b.done)
	b.closeFn()
	b.mu.Lock()
	subs := make([]*subscription, 0, len(b.subs))
	for s := range b.subs {
		subs = append(subs, s)
	}
	b.mu.Unlock()
	finished := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		for _, s := range subs {
			wg.Add(1)
			go func() { defer wg.Done(); s.shutdown() }()
		}
		wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-time.After(4 * time.Second):
		b.log.Warn("close: the cluster did not answer in time; connections are dropped")
	}
	b.transport.CloseIdleConnections()
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
