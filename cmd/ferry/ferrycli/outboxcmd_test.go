package ferrycli_test

import (
	"context"
	"fmt"
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

// "ferry outbox retry" makes a parked row due now and "ferry outbox drop
// --yes" deletes one, each logged with who and what; a row that is not
// parked is an error naming it, and drop without --yes is a usage error
// that changes nothing.
func TestOutboxRetryAndDropParked(t *testing.T) {
	db := testenv.NewDatabase(t)
	code, errOut := runFor(t, 30*time.Second, "migrate", "--database-url", db)
	require.Equal(t, 0, code, errOut)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	defer pool.Close()
	var ids []int64
	rows, err := pool.Query(ctx, `INSERT INTO outbox (event_type, payload, attempts, last_error, next_attempt_at)
		VALUES ('a.parked', 'x', 3, 'broker: message unroutable', now() + interval '1 hour'),
		       ('a.poison', 'x', 7, 'broker: invalid message', now() + interval '1 hour'),
		       ('a.fresh', 'x', 0, NULL, NULL) RETURNING id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	id := func(i int) string { return fmt.Sprint(ids[i]) }

	code, out, errOut := run(t, "outbox", "retry", "--database-url", db, "--id", id(0))
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "made due now 1 parked row(s): "+id(0))
	require.Contains(t, errOut, "outbox retry")
	require.Contains(t, errOut, "type=a.parked")
	require.Contains(t, errOut, "by=")
	var due bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT next_attempt_at IS NULL FROM outbox WHERE id = $1`, ids[0]).Scan(&due))
	require.True(t, due)

	code, _, errOut = run(t, "outbox", "drop", "--database-url", db, "--id", id(1))
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "--yes")

	code, out, errOut = run(t, "outbox", "drop", "--database-url", db, "--id", id(1)+","+id(2), "--yes")
	require.Equal(t, 1, code, errOut)
	require.Empty(t, out, "a failing command prints no result line")
	require.Contains(t, errOut, "the other 1 dropped: "+id(1))
	require.Contains(t, errOut, `last_error="broker: invalid message"`)
	require.Contains(t, errOut, "1 of 2 id(s) are not parked rows")
	require.Contains(t, errOut, id(2))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n))
	require.Equal(t, 2, n, "only the parked row was dropped")

	code, _, errOut = run(t, "outbox", "retry", "--database-url", db, "--id", "abc")
	require.Equal(t, 2, code, errOut)
}
