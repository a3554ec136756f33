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
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// BenchmarkFlowControl measures what a limit costs when it does not bind:
// b.N events enqueued beforehand are relayed and handled (an empty
// handler) on NATS JetStream, with no limit, with WithConcurrency(1000)
// and with WithRateLimit(1e6, 1000). It reports events/s and the
// transactions committed in the database per event (pg_stat_database's
// xact_commit: the relay's and the worker's, the limits' statements
// included, each an autocommit transaction of its own). Compare the
// lines of one run; no figure is asserted.
func BenchmarkFlowControl(b *testing.B) {
	for _, c := range []struct {
		name string
		opt  ferry.HandleOption
	}{
		{"limit=none", nil},
		{"limit=concurrency", ferry.WithConcurrency(1000)},
		{"limit=rate", ferry.WithRateLimit(1e6, 1000)},
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
			for done := 0; done < b.N; done += len(args) {
				require.NoError(b, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := ferry.EnqueueMany(ctx, tx, "bench.flow", args[:min(len(args), b.N-done)])
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
				Topology: broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: ex + ".q", Bindings: []string{"bench.#"}, RetryDelays: []time.Duration{time.Second}}}},
				Workers:  []worker.Config{{Queue: ex + ".q", Router: mux}},
				Logger:   slog.New(slog.DiscardHandler),
			})
			require.NoError(b, err)
			commits := func() int64 {
				var n int64
				require.NoError(b, pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n))
				return n
			}
			before := commits()
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
			time.Sleep(500 * time.Millisecond)
			b.ReportMetric(float64(b.N)/el.Seconds(), "events/s")
			b.ReportMetric(float64(commits()-before)/float64(b.N), "commits/event")
			fmt.Printf("BenchmarkFlowControl/%s: %d events in %v\n", c.name, b.N, el.Round(time.Millisecond))
		})
	}
}
