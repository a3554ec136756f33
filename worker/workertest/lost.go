package workertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/worker"
)

// errLostSettle stands for a settlement the broker never received: the
// channel closed under it (RabbitMQ consumer_timeout), the connection was
// lost, the deadline passed.
var errLostSettle = errors.New("workertest: channel closed by the broker (simulated lost settlement)")

// lossyBroker wraps a broker so that Retry always fails, and DeadLetter
// fails while failDead is positive, without reaching the broker: the
// delivery stays unsettled, as after a lost channel.
type lossyBroker struct {
	broker.Broker
	failDead *atomic.Int32
	// failAck makes Ack fail without reaching the broker, and Retry work.
	failAck bool
}

func (b *lossyBroker) Subscribe(ctx context.Context, queue string, opts broker.SubscribeOptions) (broker.Subscription, error) {
	sub, err := b.Broker.Subscribe(ctx, queue, opts)
	if err != nil {
		return nil, err
	}
	return &lossySub{Subscription: sub, b: b}, nil
}

type lossySub struct {
	broker.Subscription
	b *lossyBroker
}

func (s *lossySub) Receive(ctx context.Context) (broker.Delivery, error) {
	d, err := s.Subscription.Receive(ctx)
	if err != nil {
		return nil, err
	}
	return &lossyDelivery{Delivery: d, b: s.b}, nil
}

type lossyDelivery struct {
	broker.Delivery
	b *lossyBroker
}

func (d *lossyDelivery) Retry(ctx context.Context, delay time.Duration, reason string) error {
	if d.b.failAck {
		return d.Delivery.Retry(ctx, delay, reason)
	}
	return errLostSettle
}

func (d *lossyDelivery) Ack(ctx context.Context) error {
	if d.b.failAck {
		return errLostSettle
	}
	return d.Delivery.Ack(ctx)
}

func (d *lossyDelivery) DeadLetter(ctx context.Context, reason string) error {
	if d.b.failDead.Add(-1) >= 0 {
		return errLostSettle
	}
	return d.Delivery.DeadLetter(ctx, reason)
}

