package worker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferrymq/ferry/broker"
)

// The statements of a batch. The dedup rows are inserted in one statement,
// in sorted ID order so that two batches sharing IDs lock them in the same
// order (no deadlock); each new message then runs in the savepoint
// batchSavepoint, released (merged into the transaction) before the next
// message's savepoint is set in the same round trip.
const (
	batchDedupSQL      = `INSERT INTO processed_messages (consumer, message_id) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING RETURNING message_id`
	batchAttemptsSQL   = `SELECT message_id, attempts, dead, last_error, snoozes FROM worker_attempts WHERE consumer = $1 AND message_id = ANY($2::text[])`
	batchUndedupSQL    = `DELETE FROM processed_messages WHERE consumer = $1 AND message_id = $2`
	batchSavepoint     = `SAVEPOINT ferry_worker_msg`
	batchNextSavepoint = `RELEASE SAVEPOINT ferry_worker_msg; SAVEPOINT ferry_worker_msg`
	batchRollbackTo    = `ROLLBACK TO SAVEPOINT ferry_worker_msg`
)

// errBatch marks a failure of the batch as a whole that is not a database
// outage (a dedup ID the database refuses, a broken savepoint, a failed
// commit): nothing of the batch committed — or, for a commit whose answer
// was lost, everything did — and each message is handled again alone,
// where its own failure is judged as with BatchSize 1.
var errBatch = errors.New("worker: batch failed")

// gather returns first plus the deliveries sub hands out at once, up to
// BatchSize in all. It waits at most BatchLinger for each further one and
// stops at the first Receive error (a closed subscription is reported by
// the next blocking Receive of loop).
func (w *Worker) gather(loopCtx context.Context, sub broker.Subscription, first broker.Delivery) []broker.Delivery {
	batch := make([]broker.Delivery, 1, w.cfg.BatchSize)
	batch[0] = first
	for len(batch) < w.cfg.BatchSize && loopCtx.Err() == nil {
		ctx, cancel := context.WithTimeout(loopCtx, w.cfg.BatchLinger)
		d, err := sub.Receive(ctx)
		cancel()
		if err != nil {
			break
		}
		batch = append(batch, d)
	}
	return batch
}

// batchState is where one delivery of a batch stands.
type batchState int

const (
	batchPending   batchState = iota // not handled yet
	batchDuplicate                   // processed before, or twice in the batch
	batchDone                        // the handler succeeded
	batchFailed                      // the handler failed; its dedup row is removed
	batchDead                        // its attempt record says "dead": not handled, dedup row removed
)

// batchItem is one delivery of a batch.
type batchItem struct {
	d     broker.Delivery
	msg   *broker.Message
	ext   *extender
	state batchState
	rec   attemptRecord // the attempt record, when the state is not batchDuplicate
	err   error         // the handler's error when state is batchFailed
	fail  *failure      // the failed attempt, recorded before the commit
	// abandoned: the handler overran its timeout and was abandoned; the
	// batch's transaction was rolled back and fail is settled as is.
	abandoned bool
}

