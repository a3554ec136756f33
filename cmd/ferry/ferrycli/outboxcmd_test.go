package ferrycli_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// "ferry outbox stats" on a database without the schema gives the roles'
// "run ferry migrate first" error and exits 1, not PostgreSQL's raw
// `relation "outbox" does not exist (SQLSTATE 42P01)`.
func TestOutboxStatsRefusesDatabaseWithoutSchema(t *testing.T) {
	db := testenv.NewDatabase(t)
	code, errOut := runFor(t, 20*time.Second, "outbox", "stats", "--database-url", db)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, `ferry: the database has no ferry schema (outbox migration version 0 of `+latestOutboxVersion(t, db)+`): run "ferry migrate" first`)
	require.NotContains(t, errOut, "SQLSTATE")

	code, errOut = runFor(t, 30*time.Second, "migrate", "--database-url", db)
	require.Equal(t, 0, code, errOut)
	code, out, errOut := run(t, "outbox", "stats", "--database-url", db, "--format", "json")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"unprocessed": 0`)

	// An event scheduled for later is shown as scheduled, not as backlog.
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Event{Type: "a.b", Body: []byte{}, DueAt: time.Now().Add(time.Hour)})
		return err
	}))
	code, out, errOut = run(t, "outbox", "stats", "--database-url", db, "--format", "json")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"unprocessed": 0`)
	require.Contains(t, out, `"scheduled": 1`)
	code, out, errOut = run(t, "outbox", "stats", "--database-url", db)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `scheduled \(not yet due\)\s+1\n`, out)
}
