package worker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ferrymq/ferry/broker"
)

// SQLHandler is Handler for services written on database/sql: it handles
// one message inside the dedup transaction tx, a *sql.Tx of pgx's
// database/sql driver (github.com/jackc/pgx/v5/stdlib) on a connection of
// Config.Pool. Its writes through tx commit together with the dedup row,
// or not at all, exactly as Handler's through a pgx.Tx. It returns what a
// Handler returns (nil, an error, Permanent, RetryAfter) and must not
// commit or roll back tx. Set it in Config.SQLHandler instead of Handler.
type SQLHandler func(ctx context.Context, tx *sql.Tx, msg *broker.Message) error

// openSQL returns the *sql.DB the SQLHandler's transactions run on: pgx's
// stdlib driver over the worker's pool, keeping no idle connection of its
// own (each transaction acquires a pool connection and releases it at
// the end, as the pgx path does).
func (w *Worker) openSQL() *sql.DB {
	db := stdlib.OpenDBFromPool(w.cfg.Pool)
	db.SetMaxIdleConns(0)
	return db
}

// processSQL is process for Config.SQLHandler: the dedup insert, the read
// of the attempt record, the handler and the commit in one database/sql
// transaction. database/sql sends BEGIN, the insert and the read as three
// round trips (the pgx path pipelines them into one).
func (w *Worker) processSQL(ctx context.Context, msg *broker.Message) (res processResult) {
	res.msg = msg
	// The transaction lives on a context the shutdown does not cancel
	// (database/sql rolls a transaction back when its context ends): the
	// commit after a successful handler must happen, as commit does for
	// the pgx path. The statements use ctx.
	tx, err := w.sqlDB.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		if ctx.Err() != nil {
			res.err = ctx.Err()
		} else {
			res.err = fmt.Errorf("%w: begin transaction: %w", errDatabase, err)
		}
		return res
	}
	rollback := func() {
		if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
			w.log.Warn("worker: rollback", "err", err)
		}
	}
	inserted := false
	r, err := tx.ExecContext(ctx, dedupSQL, w.cfg.Consumer, msg.ID)
	if err == nil {
		var n int64
		n, err = r.RowsAffected()
		inserted = n == 1
	}
	if err == nil && inserted {
		err = tx.QueryRowContext(ctx, attemptSQL, w.cfg.Consumer, msg.ID).Scan(&res.rec.attempts, &res.rec.dead, &res.rec.lastError, &res.rec.snoozes)
		if errors.Is(err, sql.ErrNoRows) {
			err = nil
		}
	}
	if err != nil {
		rollback()
		var pgErr *pgconn.PgError
		switch {
		case ctx.Err() != nil:
			res.err = ctx.Err()
		case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22"):
			res.err = Permanent(fmt.Errorf("worker: message ID %q: insert into %s: %w", msg.ID, DedupTable, err))
		default:
			res.err = fmt.Errorf("%w: insert into %s: %w", errDatabase, DedupTable, err)
		}
		return res
	}
	if !inserted {
		rollback()
		res.dup = true
		return res
	}
	res.msg = withAttempt(msg, res.rec)
	if res.rec.dead {
		rollback()
		return res
	}
	if err := w.callSQLHandler(ctx, tx, res.msg); err != nil {
		if ctx.Err() == nil {
			res.fail = w.fail(ctx, res.msg, err, false)
		}
		rollback()
		res.err = err
		return res
	}
	if res.rec.attempts > 0 || res.rec.snoozes > 0 {
		if _, err := tx.ExecContext(ctx, clearAttemptsSQL, w.cfg.Consumer, msg.ID); err != nil {
			rollback()
			res.err = fmt.Errorf("worker: delete from %s: %w", AttemptsTable, err)
			return res
		}
	}
	if err := tx.Commit(); err != nil {
		rollback()
		res.err = fmt.Errorf("worker: commit: %w", err)
	}
	return res
}

// callSQLHandler is callHandler for Config.SQLHandler: it recovers a
// panic and cancels the handler's ctx after Config.HandlerTimeout (a
// handler that ignores it is not abandoned, unlike on the pgx path).
func (w *Worker) callSQLHandler(ctx context.Context, tx *sql.Tx, msg *broker.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrPanic, r)
			w.log.Error("worker: handler panicked", "message_id", msg.ID, "attempt", msg.Attempt, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	if w.cfg.HandlerTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.cfg.HandlerTimeout)
		defer cancel()
		defer func() {
			if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				err = fmt.Errorf("%w after %v: %w", ErrHandlerTimeout, w.cfg.HandlerTimeout, err)
			}
		}()
	}
	return w.cfg.SQLHandler(ctx, tx, msg)
}
