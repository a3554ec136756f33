package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotParked is returned by RetryParked and DropParked for an id that is
// not a parked row: no such row, already published, or never failed
// (attempts = 0, e.g. a row waiting out a broker outage).
var ErrNotParked = errors.New("outbox: not a parked row")

const retryParkedSQL = `UPDATE outbox SET next_attempt_at = NULL
WHERE id = $1 AND processed_at IS NULL AND attempts > 0
RETURNING id, destination, event_type, attempts, COALESCE(last_error, ''), occurred_at, NULL::timestamptz`

const dropParkedSQL = `DELETE FROM outbox
WHERE id = $1 AND processed_at IS NULL AND attempts > 0
RETURNING id, destination, event_type, attempts, COALESCE(last_error, ''), occurred_at, next_attempt_at`

// RetryParked makes the parked row id (see Stats.ParkedRows) due now: the
// next claim of any relay of its destination publishes it, whatever its backoff said. It
// keeps attempts and last_error, and returns the row as it was found. It
// returns an error wrapping ErrNotParked when id is not a parked row.
// Per-key order: the row goes out after the rows of its key that were
// published while it was parked (see the package documentation, "Order").
func RetryParked(ctx context.Context, pool *pgxpool.Pool, id int64) (ParkedRow, error) {
	return parkedOp(ctx, pool, "retry", retryParkedSQL, id)
}

// DropParked deletes the parked row id for good: its event is never
// published. It returns the deleted row, for the operator's audit log, or
// an error wrapping ErrNotParked when id is not a parked row. A row a
// relay holds in a batch at that moment is waited for (the DELETE takes
// the row lock).
func DropParked(ctx context.Context, pool *pgxpool.Pool, id int64) (ParkedRow, error) {
	return parkedOp(ctx, pool, "drop", dropParkedSQL, id)
}

func parkedOp(ctx context.Context, pool *pgxpool.Pool, op, sql string, id int64) (ParkedRow, error) {
	if pool == nil {
		return ParkedRow{}, fmt.Errorf("outbox: %s parked row: pool is nil", op)
	}
	var (
		p    ParkedRow
		next *time.Time
	)
	err := pool.QueryRow(ctx, sql, id).Scan(&p.ID, &p.Destination, &p.Type, &p.Attempts, &p.LastError, &p.OccurredAt, &next)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ParkedRow{}, fmt.Errorf("%w: id %d (no unprocessed row with attempts > 0; see ferry outbox stats)", ErrNotParked, id)
	case err != nil:
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ParkedRow{}, ctxErr
		}
		return ParkedRow{}, fmt.Errorf("outbox: %s parked row %d: %w", op, id, err)
	}
	if next != nil {
		p.NextAttemptAt = *next
	}
	return p, nil
}

// AuditParked writes the audit line of an operator's action on a parked
// row, the same for the ferry command (ferry outbox retry|drop) and the
// web console: an INFO line "outbox retry" or "outbox drop" (op is "retry"
// or "drop") with the row's id, destination, type, attempts and
// last_error, who acted (by) and when (at, RFC 3339, UTC). A nil log
// writes nothing.
func AuditParked(log *slog.Logger, op string, p ParkedRow, by string) {
	if log == nil {
		return
	}
	log.Info("outbox "+op, "id", p.ID, "destination", p.Destination, "type", p.Type, "attempts", p.Attempts, "last_error", p.LastError,
		"by", by, "at", time.Now().UTC().Format(time.RFC3339))
}
