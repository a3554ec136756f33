package kafka_test

import (
	"context"
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

// deleteTopology deletes every topic of t (kafka.TopicNames) and the
// queues' consumer groups. A subscription or publisher running meanwhile
// declares the topics again on its next failure.
func deleteTopology(ctx context.Context, tb testing.TB, t broker.Topology) {
	c := &kafkago.Client{Addr: kafkago.TCP(testenv.KafkaBrokers()...), Timeout: 10 * time.Second}
	if _, err := c.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: kafka.TopicNames(t)}); err != nil {
		tb.Logf("delete topics of %s: %v", t.Exchange, err)
	}
	var groups []string
	for _, q := range t.Queues {
		groups = append(groups, kafka.GroupID(q.Name))
	}
	if _, err := c.DeleteGroups(ctx, &kafkago.DeleteGroupsRequest{GroupIDs: groups}); err != nil {
		tb.Logf("delete groups of %s: %v", t.Exchange, err)
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
	})
}

func TestWorkerSuite(t *testing.T) {
	workertest.RunWorkerSuite(t, newBroker)
}
