package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/bench/suite"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/brokers/sqs"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// eventType is the routing key of every benchmark event (the sample app's).
const eventType = app.EventNotificationRequested

// bodyBytes is the size of every event body. With the ID, type, key and
// headers (traceparent, created-at) a message is about 300 bytes.
const bodyBytes = 160

// traceparent is carried by every event, as the sample app's API does.
const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// kinds are the brokers every benchmark runs on.
var kinds = []string{"rabbitmq", "nats", "kafka", "sqs"}

// settings are the tunables, all public configuration of ferry's packages.
// Each can be overridden by an environment variable (named in
// loadSettings) to explore without editing the file; a bad value fails the
// benchmark.
type settings struct {
	events          int   // events per throughput run
	producers       int   // concurrent producers (one event per transaction)
	relayBatch      int   // outbox.RelayConfig.BatchSize
	relayConc       int   // outbox.RelayConfig.Concurrency
	publishChannels int   // rabbitmq.Config.PublishChannels
	workerConc      int   // worker.Config.Concurrency
	workerPrefetch  int   // worker.Config.Prefetch
	workerBatch     int   // worker.Config.BatchSize (the handler's effects are all in its transaction)
	latencyEvents   int   // events of each latency run (0: 10 s worth at its rate)
	latencyRates    []int // events/s of the latency runs, one run each
	// relayModes are the relay modes (outbox.RelayConfig.Mode) each
	// benchmark runs, side by side in one run: FERRY_BENCH_RELAY_MODES,
	// "poll,wal" by default.
	relayModes []string
	// relayBatchDelay is outbox.RelayConfig.BatchDelay (0: the default).
	relayBatchDelay time.Duration
	// settleInterval is outbox.RelayConfig.SettleInterval, the WAL
	// relay's (0: the default; negative: every batch at once).
	settleInterval time.Duration
	// notifyWindow is outbox.SetNotifyWindow's window; negative leaves
	// the package default.
	notifyWindow time.Duration
	// sqs is what the SQS benchmarks (sqs_scale_test.go) set on the SQS
	// adapter; the zero value is its defaults on the kind's server.
	sqs sqsSettings
}

func loadSettings(b *testing.B) settings {
	envInt := func(name string, def int) int {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("bench: %s=%q: want a positive integer", name, v)
		}
		return n
	}
	envDur := func(name string, def time.Duration, negative bool) time.Duration {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || (d < 0 && !negative) {
			b.Fatalf("bench: %s=%q: want a duration such as 1ms", name, v)
		}
		return d
	}
	s := settings{
		relayBatchDelay: envDur("FERRY_BENCH_RELAY_BATCH_DELAY", 0, true),
		settleInterval:  envDur("FERRY_BENCH_SETTLE_INTERVAL", 0, true),
		notifyWindow:    envDur("FERRY_BENCH_NOTIFY_WINDOW", -1, false),
		events:          envInt("FERRY_BENCH_EVENTS", 20000),
		producers:       envInt("FERRY_BENCH_PRODUCERS", 4),
		relayBatch:      envInt("FERRY_BENCH_RELAY_BATCH", 500),
		relayConc:       envInt("FERRY_BENCH_RELAY_CONCURRENCY", 2),
		publishChannels: envInt("FERRY_BENCH_PUBLISH_CHANNELS", 4),
		workerConc:      envInt("FERRY_BENCH_WORKER_CONCURRENCY", 20),
		workerPrefetch:  envInt("FERRY_BENCH_WORKER_PREFETCH", 0),
		workerBatch:     envInt("FERRY_BENCH_WORKER_BATCH", 1),
		latencyRates:    []int{200, 1000},
	}
	s.relayModes = []string{outbox.RelayModePoll, outbox.RelayModeWAL}
	if v := os.Getenv("FERRY_BENCH_RELAY_MODES"); v != "" {
		s.relayModes = nil
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			if f != outbox.RelayModePoll && f != outbox.RelayModeWAL {
				b.Fatalf("bench: FERRY_BENCH_RELAY_MODES=%q: want poll, wal or both separated by a comma", v)
			}
			s.relayModes = append(s.relayModes, f)
		}
	}
	if os.Getenv("FERRY_BENCH_LATENCY_EVENTS") != "" {
		s.latencyEvents = envInt("FERRY_BENCH_LATENCY_EVENTS", 0)
	}
	if v := os.Getenv("FERRY_BENCH_LATENCY_RATE"); v != "" {
		s.latencyRates = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				b.Fatalf("bench: FERRY_BENCH_LATENCY_RATE=%q: want positive integers separated by commas", v)
			}
			s.latencyRates = append(s.latencyRates, n)
		}
	}
	if s.notifyWindow >= 0 {
		prev, err := outbox.SetNotifyWindow(s.notifyWindow)
		must(b, err)
		b.Cleanup(func() { _, _ = outbox.SetNotifyWindow(prev) })
	}
	return s
}

