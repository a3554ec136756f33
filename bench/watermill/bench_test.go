package watermill

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/bench/suite"
)

// BenchmarkCreate is the producers alone: N events committed by
// concurrent producers (business row + the forwarder's publisher on the
// same transaction) with nothing else running, on a database of its
// own; CPU per 1,000 events of this process and PostgreSQL, WAL and
// commits per event. It is the same on every broker and profile (the
// producers write only PostgreSQL), hence once: subtract it from
// BenchmarkEndToEnd's figures for what the forwarder and the consumers
// add.
func BenchmarkCreate(b *testing.B) {
	s := loadSettings(b)
	n := s.events
	db := newDatabase(b)
	pool := db.newPool(b, s.producers)
	cm := startCost(b, db, nil)
	d, err := burst(benchCtx(b), pool, "wmbench-create", s, n)
	must(b, err)
	rate := float64(n) / d.Seconds()
	pool.Close()
	cost := stopCost(b, cm, db, n, "create-")
	b.ReportMetric(rate, "create-alone-events/s")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d events, %d producers; load average %s", n, s.producers, machineLoad())
	b.Logf("creation alone %.0f events/s; %s", rate, cost)
}

// BenchmarkEndToEnd is bench's BenchmarkEndToEnd on Watermill, per
// broker (/rabbitmq, /kafka, /nats, /sqs) and profile (/defaults,
// /tuned): N events committed by concurrent producers (business row +
// the forwarder's publisher on the same transaction) while the forwarder
// and the consumers run, from the first commit to the last business row
// marked sent; CPU per 1,000 events of this process, PostgreSQL and the
// broker's server, WAL and commits per event.
func BenchmarkEndToEnd(b *testing.B) {
	for _, pb := range brokers {
		b.Run(pb.name, func(b *testing.B) {
			for _, p := range pb.profiles {
				b.Run(p.name, func(b *testing.B) { endToEnd(b, pb, p) })
			}
		})
	}
}

func endToEnd(b *testing.B, pb peerBroker, p profile) {
	s := loadSettings(b)
	n := s.events
	ctx := benchCtx(b)
	db := newDatabase(b)
	topic := p.ps.newTopic(b)
	pl := startPipeline(b, db, topic, p, int64(n), nil)
	pool := db.newPool(b, s.producers)
	m := startCost(b, db, &pb)
	start := time.Now()
	pd, err := burst(ctx, pool, topic, s, n)
	must(b, err)
	pl.wait(b, 10*time.Minute)
	elapsed := time.Since(start)
	pl.stop()
	pool.Close()
	cost := stopCost(b, m, db, n, "")
	logStatements(b, db, n, pb.name+" "+p.name+": end to end")
	if sent := countSent(b, db); sent != int64(n) {
		b.Errorf("watermill bench: %d of %d business rows marked sent", sent, n)
	}

	rate := float64(n) / elapsed.Seconds()
	b.ReportMetric(rate, "e2e-events/s")
	b.ReportMetric(float64(n)/pd.Seconds(), "produce-events/s")
	b.ReportMetric(float64(pl.dups.Load()), "duplicates")
	b.ReportMetric(0, "ns/op")
	b.Logf("%s: %d events, %d producers; %s; load average %s", pb.name, n, s.producers, p, machineLoad())
	b.Logf("%s %s: end to end %.0f events/s: all %d handled %.2fs after the first commit; producers committed at %.0f events/s meanwhile; %d duplicates, %d failed",
		pb.name, p.name, rate, n, elapsed.Seconds(), float64(n)/pd.Seconds(), pl.dups.Load(), pl.failed.Load())
	b.Logf("%s %s: end to end cost (app = producers + forwarder + consumers in this process): %s", pb.name, p.name, cost)
}

// BenchmarkLatency is bench's BenchmarkLatency on Watermill, per broker
// and profile: events committed at a steady rate (200/s and 1,000/s, 10
// s worth, after 50 warm-up events) while the forwarder and consumers
// run; latency from just after the commit returned to the handler
// starting on the event.
func BenchmarkLatency(b *testing.B) {
	for _, pb := range brokers {
		b.Run(pb.name, func(b *testing.B) {
			for _, p := range pb.profiles {
				b.Run(p.name, func(b *testing.B) {
					for _, rate := range loadSettings(b).latencyRates {
						b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) { latency(b, pb, p, rate) })
					}
				})
			}
		})
	}
}

func latency(b *testing.B, pb peerBroker, p profile, rate int) {
	s := loadSettings(b)
	n := s.latencyEvents
	if n == 0 {
		n = 10 * rate
	}
	const warm = 50
	ctx := benchCtx(b)
	db := newDatabase(b)
	topic := p.ps.newTopic(b)

	// Indexed by business row id: a fresh database numbers them from 1.
	size := n + warm + 16
	base := time.Now()
	stamp := func(ts []atomic.Int64, id int64) {
		if id > 0 && id < int64(size) {
			ts[id].CompareAndSwap(0, int64(time.Since(base)))
		}
	}
	committed := make([]atomic.Int64, size)
	handled := make([]atomic.Int64, size)
	pl := startPipeline(b, db, topic, p, int64(n+warm), func(id int64) { stamp(handled, id) })
	pool := db.newPool(b, s.producers)

	_, err := paced(ctx, pool, topic, warm, rate, s, nil)
	must(b, err)
	for deadline := time.Now().Add(time.Minute); pl.acked.Load() < warm; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("watermill bench: warm-up: %d of %d events handled after a minute", pl.acked.Load(), warm)
		}
	}
	var ids []int64
	var mu sync.Mutex
	d, err := paced(ctx, pool, topic, n, rate, s, func(id int64) {
		stamp(committed, id)
		mu.Lock()
		ids = append(ids, id)
		mu.Unlock()
	})
	must(b, err)
	pl.wait(b, 10*time.Minute)
	pl.stop()

	lat := make([]time.Duration, 0, len(ids))
	for _, id := range ids {
		if id <= 0 || id >= int64(size) || handled[id].Load() == 0 {
			b.Fatalf("watermill bench: event %d: no handling time recorded", id)
		}
		lat = append(lat, time.Duration(handled[id].Load()-committed[id].Load()))
	}
	slices.Sort(lat)
	p50, p99, worst := suite.Percentile(lat, 50), suite.Percentile(lat, 99), lat[len(lat)-1]
	b.ReportMetric(ms(p50), "p50-ms")
	b.ReportMetric(ms(p99), "p99-ms")
	b.ReportMetric(ms(worst), "max-ms")
	b.ReportMetric(float64(n)/d.Seconds(), "paced-events/s")
	b.ReportMetric(0, "ns/op")
	b.Logf("%s: %d events at %d/s (achieved %.0f/s); %s; load average %s", pb.name, n, rate, float64(n)/d.Seconds(), p, machineLoad())
	b.Logf("%s %s: commit-to-handler latency p50 %.2f ms, p99 %.2f ms, max %.2f ms; %d duplicates, %d failed", pb.name, p.name, ms(p50), ms(p99), ms(worst), pl.dups.Load(), pl.failed.Load())
}

// paced commits n events at rate events/s from s.producers goroutines
// (suite.Produce, ferry bench's producers); onCommit gets each business
// row id just after its commit returned.
func paced(ctx context.Context, pool *pgxpool.Pool, topic string, n, rate int, s settings, onCommit func(id int64)) (time.Duration, error) {
	return suite.Produce(ctx, n, s.producers, rate, func(ctx context.Context) (int64, error) { return produce(ctx, pool, topic, s.size) }, onCommit)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
