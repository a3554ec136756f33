package sqs_test

import (
	"context"
	"fmt"
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
	testenv.RequireTCP(tb, "sqs", testenv.HostPort(cfg.Endpoint))
	return sqs.New(ctx, cfg)
}

func connect(ctx context.Context, tb testing.TB) (broker.Broker, error) {
	return connectCfg(ctx, tb, config())
}

// deleteTopology deletes the SQS queues (work queue and DLQ) of t on
// ElasticMQ.
func deleteTopology(ctx context.Context, tb testing.TB, t broker.Topology, fifo bool) {
	deleteTopologyAt(ctx, tb, testenv.SQSEndpoint(), t, fifo)
}

// deleteTopologyAt deletes the SQS queues (work queue and DLQ) of t on
// the server at endpoint.
func deleteTopologyAt(ctx context.Context, tb testing.TB, endpoint string, t broker.Topology, fifo bool) {
	cfg := config()
	cfg.Endpoint = endpoint
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

// removeTopologyAt deletes the SQS queues of t (work queues and DLQs) on
// the server at endpoint at once, as an operator's mistake would, failing
// when one cannot be deleted.
func removeTopologyAt(ctx context.Context, endpoint string, t broker.Topology) error {
	cfg := config()
	cfg.Endpoint = endpoint
	b, err := sqs.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer b.Close()
	for _, q := range t.Queues {
		// The DLQ first: a process that finds the work queue gone declares
		// both again, and must not find the old DLQ still there and then
		// see it deleted.
		for _, n := range []string{sqs.QueueName(t.Exchange, broker.DLQName(q.Name), false), sqs.QueueName(t.Exchange, q.Name, false)} {
			u, err := b.Client().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(n)})
			if err != nil {
				return fmt.Errorf("remove topology: find %s: %w", n, err)
			}
			if _, err := b.Client().DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: u.QueueUrl}); err != nil {
				return fmt.Errorf("remove topology: delete %s: %w", n, err)
			}
		}
	}
	return nil
}

// cleaningBroker deletes the topologies declared through it when the test
// ends.
type cleaningBroker struct {
	broker.Broker
	mu       sync.Mutex
	tops     []broker.Topology
	fifo     bool
	endpoint string
}

// Unwrap returns the adapter, so the worker finds its broker.LimitReporter.
func (c *cleaningBroker) Unwrap() broker.Broker { return c.Broker }

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
	cb := &cleaningBroker{Broker: b, fifo: cfg.FIFO, endpoint: cfg.Endpoint}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cb.mu.Lock()
		defer cb.mu.Unlock()
		for _, t := range cb.tops {
			deleteTopologyAt(ctx, tb, cb.endpoint, t, cb.fifo)
		}
	})
	tb.Cleanup(func() { _ = b.Close() })
	return cb
}

func newBroker(tb testing.TB) broker.Broker { return newBrokerCfg(tb, config()) }

// TestConformance runs the conformance suite on ElasticMQ, whose outage
// (services.sh stop sqs) is a pause: ElasticMQ 1.6.11 loses confirmed
// messages when really stopped.
func TestConformance(t *testing.T) { conformance(t, sqsServers()[0]) }

// TestConformanceMoto runs the same suite on moto, the second SQS
// implementation, so that no behaviour the suite checks is one server's
// quirk; its outage (services.sh stop moto) is a pause too: moto keeps
// everything in memory, and a real stop loses the queues. One poller per
// subscription: moto 5.1 can hand one message to two concurrent
// ReceiveMessage calls (TestServersDiffer), which AWS does not do within
// the visibility timeout.
func TestConformanceMoto(t *testing.T) { conformance(t, sqsServers()[1]) }

func conformance(t *testing.T, srv sqsServer) {
	brokertest.RunConformance(t, brokertest.Harness{
		New: func(ctx context.Context, t *testing.T) (broker.Broker, error) {
			// A 1 s long poll: a poll ElasticMQ leaves unanswered because
			// TopologyDeleted deleted its queue is abandoned after 3 s.
			cfg := config()
			cfg.Endpoint = srv.endpoint
			cfg.WaitTime = time.Second
			if srv.name == "moto" {
				cfg.ReceivePollers = 1
			}
			testenv.RequireTCP(t, srv.role, testenv.HostPort(srv.endpoint))
			return sqs.New(ctx, cfg)
		},
		StopServer:  func(t *testing.T) { testenv.Services(t, "stop", srv.role) },
		StartServer: func(t *testing.T) { testenv.Services(t, "start", srv.role) },
		DeleteTopology: func(ctx context.Context, t *testing.T, topo broker.Topology) {
			deleteTopologyAt(ctx, t, srv.endpoint, topo, false)
		},
		RemoveTopology: func(ctx context.Context, t *testing.T, topo broker.Topology) error {
			return removeTopologyAt(ctx, srv.endpoint, topo)
		},
		Poison: srv.poison,
	})
}

