package outbox_test

import (
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/outbox"
)

// benchConn is one connection of pool with synchronous_commit off: the
// benchmarks below measure the statements, not the WAL flush of each
// commit (which dominates, ~0.5 ms on this machine, and is the same with
// and without workflows).
func benchConn(b *testing.B, pool *pgxpool.Pool) *pgx.Conn {
	ctx := testCtx(b)
	c, err := pool.Acquire(ctx)
	require.NoError(b, err)
	b.Cleanup(c.Release)
	_, err = c.Exec(ctx, `SET synchronous_commit = off`)
	require.NoError(b, err)
	return c.Conn()
}

// BenchmarkDedupTrigger measures what migration 13's deferred trigger
// adds to a worker's handler transaction that is not a workflow job's:
// one dedup INSERT and COMMIT per op, as the worker does, with the
// trigger on and disabled. Run with e.g. -bench DedupTrigger -benchtime 20000x.
func BenchmarkDedupTrigger(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "trigger=on"
		if !on {
			name = "trigger=off"
		}
		b.Run(name, func(b *testing.B) {
			ctx := testCtx(b)
			pool := migratedPool(b)
			if !on {
				_, err := pool.Exec(ctx, `ALTER TABLE processed_messages DISABLE TRIGGER ferry_workflow_handled`)
				require.NoError(b, err)
			}
			conn := benchConn(b, pool)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				require.NoError(b, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id) VALUES ('bench', $1) ON CONFLICT DO NOTHING`, strconv.Itoa(i+1))
					return err
				}))
			}
		})
	}
}

// BenchmarkWorkflow measures a workflow of 100 jobs (1, 98, 1: fan-out
// then fan-in, 196 edges) per op: its enqueue (one transaction), then
// with "complete" the completion of every job as a worker commits it (one
// dedup transaction each, releasing its dependents); "plain" is
// outbox.Enqueue of the same 100 events and their 100 dedup transactions.
// Reported per job. Run with e.g. -bench Workflow -benchtime 20x.
func BenchmarkWorkflow(b *testing.B) {
	for _, bc := range []struct {
		wfOn, complete bool
		name           string
	}{{false, false, "plain/enqueue"}, {true, false, "workflow/enqueue"}, {false, true, "plain/enqueue+complete"}, {true, true, "workflow/enqueue+complete"}} {
		wfOn := bc.wfOn
		b.Run(bc.name, func(b *testing.B) {
			ctx := testCtx(b)
			pool := migratedPool(b)
			w := outbox.Workflow{Name: "bench"}
			for i := 0; i < 100; i++ {
				var after []int
				switch {
				case i == 99:
					for k := 1; k < 99; k++ {
						after = append(after, k)
					}
				case i > 0:
					after = []int{0}
				}
				w.Jobs = append(w.Jobs, outbox.WorkflowJob{Event: outbox.Event{Type: "bench.step", Body: []byte(benchBody)}, After: after})
			}
			events := make([]outbox.Event, 100)
			for i := range events {
				events[i] = w.Jobs[i].Event
			}
			conn := benchConn(b, pool)
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				var ids []int64
				require.NoError(b, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) (err error) {
					if wfOn {
						_, ids, err = outbox.EnqueueWorkflow(ctx, tx, w)
					} else {
						ids, err = outbox.Enqueue(ctx, tx, events...)
					}
					return err
				}))
				if !bc.complete {
					continue
				}
				for _, id := range ids {
					require.NoError(b, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
						_, err := tx.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id) VALUES ('bench', $1) ON CONFLICT DO NOTHING`, strconv.FormatInt(id, 10))
						return err
					}))
				}
			}
			b.StopTimer()
			var held int
			require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_held`).Scan(&held))
			if bc.complete {
				require.Zero(b, held, "every job was released")
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*100), "µs/job")
		})
	}
}
