package sqs_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker"
)

// TestWorkerRefusesContradictingSettings: a worker whose settings
// contradict the SQS queue's (the issue: MaxReceiveCount 3 with
// MaxAttempts 5 started without a word, and attempts 4 and 5 never
// happened) refuses to start, naming both settings and a value that
// works; at that value it starts.
func TestWorkerRefusesContradictingSettings(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	noop := func(context.Context, pgx.Tx, *broker.Message) error { return nil }
	run := func(t *testing.T, b broker.Broker, cfg worker.Config) error {
		t.Helper()
		tp := topology("limits", "evt.limits")
		cfg.Consumer, cfg.Pool, cfg.Broker, cfg.Handler = "limits", pool, b, noop
		cfg.Topology, cfg.Queue = tp, tp.Queues[0].Name
		w, err := worker.New(cfg)
		require.NoError(t, err, "New has no I/O; the broker's limits are read by Run")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return w.Run(ctx) // nil when it ran until the timeout
	}
	cases := []struct {
		name         string
		maxReceive   int
		cfg          worker.Config
		want         []string
		fixedReceive int
		fixed        worker.Config
	}{
		{
			name: "MaxReceiveCount below MaxAttempts", maxReceive: 3,
			cfg:          worker.Config{Policy: worker.BackoffPolicy{MaxAttempts: 5, Delays: []time.Duration{time.Second}}},
			want:         []string{"sqs.Config.MaxReceiveCount (ferry --sqs-max-receive-count;", "maxReceiveCount of the RedrivePolicy", "= 3", "--max-attempts", "= 5", "at most 2", "at least 6"},
			fixedReceive: 6, fixed: worker.Config{Policy: worker.BackoffPolicy{MaxAttempts: 5, Delays: []time.Duration{time.Second}}},
		},
		{
			name: "AckDeadline past the visibility limit",
			cfg:  worker.Config{AckDeadline: 13 * time.Hour},
			want: []string{"worker.Config.AckDeadline = 13h0m0s", "12h0m0s or less"},
		},
		{
			name: "HandlerTimeout past the visibility limit",
			cfg:  worker.Config{HandlerTimeout: 13 * time.Hour},
			want: []string{"worker.Config.HandlerTimeout", "--handler-timeout", "= 13h0m0s", "SQS's visibility limit", "below 12h0m0s"},
		},
		{
			name: "retries outlast the retention", maxReceive: 1000,
			cfg:  worker.Config{Policy: worker.BackoffPolicy{MaxAttempts: 30, Delays: []time.Duration{12 * time.Hour}}},
			want: []string{"--retry-delay", "--max-attempts", "MessageRetentionPeriod", "= 336h0m0s", "less than 336h0m0s"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := config()
			cfg.MaxReceiveCount = c.maxReceive
			err := run(t, newBrokerCfg(t, cfg), c.cfg)
			require.ErrorIs(t, err, worker.ErrInvalidConfig)
			for _, w := range c.want {
				require.Contains(t, err.Error(), w)
			}
			t.Log(err)
			if c.fixedReceive > 0 {
				cfg.MaxReceiveCount = c.fixedReceive
				require.NoError(t, run(t, newBrokerCfg(t, cfg), c.fixed), "the value the error names works")
			}
		})
	}
}

// TestBacklog: the work queue's approximate message count and its
// retention are reported (ferry_queue_messages,
// ferry_queue_retention_seconds); SQS tells the age of the oldest message
// only in CloudWatch, so OldestAge is 0.
func TestBacklog(t *testing.T) {
	tp := topology("backlog", "evt.backlog")
	b := declaredRaw(t, config(), tp)
	ctx := ctxFor(t, 30*time.Second)
	queue := tp.Queues[0].Name
	require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: "1", Type: "evt.backlog"}, {ID: "2", Type: "evt.backlog"}}))
	var bl broker.Backlog
	require.Eventually(t, func() bool {
		var err error
		bl, err = b.Backlog(ctx, queue)
		require.NoError(t, err)
		return bl.Messages == 2
	}, 10*time.Second, 200*time.Millisecond, "approximate count: %+v", bl)
	require.Equal(t, 14*24*time.Hour, bl.Retention)
	require.Zero(t, bl.OldestAge)
	_, err := b.Backlog(ctx, "nope")
	require.ErrorIs(t, err, broker.ErrUnknownQueue)
}