func (s settings) String() string {
	prefetch := "2xConcurrency"
	if s.workerPrefetch > 0 {
		prefetch = strconv.Itoa(s.workerPrefetch)
	}
	batchDelay := "default " + outbox.DefaultBatchDelay.String()
	if s.relayBatchDelay != 0 {
		batchDelay = s.relayBatchDelay.String()
	}
	settle := "default " + outbox.DefaultSettleInterval.String()
	if s.settleInterval != 0 {
		settle = s.settleInterval.String()
	}
	return fmt.Sprintf("notify window %v; relay BatchSize=%d Concurrency=%d BatchDelay=%s SettleInterval=%s (pool %d conns); rabbitmq PublishChannels=%d; worker Concurrency=%d Prefetch=%s BatchSize=%d (pool %d conns); producers=%d (pool %d conns); load average %s on %d CPUs",
		outbox.NotifyWindow(), s.relayBatch, s.relayConc, batchDelay, settle, s.relayConc+2, s.publishChannels, s.workerConc, prefetch, s.workerBatch, s.workerConc+2, s.producers, s.producers, machineLoad(), runtime.NumCPU())
}

// machineLoad returns the 1-minute load average, to judge how far the
// figures were disturbed by other work on the machine.
func machineLoad() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(b))[0]
}

// quietLogger drops the relay's and worker's info lines (start, stop) so
// the figures stand out; warnings and errors still show.
var quietLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

func benchCtx(b *testing.B) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	b.Cleanup(cancel)
	return ctx
}

// database is a fresh, migrated database (outbox and the app's
// notifications table) and its URL.
type database struct {
	pool *pgxpool.Pool // small admin pool from testenv.NewPool
	dsn  string
	slot string // the replication slot of a WAL relay on it (slots are server-wide)
}

func newDatabase(b *testing.B) database {
	b.Helper()
	ctx := benchCtx(b)
	pool, dsn := testenv.NewPool(b)
	must(b, outbox.Migrate(ctx, pool))
	must(b, app.Migrate(ctx, pool))
	var name string
	must(b, pool.QueryRow(ctx, `SELECT current_database()`).Scan(&name))
	return database{pool: pool, dsn: dsn, slot: outbox.DefaultSlotName(name)}
}

// ensureSlot creates the WAL relay's slot on db, so that the outbox rows
// inserted next are in its stream (those inserted before would be handed
// to the polling side).
func ensureSlot(b *testing.B, db database) {
	b.Helper()
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: db.pool, Broker: nopBroker{}, Mode: outbox.RelayModeWAL, Slot: db.slot, Logger: quietLogger})
	must(b, err)
	must(b, r.EnsureSlot(benchCtx(b)))
}

// nopBroker only names itself: ensureSlot's relay publishes nothing.
type nopBroker struct{ broker.Broker }

func (nopBroker) Capabilities() broker.Capabilities { return broker.Capabilities{Name: "none"} }

// newPool opens a pool of at most maxConns connections on the database,
// closed when the benchmark ends.
func (d database) newPool(b *testing.B, maxConns int) *pgxpool.Pool {
	b.Helper()
	pool, err := suite.OpenPool(benchCtx(b), d.dsn, maxConns)
	must(b, err)
	b.Cleanup(pool.Close)
	return pool
}

