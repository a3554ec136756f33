package sqs_test

import (
	"context"
	"errors"
	"fmt"
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

// runWorker runs a worker on its own broker (cfg.Broker, or a new
// connection) until the test ends.
func runWorker(t *testing.T, tp broker.Topology, cfg worker.Config) {
	t.Helper()
	if cfg.Broker == nil {
		cfg.Broker = newBroker(t)
	}
	cfg.Topology = tp
	cfg.Queue = tp.Queues[0].Name
	w, err := worker.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("worker: %v", err)
			}
		case <-time.After(40 * time.Second):
			t.Errorf("worker did not stop")
		}
	})
}

// sideEffects counts handler calls per message ID and the attempts seen.
type sideEffects struct {
	mu       sync.Mutex
	calls    map[string]int
	attempts map[string][]int
}

func (s *sideEffects) handler(d time.Duration) worker.Handler {
	return func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		s.mu.Lock()
		s.calls[msg.ID]++
		s.attempts[msg.ID] = append(s.attempts[msg.ID], msg.Attempt)
		s.mu.Unlock()
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s *sideEffects) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.calls {
		n += c
	}
	return n
}

func slowSetup(t *testing.T) (broker.Topology, *sideEffects, worker.Config) {
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(context.Background(), pool))
	tp := topology("slow", "evt.slow")
	se := &sideEffects{calls: map[string]int{}, attempts: map[string][]int{}}
	cfg := worker.Config{Consumer: "slow", Pool: pool, AckDeadline: 5 * time.Second, Concurrency: 1,
		Policy: worker.BackoffPolicy{MaxAttempts: 3, Delays: []time.Duration{time.Second}}}
	return tp, se, cfg
}

func requireOnce(t *testing.T, se *sideEffects, ids []string) {
	t.Helper()
	se.mu.Lock()
	defer se.mu.Unlock()
	for _, id := range ids {
		require.Equal(t, 1, se.calls[id], "message %s handled once (side effects)", id)
		require.Equal(t, []int{1}, se.attempts[id], "message %s: receive count 1", id)
	}
}

func requireDLQEmpty(t *testing.T, b broker.Broker, queue string) {
	t.Helper()
	dlq, err := b.DLQ(queue)
	require.NoError(t, err)
	list, err := dlq.List(ctxFor(t, 30*time.Second), 0)
	require.NoError(t, err)
	require.Empty(t, list)
}

// TestSlowHandlerTwoWorkers: visibility timeout 5 s, a 12 s handler, two
// workers: the heartbeat (Extend) keeps the message from the second
// worker: one side effect, receive count 1, nothing in the DLQ.
func TestSlowHandlerTwoWorkers(t *testing.T) {
	tp, se, cfg := slowSetup(t)
	pub := newBroker(t)
	require.NoError(t, pub.Declare(ctxFor(t, 30*time.Second), tp))
	cfg.Handler = se.handler(12 * time.Second)
	runWorker(t, tp, cfg)
	runWorker(t, tp, cfg)
	require.NoError(t, pub.Publish(ctxFor(t, 10*time.Second), []*broker.Message{{ID: "slow-1", Type: "evt.slow", Body: []byte("{}")}}))
	time.Sleep(12*time.Second + 8*time.Second)
	requireOnce(t, se, []string{"slow-1"})
	requireDLQEmpty(t, pub, tp.Queues[0].Name)
}

// TestSlowBatchTail: 10 messages received in one batch by a worker with
// concurrency 1 and handled one after another (6 s each, visibility 5 s),
// while a second worker polls the same queue: the tail of the batch is
// kept invisible, so each message is handled once, at receive count 1.
func TestSlowBatchTail(t *testing.T) {
	tp, se, cfg := slowSetup(t)
	pub := newBroker(t)
	require.NoError(t, pub.Declare(ctxFor(t, 30*time.Second), tp))
	var msgs []*broker.Message
	var ids []string
	for i := 0; i < 10; i++ {
		id := fmt.Sprint("tail-", i)
		ids = append(ids, id)
		msgs = append(msgs, &broker.Message{ID: id, Type: "evt.slow", Body: []byte("{}")})
	}
	require.NoError(t, pub.Publish(ctxFor(t, 10*time.Second), msgs))
	cfg.Handler = se.handler(6 * time.Second)
	cfg.Prefetch = 10
	runWorker(t, tp, cfg) // takes the 10 in one receive
	time.Sleep(2 * time.Second)
	runWorker(t, tp, cfg)
	deadline := time.Now().Add(90 * time.Second)
	for se.total() < 10 && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(8 * time.Second) // a redelivery would show by now
	requireOnce(t, se, ids)
	requireDLQEmpty(t, pub, tp.Queues[0].Name)
}

