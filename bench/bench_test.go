package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
)

// The benchmarks ignore b.N: each runs its fixed workload once and reports
// its figures. Run them with
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/
//
// against the servers of compose/local/services.sh (eval "$(compose/local/services.sh env)").

// BenchmarkRelayThroughput drains a backlog of N pre-inserted outbox rows
// through outbox.Relay into the real adapter and compares the rate with the
// broker's raw confirmed-publish rate, measured in the same run before and
// after the relay (their mean is the baseline). Figure: relay/raw ratio,
// aim >= 0.6.
func BenchmarkRelayThroughput(b *testing.B) {
	for _, kind := range kinds {
		b.Run(kind, func(b *testing.B) {
			s := loadSettings()
			n := s.events
			db := newDatabase(b)
			tp := newTopology(b, kind)
			br := newBroker(b, kind, tp, s)

			rawBefore := rawPublish(b, kind, tp, n)
			purgeQueues(b, kind, tp)
			fillOutbox(b, db, n)
			relayRate := drain(b, db, br, s, n)
			purgeQueues(b, kind, tp)
			rawAfter := rawPublish(b, kind, tp, n)

			raw := (rawBefore + rawAfter) / 2
			ratio := relayRate / raw
			b.ReportMetric(relayRate, "relay-msgs/s")
			b.ReportMetric(raw, "raw-msgs/s")
			b.ReportMetric(ratio, "relay/raw")
			b.ReportMetric(0, "ns/op")
			b.Logf("%s: %d events, %s; %s", kind, n, describeMessage(), s)
			b.Logf("%s: raw confirmed publish %.0f msgs/s (before %.0f, after %.0f)", kind, raw, rawBefore, rawAfter)
			b.Logf("%s: relay %.0f msgs/s = %.2f x raw (aim >= 0.6)", kind, relayRate, ratio)
		})
	}
}

