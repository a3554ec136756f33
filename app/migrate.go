package app

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
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
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		return fmt.Errorf("app: migrate: %w", err)
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(migrationLockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("app: migrate: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool) // closing db leaves pool open
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub,
		goose.WithTableName(MigrationsTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("app: migrate: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("app: migrate: %w", err)
	}
	return nil
}
