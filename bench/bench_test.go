package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/bench/suite"
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
// after the relay (their mean is the baseline). Each broker has two raw
// baselines: a single publisher (RabbitMQ: one confirm channel pipelining
// batches of the relay's BatchSize; NATS: one async stream of all N
// messages, every PubAck awaited at the end) and the relay's shape (as many
// publishers at once as the relay publishes with, each publishing a batch
// of BatchSize and awaiting all its confirms before the next: RabbitMQ
// min(Concurrency, PublishChannels) channels, since each claim loop's
// Publish takes its own channel from the adapter's pool; NATS Concurrency
// goroutines on one connection, as the claim loops share the adapter's).
// The ratio is taken against the faster and also reported against each.
// Figure: relay/raw ratio, aim >= 0.6.
func BenchmarkRelayThroughput(b *testing.B) {
	for _, kind := range kinds {
		b.Run(kind, func(b *testing.B) {
			s := loadSettings(b)
			n := s.events
			db := newDatabase(b)
			tp := newTopology(b, kind)
			newBroker(b, kind, tp, s) // declares the topology for the raw client

			// The publishers the relay publishes with at once: one per
			// claim loop, and on RabbitMQ at most one per pool channel.
			par := s.relayConc
			if kind == "rabbitmq" {
				par = min(s.relayConc, s.publishChannels)
			}
			// On RabbitMQ one channel in the relay's shape is the
			// single baseline itself; on NATS the single baseline is a
			// stream, not batches.
			runPar := par > 1 || kind == "nats"
			single, singleMetric := "one channel", "raw-1ch-msgs/s"
			switch kind {
			case "nats":
				single, singleMetric = "one stream of all N, every PubAck awaited at the end", "raw-stream-msgs/s"
			case "kafka":
				single, singleMetric = "one kafka-go Writer, RequireAll", "raw-1pub-msgs/s"
			}
			if kind == "sqs" {
				single, singleMetric = "one publisher, batches of BatchSize as SendMessageBatch calls of 10, 16 calls in flight", "raw-1pub-msgs/s"
			}
			raw := func() (one, many float64) {
				one = rawSingle(b, kind, tp, n, s.relayBatch)
				purgeQueues(b, kind, tp)
				if runPar {
					many = rawParallel(b, kind, tp, n, par, s.relayBatch)
					purgeQueues(b, kind, tp)
				}
				return one, many
			}
			oneBefore, manyBefore := raw()
			// Each relay mode drains the same backlog in turn, between
			// the two raw runs (the WAL relay's slot exists before its
			// backlog is inserted, so the rows are in its stream).
			rates := map[string]float64{}
			phaseOf := map[string]string{}
			for _, mode := range s.relayModes {
				if mode == outbox.RelayModeWAL {
					ensureSlot(b, db)
				}
				fillOutbox(b, db, n)
				rates[mode], phaseOf[mode] = drain(b, kind, db, tp, s, n, mode)
				purgeQueues(b, kind, tp)
			}
			oneAfter, manyAfter := raw()
			relayRate, phases := rates[s.relayModes[0]], phaseOf[s.relayModes[0]]

			one, many := (oneBefore+oneAfter)/2, (manyBefore+manyAfter)/2
			ratio := relayRate / max(one, many)
			b.ReportMetric(relayRate, "relay-msgs/s")
			b.ReportMetric(one, singleMetric)
			if runPar {
				b.ReportMetric(many, "raw-par-msgs/s")
				b.ReportMetric(relayRate/one, "relay/"+strings.TrimSuffix(singleMetric, "-msgs/s"))
				b.ReportMetric(relayRate/many, "relay/raw-par")
			}
			b.ReportMetric(ratio, "relay/raw")
			for _, mode := range s.relayModes {
				b.ReportMetric(rates[mode], mode+"-relay-msgs/s")
				b.ReportMetric(rates[mode]/max(one, many), mode+"-relay/raw")
				b.Logf("%s: relay mode %s: %.0f msgs/s = %.2f x the faster raw baseline; %s", kind, mode, rates[mode], rates[mode]/max(one, many), phaseOf[mode])
			}
			b.ReportMetric(0, "ns/op")
			b.Logf("%s: %d events, %s; %s; relay/raw is the first mode's (%s)", kind, n, describeMessage(), s, s.relayModes[0])
			how := single
			if kind == "rabbitmq" || kind == "kafka" {
				how = fmt.Sprintf("%s, batches of %d", single, s.relayBatch)
			}
			b.Logf("%s: raw confirmed publish, one publisher (%s): %.0f msgs/s (before %.0f, after %.0f)", kind, how, one, oneBefore, oneAfter)
			if runPar {
				who := "channels"
				switch kind {
				case "nats":
					who = "publishers on one connection"
				case "kafka":
					who = "publishers on one kafka-go Writer (RequireAll)"
				}
				if kind == "sqs" {
					who = "publishers on one SDK client (SendMessageBatch of 10, 16 calls in flight each)"
				}
				b.Logf("%s: raw confirmed publish, %d %s at once (the relay's parallelism), batches of %d, all confirms awaited per batch: %.0f msgs/s (before %.0f, after %.0f)", kind, par, who, s.relayBatch, many, manyBefore, manyAfter)
				b.Logf("%s: relay %.0f msgs/s = %.2f x the faster raw baseline (aim >= 0.6); %.2f x one publisher, %.2f x the relay's shape", kind, relayRate, ratio, relayRate/one, relayRate/many)
			} else {
				b.Logf("%s: relay %.0f msgs/s = %.2f x the raw baseline (aim >= 0.6)", kind, relayRate, ratio)
			}
			b.Logf("%s: %s", kind, phases)
		})
	}
}

