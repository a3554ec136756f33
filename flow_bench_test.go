package ferry_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/runcost"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// BenchmarkFlowControl measures what a limit costs when it does not bind:
// b.N events enqueued beforehand are relayed and handled (an empty
// handler) on NATS JetStream, with no limit, with WithConcurrency(1000)
// and with WithRateLimit(1e6, 1000), and on a queue with three priority
// levels (batches of 500 events at priorities 0, 1, 2 in turn). It reports events/s and, per event
// (internal/runcost), the transactions committed in the database
// (pg_stat_database's xact_commit: the relay's and the worker's, the
// limits' statements included, each an autocommit transaction of its
// own), the WAL bytes and the CPU of PostgreSQL (postgres-cpu-s/1k: CPU
// seconds of the server and all its backends per 1,000 events) and of the
// benchmark's own process. Compare the lines of one run; no figure is
// asserted.
func BenchmarkFlowControl(b *testing.B) {
	for _, c := range []struct {
		name   string
		opt    ferry.HandleOption
		levels int // the queue's priority levels; events spread over them
	}{
		{"limit=none", nil, 0},
		{"limit=concurrency", ferry.WithConcurrency(1000), 0},
		{"limit=rate", ferry.WithRateLimit(1e6, 1000), 0},
		{"priorities=3", nil, 3},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			pool, _ := testenv.NewPool(b)
			require.NoError(b, outbox.Migrate(ctx, pool))
			br, err := ferrycli.OpenBroker(ctx, "nats", brokerOptions())
			if err != nil {
				testenv.Require(b, "nats")
			}
			require.NoError(b, err)
			defer br.Close()
			args := make([]job, 500)
			for done, k := 0, 0; done < b.N; done, k = done+len(args), k+1 {
				var eo []ferry.EnqueueOption
				if c.levels > 0 {
					eo = append(eo, ferry.WithPriority(k%c.levels))
				}
				require.NoError(b, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := ferry.EnqueueMany(ctx, tx, "bench.flow", args[:min(len(args), b.N-done)], eo...)
					return err
				}))
			}
			mux := ferry.NewMux()
			var opts []ferry.HandleOption
			if c.opt != nil {
				opts = append(opts, c.opt)
			}
			require.NoError(b, ferry.Handle(mux, "bench.flow", func(context.Context, pgx.Tx, *ferry.Job[job]) error { return nil }, opts...))
			ex := testenv.UniqueName("ferrybench")
			p, err := ferry.New(ferry.Config{Pool: pool, Broker: br, Relay: &outbox.RelayConfig{},
				Topology: broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: ex + ".q", Bindings: []string{"bench.#"}, RetryDelays: []time.Duration{time.Second}, Priorities: c.levels}}},
				Workers:  []worker.Config{{Queue: ex + ".q", Router: mux}},
				Logger:   slog.New(slog.DiscardHandler),
			})
			require.NoError(b, err)
			pg, err := runcost.Postgres(ctx, pool)
			require.NoError(b, err)
			meter, err := runcost.Start(ctx, pool, runcost.Self("app"), pg)
			require.NoError(b, err)
			b.ResetTimer()
			start := time.Now()
			done := make(chan error, 1)
			rctx, stop := context.WithCancel(ctx)
			go func() { done <- p.Run(rctx) }()
			defer func() { stop(); <-done }()
			for {
				var n int
				require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages`).Scan(&n))
				if n >= b.N {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			el := time.Since(start)
			b.StopTimer()
			stop()
			<-done
			done <- nil
			// An idle backend reports its statistics late; closing the
			// connections makes each report at exit.
			pool.Reset()
			cost, err := meter.Stop(ctx, pool)
			require.NoError(b, err)
			b.ReportMetric(float64(b.N)/el.Seconds(), "events/s")
			for _, m := range cost.Metrics(b.N) {
				b.ReportMetric(m.Value, m.Unit)
			}
			fmt.Printf("BenchmarkFlowControl/%s: %d events in %v; %s\n", c.name, b.N, el.Round(time.Millisecond), cost.Describe(b.N))
		})
	}
}