// testLostSettlements: a handler that always fails, every Retry of it
// lost and its first DeadLetter lost too. Each round runs a worker on a
// new broker connection until one outcome, then closes that connection,
// so the broker redelivers the unsettled message (at once on RabbitMQ,
// after the ack deadline elsewhere) — without ferry's retry header, as
// when RabbitMQ closed the channel after its consumer_timeout. The
// attempts must still be 1, 2, 3 (the policy's MaxAttempts), the message
// must reach the DLQ once, without a fourth handler run, and no "retry"
// outcome may be counted for retries that never happened.
func testLostSettlements(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	fails := &failures{}
	var (
		mu       sync.Mutex
		attempts []int
	)
	handler := func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		mu.Lock()
		attempts = append(attempts, msg.Attempt)
		mu.Unlock()
		if err := recordSideEffect(ctx, tx, "lost", msg); err != nil {
			return err
		}
		return fmt.Errorf("smtp: 451 try later (attempt %d)", msg.Attempt)
	}
	var failDead atomic.Int32
	failDead.Store(1)
	f.publish(t, f.msg("77"))

	for round := 1; out.count(worker.OutcomeDead) == 0; round++ {
		require.LessOrEqual(t, round, 6, "workertest: no DLQ after %d rounds; attempts %v, outcomes %+v", round-1, attempts, out.snapshot())
		b := s.newBroker(t)
		cfg := f.config("lost", f.queue, handler)
		cfg.Broker = &lossyBroker{Broker: b, failDead: &failDead}
		cfg.OnOutcome = out.hook
		cfg.OnFailure = fails.hook
		cfg.AckDeadline = 2 * time.Second // the redelivery after a closed connection, where the broker waits for it
		before := len(out.snapshot())
		stop := start(t, cfg)
		deadline := time.Now().Add(waitTimeout)
		for len(out.snapshot()) == before {
			require.True(t, time.Now().Before(deadline), "workertest: round %d: no outcome in %v", round, waitTimeout)
			time.Sleep(20 * time.Millisecond)
		}
		stop()
		require.NoError(t, b.Close())
	}

	mu.Lock()
	require.Equal(t, []int{1, 2, 3}, attempts, "each redelivery after a lost Retry is the next attempt; no handler run after the DLQ was decided")
	mu.Unlock()
	var got []outcomeRec
	for _, r := range out.snapshot() {
		got = append(got, outcomeRec{id: r.id, attempt: r.attempt, outcome: r.outcome})
	}
	require.Equal(t, []outcomeRec{
		{id: "77", attempt: 1, outcome: worker.OutcomeUnsettled},
		{id: "77", attempt: 2, outcome: worker.OutcomeUnsettled},
		{id: "77", attempt: 3, outcome: worker.OutcomeUnsettled},
		{id: "77", attempt: 3, outcome: worker.OutcomeDead},
	}, got, "no retry outcome for the lost retries; one dead outcome")
	require.Equal(t, 0, out.count(worker.OutcomeRetry))
	fl := fails.snapshot()
	require.Len(t, fl, 3, "OnFailure once per failed attempt")
	for i, r := range fl {
		require.Equal(t, i+1, r.attempt)
		require.Equal(t, i == 2, r.dead)
	}
	dead := waitDLQ(t, f.b, f.queue, 1)
	require.Equal(t, "77", dead[0].Message.ID)
	require.Contains(t, dead[0].LastError, "attempt 3")
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM side_effects`), "failed attempts roll back")
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM `+worker.AttemptsTable+` WHERE consumer = 'lost'`), "the record goes once the DLQ holds the message")
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'lost'`))
}

// testAttemptRecordClearedOnSuccess: a message that failed once, whose
// Retry was lost, succeeds on its redelivery as attempt 2; its attempt
// record is deleted with the success, so the count starts afresh if the
// same ID is ever replayed.
func testAttemptRecordClearedOnSuccess(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	var calls atomic.Int32
	handler := func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		if calls.Add(1) == 1 {
			return errors.New("first attempt fails")
		}
		return recordSideEffect(ctx, tx, "clear", msg)
	}
	var failDead atomic.Int32
	f.publish(t, f.msg("5"))
	for round := 1; out.count(worker.OutcomeAck) == 0; round++ {
		require.LessOrEqual(t, round, 3, "workertest: no ack after %d rounds; outcomes %+v", round-1, out.snapshot())
		b := s.newBroker(t)
		cfg := f.config("clear", f.queue, handler)
		cfg.Broker = &lossyBroker{Broker: b, failDead: &failDead}
		cfg.OnOutcome = out.hook
		cfg.AckDeadline = 2 * time.Second
		before := len(out.snapshot())
		stop := start(t, cfg)
		deadline := time.Now().Add(waitTimeout)
		for len(out.snapshot()) == before {
			require.True(t, time.Now().Before(deadline), "workertest: round %d: no outcome in %v", round, waitTimeout)
			time.Sleep(20 * time.Millisecond)
		}
		stop()
		require.NoError(t, b.Close())
	}
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE message_id = '5' AND attempt = 2`))
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM `+worker.AttemptsTable))
	require.Equal(t, 0, out.count(worker.OutcomeRetry))
	require.Equal(t, 1, out.count(worker.OutcomeUnsettled))
}

// testLostAck: the handler succeeded and committed, the Ack was lost. The
// outcome is "unsettled", not "ack" (outcomes count what the broker took),
// the failure is reported once to OnSettleFailure, the redelivery is acked
// as a duplicate without running the handler, and no attempt record is
// left.
func testLostAck(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	var calls atomic.Int32
	handler := func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		calls.Add(1)
		return recordSideEffect(ctx, tx, "lostack", msg)
	}
	var failDead atomic.Int32
	fails := &SettleFailures{}
	f.publish(t, f.msg("6"))
	for round, failAck := range []bool{true, false} {
		b := s.newBroker(t)
		cfg := f.config("lostack", f.queue, handler)
		cfg.Broker = &lossyBroker{Broker: b, failDead: &failDead, failAck: failAck}
		cfg.OnOutcome = out.hook
		cfg.OnSettleFailure = fails.Hook
		cfg.AckDeadline = 2 * time.Second
		before := len(out.snapshot())
		stop := start(t, cfg)
		deadline := time.Now().Add(waitTimeout)
		for len(out.snapshot()) == before {
			require.True(t, time.Now().Before(deadline), "workertest: round %d: no outcome in %v", round+1, waitTimeout)
			time.Sleep(20 * time.Millisecond)
		}
		stop()
		require.NoError(t, b.Close())
	}
	var got []worker.Outcome
	for _, r := range out.snapshot() {
		got = append(got, r.outcome)
	}
	require.Equal(t, []worker.Outcome{worker.OutcomeUnsettled, worker.OutcomeDuplicate}, got)
	acks := fails.Snapshot(broker.SettleAck)
	require.Len(t, acks, 1, "the lost Ack is reported once")
	require.ErrorIs(t, acks[0].Err, errLostSettle)
	require.Equal(t, broker.ReasonOther, acks[0].Reason)
	require.Equal(t, int32(1), calls.Load(), "the redelivery after a lost Ack does not run the handler")
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE message_id = '6'`))
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM `+worker.AttemptsTable))
}