// drain runs a relay over the outbox until n rows were published and
// returns rows/s, Run start to the n-th row marked.
func drain(b *testing.B, db database, br broker.Broker, s settings, n int) float64 {
	b.Helper()
	var published atomic.Int64
	done := make(chan struct{})
	r, err := outbox.NewRelay(outbox.RelayConfig{
		Pool: db.newPool(b, s.relayConc+2), Broker: br, BatchSize: s.relayBatch, Concurrency: s.relayConc,
		Retention: -1, Logger: quietLogger,
		OnBatch: func(st outbox.BatchStats) {
			if published.Add(int64(st.Published)) == int64(n) {
				close(done)
			}
		},
	})
	must(b, err)
	ctx, cancel := context.WithCancel(benchCtx(b))
	defer cancel()
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- r.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("bench: relay published %d of %d rows in 5 min", published.Load(), n)
	}
	elapsed := time.Since(start)
	cancel()
	must(b, <-errc)
	var left int64
	must(b, db.pool.QueryRow(benchCtx(b), `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&left))
	if left != 0 {
		b.Errorf("bench: %d outbox rows left unpublished", left)
	}
	return float64(n) / elapsed.Seconds()
}

// BenchmarkEndToEnd commits a burst of N events from concurrent producers
// (a business row plus outbox.Enqueue per transaction) while a relay and a
// worker run, and measures until every business row is marked handled.
// Figure: end-to-end events/s, aim >= 3,000/s on 2 cores. Context: the
// creation rate of the same producers with nothing else running, on its
// own fresh database.
func BenchmarkEndToEnd(b *testing.B) {
	for _, kind := range kinds {
		b.Run(kind, func(b *testing.B) {
			s := loadSettings()
			n := s.events
			ctx := benchCtx(b)

			alone := newDatabase(b)
			d, err := produceBurst(ctx, alone.newPool(b, s.producers), s.producers, n)
			must(b, err)
			createRate := float64(n) / d.Seconds()

			db := newDatabase(b)
			tp := newTopology(b, kind)
			p := startPipeline(b, kind, db, tp, s, int64(n), nil)
			pool := db.newPool(b, s.producers)
			start := time.Now()
			pd, err := produceBurst(ctx, pool, s.producers, n)
			must(b, err)
			p.wait(b, 5*time.Minute)
			elapsed := time.Since(start)
			p.stop()
			if sent := countSent(b, db); sent != int64(n) {
				b.Errorf("bench: %d of %d business rows marked sent", sent, n)
			}

			rate := float64(n) / elapsed.Seconds()
			b.ReportMetric(rate, "e2e-events/s")
			b.ReportMetric(float64(n)/pd.Seconds(), "produce-events/s")
			b.ReportMetric(createRate, "create-alone-events/s")
			b.ReportMetric(0, "ns/op")
			b.Logf("%s: %d events, %d producers, %s; %s", kind, n, s.producers, describeMessage(), s)
			b.Logf("%s: creation alone (no relay, no worker) %.0f events/s", kind, createRate)
			b.Logf("%s: end to end %.0f events/s (aim >= 3000): all %d handled %.2fs after the first commit; producers committed at %.0f events/s meanwhile; %d duplicates, %d retried/dead",
				kind, rate, n, elapsed.Seconds(), float64(n)/pd.Seconds(), p.dups.Load(), p.other.Load())
		})
	}
}

// BenchmarkLatency commits events at a steady rate (200/s, paced by a
// ticker, from concurrent producers) while a relay and a worker run, and
// measures each event's latency from just after its commit returned to the
// moment the handler started on it (both clocks in this process).
// Figures: p50 and p99, aim p50 <= 5 ms, p99 <= 10 ms.
func BenchmarkLatency(b *testing.B) {
	for _, kind := range kinds {
		b.Run(kind, func(b *testing.B) {
			s := loadSettings()
			n, rate := s.latencyEvents, s.latencyRate
			const warm = 50
			ctx := benchCtx(b)
			db := newDatabase(b)
			tp := newTopology(b, kind)

			// Indexed by notification id: a fresh database numbers them
			// from 1; rolled-back inserts could skip a few, hence the slack.
			size := 2*(n+warm) + 16
			base := time.Now()
			handled := make([]atomic.Int64, size)
			committed := make([]atomic.Int64, size)
			onHandled := func(id int64) {
				if id > 0 && id < int64(size) {
					handled[id].CompareAndSwap(0, int64(time.Since(base)))
				}
			}
			onCommit := func(id int64) {
				if id > 0 && id < int64(size) {
					committed[id].Store(int64(time.Since(base)))
				}
			}
			p := startPipeline(b, kind, db, tp, s, int64(n+warm), onHandled)
			pool := db.newPool(b, s.producers)

			// Warm up (LISTEN set up, subscription running, pools and
			// plans warm), then wait until the warm-up events are handled.
			_, err := paced(ctx, pool, warm, rate, s.producers, nil)
			must(b, err)
			for deadline := time.Now().Add(time.Minute); p.acked.Load() < warm; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					b.Fatalf("bench: warm-up: %d of %d events handled after a minute", p.acked.Load(), warm)
				}
			}

			var ids []int64
			var mu sync.Mutex
			d, err := paced(ctx, pool, n, rate, s.producers, func(id int64) {
				onCommit(id)
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			})
			must(b, err)
			p.wait(b, 2*time.Minute)
			p.stop()

			lat := make([]time.Duration, 0, len(ids))
			for _, id := range ids {
				if id <= 0 || id >= int64(size) || handled[id].Load() == 0 {
					b.Fatalf("bench: event of notification %d: no handling time recorded", id)
				}
				lat = append(lat, time.Duration(handled[id].Load()-committed[id].Load()))
			}
			sortDurations(lat)
			p50, p99, worst := percentile(lat, 50), percentile(lat, 99), lat[len(lat)-1]
			b.ReportMetric(ms(p50), "p50-ms")
			b.ReportMetric(ms(p99), "p99-ms")
			b.ReportMetric(ms(worst), "max-ms")
			b.ReportMetric(float64(n)/d.Seconds(), "paced-events/s")
			b.ReportMetric(0, "ns/op")
			b.Logf("%s: %d events at %d/s (achieved %.0f/s), %s; %s", kind, n, rate, float64(n)/d.Seconds(), describeMessage(), s)
			b.Logf("%s: commit-to-handler latency p50 %.2f ms (aim <= 5), p99 %.2f ms (aim <= 10), max %.2f ms", kind, ms(p50), ms(p99), ms(worst))
		})
	}
}

// paced commits n events at rate events/s: a ticker hands out the events,
// producers goroutines commit them (so a slow commit does not delay the
// next tick). onCommit, when set, gets each event's notification id just
// after its commit returned. It returns the time from the first tick to
// the last commit.
func paced(ctx context.Context, pool *pgxpool.Pool, n, rate, producers int, onCommit func(id int64)) (time.Duration, error) {
	jobs := make(chan struct{}, n)
	go func() {
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		defer close(jobs)
		for range n {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				jobs <- struct{}{}
			}
		}
	}()
	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	start := time.Now()
	for range producers {
		wg.Go(func() {
			for range jobs {
				id, err := produce(ctx, pool)
				if err != nil {
					errOnce.Do(func() { first = err })
					continue
				}
				if onCommit != nil {
					onCommit(id)
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return time.Since(start), first
}
