package ferrycli

import (
	"context"
	"log/slog"
	"net/smtp"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/runcost"
)

func TestEmbeddedPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pg, err := startEmbeddedPG(ctx, t.TempDir(), slog.New(slog.NewTextHandler(os.Stderr, nil)))
	require.NoError(t, err)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = pg.Stop()
		}
	})
	conn, err := pgx.Connect(ctx, pg.URL())
	require.NoError(t, err)
	var db string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_database()").Scan(&db))
	require.Equal(t, "ferry", db)
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, pg.Stop())
	stopped = true
	_, err = pgx.Connect(ctx, pg.URL())
	require.Error(t, err, "the server must be gone after Stop")
}

// runcost reads WAL bytes, commits and WAL fsyncs on the embedded
// PostgreSQL 18 too, where pg_stat_wal no longer has wal_sync (ferry
// bench's end-to-end figures without --database-url).
func TestEmbeddedPostgresRunCost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pg, err := startEmbeddedPG(ctx, t.TempDir(), slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })
	admin, err := pgxpool.New(ctx, pg.URL())
	require.NoError(t, err)
	defer admin.Close()
	var version int
	require.NoError(t, admin.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version))
	require.GreaterOrEqual(t, version, 180000, "the embedded server is PostgreSQL 18")
	_, err = admin.Exec(ctx, `CREATE TABLE t (id bigserial PRIMARY KEY, body text)`)
	require.NoError(t, err)
	server, err := runcost.Postgres(ctx, admin)
	require.NoError(t, err)

	m, err := runcost.Start(ctx, admin, runcost.Self("app"), server)
	require.NoError(t, err)
	run, err := pgxpool.New(ctx, pg.URL())
	require.NoError(t, err)
	const n = 200
	for range n {
		_, err := run.Exec(ctx, `INSERT INTO t (body) VALUES (repeat('x', 100))`)
		require.NoError(t, err)
	}
	run.Close()
	c, err := m.Stop(ctx, admin)
	require.NoError(t, err)
	require.Zero(t, c.Lagging)
	require.GreaterOrEqual(t, c.Commits, int64(n))
	require.Less(t, c.Commits, int64(n+20))
	require.GreaterOrEqual(t, c.WALBytes, int64(n*100))
	require.GreaterOrEqual(t, c.WALSyncs, int64(1), "200 commits fsync the WAL (pg_stat_io on PostgreSQL 18)")
	require.Positive(t, c.CPU[1].CPU)
}

func TestEmbeddedNATS(t *testing.T) {
	ns, err := startEmbeddedNATS(t.TempDir())
	require.NoError(t, err)
	defer ns.Stop()
	nc, err := nats.Connect(ns.URL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := nc.JetStream()
	require.NoError(t, err)
	_, err = js.AccountInfo()
	require.NoError(t, err, "JetStream must be enabled")
}

func TestSMTPSink(t *testing.T) {
	dir := t.TempDir()
	sink, err := startSMTPSink(dir)
	require.NoError(t, err)
	defer sink.Stop()
	msg := []byte("Subject: hi\r\n\r\nПривет\r\n")
	require.NoError(t, smtp.SendMail(sink.Addr(), nil, "a@example.com", []string{"b@example.com"}, msg))
	require.EqualValues(t, 1, sink.messages.Load())
	files, err := filepath.Glob(dir + "/*-000001.eml")
	require.NoError(t, err)
	require.Len(t, files, 1)
	b, err := os.ReadFile(files[0])
	require.NoError(t, err)
	require.Contains(t, string(b), "Привет")
	require.Contains(t, sink.Where(), "1 message(s)")
}
