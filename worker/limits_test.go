package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker"
	"github.com/ferrymq/ferry/worker/workertest"
)

// TestCheckLimits: each pair of a worker setting and a broker limit that
// must agree is refused when they contradict, with an error naming both
// settings and a value that works, and accepted at that value. No server
// is needed: the adapters' integration tests check that Run refuses what
// they report.
func TestCheckLimits(t *testing.T) {
	sqsLike := broker.Capabilities{Name: "sqs", NativeDelay: true, MaxDelay: 12 * time.Hour, CountsRedeliveries: true}
	cases := []struct {
		name   string
		cfg    worker.Config
		caps   broker.Capabilities
		limits broker.Limits
		want   []string // in the error; nil: accepted
	}{
		{
			name:   "redrive count below max attempts",
			cfg:    worker.Config{Policy: worker.BackoffPolicy{MaxAttempts: 5}},
			caps:   sqsLike,
			limits: broker.Limits{DeliveryLimit: 3, DeliveryLimitSetting: "sqs.Config.MaxReceiveCount"},
			want:   []string{"--max-attempts", "MaxAttempts", "5", "sqs.Config.MaxReceiveCount = 3", "at most 2", "at least 6"},
		},
		{
			name:   "redrive count equal to max attempts",
			cfg:    worker.Config{Policy: worker.BackoffPolicy{MaxAttempts: 3}},
			caps:   sqsLike,
			limits: broker.Limits{DeliveryLimit: 3, DeliveryLimitSetting: "sqs.Config.MaxReceiveCount"},
			want:   []string{"at most 2", "at least 4"},
		},
		{
			name:   "redrive count above max attempts",
			cfg:    worker.Config{Policy: worker.BackoffPolicy{MaxAttempts: 2}},
			caps:   sqsLike,
			limits: broker.Limits{DeliveryLimit: 3, DeliveryLimitSetting: "sqs.Config.MaxReceiveCount"},
		},
		{
			name:   "default policy against JetStream MaxDeliver",
			cfg:    worker.Config{},
			caps:   broker.Capabilities{Name: "nats"},
			limits: broker.Limits{DeliveryLimit: 4, DeliveryLimitSetting: "the MaxDeliver of JetStream consumer"},
			want:   []string{"MaxAttempts", "5", "MaxDeliver", "at least 6"},
		},
		{
			name:   "ack deadline above the visibility limit",
			cfg:    worker.Config{AckDeadline: 13 * time.Hour},
			caps:   sqsLike,
			limits: broker.Limits{MaxAckDeadline: 12 * time.Hour, MaxAckDeadlineSetting: "SQS's longest visibility timeout"},
			want:   []string{"worker.Config.AckDeadline = 13h0m0s", "visibility", "12h0m0s or less"},
		},
		{
			name:   "ack deadline at the visibility limit",
			cfg:    worker.Config{AckDeadline: 12 * time.Hour},
			caps:   sqsLike,
			limits: broker.Limits{MaxAckDeadline: 12 * time.Hour},
		},
		{
			name:   "handler timeout past consumer_timeout",
			cfg:    worker.Config{HandlerTimeout: 45 * time.Minute},
			caps:   broker.Capabilities{Name: "rabbitmq"},
			limits: broker.Limits{SettleTimeout: 30 * time.Minute, SettleTimeoutSetting: "rabbitmq.Config.ConsumerTimeout"},
			want:   []string{"HandlerTimeout (ferry --handler-timeout) = 45m0s", "--handler-timeout", "rabbitmq.Config.ConsumerTimeout", "below 30m0s", "e.g. 27m0s"},
		},
		{
			name:   "handler timeout equal to consumer_timeout",
			cfg:    worker.Config{HandlerTimeout: 30 * time.Minute},
			caps:   broker.Capabilities{Name: "rabbitmq"},
			limits: broker.Limits{SettleTimeout: 30 * time.Minute, SettleTimeoutSetting: "rabbitmq.Config.ConsumerTimeout"},
			want:   []string{"below 30m0s"},
		},
		{
			name:   "handler timeout below consumer_timeout",
			cfg:    worker.Config{HandlerTimeout: 29 * time.Minute},
			caps:   broker.Capabilities{Name: "rabbitmq"},
			limits: broker.Limits{SettleTimeout: 30 * time.Minute},
		},
		{
			name:   "no handler timeout",
			cfg:    worker.Config{},
			caps:   broker.Capabilities{Name: "rabbitmq"},
			limits: broker.Limits{SettleTimeout: 30 * time.Minute},
		},
		{
			name:   "retry delays add up past the retention",
			cfg:    worker.Config{Policy: worker.BackoffPolicy{MaxAttempts: 30, Delays: []time.Duration{12 * time.Hour}}},
			caps:   sqsLike,
			limits: broker.Limits{Retention: 14 * 24 * time.Hour, RetentionSetting: "the MessageRetentionPeriod of SQS queue"},
			want:   []string{"--retry-delay", "--max-attempts", "348h0m0s", "attempt 30", "MessageRetentionPeriod of SQS queue = 336h0m0s", "less than 336h0m0s"},
		},
		{
			name: "retry delays capped by the broker's longest delay",
			// 20 retries of 1 h asked, but 28 × 12 h caps: 28 h < 14 days.
			cfg:    worker.Config{Policy: worker.BackoffPolicy{MaxAttempts: 29, Delays: []time.Duration{time.Hour}}},
			caps:   sqsLike,
			limits: broker.Limits{Retention: 14 * 24 * time.Hour},
		},
		{
			name:   "no limits",
			cfg:    worker.Config{Policy: worker.BackoffPolicy{MaxAttempts: 1000}, AckDeadline: 100 * time.Hour, HandlerTimeout: 100 * time.Hour},
			caps:   broker.Capabilities{Name: "kafka"},
			limits: broker.Limits{},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := worker.CheckLimits(c.cfg, c.caps, c.limits)
			if c.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, worker.ErrInvalidConfig)
			for _, w := range c.want {
				require.Contains(t, err.Error(), w)
			}
			t.Log(err)
		})
	}
}