// newTopology returns a one-queue topology with unique names, removed from
// the broker when the benchmark ends.
func newTopology(b *testing.B, kind string) broker.Topology {
	ex := testenv.UniqueName("bench")
	tp := broker.Topology{Exchange: ex, Queues: []broker.Queue{{
		Name: ex + ".send", Bindings: []string{eventType}, RetryDelays: []time.Duration{time.Second},
	}}}
	b.Cleanup(func() { deleteTopology(b, kind, tp) })
	return tp
}

// newBroker connects an adapter, declares tp on it and closes it when the
// benchmark ends. Each role (relay, worker) gets its own, as separate
// processes would.
func newBroker(b *testing.B, kind string, tp broker.Topology, s settings) broker.Broker {
	b.Helper()
	ctx := benchCtx(b)
	var (
		br  broker.Broker
		err error
	)
	switch kind {
	case "rabbitmq":
		testenv.RequireTCP(b, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
		br, err = rabbitmq.New(ctx, rabbitmq.Config{URL: testenv.RabbitMQURL(), PublishChannels: s.publishChannels, Logger: quietLogger})
	case "nats":
		testenv.RequireTCP(b, "nats", testenv.HostPort(testenv.NATSURL()))
		br, err = nats.New(ctx, nats.Config{URL: testenv.NATSURL(), Logger: quietLogger})
	case "kafka":
		testenv.RequireTCP(b, "kafka", testenv.KafkaBrokers()[0])
		br, err = kafka.New(ctx, kafka.Config{Brokers: testenv.KafkaBrokers(), Logger: quietLogger})
	case "sqs", kindMoto:
		testenv.RequireTCP(b, kind, testenv.HostPort(sqsEndpoint(kind)))
		br, err = sqs.New(ctx, s.sqs.config(kind))
	default:
		b.Fatalf("bench: unknown broker %q", kind)
	}
	must(b, err)
	b.Cleanup(func() { _ = br.Close() })
	must(b, br.Declare(ctx, tp))
	return br
}

func deleteTopology(b *testing.B, kind string, tp broker.Topology) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch kind {
	case "rabbitmq":
		conn, err := amqp.Dial(testenv.RabbitMQURL())
		if err != nil {
			b.Logf("bench: delete topology: %v", err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			b.Logf("bench: delete topology: %v", err)
			return
		}
		for _, q := range tp.Queues {
			for _, n := range rabbitmq.QueueNames(q) {
				if _, err := ch.QueueDelete(n, false, false, false); err != nil {
					b.Logf("bench: delete queue %s: %v", n, err)
					return
				}
			}
		}
		if err := ch.ExchangeDelete(tp.Exchange, false, false); err != nil {
			b.Logf("bench: delete exchange %s: %v", tp.Exchange, err)
		}
	case "sqs", kindMoto:
		deleteSQSTopology(b, kind, tp)
	case "nats":
		nc, err := natsgo.Connect(testenv.NATSURL())
		if err != nil {
			b.Logf("bench: delete topology: %v", err)
			return
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			b.Logf("bench: delete topology: %v", err)
			return
		}
		for _, s := range []string{nats.StreamName(tp.Exchange), nats.StreamName(tp.Exchange) + "-dlq"} {
			if err := js.DeleteStream(ctx, s); err != nil && !strings.Contains(err.Error(), "not found") {
				b.Logf("bench: delete stream %s: %v", s, err)
			}
		}
	case "kafka":
		deleteKafkaTopology(ctx, b, tp)
	}
}

// purgeQueues empties the work queue (RabbitMQ) or the stream (NATS)
// between the phases of a benchmark, so each phase starts from the same
// broker state.
func purgeQueues(b *testing.B, kind string, tp broker.Topology) {
	b.Helper()
	ctx := benchCtx(b)
	switch kind {
	case "rabbitmq":
		conn, err := amqp.Dial(testenv.RabbitMQURL())
		must(b, err)
		defer conn.Close()
		ch, err := conn.Channel()
		must(b, err)
		_, err = ch.QueuePurge(tp.Queues[0].Name, false)
		must(b, err)
	case "nats":
		nc, err := natsgo.Connect(testenv.NATSURL())
		must(b, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		must(b, err)
		st, err := js.Stream(ctx, nats.StreamName(tp.Exchange))
		must(b, err)
		must(b, st.Purge(ctx))
	case "kafka":
		// A log is not emptied: appending costs the same at any length,
		// and each consumer group reads from its own committed offset.
	case "sqs", kindMoto:
		purgeSQS(b, kind, tp)
	}
}

// produce commits one business row (a pending notification) and its
// outbox event in one transaction and returns the outbox row's id (the
// message ID).
func produce(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	id, err := suite.InsertNotification(ctx, tx)
	if err != nil {
		return 0, err
	}
	ev := outbox.Event{Type: eventType, Key: "user-" + strconv.FormatInt(id%100, 10), Body: suite.EventBody(id, bodyBytes),
		Headers: map[string]string{broker.HeaderTraceparent: traceparent}}
	ids, err := outbox.Enqueue(ctx, tx, ev)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return ids[0], nil
}

// produceBurst commits n events from the given number of concurrent
// producers, one event per transaction, and returns the elapsed time.
func produceBurst(ctx context.Context, pool *pgxpool.Pool, producers, n int) (time.Duration, error) {
	return burst(ctx, producers, n, func() error {
		_, err := produce(ctx, pool)
		return err
	})
}

// burst runs one n times from the given number of goroutines and returns
// the elapsed time and the first error.
func burst(ctx context.Context, producers, n int, one func() error) (time.Duration, error) {
	return suite.Produce(ctx, n, producers, 0, func(context.Context) (int64, error) { return 0, one() }, nil)
}

// produceWithoutNotify writes what produce writes, with the outbox row
// inserted by hand instead of outbox.Enqueue, so without its pg_notify.
// For BenchmarkCreate only: nothing wakes a relay.
func produceWithoutNotify(ctx context.Context, pool *pgxpool.Pool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	id, err := suite.InsertNotification(ctx, tx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO outbox (event_type, partition_key, payload, headers)
		VALUES ($1, $2, $3, jsonb_build_object('traceparent', $4::text))`,
		eventType, "user-"+strconv.FormatInt(id%100, 10), suite.EventBody(id, bodyBytes), traceparent); err != nil {
		return fmt.Errorf("insert outbox: %w", err)
	}
	return tx.Commit(ctx)
}

// pipeline is a relay and a worker running on one database and broker
// kind, each with its own pool and adapter (either may be left out).
type pipeline struct {
	acked atomic.Int64  // deliveries handled and acked (OutcomeAck)
	dups  atomic.Int64  // deliveries dropped as duplicates
	other atomic.Int64  // retries and dead letters (should stay 0)
	done  chan struct{} // closed when acked reaches the target
	// The relay's batches that published rows, those rows (their ratio
	// is the mean batch the relay actually published) and the batches'
	// total, publish and mark durations.
	batches, batchRows              atomic.Int64
	batchNanos, pubNanos, markNanos atomic.Int64
	published                       chan struct{} // closed when batchRows reaches the target
	handlerNanos                    atomic.Int64  // time in the worker's transactions
	stop                            func()        // stops both and waits for them
}

// parts says what startPipeline runs.
type parts struct {
	relay, worker bool
	target        int64                                        // events to publish and to handle
	onHandled     func(*broker.Message)                        // see handler
	afterPublish  func(ctx context.Context, ids []int64) error // outbox.RelayConfig.AfterPublish
	mode          string                                       // outbox.RelayConfig.Mode ("": poll)
}

func startPipeline(b *testing.B, kind string, db database, tp broker.Topology, s settings, pt parts) *pipeline {
	b.Helper()
	ctx := benchCtx(b)
	p := &pipeline{done: make(chan struct{}), published: make(chan struct{})}
	var runs []func(context.Context) error
	// The pools are closed when the pipeline stops, so their backends
	// exit and report their counters (runcost).
	var pools []*pgxpool.Pool
	if pt.relay {
		pool := db.newPool(b, s.relayConc+2)
		pools = append(pools, pool)
		relay, err := outbox.NewRelay(outbox.RelayConfig{
			Pool: pool, Broker: newBroker(b, kind, tp, s),
			BatchSize: s.relayBatch, Concurrency: s.relayConc, BatchDelay: s.relayBatchDelay, SettleInterval: s.settleInterval, Retention: -1, Logger: quietLogger,
			AfterPublish: pt.afterPublish, Mode: pt.mode, Slot: db.slot,
			OnBatch: func(st outbox.BatchStats) {
				if st.Published > 0 {
					p.batches.Add(1)
					p.batchNanos.Add(int64(st.Duration))
					p.pubNanos.Add(int64(st.PublishDuration))
					p.markNanos.Add(int64(st.MarkDuration))
					if p.batchRows.Add(int64(st.Published)) == pt.target {
						close(p.published)
					}
				}
			},
		})
		must(b, err)
		if pt.mode == outbox.RelayModeWAL {
			must(b, relay.EnsureSlot(ctx))
		}
		runs = append(runs, relay.Run)
	}
	if pt.worker {
		pool := db.newPool(b, s.workerConc+2)
		pools = append(pools, pool)
		w, err := worker.New(worker.Config{
			Consumer: "bench", Queue: tp.Queues[0].Name, Topology: tp,
			Pool: pool, Broker: newBroker(b, kind, tp, s), Handler: suite.DBHandler(pt.onHandled),
			Concurrency: s.workerConc, Prefetch: s.workerPrefetch, BatchSize: s.workerBatch, Logger: quietLogger,
			OnOutcome: func(_ *broker.Message, o worker.Outcome, d time.Duration) {
				p.handlerNanos.Add(int64(d))
				switch o {
				case worker.OutcomeAck:
					if p.acked.Add(1) == pt.target {
						close(p.done)
					}
				case worker.OutcomeDuplicate:
					p.dups.Add(1)
				default:
					p.other.Add(1)
				}
			},
		})
		must(b, err)
		runs = append(runs, w.Run)
	}
	rctx, cancel := context.WithCancel(ctx)
	errs := make(chan error, len(runs))
	for _, run := range runs {
		go func() { errs <- run(rctx) }()
	}
	var once sync.Once
	p.stop = func() {
		once.Do(func() {
			cancel()
			for range runs {
				if err := <-errs; err != nil {
					b.Errorf("bench: pipeline: %v", err)
				}
			}
			for _, pool := range pools {
				pool.Close()
			}
		})
	}
	b.Cleanup(p.stop)
	return p
}

// stats describes how the relay batched and how long the worker's
// transactions took.
func (p *pipeline) stats() string { return p.relayStats() + "; " + p.workerStats() }

// relayStats says how many rows the relay published per batch and where a
// batch's time went on average.
func (p *pipeline) relayStats() string {
	k := max(p.batches.Load(), 1)
	avg := func(v *atomic.Int64) float64 { return ms(time.Duration(v.Load() / k)) }
	total, pub, mark := avg(&p.batchNanos), avg(&p.pubNanos), avg(&p.markNanos)
	return fmt.Sprintf("relay published %d batches of %.1f rows, each %.2f ms on average = claim %.2f + publish %.2f + mark/commit %.2f ms",
		p.batches.Load(), float64(p.batchRows.Load())/float64(k), total, total-pub-mark, pub, mark)
}

// workerStats gives the worker's mean transaction time.
func (p *pipeline) workerStats() string {
	handled := max(p.acked.Load()+p.dups.Load()+p.other.Load(), 1)
	return fmt.Sprintf("worker transactions took %.2f ms on average", ms(time.Duration(p.handlerNanos.Load()/handled)))
}

// wait blocks until the pipeline acked its target or timeout passed.
func (p *pipeline) wait(b *testing.B, timeout time.Duration) {
	b.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		b.Fatalf("bench: only %d events handled (%d duplicates, %d retried or dead) after %v", p.acked.Load(), p.dups.Load(), p.other.Load(), timeout)
	}
}

// waitPublished blocks until the relay published its target or timeout
// passed.
func (p *pipeline) waitPublished(b *testing.B, timeout time.Duration) {
	b.Helper()
	select {
	case <-p.published:
	case <-time.After(timeout):
		b.Fatalf("bench: only %d events published after %v", p.batchRows.Load(), timeout)
	}
}

// countSent returns how many business rows are marked sent.
func countSent(b *testing.B, db database) int64 {
	var n int64
	must(b, db.pool.QueryRow(benchCtx(b), `SELECT count(*) FROM notifications WHERE status = 'sent'`).Scan(&n))
	return n
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sortDurations(ds []time.Duration) []time.Duration {
	slices.Sort(ds)
	return ds
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}
