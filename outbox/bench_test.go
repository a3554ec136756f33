package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
)

const benchBody = `{"notification_id":"6f1c2a9e-0d4b-4a57-9a0e-2f7d8c1b3e45","user_id":"user-42","channel":"email","template":"welcome"}`

// BenchmarkRelay measures the relay's throughput (rows/s) from a
// pre-filled outbox to RabbitMQ with publisher confirms, claim to commit.
// Run with a fixed count, e.g. -bench Relay -benchtime 20000x.
func BenchmarkRelay(b *testing.B) {
	for _, bc := range []struct{ batch, conc int }{{100, 1}, {100, 2}, {100, 4}, {200, 4}, {500, 2}} {
		b.Run(fmt.Sprintf("batch=%d/conc=%d", bc.batch, bc.conc), func(b *testing.B) {
			ctx := testCtx(b)
			rg := setup(b)
			_, err := rg.pool.Exec(ctx, `INSERT INTO outbox (event_type, partition_key, payload, headers)
				SELECT 'test.bench', 'user-' || (g % 100), convert_to($2, 'UTF8'),
				       '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'
				FROM generate_series(1, $1) g`, b.N, benchBody)
			require.NoError(b, err)
			_, err = rg.pool.Exec(ctx, `VACUUM ANALYZE outbox`)
			require.NoError(b, err)

			var published atomic.Int64
			done := make(chan struct{})
			r, err := outbox.NewRelay(outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, BatchSize: bc.batch, Concurrency: bc.conc, Retention: -1,
				OnBatch: func(s outbox.BatchStats) {
					if published.Add(int64(s.Published)) == int64(b.N) {
						close(done)
					}
				}})
			require.NoError(b, err)
			rctx, cancel := context.WithCancel(ctx)
			runErr := make(chan error, 1)
			b.ResetTimer()
			start := time.Now()
			go func() { runErr <- r.Run(rctx) }()
			select {
			case <-done:
			case <-time.After(5 * time.Minute):
				b.Fatalf("published %d of %d rows in 5 min", published.Load(), b.N)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			cancel()
			require.NoError(b, <-runErr)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "rows/s")
			require.Zero(b, unprocessed(b, rg.pool))
		})
	}
}

// BenchmarkRawPublish is the baseline for BenchmarkRelay: the same messages
// published straight through the RabbitMQ adapter with confirms, in
// batches of 100, from 1 and 4 goroutines, without any database.
func BenchmarkRawPublish(b *testing.B) {
	for _, conc := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("batch=100/conc=%d", conc), func(b *testing.B) {
			ctx := testCtx(b)
			rg := setup(b)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for range conc {
				wg.Go(func() {
					for {
						first := next.Add(100) - 100
						if first >= int64(b.N) {
							return
						}
						n := min(int64(b.N)-first, 100)
						msgs := make([]*broker.Message, n)
						for i := range msgs {
							msgs[i] = &broker.Message{ID: strconv.FormatInt(first+int64(i)+1, 10), Type: "test.bench", Key: "user-1",
								Body: []byte(benchBody), Headers: map[string]string{
									broker.HeaderTraceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
									broker.HeaderCreatedAt:   broker.FormatTime(time.Now()),
								}}
						}
						if err := rg.b.Publish(ctx, msgs); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}

// BenchmarkRelayLatency measures, at low load (one event at a time), the
// time from the enqueueing transaction's commit returning to the broker's
// confirm (confirmed-*) and to the row marked processed (marked-*):
// LISTEN/NOTIFY wakes the relay, the poll interval is one hour.
func BenchmarkRelayLatency(b *testing.B) {
	ctx := testCtx(b)
	rg := setup(b)
	batches := make(chan outbox.BatchStats, 16)
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, PollInterval: time.Hour, Retention: -1,
		OnBatch: func(s outbox.BatchStats) { batches <- s }})
	require.NoError(b, err)
	rctx, cancel := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(rctx) }()
	// Warm up: the first event also waits for LISTEN to be set up.
	enqueue(b, rg.pool, outbox.Event{Type: "test.latency", Body: []byte(benchBody)})
	<-batches
	lat := make([]time.Duration, 0, b.N)
	pub := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		tx, err := rg.pool.Begin(ctx)
		require.NoError(b, err)
		_, err = outbox.Enqueue(ctx, tx, outbox.Event{Type: "test.latency", Body: []byte(benchBody)})
		require.NoError(b, err)
		require.NoError(b, tx.Commit(ctx))
		committed := time.Now()
		for published := 0; published < 1; {
			select {
			case s := <-batches:
				published += s.Published
				if s.Published > 0 {
					marked := time.Since(committed)
					lat = append(lat, marked)
					pub = append(pub, marked-s.MarkDuration)
				}
			case <-time.After(time.Minute):
				b.Fatal("no batch within a minute")
			}
		}
	}
	b.StopTimer()
	cancel()
	require.NoError(b, <-runErr)
	slices.Sort(lat)
	slices.Sort(pub)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(pub[len(pub)/2]), "confirmed-p50-ms")
	b.ReportMetric(ms(pub[len(pub)*99/100]), "confirmed-p99-ms")
	b.ReportMetric(ms(lat[len(lat)/2]), "marked-p50-ms")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "marked-p99-ms")
	b.ReportMetric(0, "ns/op")
}