// handleBatch processes deliveries in one transaction and settles each
// one. runCtx is Run's ctx (done when the shutdown starts), ctx the
// handlers' ctx.
func (w *Worker) handleBatch(runCtx, ctx context.Context, ds []broker.Delivery) {
	items := make([]*batchItem, 0, len(ds))
	for _, d := range ds {
		msg := d.Message()
		if msg.ID == "" {
			w.settle(ctx, d, msg, w.fail(ctx, msg, ErrNoMessageID, true), 0)
			continue
		}
		items = append(items, &batchItem{d: d, msg: msg})
	}
	switch len(items) {
	case 0:
		return
	case 1:
		w.handle(runCtx, ctx, items[0].d)
		return
	}
	for _, it := range items {
		it.ext = w.startExtender(it.d)
	}
	stopAll := func() {
		for _, it := range items {
			it.ext.stop()
		}
	}

	start := time.Now()
	err := w.processBatch(ctx, items)
	// As in handle: while the database is unavailable, hold the batch and
	// try again without spending an attempt.
	for backoff := 100 * time.Millisecond; err != nil && errors.Is(err, errDatabase); backoff = min(2*backoff, 5*time.Second) {
		w.log.Error("worker: database unavailable; holding the batch and trying again", "messages", len(items), "err", err, "retry_in", backoff)
		select {
		case <-runCtx.Done():
			stopAll()
			w.log.Warn("worker: shutdown while the database is unavailable; batch left for redelivery", "messages", len(items))
			return
		case <-time.After(backoff):
		}
		start = time.Now()
		err = w.processBatch(ctx, items)
	}
	dur := time.Since(start)

	switch {
	case err == nil:
		stopAll()
		// The settles of a batch go out at once, not one after another:
		// each waits for the broker's answer (a round trip of 10 to 20 ms
		// on AWS SQS), and an adapter may fold them into one call (SQS's
		// DeleteMessageBatch).
		var wg sync.WaitGroup
		for _, it := range items {
			wg.Go(func() {
				switch it.state {
				case batchDuplicate:
					w.ack(ctx, it.d, it.msg, OutcomeDuplicate, dur)
				case batchDone:
					w.ack(ctx, it.d, it.msg, OutcomeAck, dur)
				case batchDead:
					w.deadAgain(ctx, it.d, it.msg, it.rec, dur)
				case batchFailed:
					if ctx.Err() != nil {
						w.log.Warn("worker: handler cancelled by shutdown; message left for redelivery", "message_id", it.msg.ID, "err", it.err)
						return
					}
					f := it.fail
					if f == nil {
						f = w.fail(ctx, it.msg, it.err, false)
					}
					w.settle(ctx, it.d, it.msg, f, dur)
				}
			})
		}
		wg.Wait()
	case ctx.Err() != nil:
		stopAll()
		w.log.Warn("worker: batch cancelled by shutdown; messages left for redelivery", "messages", len(items), "err", err)
	default:
		// Not the messages' fault as far as we know: handle each alone,
		// which also decides for a lost commit answer (its dedup rows are
		// then found and the deliveries acked as duplicates).
		w.log.Warn("worker: batch failed; handling its messages one by one", "messages", len(items), "err", err)
		for _, it := range items {
			if it.abandoned {
				it.ext.stop()
				w.settle(ctx, it.d, it.msg, it.fail, dur)
				continue
			}
			w.handleExtended(runCtx, ctx, it.d, it.ext)
		}
	}
}

