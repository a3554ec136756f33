package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/outbox"
)

// BenchmarkWALShapes compares the two shapes a WAL relay could read
// (issue 20): the event as an outbox row (Enqueue, what the WAL relay
// reads, then deleted once confirmed) and the event as a logical
// decoding message written with pg_logical_emit_message(true, prefix,
// payload) in the caller's transaction (no row at all). It commits b.N
// one-event transactions of each, alternating, on one connection, and
// prints per event: the producer's transaction time and the WAL bytes
// written (pg_current_wal_lsn before and after), and for the row shape
// also the WAL of the bulk DELETE the relay does after the confirm (one
// statement per 500 rows). Run with -benchtime 2000x.
func BenchmarkWALShapes(b *testing.B) {
	ctx := testCtx(b)
	pool := migratedPool(b)
	c, err := pool.Acquire(ctx)
	require.NoError(b, err)
	defer c.Release()
	ev := outbox.Event{Type: "test.bench", Key: "user-42", Body: []byte(benchBody), Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	payload, err := json.Marshal(map[string]any{"type": ev.Type, "key": ev.Key, "body": ev.Body, "headers": ev.Headers, "destination": outbox.DefaultDestination})
	require.NoError(b, err)
	lsn := func() int64 { return walPosition(b, ctx, c) }
	var rowT, msgT time.Duration
	var rowW, msgW int64
	var ids []int64
	b.ResetTimer()
	for range b.N {
		l0 := lsn()
		t0 := time.Now()
		require.NoError(b, pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			got, err := outbox.Enqueue(ctx, tx, ev)
			ids = append(ids, got...)
			return err
		}))
		rowT += time.Since(t0)
		l1 := lsn()
		rowW += l1 - l0
		t1 := time.Now()
		require.NoError(b, pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			var id int64
			if err := tx.QueryRow(ctx, `SELECT nextval(pg_get_serial_sequence('outbox', 'id'))`).Scan(&id); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'ferry', $1::bytea)`, payload)
			return err
		}))
		msgT += time.Since(t1)
		msgW += lsn() - l1
	}
	b.StopTimer()
	l0 := lsn()
	for i := 0; i < len(ids); i += 500 {
		_, err := c.Exec(ctx, `DELETE FROM outbox WHERE id = ANY($1::bigint[]) AND attempts = 0`, ids[i:min(i+500, len(ids))])
		require.NoError(b, err)
	}
	delW := lsn() - l0
	n := float64(b.N)
	b.ReportMetric(float64(rowT.Microseconds())/n, "µs/row-tx")
	b.ReportMetric(float64(msgT.Microseconds())/n, "µs/message-tx")
	b.ReportMetric(float64(rowW)/n, "WAL-B/row")
	b.ReportMetric(float64(delW)/n, "WAL-B/row-delete")
	b.ReportMetric(float64(msgW)/n, "WAL-B/message")
	b.ReportMetric(0, "ns/op")
	fmt.Printf("BenchmarkWALShapes: %d events of %d bytes: row shape %.0f µs per producer transaction, %.0f WAL bytes (+%.0f for the relay's bulk delete); message shape %.0f µs, %.0f WAL bytes\n",
		b.N, len(ev.Body), float64(rowT.Microseconds())/n, float64(rowW)/n, float64(delW)/n, float64(msgT.Microseconds())/n, float64(msgW)/n)
}

// walPosition returns the server's current WAL position in bytes
// (pg_current_wal_lsn as a number): the difference of two is the WAL
// written between them.
func walPosition(tb testing.TB, ctx context.Context, c *pgxpool.Conn) (l int64) {
	require.NoError(tb, c.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&l))
	return l
}
