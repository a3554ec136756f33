package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker"
	"github.com/ferrymq/ferry/worker/workertest"
)

// newRabbitMQ connects to the RabbitMQ of testenv; the broker is closed
// when the test ends.
func newRabbitMQ(tb testing.TB) broker.Broker {
	tb.Helper()
	testenv.RequireTCP(tb, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: testenv.RabbitMQURL()})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = b.Close() })
	return b
}

func TestWorkerRabbitMQ(t *testing.T) {
	workertest.RunWorkerSuite(t, newRabbitMQ)
}

// TestWorkerRabbitMQBatch8 runs the whole suite again with batches of up to
// 8 deliveries per transaction, plus the tests of batches.
func TestWorkerRabbitMQBatch8(t *testing.T) {
	workertest.RunWorkerSuiteWith(t, newRabbitMQ, workertest.SuiteOptions{BatchSize: 8})
}

// BenchmarkWorker reports the worker's msgs/s and commits/msg on RabbitMQ
// and PostgreSQL with a handler doing one UPDATE, with the default
// configuration (one transaction per message) and with batches, in the
// same run; run with -benchtime=20000x (-bench
// BenchmarkWorker/Conc8/Prefetch64 for Batch1 against Batch8 alone, with
// the Router variants of Batch1).
func BenchmarkWorker(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts workertest.BenchOptions
	}{
		{"Default", workertest.BenchOptions{}},
		{"Conc8/Prefetch64/Batch1", workertest.BenchOptions{Concurrency: 8, Prefetch: 64, BatchSize: 1}},
		{"Conc8/Prefetch64/Batch1/Router", workertest.BenchOptions{Concurrency: 8, Prefetch: 64, BatchSize: 1, TypeOptions: &worker.TypeOptions{MaxAttempts: 3}}},
		{"Conc8/Prefetch64/Batch1/RouterTimeout", workertest.BenchOptions{Concurrency: 8, Prefetch: 64, BatchSize: 1, TypeOptions: &worker.TypeOptions{Timeout: 10 * time.Second}}},
		{"Conc4/Prefetch64/Batch8", workertest.BenchOptions{Concurrency: 4, Prefetch: 64, BatchSize: 8}},
		{"Conc8/Prefetch64/Batch8", workertest.BenchOptions{Concurrency: 8, Prefetch: 64, BatchSize: 8}},
		{"Conc4/Prefetch128/Batch16", workertest.BenchOptions{Concurrency: 4, Prefetch: 128, BatchSize: 16}},
		{"Conc8/Prefetch128/Batch16", workertest.BenchOptions{Concurrency: 8, Prefetch: 128, BatchSize: 16}},
	} {
		b.Run(bc.name, func(b *testing.B) { workertest.RunWorkerBenchmarkWith(b, newRabbitMQ, bc.opts) })
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	// A pool that never connects: New does not touch the database.
	pool, err := pgxpool.New(context.Background(), "postgres://ferry:ferry@127.0.0.1:1/none")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := newRabbitMQ(t)
	h := func(context.Context, pgx.Tx, *broker.Message) error { return nil }
	valid := func() worker.Config {
		return worker.Config{Consumer: "c", Queue: "q", Pool: pool, Broker: b, Handler: h}
	}
	_, err = worker.New(valid())
	require.NoError(t, err)

	for name, tc := range map[string]struct {
		edit  func(*worker.Config)
		field string
	}{
		"no consumer":        {func(c *worker.Config) { c.Consumer = "" }, "Config.Consumer"},
		"no queue":           {func(c *worker.Config) { c.Queue = "" }, "Config.Queue"},
		"no pool":            {func(c *worker.Config) { c.Pool = nil }, "Config.Pool"},
		"no broker":          {func(c *worker.Config) { c.Broker = nil }, "Config.Broker"},
		"no handler":         {func(c *worker.Config) { c.Handler = nil }, "Config.Handler"},
		"negative conc":      {func(c *worker.Config) { c.Concurrency = -1 }, "Config.Concurrency"},
		"negative prefetch":  {func(c *worker.Config) { c.Prefetch = -1 }, "Config.Prefetch"},
		"negative deadline":  {func(c *worker.Config) { c.AckDeadline = -time.Second }, "Config.AckDeadline"},
		"negative shutdown":  {func(c *worker.Config) { c.ShutdownTimeout = -time.Second }, "Config.ShutdownTimeout"},
		"negative htimeout":  {func(c *worker.Config) { c.HandlerTimeout = -time.Second }, "Config.HandlerTimeout"},
		"negative batch":     {func(c *worker.Config) { c.BatchSize = -1 }, "Config.BatchSize"},
		"batch too large":    {func(c *worker.Config) { c.BatchSize = worker.MaxBatchSize + 1 }, "Config.BatchSize"},
		"negative linger":    {func(c *worker.Config) { c.BatchLinger = -time.Millisecond }, "Config.BatchLinger"},
		"linger too long":    {func(c *worker.Config) { c.BatchLinger = worker.MaxBatchLinger + 1 }, "Config.BatchLinger"},
		"bad policy delay":   {func(c *worker.Config) { c.Policy = worker.BackoffPolicy{Delays: []time.Duration{0}} }, "Delays[0]"},
		"bad policy maximum": {func(c *worker.Config) { c.Policy = worker.BackoffPolicy{MaxAttempts: -2} }, "MaxAttempts"},
		"queue not in topology": {func(c *worker.Config) {
			c.Topology = broker.Topology{Exchange: "x", Queues: []broker.Queue{{Name: "other", Bindings: []string{"a"}}}}
		}, "not in Config.Topology"},
		"invalid topology": {func(c *worker.Config) {
			c.Topology = broker.Topology{Exchange: "bad name", Queues: []broker.Queue{{Name: "q", Bindings: []string{"a"}}}}
		}, "Config.Topology"},
	} {
		cfg := valid()
		tc.edit(&cfg)
		_, err := worker.New(cfg)
		require.ErrorIs(t, err, worker.ErrInvalidConfig, name)
		require.ErrorContains(t, err, tc.field, name)
	}
}

func TestRunTwiceAtOnce(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	workertest.CreateSchema(t, pool)
	b := newRabbitMQ(t)
	topo := broker.Topology{Exchange: testenv.UniqueName("w-ex"), Queues: []broker.Queue{{Name: testenv.UniqueName("w-q"), Bindings: []string{"a.b"}}}}
	handled := make(chan struct{}, 1)
	w, err := worker.New(worker.Config{
		Consumer: "c", Queue: topo.Queues[0].Name, Pool: pool, Broker: b, Topology: topo,
		Handler: func(context.Context, pgx.Tx, *broker.Message) error {
			select {
			case handled <- struct{}{}:
			default:
			}
			return nil
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	// Wait until the first Run is surely running: it handled a message.
	require.Eventually(t, func() bool {
		return b.Publish(context.Background(), []*broker.Message{{ID: "1", Type: "a.b", Body: []byte("{}")}}) == nil
	}, 10*time.Second, 50*time.Millisecond)
	select {
	case <-handled:
	case err := <-done:
		t.Fatalf("the first Run returned early: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the first Run handled nothing")
	}
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	require.ErrorIs(t, w.Run(cancelled), worker.ErrAlreadyRunning, "a second Run while the first runs")
	cancel()
	require.NoError(t, <-done)
	// After the first returned, a Run with a cancelled ctx returns nil at once.
	require.NoError(t, w.Run(cancelled))
}
