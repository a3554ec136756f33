package ferrycli_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// runFor runs the ferry command in-process for at most d (a role that
// starts fine runs until then and exits 0).
func runFor(t *testing.T, d time.Duration, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var errOut strings.Builder
	code := ferrycli.Main(ctx, append([]string{"ferry"}, args...), &strings.Builder{}, &errOut)
	return code, errOut.String()
}

// Every role refuses, at once and with a clear error, a database without
// the schema it needs, instead of answering /readyz 200 and then 500s, or
// a relay backing off for ever. Only "ferry migrate" (and demo, and run
// with its embedded PostgreSQL) migrates.
func TestRolesRefuseDatabaseWithoutSchema(t *testing.T) {
	db := testenv.NewDatabase(t)
	rabbit := []string{"--broker", "rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(),
		"--exchange", testenv.UniqueName("schema-ex"), "--queue", testenv.UniqueName("schema-q"),
		"--metrics-addr", "127.0.0.1:0"} // not the default ports other processes may hold
	want := `ferry: the database has no ferry schema (outbox migration version 0 of ` + latestOutboxVersion(t, db) + `): run "ferry migrate" first`
	for _, role := range [][]string{
		{"api", "--addr", "127.0.0.1:0"},
		{"relay"},
		{"worker", "--smtp-addr", testenv.SMTPAddr()},
		{"run", "--addr", "127.0.0.1:0", "--smtp-addr", testenv.SMTPAddr()},
	} {
		args := append(role, "--database-url", db)
		if role[0] == "api" {
			args = append(args, "--metrics-addr", "127.0.0.1:0") // the API has no broker flags
		} else {
			args = append(args, rabbit...)
		}
		code, errOut := runFor(t, 20*time.Second, args...)
		require.Equal(t, 1, code, "%s fails instead of running until stopped: %s", role[0], errOut)
		require.Contains(t, errOut, want, role[0])
	}

	// With only the outbox migrated, the relay has what it needs; the api
	// and the worker still lack the notifications table.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, outbox.Migrate(ctx, pool))
	code, errOut := runFor(t, 20*time.Second, append([]string{"worker", "--database-url", db, "--smtp-addr", testenv.SMTPAddr()}, rabbit...)...)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, `(app migration version 0 of 1): run "ferry migrate" first`)
	code, errOut = runFor(t, 3*time.Second, append([]string{"relay", "--database-url", db}, rabbit...)...)
	require.Equal(t, 0, code, "the relay runs until stopped: %s", errOut)

	code, errOut = runFor(t, 30*time.Second, "migrate", "--database-url", db)
	require.Equal(t, 0, code, errOut)
	code, errOut = runFor(t, 3*time.Second, "api", "--database-url", db, "--addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0")
	require.Equal(t, 0, code, "the api runs until stopped: %s", errOut)
}

// latestOutboxVersion is the number of the outbox's last migration, as the
// "no ferry schema" error names it, read through the database db.
func latestOutboxVersion(t *testing.T, db string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	defer pool.Close()
	_, latest, err := outbox.MigrationVersion(ctx, pool)
	require.NoError(t, err)
	return strconv.FormatInt(latest, 10)
}

// TestMigrateCreatesTheTablesItNames: the tables `ferry migrate` says it
// creates (its help, MigratedTables, and the README's line) are exactly
// those a migrated database has, besides the migrations' version tables.
func TestMigrateCreatesTheTablesItNames(t *testing.T) {
	db := migratedDatabase(t)
	pool, err := pgxpool.New(context.Background(), db)
	require.NoError(t, err)
	defer pool.Close()
	rows, err := pool.Query(context.Background(), `SELECT table_name FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' AND table_name NOT IN ($1, $2) ORDER BY table_name`,
		outbox.MigrationsTable, app.MigrationsTable)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.ElementsMatch(t, got, ferrycli.MigratedTables)

	_, help, _ := run(t, "migrate", "--help")
	require.Contains(t, strings.Join(strings.Fields(help), " "), strings.Join(ferrycli.MigratedTables, ", "), "the help, its line breaks aside")
	readme, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "README.md"))
	require.NoError(t, err)
	require.Contains(t, string(readme), "ferry migrate                       # "+strings.Join(ferrycli.MigratedTables, ", "))
}
