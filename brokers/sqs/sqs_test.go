package sqs_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/broker/brokertest"
	"github.com/ferrymq/ferry/brokers/sqs"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker/workertest"
)

func TestMain(m *testing.M) {
	// ElasticMQ accepts any credentials; the SDK needs some.
	if os.Getenv("AWS_ACCESS_KEY_ID") == "" {
		os.Setenv("AWS_ACCESS_KEY_ID", "ferry")
		os.Setenv("AWS_SECRET_ACCESS_KEY", "ferry")
	}
	os.Exit(m.Run())
}

func config() sqs.Config {
	return sqs.Config{Endpoint: testenv.SQSEndpoint(), Region: testenv.AWSRegion(), WaitTime: 2 * time.Second}
}

func connectCfg(ctx context.Context, tb testing.TB, cfg sqs.Config) (*sqs.Broker, error) {
	tb.Helper()
	testenv.RequireTCP(tb, "sqs", testenv.HostPort(testenv.SQSEndpoint()))
	return sqs.New(ctx, cfg)
}

func connect(ctx context.Context, tb testing.TB) (broker.Broker, error) {
	return connectCfg(ctx, tb, config())
}

// deleteTopology deletes the SQS queues (work queue and DLQ) of t.
func deleteTopology(ctx context.Context, tb testing.TB, t broker.Topology, fifo bool) {
	cfg := config()
	b, err := sqs.New(ctx, cfg)
	if err != nil {
		tb.Logf("delete topology %s: %v", t.Exchange, err)
		return
	}
	defer b.Close()
	for _, q := range t.Queues {
		for _, n := range []string{sqs.QueueName(t.Exchange, q.Name, fifo), sqs.QueueName(t.Exchange, broker.DLQName(q.Name), fifo)} {
			u, err := b.Client().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(n)})
			if err != nil {
				continue
			}
			if _, err := b.Client().DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: u.QueueUrl}); err != nil {
				tb.Logf("delete queue %s: %v", n, err)
			}
		}
	}
}

// cleaningBroker deletes the topologies declared through it when the test
// ends.
type cleaningBroker struct {
	broker.Broker
	mu   sync.Mutex
	tops []broker.Topology
	fifo bool
}

func (c *cleaningBroker) Declare(ctx context.Context, t broker.Topology) error {
	c.mu.Lock()
	c.tops = append(c.tops, t)
	c.mu.Unlock()
	return c.Broker.Declare(ctx, t)
}

func newBrokerCfg(tb testing.TB, cfg sqs.Config) broker.Broker {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := connectCfg(ctx, tb, cfg)
	require.NoError(tb, err)
	cb := &cleaningBroker{Broker: b, fifo: cfg.FIFO}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cb.mu.Lock()
		defer cb.mu.Unlock()
		for _, t := range cb.tops {
			deleteTopology(ctx, tb, t, cb.fifo)
		}
	})
	tb.Cleanup(func() { _ = b.Close() })
	return cb
}

func newBroker(tb testing.TB) broker.Broker { return newBrokerCfg(tb, config()) }

func TestConformance(t *testing.T) {
	brokertest.RunConformance(t, brokertest.Harness{
		New: func(ctx context.Context, t *testing.T) (broker.Broker, error) {
			return connect(ctx, t)
		},
		StopServer:  func(t *testing.T) { testenv.Services(t, "stop", "sqs") },
		StartServer: func(t *testing.T) { testenv.Services(t, "start", "sqs") },
		DeleteTopology: func(ctx context.Context, t *testing.T, topo broker.Topology) {
			deleteTopology(ctx, t, topo, false)
		},
	})
}

func TestWorkerSuite(t *testing.T) {
	workertest.RunWorkerSuite(t, newBroker)
}

// TestDLQWhereNamesTheSQSQueue: Where names the SQS queue that holds the
// DLQ, the name the AWS console and ListQueues show (not ferry's logical
// "<queue>.dlq"), for the declaring broker and for a tool that never
// declared, and that queue exists on the server.
func TestDLQWhereNamesTheSQSQueue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ex, q := testenv.UniqueName("where.ex"), testenv.UniqueName("where.q")
	tp := broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: q, Bindings: []string{"evt.where"}}}}
	b := newBroker(t)
	require.NoError(t, b.Declare(ctx, tp))
	real := sqs.QueueName(ex, broker.DLQName(q), false)
	require.NotEqual(t, broker.DLQName(q), real)
	for i, br := range []broker.Broker{b, newBroker(t)} {
		d, err := br.DLQ(q)
		require.NoError(t, err)
		where, err := d.Where(ctx)
		require.NoError(t, err, "broker %d", i)
		require.Equal(t, `SQS queue "`+real+`"`, where, "broker %d", i)
	}
	tool, err := sqs.New(ctx, config())
	require.NoError(t, err)
	defer tool.Close()
	_, err = tool.Client().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(real)})
	require.NoError(t, err, "the queue Where names exists on the server")
}
