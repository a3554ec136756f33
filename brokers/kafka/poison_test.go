package kafka_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// TestRelayPoisonRecordBatch (issue 16, item 1): one row whose record is
// over the work topic's max.message.bytes (lowered to 4 KiB; the
// adapter's own check uses the broker's message.max.bytes) among 30 good
// rows of one relay batch. Kafka refuses the whole record batch of that
// record's partition with MESSAGE_TOO_LARGE; before, every row of that
// partition was parked as too large. Now only the poison row is parked,
// with Kafka's reason, and the 30 good rows are published at once.
func TestRelayPoisonRecordBatch(t *testing.T) {
	tp := topology("kafka-poison")
	b := declared(t, tp)
	pool, _ := testenv.NewPool(t)
	ctx := ctxFor(t, time.Minute)
	require.NoError(t, outbox.Migrate(ctx, pool))
	lowerMaxMessageBytes(ctx, t, kafka.TopicName(tp.Exchange), 4096)

	evs := make([]outbox.Event, 31)
	for i := range evs {
		evs[i] = outbox.Event{Type: "evt.poison", Key: fmt.Sprint("k", i%3), Body: []byte(fmt.Sprintf(`{"n":%d}`, i))}
	}
	evs[17].Body = make([]byte, 8192)
	var ids []int64
	start := time.Now()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		ids, err = outbox.Enqueue(ctx, tx, evs...)
		return err
	}))
	var first outbox.BatchStats
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: b, Retention: -1,
		RetryBackoff: time.Hour, MaxRetryBackoff: time.Hour,
		OnBatch: func(s outbox.BatchStats) {
			if first.Claimed == 0 {
				first = s
			}
		}})
	require.NoError(t, err)
	n, err := r.ProcessBatch(ctx)
	took := time.Since(start)
	require.Equal(t, 30, n, "the 30 good rows are published in the same batch: %v", err)
	require.True(t, broker.IsMessageFault(err), "the refusal is the poison row's, not an outage: %v", err)
	t.Logf("30 good rows published %v after the enqueue (publish %v) beside one record Kafka refuses", took.Round(time.Millisecond), first.PublishDuration.Round(time.Millisecond))

	var attempts int
	var lastErr string
	require.NoError(t, pool.QueryRow(ctx, `SELECT attempts, last_error FROM outbox WHERE id = $1 AND processed_at IS NULL`, ids[17]).Scan(&attempts, &lastErr))
	require.Equal(t, 1, attempts)
	require.Contains(t, lastErr, "Message Size Too Large")
	require.Equal(t, 1, unprocessed(t, pool))

	sub, err := b.Subscribe(ctx, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 50})
	require.NoError(t, err)
	defer sub.Close()
	got := map[string]int{}
	for len(got) < 30 {
		d, err := sub.Receive(ctx)
		require.NoError(t, err, "received %d of 30", len(got))
		got[d.Message().ID]++
		require.NoError(t, d.Ack(ctx))
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if d, err := sub.Receive(rctx); err == nil {
		got[d.Message().ID]++
	}
	for i, id := range ids {
		want := 1
		if i == 17 {
			want = 0
		}
		require.Equal(t, want, got[fmt.Sprint(id)], "row %d delivered %d time(s)", id, want)
	}
}