// TestCheckLimitsUsesTopologyDelays: without a Policy the default policy
// takes the queue's RetryDelays, as New does.
func TestCheckLimitsUsesTopologyDelays(t *testing.T) {
	tp := broker.Topology{Exchange: "x", Queues: []broker.Queue{{Name: "q", Bindings: []string{"a"}, RetryDelays: []time.Duration{4 * 24 * time.Hour}}}}
	err := worker.CheckLimits(worker.Config{Queue: "q", Topology: tp}, broker.Capabilities{Name: "sqs"},
		broker.Limits{Retention: 14 * 24 * time.Hour, RetentionSetting: "MessageRetentionPeriod"})
	require.ErrorIs(t, err, worker.ErrInvalidConfig)
	require.Contains(t, err.Error(), "384h0m0s") // 4 retries of 4 days
}

// TestHandlerTimeoutBoundsAnAttempt: with HandlerTimeout the handler's
// ctx ends that long after the call began; a handler that waits for it
// fails the attempt, which is retried as any other failure, and the next
// attempt gets a fresh bound.
func TestHandlerTimeoutBoundsAnAttempt(t *testing.T) {
	b := newRabbitMQ(t)
	pool, _ := testenv.NewPool(t)
	workertest.CreateSchema(t, pool)
	base := testenv.UniqueName("htimeout")
	tp := broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{Name: base + ".work", Bindings: []string{"evt"},
		RetryDelays: []time.Duration{100 * time.Millisecond}}}}
	t.Cleanup(func() {
		conn, err := amqp.Dial(testenv.RabbitMQURL())
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			for _, n := range rabbitmq.QueueNames(tp.Queues[0]) {
				_, _ = ch.QueueDelete(n, false, false, false)
			}
			_ = ch.ExchangeDelete(tp.Exchange, false, false)
		}
	})
	type call struct {
		attempt  int
		deadline time.Duration
		hasDL    bool
		err      error
	}
	calls := make(chan call, 10)
	w, err := worker.New(worker.Config{Consumer: "htimeout", Queue: tp.Queues[0].Name, Topology: tp, Pool: pool, Broker: b,
		HandlerTimeout: 300 * time.Millisecond,
		Policy:         worker.BackoffPolicy{MaxAttempts: 3, Delays: []time.Duration{100 * time.Millisecond}},
		Handler: func(ctx context.Context, _ pgx.Tx, msg *broker.Message) error {
			dl, ok := ctx.Deadline()
			c := call{attempt: msg.Attempt, deadline: time.Until(dl), hasDL: ok}
			if msg.Attempt == 1 {
				<-ctx.Done()
				c.err = ctx.Err()
			}
			calls <- c
			return c.err
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool { return b.Declare(ctx, tp) == nil }, 10*time.Second, 100*time.Millisecond)
	require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: "1", Type: "evt", Body: []byte("{}")}}))
	first := <-calls
	require.Equal(t, 1, first.attempt)
	require.True(t, first.hasDL, "the handler's ctx has the HandlerTimeout deadline")
	require.ErrorIs(t, first.err, context.DeadlineExceeded)
	require.LessOrEqual(t, first.deadline, 300*time.Millisecond)
	select {
	case second := <-calls:
		require.Equal(t, 2, second.attempt, "the timed-out attempt is retried")
		require.Greater(t, second.deadline, 200*time.Millisecond, "a fresh bound per attempt")
		require.NoError(t, second.err)
	case <-time.After(15 * time.Second):
		t.Fatal("the timed-out attempt was not retried")
	}
}
