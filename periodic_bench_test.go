package ferry

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// BenchmarkPeriodicTick measures what a periodic job's tick costs the
// replica that enqueues it: the transaction that locks the job's row,
// moves last_tick and inserts the outbox event (tick), against a
// transaction with one Enqueue of the same event (enqueue), on one
// database, uncontended. Compare the two ns/op of one run.
func BenchmarkPeriodicTick(b *testing.B) {
	ctx := context.Background()
	pool, _ := testenv.NewPool(b)
	require.NoError(b, outbox.Migrate(ctx, pool))
	job, err := Periodic("bench", "@every 1s", "bench.tick", map[string]int{"n": 1})
	require.NoError(b, err)
	s, err := NewScheduler(SchedulerConfig{Pool: pool, Jobs: []*PeriodicJob{job}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(b, err)
	start := time.Now().Truncate(time.Second)
	_, err = pool.Exec(ctx, registerSQL, job.name, start)
	require.NoError(b, err)
	b.Run("tick", func(b *testing.B) {
		for i := range b.N {
			prev, err := s.fire(ctx, job, start.Add(time.Duration(i+1)*time.Second), s.log)
			require.NoError(b, err)
			require.True(b, prev.Before(start.Add(time.Duration(i+1)*time.Second)))
		}
		start = start.Add(time.Duration(b.N) * time.Second)
	})
	b.Run("enqueue", func(b *testing.B) {
		for range b.N {
			require.NoError(b, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, job.event)
				return err
			}))
		}
	})
}
