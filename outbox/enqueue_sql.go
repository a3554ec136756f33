package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
)

// EnqueueSQL is Enqueue for database/sql users: it stores events in the
// outbox inside the caller's transaction tx, which must come from a
// *sql.DB opened with the pgx driver (github.com/jackc/pgx/v5/stdlib:
// sql.Open("pgx", url) or stdlib.OpenDBFromPool), so the events are
// published if and only if tx commits. It returns the row ids in the
// order of events, validates the events as Enqueue does (an invalid one
// fails the call with an error wrapping ErrInvalidEvent and nothing is
// inserted), and returns nil, nil for no events. It sends the NOTIFY that
// wakes the relays in every call that has an event due now (the notify
// window of SetNotifyWindow applies to Enqueue only, which can see the
// connection). A database error, or a tx of another driver whose
// parameters cannot carry the arrays, is returned wrapped.
func EnqueueSQL(ctx context.Context, tx *sql.Tx, events ...Event) ([]int64, error) {
	if tx == nil {
		return nil, errors.New("outbox: enqueue: tx is nil")
	}
	if len(events) == 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a, err := prepare(events)
	if err != nil {
		return nil, err
	}
	fail := func(err error) ([]int64, error) {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, fmt.Errorf("outbox: enqueue: %w", err)
	}
	ids := make([]int64, 0, len(events))
	for _, st := range a.statements() {
		rows, err := tx.QueryContext(ctx, st.sql, st.args...)
		if err != nil {
			return fail(err)
		}
		start := len(ids)
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return fail(err)
			}
			ids = append(ids, id)
		}
		if err := rows.Err(); err != nil {
			return fail(err)
		}
		if err := rows.Close(); err != nil {
			return fail(err)
		}
		slices.Sort(ids[start:])
		if len(ids)-start != st.n {
			return nil, fmt.Errorf("outbox: enqueue: inserted %d rows for %d events", len(ids)-start, st.n)
		}
	}
	if !a.allLater {
		if _, err := tx.ExecContext(ctx, "SELECT pg_notify($1, '')", NotifyChannel); err != nil {
			return fail(err)
		}
	}
	return ids, nil
}
