package workertest

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/worker"
)

// The tests of batches (SuiteOptions.BatchSize > 1). Their messages are
// published before the worker starts, and the worker has one handling
// goroutine and a long BatchLinger, so the messages are handed out as one
// batch; each test checks that they were (one transaction ID).

// batchLinger is the batch tests' Config.BatchLinger: long enough for the
// adapter to hand out every prefetched message to one batch even on a busy
// machine.
const batchLinger = 200 * time.Millisecond

// batchConfig is f.config with one handling goroutine, batchLinger and a
// BatchSize of at least 5 (the most messages a batch test publishes).
func (f *fixture) batchConfig(consumer string, h worker.Handler) worker.Config {
	cfg := f.config(consumer, f.queue, h)
	cfg.BatchSize = max(cfg.BatchSize, 5)
	f.oneBatch(&cfg)
	return cfg
}

// oneBatch makes a worker with a BatchSize above 1 hand the messages
// published before its start out as one batch (one handling goroutine,
// batchLinger); it leaves a worker without batches as it is.
func (f *fixture) oneBatch(cfg *worker.Config) {
	if cfg.BatchSize > 1 {
		cfg.Concurrency = 1
		cfg.BatchLinger = batchLinger
	}
}

// txLog records, for every handler call, the transaction it ran in.
type txLog struct {
	mu    sync.Mutex
	calls []txCall
}

type txCall struct {
	id      string
	attempt int
	txid    int64
}

// record reads tx's transaction ID and records the call.
func (l *txLog) record(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
	var txid int64
	if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&txid); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, txCall{id: msg.ID, attempt: msg.Attempt, txid: txid})
	return nil
}

// mates returns the IDs handled in the same transaction as the first call
// for the given attempt of id, id excluded, sorted.
func (l *txLog) mates(t *testing.T, id string, attempt int) []string {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	txid := int64(-1)
	for _, c := range l.calls {
		if c.id == id && c.attempt == attempt {
			txid = c.txid
			break
		}
	}
	require.NotEqual(t, int64(-1), txid, "workertest: no handler call for %s attempt %d", id, attempt)
	var ids []string
	for _, c := range l.calls {
		if c.txid == txid && c.id != id {
			ids = append(ids, c.id)
		}
	}
	slices.Sort(ids)
	return ids
}

// callsOf returns how many times the handler ran for id.
func (l *txLog) callsOf(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.calls {
		if c.id == id {
			n++
		}
	}
	return n
}

// outcomesOf returns the outcomes recorded for id, in order.
func (o *outcomes) outcomesOf(id string) []outcomeRec {
	var recs []outcomeRec
	for _, r := range o.snapshot() {
		if r.id == id {
			recs = append(recs, outcomeRec{id: r.id, attempt: r.attempt, outcome: r.outcome})
		}
	}
	return recs
}

