package outbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/outbox"
)

func TestPruneDeletesOnlyOldProcessedRows(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)

	ids := enqueue(t, pool, events(12, "test.retention")...)
	// ids[0:5]: processed 8 days ago (deleted); ids[5:8]: processed an hour
	// ago (kept); ids[8:10]: enqueued 30 days ago, never processed (kept);
	// ids[10:12]: fresh and unprocessed (kept).
	_, err := pool.Exec(ctx, `UPDATE outbox SET processed_at = now() - interval '8 days' WHERE id = ANY($1)`, ids[0:5])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE outbox SET processed_at = now() - interval '1 hour' WHERE id = ANY($1)`, ids[5:8])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE outbox SET occurred_at = now() - interval '30 days', attempts = 3 WHERE id = ANY($1)`, ids[8:10])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, processed_at)
		SELECT 'c', g::text, now() - interval '8 days' FROM generate_series(1, 7) g
		UNION ALL SELECT 'c', g::text, now() - interval '6 days' FROM generate_series(8, 9) g
		UNION ALL SELECT 'd', '1', now()`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO worker_attempts (consumer, message_id, attempts, updated_at)
		VALUES ('c', 'old', 2, now() - interval '8 days'), ('c', 'new', 1, now())`)
	require.NoError(t, err)

	// Batches of two: several statements per table.
	res, err := outbox.Prune(ctx, pool, 7*24*time.Hour, 2)
	require.NoError(t, err)
	require.Equal(t, outbox.PruneResult{Outbox: 5, ProcessedMessages: 7, WorkerAttempts: 1}, res)

	var left []int64
	rows, err := pool.Query(ctx, `SELECT id FROM outbox ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		left = append(left, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, ids[5:], left)
	var pm int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages`).Scan(&pm))
	require.Equal(t, 3, pm)

	// Nothing more to do.
	res, err = outbox.Prune(ctx, pool, 7*24*time.Hour, 0)
	require.NoError(t, err)
	require.Zero(t, res)

	_, err = outbox.Prune(ctx, pool, -time.Second, 0)
	require.Error(t, err)

	st, err := outbox.ReadStats(ctx, pool)
	require.NoError(t, err)
	require.EqualValues(t, 4, st.Unprocessed)
	require.EqualValues(t, 2, st.Parked)
	require.Len(t, st.ParkedRows, 2)
	require.Equal(t, ids[8], st.ParkedRows[0].ID)
	require.True(t, st.ParkedRows[0].NextAttemptAt.IsZero())
	require.Greater(t, st.OldestUnprocessedAge, 29*24*time.Hour)
	require.EqualValues(t, 0, st.ProcessedLastMinute)
	require.EqualValues(t, 0, st.ProcessedLastHour) // an hour and a few ms ago
}

func TestStatsEmpty(t *testing.T) {
	t.Parallel()
	st, err := outbox.ReadStats(testCtx(t), migratedPool(t))
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{}, st)
}
