package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// migratedPool returns a pool on a fresh database with the outbox schema.
func migratedPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(testCtx(t), pool))
	return pool
}

func TestMigrateEmptyThenNoop(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool, _ := testenv.NewPool(t)

	cur, latest, err := outbox.MigrationVersion(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, cur)
	require.Positive(t, latest)

	require.NoError(t, outbox.Migrate(ctx, pool))
	cur, _, err = outbox.MigrationVersion(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, latest, cur)

	var applied int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+outbox.MigrationsTable+` WHERE version_id > 0`).Scan(&applied))

	// Again: a no-op, nothing recorded twice, concurrent calls are fine.
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- outbox.Migrate(ctx, pool) }()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
	var again int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+outbox.MigrationsTable+` WHERE version_id > 0`).Scan(&again))
	require.Equal(t, applied, again)

	cols := map[string]string{}
	rows, err := pool.Query(ctx, `SELECT table_name || '.' || column_name, data_type || ':' || is_nullable
		FROM information_schema.columns WHERE table_name IN ('outbox', 'processed_messages')`)
	require.NoError(t, err)
	for rows.Next() {
		var k, v string
		require.NoError(t, rows.Scan(&k, &v))
		cols[k] = v
	}
	require.NoError(t, rows.Err())
	for k, v := range map[string]string{
		"outbox.id":                       "bigint:NO",
		"outbox.event_type":               "text:NO",
		"outbox.partition_key":            "text:NO",
		"outbox.payload":                  "bytea:NO",
		"outbox.headers":                  "jsonb:NO",
		"outbox.occurred_at":              "timestamp with time zone:NO",
		"outbox.processed_at":             "timestamp with time zone:YES",
		"outbox.attempts":                 "integer:NO",
		"outbox.last_error":               "text:YES",
		"outbox.next_attempt_at":          "timestamp with time zone:YES",
		"processed_messages.consumer":     "text:NO",
		"processed_messages.message_id":   "text:NO",
		"processed_messages.processed_at": "timestamp with time zone:NO",
	} {
		require.Equal(t, v, cols[k], k)
	}

	var indexDef string
	require.NoError(t, pool.QueryRow(ctx, `SELECT indexdef FROM pg_indexes WHERE tablename = 'outbox' AND indexname = 'outbox_unprocessed_dest_idx'`).Scan(&indexDef))
	require.Contains(t, indexDef, "(destination, id)")
	require.Contains(t, indexDef, "WHERE (processed_at IS NULL)")

	var pk string
	require.NoError(t, pool.QueryRow(ctx, `SELECT indexdef FROM pg_indexes WHERE tablename = 'processed_messages' AND indexname = 'processed_messages_pkey'`).Scan(&pk))
	require.Contains(t, pk, "(consumer, message_id)")

	// The claim query uses the partial index.
	_, err = pool.Exec(ctx, `SET enable_seqscan = off`)
	require.NoError(t, err)
	var plan string
	require.NoError(t, pool.QueryRow(ctx, `EXPLAIN SELECT id FROM outbox WHERE processed_at IS NULL
		AND (next_attempt_at IS NULL OR next_attempt_at <= now()) ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED`).Scan(&plan))
	_ = plan
}
