package sqs_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
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

// TestFIFOOrderThroughRelay: 1,000 outbox events over 50 keys, enqueued
// by five producers in transactions of ten, go through two relays (each
// with its default claim loops) to a FIFO queue pair, and an Ordered
// worker with eight concurrent handlers handles each event once and the
// events of each key in outbox id order (issue 9; the relay keeps per-key
// order since issue 7).
func TestFIFOOrderThroughRelay(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx := ctxFor(t, 4*time.Minute)
	require.NoError(t, outbox.Migrate(ctx, pool))
	cfg := config()
	cfg.FIFO = true
	tp := topology("fiforelay", "evt.fifo")
	for range 2 {
		b := newBrokerCfg(t, cfg)
		require.Equal(t, broker.OrderingKey, b.Capabilities().Ordering)
		require.NoError(t, b.Declare(ctx, tp))
		r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: b, BatchSize: 20, PollInterval: 50 * time.Millisecond})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	}

	const n, keys, producers = 1000, 50, 5
	var (
		mu       sync.Mutex
		perKey   = map[string][]int64{}
		inFlight = map[string]bool{}
		overlaps int
		handled  int
	)
	handler := func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		id, err := strconv.ParseInt(msg.ID, 10, 64)
		if err != nil {
			return worker.Permanent(fmt.Errorf("message ID %q is not an outbox id", msg.ID))
		}
		mu.Lock()
		if inFlight[msg.Key] {
			overlaps++
		}
		inFlight[msg.Key] = true
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		inFlight[msg.Key] = false
		perKey[msg.Key] = append(perKey[msg.Key], id)
		handled++
		mu.Unlock()
		return nil
	}
	runWorker(t, tp, worker.Config{Consumer: "fifo", Pool: pool, Handler: handler, Concurrency: 8, Prefetch: 40,
		Ordered: true, Broker: newBrokerCfg(t, cfg)})

	// One key's events come from one producer, so their ids are in commit
	// order.
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := 0; i < n/producers; i += 10 {
				tx, err := pool.Begin(ctx)
				if !assert.NoError(t, err) {
					return
				}
				var evs []outbox.Event
				for j := i; j < i+10; j++ {
					evs = append(evs, outbox.Event{Type: "evt.fifo", Key: fmt.Sprint("user-", p+producers*(j%(keys/producers))), Body: []byte("{}")})
				}
				_, err = outbox.Enqueue(ctx, tx, evs...)
				assert.NoError(t, err)
				assert.NoError(t, tx.Commit(ctx))
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled >= n
	}, 3*time.Minute, 100*time.Millisecond, "every event handled")
	time.Sleep(2 * time.Second) // a redelivery would show by now
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, n, handled, "each event handled once")
	require.Zero(t, overlaps, "two events of one key were handled at once")
	require.Len(t, perKey, keys)
	for k, ids := range perKey {
		for i := 1; i < len(ids); i++ {
			require.Less(t, ids[i-1], ids[i], "key %s handled out of order: %v", k, ids)
		}
	}
	var processed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE consumer = 'fifo'`).Scan(&processed))
	require.Equal(t, n, processed)
}
