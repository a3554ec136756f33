package kafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// Per-key order through the whole path (issue 8): 1,000 events over 50
// keys are enqueued in the outbox (one producer, 50 transactions of 20,
// each key's events in runs of 4 so several are in flight together), the
// relay (its default claim loops) publishes them while a worker with
// Concurrency 4 handles them with handlers of random duration. With
// worker.Config.Ordered every key's events are handled in enqueue order;
// without it the test counts the violations and logs them (concurrent
// handlers may or may not overtake each other, so that count is not
// asserted).
func TestRelayAndWorkerKeepPerKeyOrder(t *testing.T) {
	t.Parallel()
	const n, keys = 1000, 50
	run := func(t *testing.T, ordered bool) int {
		tp := topology("kafka-order-rw")
		b := declared(t, tp)
		pool, _ := testenv.NewPool(t)
		require.NoError(t, outbox.Migrate(context.Background(), pool))

		var (
			mu         sync.Mutex
			last       = map[string]int{}
			seen       = map[int]bool{}
			violations int
			done       = make(chan struct{})
		)
		handler := func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
			seq, err := strconv.Atoi(string(msg.Body))
			if err != nil {
				return worker.Permanent(fmt.Errorf("body %q: %w", msg.Body, err))
			}
			time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
			mu.Lock()
			defer mu.Unlock()
			if seen[seq] {
				return nil // a redelivery after a rebalance: not a new side effect
			}
			seen[seq] = true
			if prev, ok := last[msg.Key]; ok && seq < prev {
				violations++
			}
			last[msg.Key] = max(last[msg.Key], seq)
			if len(seen) == n {
				close(done)
			}
			return nil
		}
		w, err := worker.New(worker.Config{Consumer: "order", Queue: tp.Queues[0].Name, Pool: pool, Broker: b,
			Handler: handler, Topology: tp, Concurrency: 4, Ordered: ordered})
		require.NoError(t, err)
		relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: b, BatchSize: 20, Retention: -1})
		require.NoError(t, err)

		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		for _, r := range []func(context.Context) error{w.Run, relay.Run} {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- r(ctx) }()
		}
		defer func() {
			cancel()
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
		}()

		ectx := ctxFor(t, 60*time.Second)
		for i := 0; i < n; i += 20 {
			evs := make([]outbox.Event, 0, 20)
			for j := i; j < i+20; j++ {
				evs = append(evs, outbox.Event{Type: "evt.order", Key: fmt.Sprint("user-", (j/4)%keys), Body: []byte(strconv.Itoa(j))})
			}
			require.NoError(t, pgx.BeginFunc(ectx, pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ectx, tx, evs...)
				return err
			}))
		}
		select {
		case <-done:
		case <-time.After(120 * time.Second):
			mu.Lock()
			defer mu.Unlock()
			require.FailNow(t, "not every event was handled", "%d of %d handled in 120s", len(seen), n)
		}
		mu.Lock()
		defer mu.Unlock()
		return violations
	}
	t.Run("Ordered", func(t *testing.T) {
		require.Zero(t, run(t, true), "with worker.Config.Ordered each key's events are handled in enqueue order")
	})
	t.Run("Unordered", func(t *testing.T) {
		t.Logf("without Ordered: %d per-key order violations among %d events over %d keys, worker Concurrency 4", run(t, false), n, keys)
	})
}
