package sqs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// TestRelayRefusedEntry: ten outbox rows relayed in one batch, one with a
// body holding a character SQS refuses: only that row stays unprocessed,
// with SQS's error as last_error; the other nine are delivered once and
// not sent again while the relay keeps retrying the refused one.
func TestRelayRefusedEntry(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx := ctxFor(t, 2*time.Minute)
	require.NoError(t, outbox.Migrate(ctx, pool))
	tp := topology("relay", "evt.relay")
	b := newBroker(t)
	require.NoError(t, b.Declare(ctx, tp))

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	var events []outbox.Event
	for i := 0; i < 10; i++ {
		body := []byte(fmt.Sprintf(`{"n":%d}`, i))
		if i == 6 {
			body = []byte("refused \x02 byte")
		}
		events = append(events, outbox.Event{Type: "evt.relay", Key: fmt.Sprint("k", i), Body: body})
	}
	ids, err := outbox.Enqueue(ctx, tx, events...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: b, BatchSize: 100, PollInterval: 100 * time.Millisecond,
		RetryBackoff: 200 * time.Millisecond, MaxRetryBackoff: 500 * time.Millisecond})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { cancel(); <-done }()

	refused := ids[6]
	var lastErr *string
	var attempts int
	require.Eventually(t, func() bool {
		var left int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&left))
		require.NoError(t, pool.QueryRow(ctx, `SELECT last_error, attempts FROM outbox WHERE id = $1`, refused).Scan(&lastErr, &attempts))
		return left == 1 && lastErr != nil && attempts >= 2
	}, 30*time.Second, 100*time.Millisecond, "the refused row parked with its error, retried, the others processed")
	var unprocessed int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM outbox WHERE processed_at IS NULL`).Scan(&unprocessed))
	require.Equal(t, refused, unprocessed)
	require.Contains(t, *lastErr, "InvalidMessageContents", "SQS's error as last_error")
	t.Logf("last_error after %d attempts: %s", attempts, *lastErr)

	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 10})
	got := drain(t, sub, 3*time.Second)
	require.Len(t, got, 9)
	for i, id := range ids {
		if i == 6 {
			require.Zero(t, got[fmt.Sprint(id)])
			continue
		}
		require.Equal(t, 1, got[fmt.Sprint(id)], "row %d delivered once", id)
	}
}