// TestAlwaysFailsToDLQ: a handler that always fails, 3 attempts, 1 s
// retry delay: the message is in the DLQ within 3 × the delay plus one
// poll, with its body, ID and reason, dead-lettered by ferry (not by the
// RedrivePolicy).
func TestAlwaysFailsToDLQ(t *testing.T) {
	tp, se, cfg := slowSetup(t)
	pub := newBroker(t)
	require.NoError(t, pub.Declare(ctxFor(t, 30*time.Second), tp))
	cfg.Concurrency = 4
	cfg.Handler = func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		se.mu.Lock()
		se.calls[msg.ID]++
		se.attempts[msg.ID] = append(se.attempts[msg.ID], msg.Attempt)
		se.mu.Unlock()
		return errors.New("smtp: 451 try later")
	}
	runWorker(t, tp, cfg)
	start := time.Now()
	require.NoError(t, pub.Publish(ctxFor(t, 10*time.Second), []*broker.Message{{ID: "fail-1", Type: "evt.slow", Body: []byte(`{"n":1}`)}}))
	dlq, err := pub.DLQ(tp.Queues[0].Name)
	require.NoError(t, err)
	var list []broker.DeadMessage
	for time.Since(start) < 3*time.Second+3*time.Second {
		list, err = dlq.List(ctxFor(t, 10*time.Second), 0)
		require.NoError(t, err)
		if len(list) > 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	took := time.Since(start)
	require.Len(t, list, 1, "in the DLQ within 3 × 1 s + one poll (3 s)")
	t.Logf("dead after %v", took)
	dm := list[0]
	require.Equal(t, "fail-1", dm.Message.ID)
	require.Equal(t, []byte(`{"n":1}`), dm.Message.Body)
	require.Equal(t, 3, dm.Message.Attempt)
	require.Contains(t, dm.LastError, "smtp: 451 try later")
	require.False(t, dm.DeadAt.IsZero())
	se.mu.Lock()
	require.Equal(t, []int{1, 2, 3}, se.attempts["fail-1"])
	se.mu.Unlock()
}

// TestBatchAcksShareOneCall: a worker with BatchSize 8 settles the eight
// deliveries of a batch at once, not one after another, so the adapter
// folds their Acks into one DeleteMessageBatch: one round trip per batch
// (10 to 20 ms on AWS) instead of one per message.
func TestBatchAcksShareOneCall(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(context.Background(), pool))
	tp := topology("batchack", "evt.ba")
	c := newCalls()
	cfg := config()
	cfg.APIOptions = c.options()
	b := declaredRaw(t, cfg, tp)
	const n = 8
	var msgs []*broker.Message
	for i := range n {
		msgs = append(msgs, &broker.Message{ID: fmt.Sprint("ba", i), Type: "evt.ba", Body: []byte("{}")})
	}
	require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), msgs))
	var acked sync.WaitGroup
	acked.Add(n)
	runWorker(t, tp, worker.Config{Consumer: "batchack", Pool: pool, Broker: b, Concurrency: 1, Prefetch: n, BatchSize: n,
		BatchLinger: time.Second, Handler: func(context.Context, pgx.Tx, *broker.Message) error { return nil },
		OnOutcome: func(_ *broker.Message, o worker.Outcome, _ time.Duration) {
			if o == worker.OutcomeAck {
				acked.Done()
			}
		}})
	done := make(chan struct{})
	go func() { acked.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the batch was not acked within 30 s")
	}
	calls, _, _ := c.get("DeleteMessageBatch")
	require.LessOrEqual(t, calls, 2, "the batch's Acks share a DeleteMessageBatch (at most two if the receive split the batch)")
}
