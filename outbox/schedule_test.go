package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/outbox"
)

// A scheduled event is stored with next_attempt_at = DueAt (rounded up to
// PostgreSQL's microseconds, never earlier) and occurred_at = DueAt, and
// counts as Scheduled, not as backlog, until due; a DueAt already past is
// an ordinary due row.
func TestEnqueueDueAt(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	due := time.Now().Add(time.Hour).Truncate(time.Microsecond).Add(1500 * time.Nanosecond)
	ids := enqueue(t, pool,
		outbox.Event{Type: "a.later", Body: []byte{}, DueAt: due},
		outbox.Event{Type: "a.now", Body: []byte{}},
		outbox.Event{Type: "a.past", Body: []byte{}, DueAt: time.Now().Add(-time.Hour)})

	var next, occurred time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT next_attempt_at, occurred_at FROM outbox WHERE id = $1`, ids[0]).Scan(&next, &occurred))
	require.False(t, next.Before(due), "next_attempt_at %v is before DueAt %v", next, due)
	require.Less(t, next.Sub(due), time.Microsecond)
	require.Equal(t, next, occurred, "a scheduled event occurs when it is due")

	var nullNext bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT next_attempt_at IS NULL FROM outbox WHERE id = $1`, ids[1]).Scan(&nullNext))
	require.True(t, nullNext)
	require.NoError(t, pool.QueryRow(ctx, `SELECT occurred_at FROM outbox WHERE id = $1`, ids[2]).Scan(&occurred))
	require.WithinDuration(t, time.Now(), occurred, time.Minute, "a past DueAt: occurred_at is the enqueue time")

	st, err := outbox.ReadStats(ctx, pool)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Scheduled)
	require.EqualValues(t, 2, st.Unprocessed, "the scheduled row is not backlog")
	require.Less(t, st.OldestUnprocessedAge, time.Minute, "the scheduled row does not age the backlog")
	require.Zero(t, st.Parked)
}

// With many rows waiting for their DueAt and few due, the claim's plan
// reads the due rows through the partial indexes instead of walking the
// waiting ones (outbox/doc.go, "Scheduled events").
func TestClaimDoesNotReadWaitingRows(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	_, err := pool.Exec(ctx, `INSERT INTO outbox (event_type, payload, next_attempt_at, occurred_at)
		SELECT 'a.later', '', now() + interval '1 day', now() + interval '1 day' FROM generate_series(1, 20000)`)
	require.NoError(t, err)
	enqueue(t, pool, events(5, "a.now")...)
	_, err = pool.Exec(ctx, `ANALYZE outbox`)
	require.NoError(t, err)
	rows, err := pool.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF) SELECT id FROM outbox
		WHERE processed_at IS NULL AND destination = 'default' AND (next_attempt_at IS NULL OR next_attempt_at <= now())
		ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED`)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := ""
	for _, l := range lines {
		plan += l + "\n"
	}
	require.Contains(t, plan, "outbox_ready_dest_idx", plan)
	require.Contains(t, plan, "outbox_waiting_dest_idx", plan)
	require.NotContains(t, plan, "Rows Removed by Filter: 20000", plan)
}

// EnqueueSQL stores events through a database/sql transaction of the pgx
// driver: published only on commit, validated like Enqueue, and it wakes
// the relay unless every event is due later.
func TestEnqueueSQL(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "LISTEN "+outbox.NotifyChannel)
	require.NoError(t, err)

	inTx := func(f func(tx *sql.Tx) error) error {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		if err := f(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	var ids []int64
	require.NoError(t, inTx(func(tx *sql.Tx) error {
		ids, err = outbox.EnqueueSQL(ctx, tx, events(3, "a.b")...)
		return err
	}))
	require.Len(t, ids, 3)
	require.Less(t, ids[0], ids[1])
	require.Equal(t, 1, notifications(t, conn, 300*time.Millisecond))
	var typ, key, body string
	require.NoError(t, pool.QueryRow(ctx, `SELECT event_type, partition_key, convert_from(payload, 'UTF8') FROM outbox WHERE id = $1`, ids[2]).
		Scan(&typ, &key, &body))
	require.Equal(t, []string{"a.b", "k2", `{"i":2}`}, []string{typ, key, body})

	// Due later only: no NOTIFY, the relay's poll finds it when due.
	require.NoError(t, inTx(func(tx *sql.Tx) error {
		_, err := outbox.EnqueueSQL(ctx, tx, outbox.Event{Type: "a.b", Body: []byte{}, DueAt: time.Now().Add(time.Hour)})
		return err
	}))
	require.Zero(t, notifications(t, conn, 300*time.Millisecond))

	// Invalid: nothing inserted; rolled back: nothing stored.
	err = inTx(func(tx *sql.Tx) error {
		_, err := outbox.EnqueueSQL(ctx, tx, outbox.Event{Type: "a.b", Body: []byte{}}, outbox.Event{Type: "a.*", Body: []byte{}})
		return err
	})
	require.ErrorIs(t, err, outbox.ErrInvalidEvent)
	require.Contains(t, err.Error(), "events[1].Type")
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = outbox.EnqueueSQL(ctx, tx, events(1, "a.rolledback")...)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n))
	require.Equal(t, 4, n)

	got, err := outbox.EnqueueSQL(ctx, nil, events(1, "a.b")...)
	require.Error(t, err)
	require.Nil(t, got)
}
