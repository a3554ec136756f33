package ferry_test

import (
	"context"
	"database/sql"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// BenchmarkSQLHandler compares a worker whose handler takes a pgx.Tx
// (Handle) with one whose handler takes a *sql.Tx (HandleSQL), each
// writing one row per message, on NATS: b.N events are enqueued, then a
// pipeline (relay and worker, default concurrency) runs until every one is
// handled. ns/op is the wall time per message; compare the two of one
// run. database/sql cannot pipeline, so the SQL path's BEGIN, dedup insert
// and attempt read are three round trips where the pgx path sends one.
func BenchmarkSQLHandler(b *testing.B) {
	for _, kind := range []string{"pgx", "sql"} {
		b.Run("handler="+kind, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, dsn := testenv.NewPool(b)
			pc, err := pgxpool.ParseConfig(dsn)
			require.NoError(b, err)
			pc.MaxConns = 20 // the worker's 10 handlers and the relay
			pool, err := pgxpool.NewWithConfig(ctx, pc)
			require.NoError(b, err)
			defer pool.Close()
			require.NoError(b, outbox.Migrate(ctx, pool))
			var br broker.Broker
			br, err = ferrycli.OpenBroker(ctx, "nats", brokerOptions())
			if err != nil {
				testenv.Require(b, "nats")
			}
			require.NoError(b, err)
			defer br.Close()
			ex := testenv.UniqueName("ferrybench")
			bu := &bundle{ctx: ctx, pool: pool, b: br, queue: ex + ".q", topo: broker.Topology{Exchange: ex,
				Queues: []broker.Queue{{Name: ex + ".q", Bindings: []string{"bench.#"}}}}}
			_, err = bu.pool.Exec(ctx, `CREATE TABLE effects (id TEXT PRIMARY KEY)`)
			require.NoError(b, err)
			mux := ferry.NewMux()
			wc := worker.Config{Queue: bu.queue}
			if kind == "pgx" {
				require.NoError(b, ferry.Handle(mux, "bench.run", func(ctx context.Context, tx pgx.Tx, j *ferry.Job[int]) error {
					_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, j.ID)
					return err
				}))
				wc.Handler = mux.HandleMessage
			} else {
				require.NoError(b, ferry.HandleSQL(mux, "bench.run", func(ctx context.Context, tx *sql.Tx, j *ferry.Job[int]) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES ($1)`, j.ID)
					return err
				}))
				wc.SQLHandler = mux.HandleMessageSQL
			}
			require.NoError(b, pgx.BeginFunc(ctx, bu.pool, func(tx pgx.Tx) error {
				events := make([]outbox.Event, b.N)
				for i := range events {
					if events[i], err = ferry.NewEvent("bench.run", i); err != nil {
						return err
					}
				}
				_, err := outbox.Enqueue(ctx, tx, events...)
				return err
			}))
			b.ResetTimer()
			p, err := ferry.New(ferry.Config{Pool: pool, Broker: br, Topology: bu.topo,
				Relay: &outbox.RelayConfig{}, Workers: []worker.Config{wc}, Logger: slog.New(slog.DiscardHandler)})
			require.NoError(b, err)
			rctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- p.Run(rctx) }()
			defer func() { stop(); <-done }()
			for {
				var n int
				require.NoError(b, bu.pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n))
				if n == b.N {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			b.StopTimer()
		})
	}
}
