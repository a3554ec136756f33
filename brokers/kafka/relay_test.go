package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

func enqueueN(t *testing.T, pool *pgxpool.Pool, prefix string, n int) {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	var evs []outbox.Event
	for i := range n {
		evs = append(evs, outbox.Event{Type: "evt.relay", Key: fmt.Sprint(prefix, i%5), Body: []byte(`{}`)})
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, evs...)
		return err
	}))
}

func unprocessed(t *testing.T, pool *pgxpool.Pool) int {
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&n))
	return n
}

// The relay on Kafka: a deleted work topic is declared again by the next
// publish and the rows go out; while the broker is down every publish
// fails within the relay's PublishTimeout, the rows stay unprocessed and
// are neither parked nor charged an attempt (an outage, not a message
// fault), the relay stops cleanly when cancelled (SIGTERM) in the middle
// of a write, and a new relay sends every row once the broker is back.
// Not parallel: it stops the shared Kafka (compose/local/services.sh).
func TestRelayTopicDeletedAndBrokerDown(t *testing.T) {
	tp := topology("kafka-relay")
	b := declared(t, tp)
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(context.Background(), pool))
	const publishTimeout = time.Second
	var (
		mu          sync.Mutex
		slowestFail time.Duration
		failures    atomic.Int64
	)
	newRelay := func() *outbox.Relay {
		r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: b, Concurrency: 2, PublishTimeout: publishTimeout,
			MaxBackoff: 300 * time.Millisecond, Retention: -1,
			Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
			OnBatch: func(s outbox.BatchStats) {
				if s.Err != nil {
					failures.Add(1)
					mu.Lock()
					slowestFail = max(slowestFail, s.PublishDuration)
					mu.Unlock()
				}
			}})
		require.NoError(t, err)
		return r
	}
	run := func(r *outbox.Relay) (stop func() time.Duration) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		var once sync.Once
		var took time.Duration
		stop = func() time.Duration {
			once.Do(func() {
				at := time.Now()
				cancel()
				select {
				case err := <-done:
					require.NoError(t, err)
				case <-time.After(30 * time.Second):
					t.Error("relay did not stop within 30s of its cancel")
				}
				took = time.Since(at)
			})
			return took
		}
		t.Cleanup(func() { stop() })
		return stop
	}
	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 50})
	received := map[string]bool{}
	var rmu sync.Mutex
	go func() {
		for {
			d, err := sub.Receive(context.Background())
			if err != nil {
				return
			}
			rmu.Lock()
			received[d.Message().ID] = true
			rmu.Unlock()
			_ = d.Ack(context.Background())
		}
	}()
	nReceived := func() int { rmu.Lock(); defer rmu.Unlock(); return len(received) }

	stop := run(newRelay())
	// The work topic is deleted under the running relay and subscription.
	c := &kafkago.Client{Addr: kafkago.TCP(testenv.KafkaBrokers()...), Timeout: 10 * time.Second}
	_, err := c.DeleteTopics(ctxFor(t, 10*time.Second), &kafkago.DeleteTopicsRequest{Topics: []string{kafka.TopicName(tp.Exchange)}})
	require.NoError(t, err)
	// Kafka deletes a topic asynchronously and keeps accepting writes to it
	// until the deletion completes; what is written then is deleted with it
	// (an operator's deletion loses what the topic holds). So the rows are
	// enqueued only once the topic is gone from the metadata, or after 20 s;
	// the adapter may declare it again right after, which is what is tested.
	gone := false
	for deadline := time.Now().Add(20 * time.Second); !gone && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		md, err := c.Metadata(ctxFor(t, 5*time.Second), &kafkago.MetadataRequest{Topics: []string{kafka.TopicName(tp.Exchange)}})
		gone = err == nil && (len(md.Topics) == 0 || errors.Is(md.Topics[0].Error, kafkago.UnknownTopicOrPartition))
	}
	t.Logf("work topic seen deleted: %v", gone)
	enqueueN(t, pool, "a", 10)
	require.Eventually(t, func() bool { return unprocessed(t, pool) == 0 }, 30*time.Second, 50*time.Millisecond,
		"rows published after the topic was declared again")
	require.Eventually(t, func() bool { return nReceived() >= 10 }, 60*time.Second, 50*time.Millisecond,
		"the subscription reads the new topic")

	testenv.Services(t, "stop", "kafka")
	stopped := true
	defer func() {
		if stopped {
			testenv.Services(t, "start", "kafka")
		}
	}()
	enqueueN(t, pool, "b", 20)
	require.Eventually(t, func() bool { return failures.Load() >= 2 }, 30*time.Second, 50*time.Millisecond, "publishes fail while Kafka is down")
	require.Equal(t, 20, unprocessed(t, pool), "the rows stay unprocessed while Kafka is down")
	// SIGTERM in the middle of a write to the dead broker.
	require.Less(t, stop(), 10*time.Second, "the relay stops promptly while a write hangs on a dead broker")
	mu.Lock()
	require.Less(t, slowestFail, publishTimeout+2*time.Second, "a failing publish ends within its deadline")
	mu.Unlock()
	require.Equal(t, 20, unprocessed(t, pool))
	// A dead broker is an outage of the whole relay, not a fault of each
	// message: no row is parked or charged an attempt (issue 7, item 1).
	st, err := outbox.ReadStats(context.Background(), pool)
	require.NoError(t, err)
	require.Zero(t, st.Parked, "no row is parked while Kafka is down")
	var charged int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE attempts > 0`).Scan(&charged))
	require.Zero(t, charged, "no row is charged an attempt while Kafka is down")

	testenv.Services(t, "start", "kafka")
	stopped = false
	run(newRelay())
	require.Eventually(t, func() bool { return unprocessed(t, pool) == 0 }, 60*time.Second, 100*time.Millisecond, "rows go out once Kafka is back")
	require.Eventually(t, func() bool { return nReceived() >= 30 }, 60*time.Second, 100*time.Millisecond, "every row arrives")
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}
