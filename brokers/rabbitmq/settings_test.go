package rabbitmq_test

import (
	"context"
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
	for _, w := range []string{"worker.Config.HandlerTimeout", "--handler-timeout", "= 2m0s", "rabbitmq.Config.ConsumerTimeout", "consumer_timeout", "= 1m0s", "below 1m0s, e.g. 54s"} {
		require.Contains(t, err.Error(), w)
	}
	require.NoError(t, run(54*time.Second), "the value the error names works")
	require.NoError(t, run(0), "no handler timeout: nothing to contradict")
}
