package app

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/internal/pgmigrate"
	"github.com/ferrymq/ferry/outbox"
)

// MigrationsTable is goose's version table for the app's migrations.
const MigrationsTable = "ferry_app_migrations"

// migrationLockID is the advisory lock id held while migrating, so several
// processes starting at once migrate one after another ("ferryapp" in hex).
const migrationLockID int64 = 0x6665727279617070

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate applies the app's pending migrations (the notifications table)
// to the database of pool, under a PostgreSQL advisory lock, recording
// them in MigrationsTable. It is idempotent. The outbox's own tables are
// migrated by outbox.Migrate.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return fmt.Errorf("%w: Migrate: pool is nil", ErrConfig)
	}
	if err := migrations().Up(ctx, pool); err != nil {
		return fmt.Errorf("app: migrate: %w", err)
	}
	return nil
}

// MigrationVersion returns the app's schema version applied on the
// database of pool (0 when none) and the latest version embedded in this
// binary. Like goose, it creates the empty version table MigrationsTable
// when it is missing (a no-op once it exists, safe against concurrent
// callers).
func MigrationVersion(ctx context.Context, pool *pgxpool.Pool) (current, latest int64, err error) {
	if pool == nil {
		return 0, 0, fmt.Errorf("%w: MigrationVersion: pool is nil", ErrConfig)
	}
	current, latest, err = migrations().Versions(ctx, pool)
	if err != nil {
		return 0, 0, fmt.Errorf("app: migration version: %w", err)
	}
	return current, latest, nil
}

func migrations() pgmigrate.Set {
	sub, _ := fs.Sub(migrationFS, "migrations") // a constant, valid path
	return pgmigrate.Set{FS: sub, Table: MigrationsTable, LockID: migrationLockID, LockTimeout: 300}
}

// ErrNoSchema is matched (errors.Is) by the *SchemaError that CheckSchema
// returns when the database lacks migrations this binary needs.
var ErrNoSchema = errors.New("app: the database schema is not migrated")

// SchemaError reports a database whose schema is behind this binary: one
// set of migrations (the outbox's or the app's) is not fully applied. It
// matches ErrNoSchema.
type SchemaError struct {
	// Component is "outbox" or "app": whose migrations are missing.
	Component string
	// Current is the version applied on the database (0 when none);
	// Latest is the version this binary embeds.
	Current, Latest int64
}

// Reason says what is missing, without a package prefix, e.g. "the
// database has no ferry schema (outbox migration version 0 of 1)".
func (e *SchemaError) Reason() string {
	what := "the database's ferry schema is out of date"
	if e.Current == 0 {
		what = "the database has no ferry schema"
	}
	return fmt.Sprintf("%s (%s migration version %d of %d)", what, e.Component, e.Current, e.Latest)
}

// Error implements error.
func (e *SchemaError) Error() string {
	return "app: " + e.Reason() + `: run "ferry migrate" first`
}

// Is reports whether target is ErrNoSchema.
func (e *SchemaError) Is(target error) bool { return target == ErrNoSchema }

// CheckSchema checks that the database of pool has every migration the
// service needs, the outbox's (outbox.MigrationVersion) then the app's
// (MigrationVersion). It returns nil when both are current (or newer), a
// *SchemaError naming the first that is behind, or another error when
// the versions cannot be read (the database is down).
func CheckSchema(ctx context.Context, pool *pgxpool.Pool) error {
	cur, latest, err := outbox.MigrationVersion(ctx, pool)
	if err != nil {
		return fmt.Errorf("app: check schema: %w", err)
	}
	if cur < latest {
		return &SchemaError{Component: "outbox", Current: cur, Latest: latest}
	}
	cur, latest, err = MigrationVersion(ctx, pool)
	if err != nil {
		return fmt.Errorf("app: check schema: %w", err)
	}
	if cur < latest {
		return &SchemaError{Component: "app", Current: cur, Latest: latest}
	}
	return nil
}
