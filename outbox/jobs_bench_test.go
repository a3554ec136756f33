package outbox_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/outbox"
)

// BenchmarkClaim measures the relay's claim statement alone (claim 100
// rows of 10000 due, keyed over 100 keys, then roll back) on a database
// holding only its own destination's rows ("alone", what a claim read
// before destinations existed) and on one where 50000 rows of another
// destination are due too, interleaved with its own ("shared"). The two
// claims alternate in one loop, so a load on the machine weighs on both
// alike, and it reports µs per claim of each and shared/alone: the cost of
// sharing the database, 1 when the claim reads only its own rows.
func BenchmarkClaim(b *testing.B) {
	ctx := testCtx(b)
	prepare := func(others int) *pgxpool.Pool {
		pool := migratedPool(b)
		_, err := pool.Exec(ctx, `INSERT INTO outbox (event_type, partition_key, payload, destination)
			SELECT 'test.bench', 'user-' || ((g / ($2::int / 10000 + 1)) % 100), convert_to($1, 'UTF8'),
			       CASE WHEN g % ($2::int / 10000 + 1) = 0 THEN 'mine' ELSE 'other' END
			FROM generate_series(1, 10000 + $2::int) g`, benchBody, others)
		require.NoError(b, err)
		_, err = pool.Exec(ctx, `ANALYZE outbox`)
		require.NoError(b, err)
		return pool
	}
	alone, shared := prepare(0), prepare(50000)
	claim := func(pool *pgxpool.Pool) time.Duration {
		start := time.Now()
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
		require.Equal(b, 100, n)
		return time.Since(start)
	}
	var ta, ts time.Duration
	b.ResetTimer()
	for range b.N {
		ta += claim(alone)
		ts += claim(shared)
	}
	b.ReportMetric(float64(ta.Microseconds())/float64(b.N), "µs/claim-alone")
	b.ReportMetric(float64(ts.Microseconds())/float64(b.N), "µs/claim-shared")
	b.ReportMetric(float64(ts)/float64(ta), "shared/alone")
}

// BenchmarkEnqueue measures a transaction of one Enqueue of one event
// (begin, enqueue, commit): without a UniqueKey ("plain"), with a new key
// each time ("unique-new": the upsert inserts the key and the event), and
// with one key inside its window ("unique-dup": nothing is inserted, the
// key's row is updated). The three alternate in one loop, and it reports
// µs per transaction of each and their ratios to plain.
func BenchmarkEnqueue(b *testing.B) {
	ctx := testCtx(b)
	pool := migratedPool(b)
	run := func(e outbox.Event) time.Duration {
		start := time.Now()
		require.NoError(b, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, e)
			return err
		}))
		return time.Since(start)
	}
	var plain, fresh, dup time.Duration
	b.ResetTimer()
	for i := range b.N {
		e := outbox.Event{Type: "test.bench", Key: "user-42", Body: []byte(benchBody)}
		plain += run(e)
		e.UniqueKey, e.UniqueFor = "k"+strconv.Itoa(i), time.Hour
		fresh += run(e)
		e.UniqueKey = "dup"
		dup += run(e)
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
	b.ReportMetric(per(plain), "µs/plain")
	b.ReportMetric(per(fresh), "µs/unique-new")
	b.ReportMetric(per(dup), "µs/unique-dup")
	b.ReportMetric(float64(fresh)/float64(plain), "unique-new/plain")
	b.ReportMetric(float64(dup)/float64(plain), "unique-dup/plain")
}
