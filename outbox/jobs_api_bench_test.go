package outbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/outbox"
)

// BenchmarkJobGetAndCancel measures JobGet of a handled job and JobCancel
// of a pending one on a database holding 100,000 published rows handled
// by three consumers (300,000 processed_messages rows) and 10,000 pending
// rows: the skip scan over the consumers keeps JobGet to index probes. It
// reports µs per JobGet and per JobCancel.
func BenchmarkJobGetAndCancel(b *testing.B) {
	ctx := testCtx(b)
	pool := migratedPool(b)
	_, err := pool.Exec(ctx, `INSERT INTO outbox (event_type, payload, processed_at)
		SELECT 'test.bench', '\x00', now() FROM generate_series(1, 100000)`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id)
		SELECT c, g::text FROM generate_series(1, 100000) g, unnest(ARRAY['mail', 'sms', 'audit']) c`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `INSERT INTO outbox (event_type, payload) SELECT 'test.bench', '\x00' FROM generate_series(1, 10000)`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `ANALYZE`)
	require.NoError(b, err)
	b.ResetTimer()
	var get, cancel int64
	for i := 0; i < b.N; i++ {
		t0 := nowNano()
		j, err := outbox.JobGet(ctx, pool, int64(1+i%100000))
		require.NoError(b, err)
		require.Equal(b, outbox.JobHandled, j.State)
		t1 := nowNano()
		_, err = outbox.JobCancel(ctx, pool, int64(100001+i%10000))
		if i < 10000 {
			require.NoError(b, err)
		}
		get += t1 - t0
		cancel += nowNano() - t1
	}
	b.ReportMetric(float64(get)/float64(b.N)/1e3, "µs/get")
	b.ReportMetric(float64(cancel)/float64(b.N)/1e3, "µs/cancel")
}

func nowNano() int64 { return time.Now().UnixNano() }
