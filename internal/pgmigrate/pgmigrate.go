// Package pgmigrate runs one set of embedded goose SQL migrations on a pgx
// pool: its own version table, and a PostgreSQL advisory lock so that
// several processes starting at once migrate one after another. Package
// outbox and package app each own one set.
package pgmigrate

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// Set is one set of migrations.
type Set struct {
	// FS holds the *.sql files at its root.
	FS fs.FS
	// Table is goose's version table of this set.
	Table string
	// LockID is the advisory lock key held while migrating; distinct per
	// set, so one set's migrations never wait for another's.
	LockID int64
	// LockTimeout is how long to wait for the lock, in seconds (polled
	// every second).
	LockTimeout uint64
}

// Up applies the pending migrations. Running it again is a no-op.
func (s Set) Up(ctx context.Context, pool *pgxpool.Pool) error {
	p, db, err := s.provider(pool)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = p.Up(ctx)
	return err
}

// Versions returns the version applied on the database of pool (0 when
// none) and the latest version in FS. Like goose, it creates the empty
// version table when it is missing.
func (s Set) Versions(ctx context.Context, pool *pgxpool.Pool) (current, latest int64, err error) {
	p, db, err := s.provider(pool)
	if err != nil {
		return 0, 0, err
	}
	defer db.Close()
	return p.GetVersions(ctx)
}

func (s Set) provider(pool *pgxpool.Pool) (*goose.Provider, *sql.DB, error) {
	if pool == nil {
		return nil, nil, fmt.Errorf("pool is nil")
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(s.LockID), lock.WithLockTimeout(1, s.LockTimeout))
	if err != nil {
		return nil, nil, err
	}
	db := stdlib.OpenDBFromPool(pool) // closing db leaves pool open
	p, err := goose.NewProvider(goose.DialectPostgres, db, s.FS,
		goose.WithTableName(s.Table),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return p, db, nil
}
