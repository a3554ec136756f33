package outbox

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/internal/pgmigrate"
)

// MigrationsTable is the goose version table of package outbox's migrations.
const MigrationsTable = "ferry_outbox_migrations"

// migrationLockID is the PostgreSQL advisory lock key that serialises
// concurrent Migrate calls (several relays and workers starting at once).
// It differs from goose's default so that other packages' migrations (the
// app's notifications table) do not wait for ours.
const migrationLockID int64 = 0x6665727279_0b // "ferry" + outbox

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrate brings the outbox schema up to date on the database of pool: the
// outbox table with its partial indexes of the unprocessed rows (WHERE
// processed_at IS NULL, per destination), the outbox_unique table of
// Event.UniqueKey, the processed_messages table the workers deduplicate
// with, and the other tables of the package doc's "Schema"
// (worker_attempts, ferry_periodic, outbox_cancelled, worker_dead). The SQL is embedded in the binary;
// the applied versions are recorded in MigrationsTable. Running it again
// is a no-op, and
// concurrent calls from several processes are serialised by an advisory
// lock. Errors wrap ErrMigrate.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return fmt.Errorf("%w: pool is nil", ErrMigrate)
	}
	if err := migrations().Up(ctx, pool); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
			return ctxErr
		}
		return fmt.Errorf("%w: %w", ErrMigrate, err)
	}
	return nil
}

// MigrationVersion returns the schema version applied on the database of
// pool (0 when none) and the latest version embedded in this binary.
func MigrationVersion(ctx context.Context, pool *pgxpool.Pool) (current, latest int64, err error) {
	if pool == nil {
		return 0, 0, fmt.Errorf("%w: pool is nil", ErrMigrate)
	}
	current, latest, err = migrations().Versions(ctx, pool)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %w", ErrMigrate, err)
	}
	return current, latest, nil
}

func migrations() pgmigrate.Set {
	fsys, _ := fs.Sub(migrationFiles, "migrations") // a constant, valid path
	return pgmigrate.Set{FS: fsys, Table: MigrationsTable, LockID: migrationLockID, LockTimeout: 600}
}
