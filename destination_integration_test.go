package ferry_test

import (
	"context"
	"sync"
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

type destJob struct {
	N int `json:"n"`
}

// TestDestinationsOnEveryBroker: two pipelines on one database, each with
// its own exchange and Destination and the same event type bound, and
// events of both enqueued interleaved in one transaction. Each pipeline's
// worker handles exactly its own 20 events, once, and no row is ever
// parked. On main (no destinations) either relay claimed the other's rows
// and published them to its own exchange, where this test's other worker
// handled them (or, with nothing bound, parked them as unroutable).
func TestDestinationsOnEveryBroker(t *testing.T) {
	const n = 20
	forEachBroker(t, func(t *testing.T, name string) {
		bu := setup(t, name, "dest.job")
		ctx := bu.ctx
		b2, err := ferrycli.OpenBroker(ctx, name, brokerOptions())
		require.NoError(t, err)
		t.Cleanup(func() { _ = b2.Close() })
		ex2 := testenv.UniqueName("ferrylib")
		topo2 := broker.Topology{Exchange: ex2, Queues: []broker.Queue{{Name: ex2 + ".jobs", Bindings: []string{"dest.job"}, RetryDelays: []time.Duration{time.Second}}}}

		type side struct {
			dest string
			mu   sync.Mutex
			got  map[int]int
		}
		sides := []*side{{dest: bu.topo.Exchange, got: map[int]int{}}, {dest: ex2, got: map[int]int{}}}
		for i, s := range sides {
			mux := ferry.NewMux()
			require.NoError(t, ferry.Handle(mux, "dest.job", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[destJob]) error {
				s.mu.Lock()
				defer s.mu.Unlock()
				s.got[job.Args.N]++
				return nil
			}))
			cfg := ferry.Config{Destination: s.dest, Relay: &outbox.RelayConfig{}}
			if i == 0 {
				cfg.Workers = []worker.Config{{Queue: bu.queue, Handler: mux.HandleMessage}}
				bu.start(t, cfg)
				continue
			}
			cfg.Pool, cfg.Broker, cfg.Topology = bu.pool, b2, topo2
			cfg.Workers = []worker.Config{{Queue: topo2.Queues[0].Name, Handler: mux.HandleMessage}}
			p, err := ferry.New(cfg)
			require.NoError(t, err)
			pctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- p.Run(pctx) }()
			t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
		}

		// Side 0 gets the even numbers, side 1 the odd ones.
		require.NoError(t, pgx.BeginFunc(ctx, bu.pool, func(tx pgx.Tx) error {
			for i := range 2 * n {
				if _, err := ferry.Enqueue(ctx, tx, "dest.job", destJob{N: i}, ferry.WithDestination(sides[i%2].dest)); err != nil {
					return err
				}
			}
			return nil
		}))
		total := func() (c int) {
			for _, s := range sides {
				s.mu.Lock()
				c += len(s.got)
				s.mu.Unlock()
			}
			return c
		}
		require.Eventually(t, func() bool { return total() >= 2*n }, 2*time.Minute, 50*time.Millisecond)
		time.Sleep(time.Second) // a stray or duplicate delivery would show by now
		for k, s := range sides {
			s.mu.Lock()
			want := map[int]int{}
			for i := k; i < 2*n; i += 2 {
				want[i] = 1
			}
			require.Equal(t, want, s.got, "destination %q", s.dest)
			s.mu.Unlock()
		}
		var parked, left int
		require.NoError(t, bu.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE attempts > 0), count(*) FILTER (WHERE processed_at IS NULL) FROM outbox`).Scan(&parked, &left))
		require.Zero(t, parked, "no row parked")
		require.Zero(t, left, "every row published")
	})
}
