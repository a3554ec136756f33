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
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
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
