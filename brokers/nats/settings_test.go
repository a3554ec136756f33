package nats_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker"
)

// Unwrap returns the adapter, so the worker finds its broker.LimitReporter.
func (c *cleaningBroker) Unwrap() broker.Broker { return c.Broker }

// TestWorkerRefusesMaxDeliverBelowMaxAttempts: an operator gave the
// queue's JetStream consumer a MaxDeliver (Declare keeps it on an
// existing consumer) below the worker's attempts: JetStream would stop
// delivering a failing message after MaxDeliver deliveries, before the
// worker's last attempt could dead-letter it, so the worker refuses to
// start, naming both settings and a value that works; at that value it
// starts.
func TestWorkerRefusesMaxDeliverBelowMaxAttempts(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	b := newBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tp := broker.Topology{Exchange: testenv.UniqueName("limits"), Queues: []broker.Queue{{
		Name: testenv.UniqueName("limits.q"), Bindings: []string{"evt.limits"}, RetryDelays: []time.Duration{time.Second}}}}
	require.NoError(t, b.Declare(ctx, tp))

	nc, err := natsgo.Connect(testenv.NATSURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	stream, consumer := nats.StreamName(tp.Exchange), nats.StreamName(tp.Queues[0].Name)
	c, err := js.Consumer(ctx, stream, consumer)
	require.NoError(t, err)
	cc := c.CachedInfo().Config
	cc.MaxDeliver = 3
	_, err = js.UpdateConsumer(ctx, stream, cc)
	require.NoError(t, err)

	run := func(attempts int) error {
		w, err := worker.New(worker.Config{Consumer: "limits", Queue: tp.Queues[0].Name, Topology: tp, Pool: pool, Broker: b,
			Handler: func(context.Context, pgx.Tx, *broker.Message) error { return nil },
			Policy:  worker.BackoffPolicy{MaxAttempts: attempts, Delays: []time.Duration{time.Second}}})
		require.NoError(t, err)
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		defer rcancel()
		return w.Run(rctx)
	}
	err = run(5)
	require.ErrorIs(t, err, worker.ErrInvalidConfig)
	t.Log(err)
	for _, w := range []string{"--max-attempts", "= 5", "MaxDeliver of JetStream consumer", consumer, "= 3", "at most 2", "at least 6"} {
		require.Contains(t, err.Error(), w)
	}
	require.NoError(t, run(2), "the value the error names works")
}

// TestBacklog: the queue's consumer's pending messages and the age of
// the oldest are reported (ferry_queue_messages,
// ferry_queue_oldest_message_age_seconds), with no retention: ferry's
// stream keeps a message until every queue acknowledged it.
func TestBacklog(t *testing.T) {
	b := newBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tp := broker.Topology{Exchange: testenv.UniqueName("backlog"), Queues: []broker.Queue{{
		Name: testenv.UniqueName("backlog.q"), Bindings: []string{"evt.*"}}}}
	require.NoError(t, b.Declare(ctx, tp))
	br := b.(*cleaningBroker).Broker.(broker.BacklogReporter)
	queue := tp.Queues[0].Name
	bl, err := br.Backlog(ctx, queue)
	require.NoError(t, err)
	require.Equal(t, broker.Backlog{}, bl)
	require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: "1", Type: "evt.a"}, {ID: "2", Type: "evt.b"}, {ID: "3", Type: "evt.c"}}))
	time.Sleep(time.Second)
	bl, err = br.Backlog(ctx, queue)
	require.NoError(t, err)
	t.Logf("backlog: %+v", bl)
	require.Equal(t, int64(3), bl.Messages)
	require.GreaterOrEqual(t, bl.OldestAge, 900*time.Millisecond)
	require.Zero(t, bl.Retention)
	_, err = br.Backlog(ctx, "nope")
	require.ErrorIs(t, err, broker.ErrUnknownQueue)
}
