package workertest

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker"
)

// RunWorkerBenchmark measures the worker's throughput on the broker from
// newBroker: b.N messages are published first (not timed), then a worker
// with the given Concurrency (0: the default) handles them with a handler
// doing one UPDATE of a status row, as the notification service does; the
// database pool has Concurrency connections. It reports msgs/s and
// commits/msg (the handling transactions that committed, counted by the
// distinct xmin of the dedup rows, per message: 1 without batches); the
// timer covers the handling only. Run it with a fixed count, e.g.
// -benchtime=20000x, so the queue holds enough messages.
func RunWorkerBenchmark(b *testing.B, newBroker NewBrokerFunc, concurrency int) {
	RunWorkerBenchmarkWith(b, newBroker, BenchOptions{Concurrency: concurrency})
}

// BenchOptions tune RunWorkerBenchmarkWith; zero fields mean the worker's
// defaults.
type BenchOptions struct {
	// Concurrency is Config.Concurrency; the pool gets as many connections.
	Concurrency int
	// Prefetch is Config.Prefetch.
	Prefetch int
	// BatchSize is Config.BatchSize.
	BatchSize int
	// TypeOptions, when set, serves the handler through a Router with one
	// route with these options (Config.Router), to measure what the
	// per-type lookup and, with a Timeout, the handler's own goroutine
	// and timer cost.
	TypeOptions *worker.TypeOptions
}

// RunWorkerBenchmarkWith is RunWorkerBenchmark with the worker configured
// by opts.
func RunWorkerBenchmarkWith(b *testing.B, newBroker NewBrokerFunc, opts BenchOptions) {
	ctx := context.Background()
	concurrency := opts.Concurrency
	if concurrency <= 0 {
		concurrency = worker.DefaultConcurrency
	}
	// A pool sized to Concurrency, as the package doc asks.
	pcfg, err := pgxpool.ParseConfig(testenv.NewDatabase(b))
	require.NoError(b, err)
	pcfg.MaxConns = int32(concurrency)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	CreateSchema(b, pool)
	_, err = pool.Exec(ctx, `CREATE TABLE bench_items (id BIGINT PRIMARY KEY, status TEXT NOT NULL DEFAULT 'pending')`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `INSERT INTO bench_items (id) SELECT generate_series(1, $1::bigint)`, b.N)
	require.NoError(b, err)

	br := newBroker(b)
	topo := broker.Topology{
		Exchange: testenv.UniqueName("wb-ex"),
		Queues:   []broker.Queue{{Name: testenv.UniqueName("wb-q"), Bindings: []string{"bench.item"}, RetryDelays: []time.Duration{time.Second}}},
	}
	require.NoError(b, br.Declare(ctx, topo))
	const batch = 500
	msgs := make([]*broker.Message, 0, batch)
	for i := 1; i <= b.N; i++ {
		msgs = append(msgs, &broker.Message{ID: strconv.Itoa(i), Type: "bench.item", Body: []byte(`{"id":` + strconv.Itoa(i) + `}`)})
		if len(msgs) == batch || i == b.N {
			require.NoError(b, br.Publish(ctx, msgs))
			msgs = msgs[:0]
		}
	}

	var handled atomic.Int64
	done := make(chan struct{})
	cfg := worker.Config{
		Consumer:    "bench",
		Queue:       topo.Queues[0].Name,
		Pool:        pool,
		Broker:      br,
		Topology:    topo,
		Concurrency: concurrency,
		Prefetch:    opts.Prefetch,
		BatchSize:   opts.BatchSize,
		Handler: func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
			_, err := tx.Exec(ctx, `UPDATE bench_items SET status = 'sent' WHERE id = $1`, msg.ID)
			return err
		},
		OnOutcome: func(_ *broker.Message, o worker.Outcome, _ time.Duration) {
			if handled.Add(1) == int64(b.N) {
				close(done)
			}
		},
	}
	if opts.TypeOptions != nil {
		r := &router{}
		r.add("bench.item", *opts.TypeOptions, cfg.Handler)
		cfg.Handler, cfg.Router = nil, r
	}
	w, err := worker.New(cfg)
	require.NoError(b, err)
	runCtx, cancel := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	b.ResetTimer()
	start := time.Now()
	go func() { runDone <- w.Run(runCtx) }()
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		b.Fatalf("workertest: handled %d of %d messages in 10 minutes", handled.Load(), b.N)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	require.NoError(b, <-runDone)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	// The handling transactions that committed: each dedup row's xmin is
	// the transaction that inserted it, one per batch.
	var txs int
	require.NoError(b, pool.QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM processed_messages WHERE consumer = 'bench'`).Scan(&txs))
	b.ReportMetric(float64(txs)/float64(b.N), "commits/msg")
	var sent int
	require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM bench_items WHERE status = 'sent'`).Scan(&sent))
	require.Equal(b, b.N, sent)
}