// testBatchFailure: one handler of a batch fails. The others commit and are
// acked at their first attempt; only the failing message is retried, and
// its dedup row is gone when OnFailure runs (after the batch's commit).
func testBatchFailure(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	log := &txLog{}
	cfg := f.batchConfig("bfail", func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		if err := log.record(ctx, tx, msg); err != nil {
			return err
		}
		if err := recordSideEffect(ctx, tx, "bfail", msg); err != nil {
			return err
		}
		if msg.ID == "3" && msg.Attempt == 1 {
			return errors.New("transient failure")
		}
		return nil
	})
	var dedupAtFailure, matesAtFailure atomic.Int32
	dedupAtFailure.Store(-1)
	fails := &failures{}
	cfg.OnFailure = func(ctx context.Context, tx pgx.Tx, msg *broker.Message, err error, dead bool) error {
		var n, m int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE message_id = $1`, msg.ID).Scan(&n); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM side_effects WHERE message_id <> $1`, msg.ID).Scan(&m); err != nil {
			return err
		}
		dedupAtFailure.Store(int32(n))
		matesAtFailure.Store(int32(m))
		return fails.hook(ctx, tx, msg, err, dead)
	}
	cfg.OnOutcome = out.hook
	f.publish(t, f.msg("1"), f.msg("2"), f.msg("3"), f.msg("4"), f.msg("5"))
	start(t, cfg)
	out.waitCount(t, worker.OutcomeAck, 5)
	out.settle()

	require.Equal(t, []string{"1", "2", "4", "5"}, log.mates(t, "3", 1), "the five messages form one batch")
	require.Equal(t, []failureRec{{attempt: 1, dead: false, err: "transient failure"}}, fails.snapshot())
	require.Equal(t, int32(0), dedupAtFailure.Load(), "the failed message's dedup row is removed")
	require.Equal(t, int32(4), matesAtFailure.Load(), "the other messages of the batch committed before the failure was settled")
	for _, id := range []string{"1", "2", "4", "5"} {
		require.Equal(t, []outcomeRec{{id: id, attempt: 1, outcome: worker.OutcomeAck}}, out.outcomesOf(id), "message %s", id)
		require.Equal(t, 1, log.callsOf(id), "message %s", id)
	}
	require.Equal(t, []outcomeRec{
		{id: "3", attempt: 1, outcome: worker.OutcomeRetry},
		{id: "3", attempt: 2, outcome: worker.OutcomeAck},
	}, out.outcomesOf("3"))
	require.Equal(t, 5, count(t, f.pool, `SELECT count(*) FROM side_effects`))
	require.Equal(t, 2, count(t, f.pool, `SELECT attempt FROM side_effects WHERE message_id = '3'`), "only the successful attempt's write of 3 survived")
	require.Equal(t, 5, count(t, f.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'bfail'`))
}

// testBatchDuplicates: a batch holds a message processed before and a
// message twice. The handler runs once for each new message; the others
// are acked as duplicates.
func testBatchDuplicates(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	log := &txLog{}
	cfg := f.batchConfig("bdup", func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		if err := log.record(ctx, tx, msg); err != nil {
			return err
		}
		return recordSideEffect(ctx, tx, "bdup", msg)
	})
	cfg.OnOutcome = out.hook
	_, err := f.pool.Exec(context.Background(), `INSERT INTO processed_messages (consumer, message_id) VALUES ('bdup', '8')`)
	require.NoError(t, err)
	// "9" is published twice; brokers that deduplicate publishes store it
	// once.
	f.publish(t, f.msg("7"), f.msg("8"), f.msg("9"))
	f.publish(t, f.msg("9"), f.msg("10"))
	start(t, cfg)
	out.waitCount(t, worker.OutcomeAck, 3)
	out.waitCount(t, worker.OutcomeDuplicate, 1)
	out.settle()

	require.Equal(t, []string{"10", "9"}, log.mates(t, "7", 1), "the messages form one batch")
	require.Equal(t, 3, out.count(worker.OutcomeAck))
	require.Equal(t, []outcomeRec{{id: "8", attempt: 1, outcome: worker.OutcomeDuplicate}}, out.outcomesOf("8"))
	// The settles of one batch go out at once, so the outcomes of its two
	// copies of 9 may be reported in either order.
	nine := out.outcomesOf("9")
	slices.SortStableFunc(nine, func(a, b outcomeRec) int { return cmp.Compare(a.outcome, b.outcome) })
	require.Contains(t, [][]outcomeRec{
		{{id: "9", attempt: 1, outcome: worker.OutcomeAck}},
		{{id: "9", attempt: 1, outcome: worker.OutcomeAck}, {id: "9", attempt: 1, outcome: worker.OutcomeDuplicate}},
	}, nine, "9 is handled once, its second delivery (if any) is a duplicate")
	require.Equal(t, 0, log.callsOf("8"))
	require.Equal(t, 1, log.callsOf("9"))
	require.Equal(t, 3, count(t, f.pool, `SELECT count(*) FROM side_effects`))
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE message_id = '8'`))
	require.Equal(t, 4, count(t, f.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'bdup'`))
}

// testBatchPanic: a handler panics in the middle of a batch. Only its
// message fails (and is retried); the others commit.
func testBatchPanic(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	log := &txLog{}
	fails := &failures{}
	cfg := f.batchConfig("bpanic", func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		if err := log.record(ctx, tx, msg); err != nil {
			return err
		}
		if err := recordSideEffect(ctx, tx, "bpanic", msg); err != nil {
			return err
		}
		if msg.ID == "2" && msg.Attempt == 1 {
			panic("nil map write in handler")
		}
		return nil
	})
	cfg.OnOutcome = out.hook
	cfg.OnFailure = fails.hook
	f.publish(t, f.msg("1"), f.msg("2"), f.msg("3"), f.msg("4"))
	start(t, cfg)
	out.waitCount(t, worker.OutcomeAck, 4)
	out.settle()

	require.Equal(t, []string{"1", "3", "4"}, log.mates(t, "2", 1), "the messages form one batch")
	got := fails.snapshot()
	require.Len(t, got, 1)
	require.False(t, got[0].dead)
	require.Contains(t, got[0].err, "nil map write in handler")
	for _, id := range []string{"1", "3", "4"} {
		require.Equal(t, []outcomeRec{{id: id, attempt: 1, outcome: worker.OutcomeAck}}, out.outcomesOf(id), "message %s", id)
	}
	require.Equal(t, []outcomeRec{
		{id: "2", attempt: 1, outcome: worker.OutcomeRetry},
		{id: "2", attempt: 2, outcome: worker.OutcomeAck},
	}, out.outcomesOf("2"))
	require.Equal(t, 4, count(t, f.pool, `SELECT count(*) FROM side_effects`))
	require.Equal(t, 4, count(t, f.pool, `SELECT count(DISTINCT message_id) FROM side_effects`))
	require.Equal(t, 4, count(t, f.pool, `SELECT count(*) FROM processed_messages`))
}

// testBatchCommitFailure: one message's write makes the batch's COMMIT
// fail (a deferred unique constraint). Nothing of the batch committed; the
// worker handles each message alone, so the other messages succeed at
// their first attempt and only the faulty one spends its attempts and goes
// to the DLQ.
func testBatchCommitFailure(t *testing.T, s suite) {
	f := setup(t, s, 1)
	ctx := context.Background()
	_, err := f.pool.Exec(ctx, `CREATE TABLE batch_deferred (k INT UNIQUE DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	out := newOutcomes()
	log := &txLog{}
	fails := &failures{}
	cfg := f.batchConfig("bcommit", func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		if err := log.record(ctx, tx, msg); err != nil {
			return err
		}
		if msg.ID == "bad" {
			// Checked only at COMMIT.
			if _, err := tx.Exec(ctx, `INSERT INTO batch_deferred (k) VALUES (1), (1)`); err != nil {
				return err
			}
		}
		return recordSideEffect(ctx, tx, "bcommit", msg)
	})
	cfg.OnOutcome = out.hook
	cfg.OnFailure = fails.hook
	f.publish(t, f.msg("1"), f.msg("2"), f.msg("bad"), f.msg("4"))
	start(t, cfg)
	out.waitCount(t, worker.OutcomeAck, 3)
	out.waitCount(t, worker.OutcomeDead, 1)
	out.settle()

	require.Equal(t, []string{"1", "2", "4"}, log.mates(t, "bad", 1), "the messages form one batch")
	for _, id := range []string{"1", "2", "4"} {
		require.Equal(t, []outcomeRec{{id: id, attempt: 1, outcome: worker.OutcomeAck}}, out.outcomesOf(id), "message %s spent no attempt", id)
		require.Equal(t, 2, log.callsOf(id), "message %s: handled in the batch, then alone", id)
	}
	require.Len(t, fails.snapshot(), 3, "bad: MaxAttempts failed attempts")
	for i, fr := range fails.snapshot() {
		require.Equal(t, i+1, fr.attempt)
		require.Equal(t, i == 2, fr.dead)
		require.Contains(t, fr.err, "commit")
	}
	dead := waitDLQ(t, f.b, f.queue, 1)
	require.Equal(t, "bad", dead[0].Message.ID)
	require.Equal(t, 3, count(t, f.pool, `SELECT count(*) FROM side_effects`))
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE message_id = 'bad'`))
	require.Equal(t, 3, count(t, f.pool, `SELECT count(*) FROM processed_messages`))
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM batch_deferred`))
}