// processBatch runs the dedup insert for every item, the handler of each
// new message in its own savepoint, and the commit, in one transaction. On
// nil every item's state is set; otherwise nothing was committed (unless a
// commit's answer was lost) and the error wraps errDatabase (hold and try
// again), errBatch (handle each message alone) or is ctx's error.
func (w *Worker) processBatch(ctx context.Context, items []*batchItem) error {
	for _, it := range items {
		it.state, it.err, it.rec, it.msg, it.fail, it.abandoned = batchPending, nil, attemptRecord{}, it.d.Message(), nil, false
	}
	ids := make([]string, 0, len(items))
	for _, it := range items {
		ids = append(ids, it.msg.ID)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	insert := w.insertDedup
	if w.cfg.SQLHandler != nil {
		insert = w.insertDedupSQL
	}
	tx, inserted, err := insert(ctx, ids)
	abandoned := false
	if tx != nil {
		defer func() {
			if !abandoned { // else the abandoned handler's goroutine owns tx
				tx.rollback(ctx) // after the commit: a no-op
			}
		}()
	}
	if err != nil {
		return err
	}
	// A message already bound for the DLQ is not handled: its dedup row
	// goes (before any savepoint), and it is dead-lettered after the commit.
	for id, rec := range inserted {
		if rec.dead {
			if err := tx.exec(ctx, batchUndedupSQL, w.cfg.Consumer, id); err != nil {
				return w.batchErr(ctx, "delete the dedup row of a dead message", err)
			}
		}
	}
	var savepoint bool
	for _, it := range items {
		rec, ok := inserted[it.msg.ID]
		if !ok {
			it.state = batchDuplicate
			continue
		}
		delete(inserted, it.msg.ID) // a second delivery of it in this batch is a duplicate
		it.rec, it.msg = rec, withAttempt(it.msg, rec)
		if rec.dead {
			it.state = batchDead
			continue
		}
		sql := batchSavepoint
		if savepoint {
			sql = batchNextSavepoint
		}
		if err := tx.exec(ctx, sql); err != nil {
			return w.batchErr(ctx, "savepoint", err)
		}
		savepoint = true
		ab, err := tx.handle(ctx, it.msg)
		if ab != nil {
			// As in process: record, then roll the whole batch back by
			// closing its connection; the others are handled alone.
			abandoned = true
			it.state, it.err, it.abandoned = batchFailed, err, true
			it.fail = w.fail(ctx, it.msg, err, false)
			ab.kill()
			return w.batchErr(ctx, "a handler overran its timeout", err)
		}
		if err != nil {
			it.state, it.err = batchFailed, err
			if ctx.Err() == nil {
				// Recorded before the commit releases the dedup row a
				// redelivered copy may be waiting for (see process).
				it.fail = w.fail(ctx, it.msg, err, false)
			}
			// Undo the handler's writes and the message's dedup row, so
			// the retry is handled like a first delivery.
			if err := tx.exec(ctx, batchRollbackTo); err != nil {
				return w.batchErr(ctx, "roll back to savepoint", err)
			}
			if err := tx.exec(ctx, batchUndedupSQL, w.cfg.Consumer, it.msg.ID); err != nil {
				return w.batchErr(ctx, "delete the dedup row of a failed message", err)
			}
			continue
		}
		if rec.attempts > 0 || rec.snoozes > 0 {
			if err := tx.exec(ctx, clearAttemptsSQL, w.cfg.Consumer, it.msg.ID); err != nil {
				return w.batchErr(ctx, "delete the attempt record of a message handled", err)
			}
		}
		it.state = batchDone
	}
	if err := tx.commit(ctx); err != nil {
		return w.batchErr(ctx, "commit", err)
	}
	return nil
}

// batchTx is the transaction of a batch: a pgx.Tx for Config.Handler, a
// *sql.Tx for Config.SQLHandler.
type batchTx interface {
	// exec runs one statement (or several, without args).
	exec(ctx context.Context, sql string, args ...any) error
	// handle calls the handler for msg in the transaction; a non-nil
	// abandonment means it overran its timeout (pgx only).
	handle(ctx context.Context, msg *broker.Message) (*abandonment, error)
	commit(ctx context.Context) error
	// rollback rolls back; after commit, a no-op.
	rollback(ctx context.Context)
}

// pgxBatchTx is batchTx for Config.Handler.
type pgxBatchTx struct {
	w  *Worker
	tx pgx.Tx
}

func (t pgxBatchTx) exec(ctx context.Context, sql string, args ...any) error {
	_, err := t.tx.Exec(ctx, sql, args...)
	return err
}

func (t pgxBatchTx) handle(ctx context.Context, msg *broker.Message) (*abandonment, error) {
	return t.w.callHandler(ctx, t.tx, msg, func() { t.w.rollback(ctx, t.tx) })
}

func (t pgxBatchTx) commit(ctx context.Context) error { return commit(ctx, t.tx) }
func (t pgxBatchTx) rollback(ctx context.Context)     { t.w.rollback(ctx, t.tx) }

// sqlBatchTx is batchTx for Config.SQLHandler: savepoints work on a
// *sql.Tx as on a pgx.Tx (they are plain statements); a handler that
// overruns HandlerTimeout is not abandoned (as in processSQL).
type sqlBatchTx struct {
	w  *Worker
	tx *sql.Tx
}

func (t sqlBatchTx) exec(ctx context.Context, sql string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, sql, args...)
	return err
}

func (t sqlBatchTx) handle(ctx context.Context, msg *broker.Message) (*abandonment, error) {
	return nil, t.w.callSQLHandler(ctx, t.tx, msg)
}

func (t sqlBatchTx) commit(context.Context) error { return t.tx.Commit() }

