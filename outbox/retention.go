package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PruneResult counts the rows one Prune deleted.
type PruneResult struct {
	// Outbox is the number of processed outbox rows deleted.
	Outbox int64
	// ProcessedMessages is the number of processed_messages rows deleted.
	ProcessedMessages int64
	// WorkerAttempts is the number of worker_attempts rows deleted: attempt
	// records not updated for olderThan, left by messages that vanished
	// from the broker (purged) between a failed attempt and the next.
	WorkerAttempts int64
	// UniqueKeys is the number of outbox_unique rows deleted: unique keys
	// (Event.UniqueKey) whose window had ended, whatever olderThan.
	UniqueKeys int64
	// Cancelled is the number of outbox_cancelled rows deleted: jobs
	// cancelled (JobCancel) more than olderThan ago.
	Cancelled int64
	// DeadRecords is the number of worker_dead rows deleted: records of
	// messages dead-lettered more than olderThan ago.
	DeadRecords int64
	// Workflows is the number of workflows deleted (with their jobs' and
	// edges' rows; the jobs' outbox rows go as any): enqueued more than
	// olderThan ago, none of their jobs still held.
	Workflows int64
}

const pruneOutboxSQL = `DELETE FROM outbox WHERE id IN (
	SELECT id FROM outbox
	WHERE processed_at IS NOT NULL AND processed_at < now() - $1::bigint * interval '1 millisecond'
	LIMIT $2
	FOR UPDATE SKIP LOCKED)`

const pruneProcessedSQL = `DELETE FROM processed_messages WHERE (consumer, message_id) IN (
	SELECT consumer, message_id FROM processed_messages
	WHERE processed_at < now() - $1::bigint * interval '1 millisecond'
	LIMIT $2
	FOR UPDATE SKIP LOCKED)`

const pruneAttemptsSQL = `DELETE FROM worker_attempts WHERE (consumer, message_id) IN (
	SELECT consumer, message_id FROM worker_attempts
	WHERE updated_at < now() - $1::bigint * interval '1 millisecond'
	LIMIT $2
	FOR UPDATE SKIP LOCKED)`

const pruneCancelledSQL = `DELETE FROM outbox_cancelled WHERE id IN (
	SELECT id FROM outbox_cancelled
	WHERE cancelled_at < now() - $1::bigint * interval '1 millisecond'
	LIMIT $2
	FOR UPDATE SKIP LOCKED)`

const pruneDeadSQL = `DELETE FROM worker_dead WHERE (consumer, message_id) IN (
	SELECT consumer, message_id FROM worker_dead
	WHERE dead_at < now() - $1::bigint * interval '1 millisecond'
	LIMIT $2
	FOR UPDATE SKIP LOCKED)`

// pruneWorkflowsSQL deletes the workflows enqueued more than $1 ago of
// which no job is held (nothing is left to release or cancel), with their
// rows in outbox_workflow_jobs and outbox_workflow_edges.
const pruneWorkflowsSQL = `WITH w AS (
	SELECT ow.id FROM outbox_workflows ow
	WHERE ow.created_at < now() - $1::bigint * interval '1 millisecond'
	  AND NOT EXISTS (SELECT 1 FROM outbox_workflow_jobs j JOIN outbox_held h ON h.id = j.id WHERE j.workflow_id = ow.id)
	ORDER BY ow.id
	LIMIT $2
	FOR UPDATE SKIP LOCKED
), j AS (
	DELETE FROM outbox_workflow_jobs j USING w WHERE j.workflow_id = w.id RETURNING j.id
), e AS (
	DELETE FROM outbox_workflow_edges e USING j WHERE e.job = j.id
)
DELETE FROM outbox_workflows o USING w WHERE o.id = w.id`

// pruneUniqueSQL deletes the unique keys whose window has ended: an
// Enqueue would replace them anyway. $1 (olderThan) does not apply.
const pruneUniqueSQL = `DELETE FROM outbox_unique WHERE unique_key IN (
	SELECT unique_key FROM outbox_unique
	WHERE expires_at < now() AND $1::bigint IS NOT NULL
	LIMIT $2
	FOR UPDATE SKIP LOCKED)`

// Prune deletes outbox rows processed more than olderThan ago (rows not
// yet processed are never deleted), processed_messages rows recorded
// more than olderThan ago and the workers' attempt records (worker_attempts)
// last updated more than olderThan ago, the unique keys whose window
// has ended (Event.UniqueFor), the cancelled jobs (outbox_cancelled)
// cancelled and the dead-letter records (worker_dead) written more than
// olderThan ago, and the workflows enqueued more than olderThan ago with
// no job still held (WorkflowGet no longer finds them), batch rows per DELETE statement (batch <= 0
// means DefaultRetentionBatch), until none is left. Each statement is its
// own short transaction, so Prune can run beside a busy relay; several
// Prunes at once skip each other's rows. It returns what it deleted, also
// when it stops early on an error or on ctx.
func Prune(ctx context.Context, pool *pgxpool.Pool, olderThan time.Duration, batch int) (PruneResult, error) {
	var res PruneResult
	if pool == nil {
		return res, errors.New("outbox: prune: pool is nil")
	}
	if olderThan < 0 {
		return res, fmt.Errorf("outbox: prune: olderThan %v: must not be negative", olderThan)
	}
	if batch <= 0 {
		batch = DefaultRetentionBatch
	}
	for _, step := range []struct {
		table string
		sql   string
		n     *int64
	}{
		{"outbox", pruneOutboxSQL, &res.Outbox},
		{"processed_messages", pruneProcessedSQL, &res.ProcessedMessages},
		{"worker_attempts", pruneAttemptsSQL, &res.WorkerAttempts},
		{"outbox_unique", pruneUniqueSQL, &res.UniqueKeys},
		{"outbox_cancelled", pruneCancelledSQL, &res.Cancelled},
		{"worker_dead", pruneDeadSQL, &res.DeadRecords},
		{"outbox_workflows", pruneWorkflowsSQL, &res.Workflows},
	} {
		for {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			tag, err := pool.Exec(ctx, step.sql, olderThan.Milliseconds(), batch)
			if err != nil {
				if ctxErr := ctx.Err(); ctxErr != nil {
					return res, ctxErr
				}
				return res, fmt.Errorf("outbox: prune %s: %w", step.table, err)
			}
			*step.n += tag.RowsAffected()
			if tag.RowsAffected() < int64(batch) {
				break
			}
		}
	}
	return res, nil
}

// retain runs Prune at start and every RetentionInterval until ctx is done.
func (r *Relay) retain(ctx context.Context) {
	failing := false
	for {
		res, err := Prune(ctx, r.cfg.Pool, r.cfg.Retention, r.cfg.RetentionBatch)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil && !failing:
			failing = true
			r.log.Warn("outbox: relay: retention failed, will retry", "err", err)
		case err == nil:
			failing = false
			if res.Outbox > 0 || res.ProcessedMessages > 0 || res.WorkerAttempts > 0 || res.UniqueKeys > 0 {
				r.log.Debug("outbox: relay: retention", "outbox_deleted", res.Outbox, "processed_messages_deleted", res.ProcessedMessages,
					"worker_attempts_deleted", res.WorkerAttempts, "unique_keys_deleted", res.UniqueKeys)
			}
		}
		if !sleep(ctx, r.cfg.RetentionInterval) {
			return
		}
	}
}
