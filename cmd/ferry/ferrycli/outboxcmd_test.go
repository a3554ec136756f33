package ferrycli_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
)

// "ferry outbox stats" on a database without the schema gives the roles'
// "run ferry migrate first" error and exits 1, not PostgreSQL's raw
// `relation "outbox" does not exist (SQLSTATE 42P01)`.
func TestOutboxStatsRefusesDatabaseWithoutSchema(t *testing.T) {
	db := testenv.NewDatabase(t)
	code, errOut := runFor(t, 20*time.Second, "outbox", "stats", "--database-url", db)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, `ferry: the database has no ferry schema (outbox migration version 0 of 3): run "ferry migrate" first`)
	require.NotContains(t, errOut, "SQLSTATE")

	code, errOut = runFor(t, 30*time.Second, "migrate", "--database-url", db)
	require.Equal(t, 0, code, errOut)
	code, out, errOut := run(t, "outbox", "stats", "--database-url", db, "--format", "json")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"unprocessed": 0`)
}