// testBatchSQL: a batch handled by a Config.SQLHandler (a *sql.Tx) keeps
// the guarantees of a pgx batch: one transaction for the batch, a failing
// and a panicking handler fail only their own message (savepoints on the
// *sql.Tx), a message processed before is a duplicate.
func testBatchSQL(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	log := &txLog{}
	cfg := f.batchConfig("bsql", nil)
	cfg.Handler = nil
	cfg.SQLHandler = func(ctx context.Context, tx *sql.Tx, msg *broker.Message) error {
		var txid int64
		if err := tx.QueryRowContext(ctx, `SELECT txid_current()`).Scan(&txid); err != nil {
			return err
		}
		log.mu.Lock()
		log.calls = append(log.calls, txCall{id: msg.ID, attempt: msg.Attempt, txid: txid})
		log.mu.Unlock()
		if _, err := tx.ExecContext(ctx, `INSERT INTO side_effects (consumer, message_id, attempt) VALUES ('bsql', $1, $2)`, msg.ID, msg.Attempt); err != nil {
			return err
		}
		switch {
		case msg.ID == "2" && msg.Attempt == 1:
			panic("nil map write in handler")
		case msg.ID == "3" && msg.Attempt == 1:
			return errors.New("transient failure")
		}
		return nil
	}
	cfg.OnOutcome = out.hook
	_, err := f.pool.Exec(context.Background(), `INSERT INTO processed_messages (consumer, message_id) VALUES ('bsql', '5')`)
	require.NoError(t, err)
	f.publish(t, f.msg("1"), f.msg("2"), f.msg("3"), f.msg("4"), f.msg("5"))
	start(t, cfg)
	out.waitCount(t, worker.OutcomeAck, 4)
	out.waitCount(t, worker.OutcomeDuplicate, 1)
	out.settle()

	require.Equal(t, []string{"1", "2", "4"}, log.mates(t, "3", 1), "the new messages form one batch")
	for _, id := range []string{"1", "4"} {
		require.Equal(t, []outcomeRec{{id: id, attempt: 1, outcome: worker.OutcomeAck}}, out.outcomesOf(id), "message %s", id)
	}
	for _, id := range []string{"2", "3"} {
		require.Equal(t, []outcomeRec{
			{id: id, attempt: 1, outcome: worker.OutcomeRetry},
			{id: id, attempt: 2, outcome: worker.OutcomeAck},
		}, out.outcomesOf(id), "message %s", id)
	}
	require.Equal(t, []outcomeRec{{id: "5", attempt: 1, outcome: worker.OutcomeDuplicate}}, out.outcomesOf("5"))
	require.Equal(t, 0, log.callsOf("5"))
	require.Equal(t, 4, count(t, f.pool, `SELECT count(*) FROM side_effects`), "one write per message: the failed attempts' writes were rolled back")
	require.Equal(t, 4, count(t, f.pool, `SELECT count(DISTINCT message_id) FROM side_effects`))
	require.Equal(t, 2, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE attempt = 2`))
	require.Equal(t, 5, count(t, f.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'bsql'`))
}
