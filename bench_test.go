package ferry_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// BenchmarkWaitingRows measures what scheduled events cost while they
// wait: the time from the commit of one due event to its row being marked
// published by a relay (RabbitMQ), with 0 and with 100,000 events waiting
// for a DueAt a day away. Compare the two ns/op of one run.
func BenchmarkWaitingRows(b *testing.B) {
	for _, waiting := range []int{0, 100_000} {
		b.Run(fmt.Sprintf("waiting=%d", waiting), func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pool, _ := testenv.NewPool(b)
			require.NoError(b, outbox.Migrate(ctx, pool))
			_, err := pool.Exec(ctx, `INSERT INTO outbox (event_type, payload, next_attempt_at, occurred_at)
				SELECT 'bench.later', '', now() + interval '1 day', now() + interval '1 day' FROM generate_series(1, $1::int)`, waiting)
			require.NoError(b, err)
			_, err = pool.Exec(ctx, `ANALYZE outbox`)
			require.NoError(b, err)
			br, err := ferrycli.OpenBroker(ctx, "rabbitmq", brokerOptions())
			if err != nil {
				testenv.Require(b, "rabbitmq")
			}
			require.NoError(b, err)
			defer br.Close()
			ex := testenv.UniqueName("ferrybench")
			p, err := ferry.New(ferry.Config{Pool: pool, Broker: br, Relay: &outbox.RelayConfig{},
				Topology: broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: ex + ".q", Bindings: []string{"bench.#"}}}}})
			require.NoError(b, err)
			done := make(chan error, 1)
			rctx, stop := context.WithCancel(ctx)
			go func() { done <- p.Run(rctx) }()
			defer func() { stop(); <-done }()

			b.ResetTimer()
			for i := range b.N {
				var id int64
				require.NoError(b, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					id, err = ferry.Enqueue(ctx, tx, "bench.now", i)
					return err
				}))
				for {
					var published bool
					require.NoError(b, pool.QueryRow(ctx, `SELECT processed_at IS NOT NULL FROM outbox WHERE id = $1`, id).Scan(&published))
					if published {
						break
					}
					time.Sleep(50 * time.Microsecond)
				}
			}
		})
	}
}

// BenchmarkEnqueueMany measures the producer's side of 100 events stored
// in one transaction: EnqueueMany's one INSERT against 100 Enqueue calls
// (100 round trips). ns/op is per event; compare the two of one run.
func BenchmarkEnqueueMany(b *testing.B) {
	const perTx = 100
	args := make([]welcome, perTx)
	for i := range args {
		args[i] = welcome{UserID: fmt.Sprintf("u%d", i)}
	}
	for _, many := range []bool{false, true} {
		b.Run(fmt.Sprintf("many=%v", many), func(b *testing.B) {
			ctx := context.Background()
			pool, _ := testenv.NewPool(b)
			require.NoError(b, outbox.Migrate(ctx, pool))
			b.ResetTimer()
			for done := 0; done < b.N; done += perTx {
				require.NoError(b, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if many {
						_, err := ferry.EnqueueMany(ctx, tx, "email.welcome", args)
						return err
					}
					for _, a := range args {
						if _, err := ferry.Enqueue(ctx, tx, "email.welcome", a); err != nil {
							return err
						}
					}
					return nil
				}))
			}
		})
	}
}
