package outbox_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/outbox"
)

// BenchmarkClaim measures the relay's claim statement alone (claim 100
// rows of 10000 due, keyed over 100 keys, then roll back) on a database
// holding only its own destination's rows ("alone"), and with 50000 rows
// of another destination due, interleaved with its own ("shared"), and
// reports µs/claim. Destinations cost nothing when the two are equal.
func BenchmarkClaim(b *testing.B) {
	for _, others := range []int{0, 50000} {
		name := "alone"
		if others > 0 {
			name = "shared"
		}
		b.Run(name, func(b *testing.B) {
			ctx := testCtx(b)
			pool := migratedPool(b)
			_, err := pool.Exec(ctx, `INSERT INTO outbox (event_type, partition_key, payload, destination)
				SELECT 'test.bench', 'user-' || (g % 100), convert_to($1, 'UTF8'),
				       CASE WHEN g % ($2::int / 10000 + 1) = 0 THEN 'mine' ELSE 'other' END
				FROM generate_series(1, 10000 + $2::int) g`, benchBody, others)
			require.NoError(b, err)
			_, err = pool.Exec(ctx, `ANALYZE outbox`)
			require.NoError(b, err)
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				tx, err := pool.Begin(ctx)
				require.NoError(b, err)
				rows, err := tx.Query(ctx, outbox.ClaimSQL, 100, 10000, "mine", int32(1))
				require.NoError(b, err)
				n := 0
				for rows.Next() {
					n++
				}
				require.NoError(b, rows.Err())
				require.NoError(b, tx.Rollback(ctx))
				require.Greater(b, n, 0)
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "µs/claim")
		})
	}
}

// BenchmarkEnqueue measures one Enqueue of one event per transaction
// (begin, enqueue, commit) without a UniqueKey ("plain"), with a new key
// each time ("unique-new": the upsert inserts), and with the same key
// inside its window ("unique-dup": nothing is inserted), and reports
// µs/enqueue.
func BenchmarkEnqueue(b *testing.B) {
	for _, mode := range []string{"plain", "unique-new", "unique-dup"} {
		b.Run(mode, func(b *testing.B) {
			ctx := testCtx(b)
			pool := migratedPool(b)
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				e := outbox.Event{Type: "test.bench", Key: "user-42", Body: []byte(benchBody)}
				switch mode {
				case "unique-new":
					e.UniqueKey, e.UniqueFor = "k"+strconv.Itoa(i), time.Hour
				case "unique-dup":
					e.UniqueKey, e.UniqueFor = "k", time.Hour
				}
				require.NoError(b, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := outbox.Enqueue(ctx, tx, e)
					return err
				}))
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "µs/enqueue")
		})
	}
}
