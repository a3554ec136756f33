package runcost

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/procstat"
	"github.com/ferrymq/ferry/internal/testenv"
)

// A run of 200 committed inserts on another pool, closed before Stop,
// shows as at least 200 commits, WAL written, and CPU of this process and
// of PostgreSQL.
func TestMeterCountsCommitsWALAndCPU(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, dsn := testenv.NewPool(t)
	_, err := admin.Exec(ctx, `CREATE TABLE t (id bigserial PRIMARY KEY, body text)`)
	require.NoError(t, err)
	pg, err := Postgres(ctx, admin)
	require.NoError(t, err)
	st, err := procstat.ReadStat(pg.PID)
	require.NoError(t, err)
	require.Contains(t, []string{"postgres", "postmaster"}, st.Comm)

	m, err := Start(ctx, admin, Self("app"), pg)
	require.NoError(t, err)
	run, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	const n = 200
	for range n {
		_, err := run.Exec(ctx, `INSERT INTO t (body) VALUES (repeat('x', 100))`)
		require.NoError(t, err)
	}
	run.Close()
	// 200 small inserts can cost PostgreSQL less than one clock tick
	// (10 ms) per process, which /proc then shows as 0 (seen once in
	// CI); a query that keeps a live backend busy for a few hundred ms
	// makes the CPU figure's check meaningful on any machine.
	var sum int64
	require.NoError(t, admin.QueryRow(ctx, `SELECT sum(g) FROM generate_series(1, 3000000) g`).Scan(&sum))
	c, err := m.Stop(ctx, admin)
	require.NoError(t, err)

	var version int
	require.NoError(t, admin.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version))
	require.Zero(t, c.Lagging)
	require.GreaterOrEqual(t, c.Commits, int64(n))
	require.Less(t, c.Commits, int64(n+20))
	require.GreaterOrEqual(t, c.WALBytes, int64(n*100))
	require.GreaterOrEqual(t, c.WALSyncs, int64(1), "WAL fsyncs on server_version_num %d", version)
	require.Len(t, c.CPU, 2)
	require.Equal(t, "postgres", c.CPU[1].Name)
	require.Positive(t, c.CPU[1].CPU, "200 transactions cost PostgreSQL some CPU")
	// pg_stat_statements, read from database ferry where the extension
	// is, saw the inserts of this run's database.
	ferry, err := pgxpool.New(ctx, testenv.DatabaseURL())
	require.NoError(t, err)
	defer ferry.Close()
	var dbName string
	require.NoError(t, admin.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName))
	sts, err := Statements(ctx, ferry, dbName, 50)
	require.NoError(t, err)
	var inserts int64
	for _, st := range sts {
		if st.Query == "INSERT INTO t (body) VALUES (repeat($1, $2))" {
			inserts = st.Calls
			require.Positive(t, st.WALBytes)
		}
	}
	require.Equal(t, int64(n), inserts, "%v", sts)
	require.Len(t, DescribeStatements(sts[:1], n), 1)

	ms := c.Metrics(n)
	require.Equal(t, "all-cpu-s/1k", ms[2].Unit)
	require.InDelta(t, c.TotalCPU().Seconds()/(n/1000.0), ms[2].Value, 1e-9)
	require.Equal(t, "commits/event", ms[4].Unit)
}

// The broker of this checkout is found by the port of its URL.
func TestListenerFindsTheBrokers(t *testing.T) {
	for name, u := range map[string]string{"rabbitmq": testenv.RabbitMQURL(), "nats": testenv.NATSURL()} {
		testenv.RequireTCP(t, name, testenv.HostPort(u))
		p, err := Listener(name, u)
		require.NoError(t, err, name)
		st, err := procstat.ReadStat(p.PID)
		require.NoError(t, err)
		want := map[string]string{"rabbitmq": "beam.smp", "nats": "nats-server"}[name]
		require.Equal(t, want, st.Comm, name)
	}
	_, err := Listener("nothing", "amqp://127.0.0.1:1/")
	require.ErrorIs(t, err, procstat.ErrNotFound)
}

// PostgreSQL 18 moved the WAL fsyncs from pg_stat_wal to pg_stat_io; the
// query follows the server's version (the embedded PostgreSQL 18 is
// measured in cmd/ferry/ferrycli's TestEmbeddedPostgresRunCost).
func TestWALSyncsQueryPerVersion(t *testing.T) {
	require.Contains(t, walSyncsQuery(150018), "pg_stat_wal")
	require.Contains(t, walSyncsQuery(170005), "pg_stat_wal")
	require.Contains(t, walSyncsQuery(180003), "pg_stat_io")
	require.NotContains(t, walSyncsQuery(180003), "wal_sync")
}