func TestWorkerSuite(t *testing.T) {
	workertest.RunWorkerSuite(t, newBroker)
}

// TestBatchKill kills a worker process (SIGKILL) right after a batch's
// commit and in the middle of a batch; see workertest.RunBatchKillSuite.
func TestBatchKill(t *testing.T) {
	workertest.RunBatchKillSuite(t, newBroker)
}

// TestWorkerSuiteMoto runs the worker suite on moto, with make test-long
// (FERRY_SQS_MOTO_WORKER_SUITE=1): about 2 minutes, twice the suite on
// ElasticMQ, for no behaviour of the adapter the conformance suite on moto
// does not already check (moto spends about 20 ms of CPU per message).
func TestWorkerSuiteMoto(t *testing.T) {
	if os.Getenv("FERRY_SQS_MOTO_WORKER_SUITE") != "1" {
		t.Skip("the worker suite on moto runs with make test-long (FERRY_SQS_MOTO_WORKER_SUITE=1)")
	}
	workertest.RunWorkerSuite(t, func(tb testing.TB) broker.Broker {
		cfg := config()
		cfg.Endpoint = testenv.SQSMotoEndpoint()
		return newBrokerCfg(tb, cfg)
	})
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

// TestDLQUnknownQueueErrorNamesNoImpossibleQueue: a DLQ that is on no
// exchange, looked up without Config.LookupExchange (ferry dlq list
// --broker sqs without --exchange), is reported as searched on every
// exchange, not as an SQS queue "__<queue>-dlq" with an empty exchange
// prefix, a name ferry never creates; with LookupExchange the error names
// the one SQS queue it looked for.
func TestDLQUnknownQueueErrorNamesNoImpossibleQueue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := testenv.UniqueName("nosuch.q")
	b := newBroker(t)
	d, err := b.DLQ(q)
	require.NoError(t, err)
	_, err = d.List(ctx, 10)
	require.ErrorIs(t, err, broker.ErrUnknownQueue)
	require.NotContains(t, err.Error(), "SQS queue __", "no SQS queue name with an empty exchange prefix")
	require.Contains(t, err.Error(), "every exchange")
	require.Contains(t, err.Error(), sqs.QueueName("x", broker.DLQName(q), false)[len("x"):], "the name's suffix that was searched for")

	cfg := config()
	cfg.LookupExchange = testenv.UniqueName("nosuch.ex")
	lb := newBrokerCfg(t, cfg)
	d, err = lb.DLQ(q)
	require.NoError(t, err)
	_, err = d.List(ctx, 10)
	require.ErrorIs(t, err, broker.ErrUnknownQueue)
	require.Contains(t, err.Error(), sqs.QueueName(cfg.LookupExchange, broker.DLQName(q), false))
}

// TestFailedSettleFreesPrefetchSlot: a settle that fails (here Retry with
// a cancelled context; in production a network error or a deleted queue)
// gives back its prefetch slot, so a subscription whose settles fail
// keeps receiving instead of stopping once Prefetch settles have failed
// (the worker does not retry a failed settle).
func TestFailedSettleFreesPrefetchSlot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ex, q := testenv.UniqueName("slot.ex"), testenv.UniqueName("slot.q")
	tp := broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: q, Bindings: []string{"evt.slot"}}}}
	b := newBroker(t)
	require.NoError(t, b.Declare(ctx, tp))
	sub, err := b.Subscribe(ctx, q, broker.SubscribeOptions{Prefetch: 2, AckDeadline: 30 * time.Second})
	require.NoError(t, err)
	defer sub.Close()
	for i := range 4 {
		require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: fmt.Sprint("s", i), Type: "evt.slot", Body: []byte(`{}`)}}))
	}
	dead, stop := context.WithCancel(ctx)
	stop()
	seen := map[string]bool{}
	for range 2 {
		d, err := sub.Receive(ctx)
		require.NoError(t, err)
		seen[d.Message().ID] = true
		require.Error(t, d.Retry(dead, time.Second, "settle fails"), "Retry with a cancelled context fails")
	}
	for range 2 {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		d, err := sub.Receive(rctx)
		rcancel()
		require.NoError(t, err, "the subscription keeps receiving after 2 (= Prefetch) failed settles")
		require.False(t, seen[d.Message().ID], "a message whose visibility (30 s) has not ended")
		seen[d.Message().ID] = true
		require.NoError(t, d.Ack(ctx))
	}
	require.Len(t, seen, 4)
}