// drain runs a relay over the outbox until n rows were published and
// returns rows/s and where a batch's time went.
func drain(b *testing.B, kind string, db database, tp broker.Topology, s settings, n int, mode string) (float64, string) {
	b.Helper()
	p := startPipeline(b, kind, db, tp, s, parts{relay: true, target: int64(n), mode: mode})
	start := time.Now()
	p.waitPublished(b, 5*time.Minute)
	rate := float64(n) / time.Since(start).Seconds()
	p.stop()
	var left int64
	must(b, db.pool.QueryRow(benchCtx(b), `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&left))
	if left != 0 {
		b.Errorf("bench: %d outbox rows left unpublished", left)
	}
	return rate, p.relayStats()
}

// BenchmarkEndToEnd commits a burst of N events from concurrent producers
// (a business row plus outbox.Enqueue per transaction) while a relay and a
// worker run, and measures until every business row is marked handled.
// Figure: end-to-end events/s, aim >= 3,000/s on 2 cores. Context: the
// creation rate of the same producers with nothing else running, on its
// own fresh database.
func BenchmarkEndToEnd(b *testing.B) {
	for _, kind := range kinds {
		for _, mode := range loadSettings(b).relayModes {
			b.Run(modeName(kind, mode), func(b *testing.B) { endToEnd(b, kind, mode) })
		}
	}
}

// modeName is a sub-benchmark's name: the broker, and "-wal" for the WAL
// relay (the polling relay's keep the names of the runs before it, which
// bench/compare.sh reads).
func modeName(kind, mode string) string {
	if mode == outbox.RelayModeWAL {
		return kind + "-wal"
	}
	return kind
}

// endToEnd is one run of BenchmarkEndToEnd with the relay in mode.
func endToEnd(b *testing.B, kind, mode string) {
	s := loadSettings(b)
	n := s.events
	ctx := benchCtx(b)

	alone := newDatabase(b)
	apool := alone.newPool(b, s.producers)
	cm := startCost(b, alone, "")
	d, err := produceBurst(ctx, apool, s.producers, n)
	must(b, err)
	createRate := float64(n) / d.Seconds()
	apool.Close()
	createCost := stopCost(b, cm, alone, n, "create-")

	db := newDatabase(b)
	tp := newTopology(b, kind)
	p := startPipeline(b, kind, db, tp, s, parts{relay: true, worker: true, target: int64(n), mode: mode})
	pool := db.newPool(b, s.producers)
	m := startCost(b, db, kind)
	start := time.Now()
	pd, err := produceBurst(ctx, pool, s.producers, n)
	must(b, err)
	p.wait(b, 5*time.Minute)
	elapsed := time.Since(start)
	p.stop()
	pool.Close()
	cost := stopCost(b, m, db, n, "")
	logStatements(b, db, n, kind+": end to end")
	if sent := countSent(b, db); sent != int64(n) {
		b.Errorf("bench: %d of %d business rows marked sent", sent, n)
	}

	pstats := p.stats()

	// Each stage alone on its own fresh database: the relay
	// draining N committed events, then the worker draining the
	// N queued messages.
	staged := newDatabase(b)
	if mode == outbox.RelayModeWAL {
		ensureSlot(b, staged)
	}
	fillBusiness(b, staged, n)
	stp := newTopology(b, kind)
	relayRate, relayPhases := drain(b, kind, staged, stp, s, n, mode)
	wp := startPipeline(b, kind, staged, stp, s, parts{worker: true, target: int64(n)})
	wstart := time.Now()
	wp.wait(b, 5*time.Minute)
	workerRate := float64(n) / time.Since(wstart).Seconds()
	wp.stop()
	if sent := countSent(b, staged); sent != int64(n) {
		b.Errorf("bench: worker alone: %d of %d business rows marked sent", sent, n)
	}

	rate := float64(n) / elapsed.Seconds()
	b.ReportMetric(rate, "e2e-events/s")
	b.ReportMetric(relayRate, "relay-alone-events/s")
	b.ReportMetric(workerRate, "worker-alone-events/s")
	b.ReportMetric(float64(n)/pd.Seconds(), "produce-events/s")
	b.ReportMetric(createRate, "create-alone-events/s")
	b.ReportMetric(0, "ns/op")
	b.Logf("%s: relay mode %s; %d events, %d producers, %s; %s", kind, mode, n, s.producers, describeMessage(), s)
	b.Logf("%s: creation alone (no relay, no worker) %.0f events/s; %s", kind, createRate, createCost)
	b.Logf("%s: end to end %.0f events/s (aim >= 3000): all %d handled %.2fs after the first commit; producers committed at %.0f events/s meanwhile; %d duplicates, %d retried/dead",
		kind, rate, n, elapsed.Seconds(), float64(n)/pd.Seconds(), p.dups.Load(), p.other.Load())
	b.Logf("%s: end to end cost (app = producers + relay + worker in this process): %s", kind, cost)
	b.Logf("%s: %s", kind, pstats)
	b.Logf("%s: stages alone: relay %.0f events/s (%s); worker %.0f events/s (%s)", kind, relayRate, relayPhases, workerRate, wp.workerStats())
}

// BenchmarkLatency commits events at a steady rate (200/s and 1,000/s,
// one run each, 10 s worth; paced by a ticker, from concurrent producers) while a relay and a worker run, and
// measures each event's latency from just after its commit returned to the
// moment the handler started on it (both clocks in this process).
// Figures: p50 and p99, aim at 200/s p50 <= 5 ms, p99 <= 10 ms; at
// 1,000/s p99 <= 50 ms.
func BenchmarkLatency(b *testing.B) {
	for _, kind := range kinds {
		for _, mode := range loadSettings(b).relayModes {
			b.Run(modeName(kind, mode), func(b *testing.B) {
				for _, rate := range loadSettings(b).latencyRates {
					b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) { latency(b, kind, mode, rate) })
				}
			})
		}
	}
}

// latency is one run of BenchmarkLatency at rate events/s with the relay
// in mode.
func latency(b *testing.B, kind, mode string, rate int) {
	s := loadSettings(b)
	n := s.latencyEvents
	if n == 0 {
		n = 10 * rate
	}
	const warm = 50
	ctx := benchCtx(b)
	db := newDatabase(b)
	tp := newTopology(b, kind)

	// Indexed by outbox id (the message ID): a fresh database
	// numbers them from 1.
	size := n + warm + 16
	base := time.Now()
	stamp := func(ts []atomic.Int64, id int64) {
		if id > 0 && id < int64(size) {
			ts[id].CompareAndSwap(0, int64(time.Since(base)))
		}
	}
	committed := make([]atomic.Int64, size) // commit returned
	confirmed := make([]atomic.Int64, size) // the relay's Publish returned
	handled := make([]atomic.Int64, size)   // the handler started
	p := startPipeline(b, kind, db, tp, s, parts{relay: true, worker: true, target: int64(n + warm), mode: mode,
		onHandled: func(msg *broker.Message) {
			id, _ := strconv.ParseInt(msg.ID, 10, 64)
			stamp(handled, id)
		},
		afterPublish: func(_ context.Context, ids []int64) error {
			for _, id := range ids {
				stamp(confirmed, id)
			}
			return nil
		},
	})
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
		stamp(committed, id)
		mu.Lock()
		ids = append(ids, id)
		mu.Unlock()
	})
	must(b, err)
	p.wait(b, 2*time.Minute)
	p.stop()

	lat := make([]time.Duration, 0, len(ids))
	conf := make([]time.Duration, 0, len(ids))
	early := 0
	for _, id := range ids {
		if id <= 0 || id >= int64(size) || handled[id].Load() == 0 || confirmed[id].Load() == 0 {
			b.Fatalf("bench: message %d: no handling or confirm time recorded", id)
		}
		lat = append(lat, time.Duration(handled[id].Load()-committed[id].Load()))
		conf = append(conf, time.Duration(confirmed[id].Load()-committed[id].Load()))
		if handled[id].Load() < confirmed[id].Load() {
			early++
		}
	}
	sortDurations(lat)
	sortDurations(conf)
	p50, p99, worst := suite.Percentile(lat, 50), suite.Percentile(lat, 99), lat[len(lat)-1]
	b.ReportMetric(ms(p50), "p50-ms")
	b.ReportMetric(ms(p99), "p99-ms")
	b.ReportMetric(ms(worst), "max-ms")
	b.ReportMetric(ms(suite.Percentile(conf, 50)), "confirmed-p50-ms")
	b.ReportMetric(ms(suite.Percentile(conf, 99)), "confirmed-p99-ms")
	b.ReportMetric(float64(n)/d.Seconds(), "paced-events/s")
	b.ReportMetric(0, "ns/op")
	b.Logf("%s: relay mode %s; %d events at %d/s (achieved %.0f/s), %s; %s", kind, mode, n, rate, float64(n)/d.Seconds(), describeMessage(), s)
	b.Logf("%s: commit-to-handler latency p50 %.2f ms (aim <= 5), p99 %.2f ms (aim <= 10), max %.2f ms", kind, ms(p50), ms(p99), ms(worst))
	b.Logf("%s: of which commit-to-confirmed (relay woken, claimed, published, confirm received) p50 %.2f ms, p99 %.2f ms; %d of %d handled before the relay saw the confirm",
		kind, ms(suite.Percentile(conf, 50)), ms(suite.Percentile(conf, 99)), early, len(ids))
	b.Logf("%s: %s", kind, p.stats())
}

// paced commits n events at rate events/s: a ticker hands out the events,
// producers goroutines commit them (so a slow commit does not delay the
// next tick). onCommit, when set, gets each event's outbox id just
// after its commit returned. It returns the time from the first tick to
// the last commit.
func paced(ctx context.Context, pool *pgxpool.Pool, n, rate, producers int, onCommit func(id int64)) (time.Duration, error) {
	return suite.Produce(ctx, n, producers, rate, func(ctx context.Context) (int64, error) { return produce(ctx, pool) }, onCommit)
}

// BenchmarkCreate is context for BenchmarkEndToEnd: the rate at which
// producers alone commit events (business row + outbox.Enqueue, one event
// per transaction), with 4 and 8 producers: with Enqueue's default notify
// window (at most one pg_notify per window), with a pg_notify in every
// transaction (outbox.SetNotifyWindow(0)), and with the same rows inserted
// without any pg_notify. PostgreSQL serializes the commits of transactions
// that sent a NOTIFY (a global lock is taken in pre-commit and held
// through the WAL flush), so with a NOTIFY in every transaction the rate
// stops growing with producers.
func BenchmarkCreate(b *testing.B) {
	for _, mode := range []string{"enqueue", "enqueue-notify-every-tx", "insert-without-notify"} {
		for _, producers := range []int{4, 8} {
			name := fmt.Sprintf("%s/producers=%d", mode, producers)
			b.Run(name, func(b *testing.B) {
				s := loadSettings(b)
				n := s.events
				db := newDatabase(b)
				pool := db.newPool(b, producers)
				ctx := benchCtx(b)
				var d time.Duration
				var err error
				window := outbox.NotifyWindow()
				switch mode {
				case "enqueue-notify-every-tx":
					prev, werr := outbox.SetNotifyWindow(0)
					must(b, werr)
					window = 0
					d, err = produceBurst(ctx, pool, producers, n)
					_, _ = outbox.SetNotifyWindow(prev)
				case "enqueue":
					d, err = produceBurst(ctx, pool, producers, n)
				default:
					window = -1
					d, err = burst(ctx, producers, n, func() error { return produceWithoutNotify(ctx, pool) })
				}
				must(b, err)
				rate := float64(n) / d.Seconds()
				b.ReportMetric(rate, "events/s")
				b.ReportMetric(0, "ns/op")
				how := fmt.Sprintf("notify window %v", window)
				if window < 0 {
					how = "no pg_notify"
				}
				b.Logf("%s: %d events committed at %.0f events/s (%s; load average %s)", name, n, rate, how, machineLoad())
			})
		}
	}
}
