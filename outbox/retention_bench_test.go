package outbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// BenchmarkRetentionShapes measures the two ways the WAL relay could
// retain its table (issue 28, item 2), on two scratch copies of the
// outbox's columns, with b.N rows each inserted in transactions of 500
// (the relay's batch): "delete", today's shape, a plain table from which
// the relay deletes each confirmed batch (DELETE ... WHERE id =
// ANY($1), 500 ids a statement) and which autovacuum must then vacuum
// (measured here with an explicit VACUUM); "partition", a table
// partitioned by id range (partitions of 10,000 ids) from which whole
// partitions are dropped once every row of them is confirmed. It prints,
// per row: the producer's insert time (µs), and for the retention the
// time (µs) and WAL bytes (pg_current_wal_lsn before and after), VACUUM
// included for "delete". Run with -benchtime 20000x; compare the lines of
// one run.
func BenchmarkRetentionShapes(b *testing.B) {
	ctx := testCtx(b)
	pool := migratedPool(b)
	c, err := pool.Acquire(ctx)
	require.NoError(b, err)
	defer c.Release()
	const cols = `id bigint NOT NULL, type text NOT NULL, key text NOT NULL DEFAULT '', body bytea NOT NULL,
		headers jsonb NOT NULL DEFAULT '{}', destination text NOT NULL DEFAULT 'default',
		occurred_at timestamptz NOT NULL DEFAULT now(), attempts int NOT NULL DEFAULT 0`
	const part = 10000
	n := b.N
	parts := (n + part - 1) / part
	_, err = c.Exec(ctx, `CREATE TABLE ret_delete (`+cols+`, PRIMARY KEY (id));
		CREATE TABLE ret_partition (`+cols+`, PRIMARY KEY (id)) PARTITION BY RANGE (id)`)
	require.NoError(b, err)
	for p := range parts {
		_, err := c.Exec(ctx, fmt.Sprintf(`CREATE TABLE ret_partition_%d PARTITION OF ret_partition FOR VALUES FROM (%d) TO (%d)`, p, p*part, (p+1)*part))
		require.NoError(b, err)
	}
	lsn := func() int64 { return walPosition(b, ctx, c) }
	insert := func(table string) time.Duration {
		start := time.Now()
		for i := 0; i < n; i += 500 {
			require.NoError(b, pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+table+` (id, type, key, body)
					SELECT g, 'test.bench', 'user-42', convert_to($3, 'UTF8') FROM generate_series($1::bigint, $2::bigint) g`,
					i, min(i+500, n)-1, benchBody)
				return err
			}))
		}
		return time.Since(start)
	}
	b.ResetTimer()
	delIns := insert("ret_delete")
	partIns := insert("ret_partition")

	l0, t0 := lsn(), time.Now()
	ids := make([]int64, 0, 500)
	for i := 0; i < n; i += 500 {
		ids = ids[:0]
		for id := i; id < min(i+500, n); id++ {
			ids = append(ids, int64(id))
		}
		_, err := c.Exec(ctx, `DELETE FROM ret_delete WHERE id = ANY($1::bigint[]) AND attempts = 0`, ids)
		require.NoError(b, err)
	}
	delT, delW := time.Since(t0), lsn()-l0
	l1, t1 := lsn(), time.Now()
	_, err = c.Exec(ctx, `VACUUM ret_delete`)
	require.NoError(b, err)
	vacT, vacW := time.Since(t1), lsn()-l1

	l2, t2 := lsn(), time.Now()
	for p := range parts {
		_, err := c.Exec(ctx, fmt.Sprintf(`DROP TABLE ret_partition_%d`, p))
		require.NoError(b, err)
	}
	partT, partW := time.Since(t2), lsn()-l2
	b.StopTimer()
	_, err = c.Exec(ctx, `DROP TABLE ret_delete; DROP TABLE ret_partition`)
	require.NoError(b, err)

	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n) }
	b.ReportMetric(per(delT+vacT), "µs/row-delete+vacuum")
	b.ReportMetric(float64(delW+vacW)/float64(n), "WAL-B/row-delete+vacuum")
	b.ReportMetric(per(partT), "µs/row-partition-drop")
	b.ReportMetric(float64(partW)/float64(n), "WAL-B/row-partition-drop")
	b.ReportMetric(0, "ns/op")
	fmt.Printf("BenchmarkRetentionShapes: %d rows: insert %.1f µs/row plain, %.1f partitioned; retention: delete %.2f µs + vacuum %.2f µs, %.0f + %.0f WAL bytes per row; partition drop %.3f µs, %.2f WAL bytes per row (%d partitions)\n",
		n, per(delIns), per(partIns), per(delT), per(vacT), float64(delW)/float64(n), float64(vacW)/float64(n), per(partT), float64(partW)/float64(n), parts)
}