func (t sqlBatchTx) rollback(context.Context) {
	if err := t.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		t.w.log.Warn("worker: rollback", "err", err)
	}
}

// insertDedupSQL is insertDedup for Config.SQLHandler, on a database/sql
// transaction (BEGIN, the insert and the read are three round trips). The
// transaction lives on a ctx the shutdown does not cancel, as in
// processSQL; tx is nil only when BEGIN failed.
func (w *Worker) insertDedupSQL(ctx context.Context, ids []string) (batchTx, map[string]attemptRecord, error) {
	stx, err := w.sqlDB.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, fmt.Errorf("%w: begin transaction: %w", errDatabase, err)
	}
	tx := sqlBatchTx{w: w, tx: stx}
	inserted := make(map[string]attemptRecord, len(ids))
	err = func() error {
		rows, err := stx.QueryContext(ctx, batchDedupSQL, w.cfg.Consumer, ids)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			inserted[id] = attemptRecord{}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = stx.QueryContext(ctx, batchAttemptsSQL, w.cfg.Consumer, ids)
		if err != nil {
			return err
		}
		for rows.Next() {
			var (
				id  string
				rec attemptRecord
			)
			if err := rows.Scan(&id, &rec.attempts, &rec.dead, &rec.lastError, &rec.snoozes); err != nil {
				rows.Close()
				return err
			}
			if _, ok := inserted[id]; ok {
				inserted[id] = rec
			}
		}
		return rows.Err()
	}()
	if err != nil {
		return tx, nil, w.dedupErr(ctx, err)
	}
	return tx, inserted, nil
}

// dedupErr classifies a failure of a batch's dedup insert or attempt
// read: ctx's error, errBatch for a data exception (some message ID is
// unusable; alone, that message is dead-lettered and the others
// handled), else errDatabase.
func (w *Worker) dedupErr(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22"):
		return fmt.Errorf("%w: insert into %s: %w", errBatch, DedupTable, err)
	default:
		return fmt.Errorf("%w: insert into %s: %w", errDatabase, DedupTable, err)
	}
}

// insertDedup opens the batch's transaction and inserts (Consumer, id) for
// each of ids, and returns the transaction and the ids inserted, i.e. not
// processed before, with their attempt records. BEGIN, the insert and the
// read of the records (a second statement, for the reason given at
// attemptSQL) go in one round trip (pgx.Batch.BeginTx). tx is nil only
// when no connection was acquired; the caller rolls it back on error.
func (w *Worker) insertDedup(ctx context.Context, ids []string) (_ batchTx, _ map[string]attemptRecord, err error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(batchDedupSQL, w.cfg.Consumer, ids)
	b.Queue(batchAttemptsSQL, w.cfg.Consumer, ids)
	br := w.cfg.Pool.SendBatch(ctx, b)
	var tx batchTx
	if ptx := br.Tx(); ptx != nil {
		tx = pgxBatchTx{w: w, tx: ptx}
	}
	inserted := make(map[string]attemptRecord, len(ids))
	if _, err := br.Exec(); err != nil {
		br.Close()
		if ctx.Err() != nil {
			return tx, nil, ctx.Err()
		}
		return tx, nil, fmt.Errorf("%w: begin transaction: %w", errDatabase, err)
	}
	rows, _ := br.Query()
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err == nil {
		for _, id := range got {
			inserted[id] = attemptRecord{}
		}
		var (
			id  string
			rec attemptRecord
		)
		rows, _ = br.Query()
		_, err = pgx.ForEachRow(rows, []any{&id, &rec.attempts, &rec.dead, &rec.lastError, &rec.snoozes}, func() error {
			if _, ok := inserted[id]; ok {
				inserted[id] = rec
			}
			return nil
		})
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return tx, nil, w.dedupErr(ctx, err)
	}
	return tx, inserted, nil
}

// batchErr wraps a failure of a batch statement in errBatch, or returns
// ctx's error when the handlers' ctx was cancelled.
func (w *Worker) batchErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %s: %w", errBatch, what, err)
}
