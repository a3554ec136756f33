package rabbitmq_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker"
)

// TestWorkerRefusesHandlerTimeoutPastConsumerTimeout: a handler allowed
// to run longer than the server's consumer_timeout would have its channel
// closed under it and its message redelivered (and handled twice), so the
// worker refuses to start, naming both settings and a value that works;
// at that value it starts.
func TestWorkerRefusesHandlerTimeoutPastConsumerTimeout(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := config()
	cfg.ConsumerTimeout = time.Minute
	b, err := rabbitmq.New(ctx, cfg)
	require.NoError(t, err)
	defer b.Close()
	tp := topology(t, time.Second)
	run := func(handlerTimeout time.Duration) error {
		w, err := worker.New(worker.Config{Consumer: "limits", Queue: tp.Queues[0].Name, Topology: tp, Pool: pool, Broker: b,
			Handler:        func(context.Context, pgx.Tx, *broker.Message) error { return nil },
			HandlerTimeout: handlerTimeout})
		require.NoError(t, err)
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		defer rcancel()
		return w.Run(rctx)
	}
	err = run(2 * time.Minute)
	require.ErrorIs(t, err, worker.ErrInvalidConfig)
	t.Log(err)
	for _, w := range []string{"worker.Config.HandlerTimeout", "--handler-timeout", "= 2m0s", "rabbitmq.Config.ConsumerTimeout (ferry --rabbitmq-consumer-timeout;", "consumer_timeout", "= 1m0s", "below 1m0s, e.g. 54s"} {
		require.Contains(t, err.Error(), w)
	}
	require.NoError(t, run(54*time.Second), "the value the error names works")
	require.NoError(t, run(0), "no handler timeout: nothing to contradict")
}

// TestWorkerRefusesPolicyDeliveryLimitBelowMaxAttempts: an operator
// policy's delivery-limit on a quorum work queue (RabbitMQ applies it over
// ferry's higher x-delivery-limit) below the worker's attempts would let
// RabbitMQ dead-letter a message whose settlements were lost before the
// worker's last attempt; with Config.ManagementURL the adapter reads it
// and the worker refuses to start, naming the policy, --max-attempts and
// values that work; at such a value it starts.
func TestWorkerRefusesPolicyDeliveryLimitBelowMaxAttempts(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := config()
	cfg.QueueType = rabbitmq.QueueTypeQuorum
	cfg.ManagementURL = testenv.RabbitMQManagementURL()
	b, err := rabbitmq.New(ctx, cfg)
	require.NoError(t, err)
	defer b.Close()
	tp := topology(t, time.Second)
	work := tp.Queues[0].Name
	run := func(attempts int) error {
		w, err := worker.New(worker.Config{Consumer: "limits", Queue: work, Topology: tp, Pool: pool, Broker: b,
			Handler: func(context.Context, pgx.Tx, *broker.Message) error { return nil },
			Policy:  worker.BackoffPolicy{MaxAttempts: attempts, Delays: []time.Duration{time.Second}}})
		require.NoError(t, err)
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		defer rcancel()
		return w.Run(rctx)
	}
	require.NoError(t, run(5), "no policy: ferry's own x-delivery-limit limits nothing")

	setPolicy(t, work, map[string]any{"delivery-limit": 3})
	require.Eventually(t, func() bool {
		var q struct {
			Effective map[string]any `json:"effective_policy_definition"`
		}
		mgmt(t, "/api/queues/%2F/"+url.PathEscape(work), &q)
		return q.Effective["delivery-limit"] != nil
	}, 45*time.Second, 200*time.Millisecond, "the policy never showed on the queue in the management API (its statistics are refreshed every few seconds)")
	err = run(5)
	require.ErrorIs(t, err, worker.ErrInvalidConfig)
	t.Log(err)
	for _, w := range []string{"--max-attempts", "= 5", "delivery-limit of RabbitMQ queue", "ferry-test-" + work, "= 3", "at most 2", "at least 6"} {
		require.Contains(t, err.Error(), w)
	}
	require.NoError(t, run(2), "the value the error names works")
}
