package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/broker/brokertest"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker/workertest"
)

func connect(ctx context.Context, tb testing.TB) (broker.Broker, error) {
	tb.Helper()
	testenv.RequireTCP(tb, "kafka", testenv.KafkaBrokers()[0])
	return kafka.New(ctx, kafka.Config{Brokers: testenv.KafkaBrokers()})
}

// newBroker connects a broker, closed when the test ends.
func newBroker(tb testing.TB) broker.Broker {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := connect(ctx, tb)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = b.Close() })
	return b
}

// removeTopology deletes every topic of t (kafka.TopicNames) and the
// queues' consumer groups and returns what failed. A subscription or
// publisher running meanwhile declares the topics again on its next
// failure. A group with a live member cannot be deleted (Kafka answers
// NON_EMPTY_GROUP, KIP-229); that is not an error here: under a running
// consumer the topics are the topology, and the group's offsets of a
// deleted topic go with it.
func removeTopology(ctx context.Context, t broker.Topology) error {
	c := &kafkago.Client{Addr: kafkago.TCP(testenv.KafkaBrokers()...), Timeout: 10 * time.Second}
	var errs []error
	tr, err := c.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: kafka.TopicNames(t)})
	if err != nil {
		errs = append(errs, fmt.Errorf("delete topics of %s: %w", t.Exchange, err))
	} else {
		for topic, terr := range tr.Errors {
			if terr != nil && !errors.Is(terr, kafkago.UnknownTopicOrPartition) {
				errs = append(errs, fmt.Errorf("delete topic %s: %w", topic, terr))
			}
		}
	}
	var groups []string
	for _, q := range t.Queues {
		groups = append(groups, kafka.GroupID(q.Name))
	}
	gr, err := c.DeleteGroups(ctx, &kafkago.DeleteGroupsRequest{GroupIDs: groups})
	if err != nil {
		errs = append(errs, fmt.Errorf("delete groups of %s: %w", t.Exchange, err))
	} else {
		for group, gerr := range gr.Errors {
			if gerr != nil && !errors.Is(gerr, kafkago.NonEmptyGroup) && !errors.Is(gerr, kafkago.GroupIdNotFound) {
				errs = append(errs, fmt.Errorf("delete group %s: %w", group, gerr))
			}
		}
	}
	return errors.Join(errs...)
}

// deleteTopology is removeTopology for a clean-up: it logs what failed.
func deleteTopology(ctx context.Context, tb testing.TB, t broker.Topology) {
	if err := removeTopology(ctx, t); err != nil {
		tb.Logf("clean-up: %v", err)
	}
}

func TestConformance(t *testing.T) {
	brokertest.RunConformance(t, brokertest.Harness{
		New: func(ctx context.Context, t *testing.T) (broker.Broker, error) {
			return connect(ctx, t)
		},
		StopServer:  func(t *testing.T) { testenv.Services(t, "stop", "kafka") },
		StartServer: func(t *testing.T) { testenv.Services(t, "start", "kafka") },
		DeleteTopology: func(ctx context.Context, t *testing.T, topo broker.Topology) {
			deleteTopology(ctx, t, topo)
		},
		RemoveTopology: func(ctx context.Context, _ *testing.T, topo broker.Topology) error {
			return removeTopology(ctx, topo)
		},
		Poison: func(ctx context.Context, t *testing.T, _ broker.Broker, tp broker.Topology, id, typ string) *broker.Message {
			lowerMaxMessageBytes(ctx, t, kafka.TopicName(tp.Exchange), 4096)
			return &broker.Message{ID: id, Type: typ, Key: "poison", Body: make([]byte, 8192)}
		},
	})
}

// lowerMaxMessageBytes sets the topic's max.message.bytes, so that a
// record larger than that, which the adapter's own check (the broker's
// message.max.bytes) lets through, makes Kafka refuse its partition's
// whole record batch with MESSAGE_TOO_LARGE.
func lowerMaxMessageBytes(ctx context.Context, t *testing.T, topic string, n int) {
	t.Helper()
	c := &kafkago.Client{Addr: kafkago.TCP(testenv.KafkaBrokers()...), Timeout: 10 * time.Second}
	res, err := c.IncrementalAlterConfigs(ctx, &kafkago.IncrementalAlterConfigsRequest{Resources: []kafkago.IncrementalAlterConfigsRequestResource{{
		ResourceType: kafkago.ResourceTypeTopic, ResourceName: topic,
		Configs: []kafkago.IncrementalAlterConfigsRequestConfig{{Name: "max.message.bytes", Value: fmt.Sprint(n), ConfigOperation: kafkago.ConfigOperationSet}},
	}}})
	require.NoError(t, err)
	for _, r := range res.Resources {
		require.NoError(t, r.Error)
	}
	// The change reaches the partition's log asynchronously (KRaft
	// metadata): wait until the broker reports it, then a little more.
	require.Eventually(t, func() bool {
		d, err := c.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{Resources: []kafkago.DescribeConfigRequestResource{{
			ResourceType: kafkago.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"max.message.bytes"}}}})
		if err != nil || len(d.Resources) != 1 || len(d.Resources[0].ConfigEntries) != 1 {
			return false
		}
		return d.Resources[0].ConfigEntries[0].ConfigValue == fmt.Sprint(n)
	}, 10*time.Second, 50*time.Millisecond, "topic %s reports max.message.bytes %d", topic, n)
	time.Sleep(time.Second)
}

func TestWorkerSuite(t *testing.T) {
	workertest.RunWorkerSuite(t, newBroker)
}

// TestBatchKill kills a worker process (SIGKILL) right after a batch's
// commit and in the middle of a batch; see workertest.RunBatchKillSuite.
// The killed consumer's partitions come back after its session timeout:
// 6 s (the broker's group.min.session.timeout.ms) instead of 10 s.
func TestBatchKill(t *testing.T) {
	workertest.RunBatchKillSuite(t, func(tb testing.TB) broker.Broker {
		tb.Helper()
		testenv.RequireTCP(tb, "kafka", testenv.KafkaBrokers()[0])
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, err := kafka.New(ctx, kafka.Config{Brokers: testenv.KafkaBrokers(), SessionTimeout: 6 * time.Second})
		require.NoError(tb, err)
		tb.Cleanup(func() { _ = b.Close() })
		return b
	})
}
