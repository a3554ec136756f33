package ferry_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

type reminder struct {
	N int `json:"n"`
}

// TestScheduledOnEveryBroker is the documented contract of scheduled
// events (package doc, "Scheduled events") with the default relay and
// worker settings: 200 events due at random times spread over a minute
// are each handled no earlier than due and at most a second after; the
// relay that saw them waiting is stopped before the first is due and
// another one publishes them; an event due in an hour is not published
// and stays a plain waiting row.
func TestScheduledOnEveryBroker(t *testing.T) {
	const n, within, resolution = 200, time.Minute, time.Second
	forEachBroker(t, func(t *testing.T, name string) {
		bu := setup(t, name, "reminder.due")
		ctx := bu.ctx

		var (
			mu      sync.Mutex
			handled = map[int]time.Time{}
			twice   []int
		)
		mux := ferry.NewMux()
		require.NoError(t, ferry.Handle(mux, "reminder.due", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[reminder]) error {
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if _, ok := handled[job.Args.N]; ok {
				twice = append(twice, job.Args.N)
			} else {
				handled[job.Args.N] = now
			}
			return nil
		}))

		start := time.Now()
		first := start.Add(3 * time.Second)
		due := make([]time.Time, n)
		var farID int64
		require.NoError(t, pgx.BeginFunc(ctx, bu.pool, func(tx pgx.Tx) error {
			for i := range due {
				due[i] = first.Add(time.Duration(rand.Int64N(int64(within))))
				if _, err := ferry.Enqueue(ctx, tx, "reminder.due", reminder{N: i}, ferry.DueAt(due[i])); err != nil {
					return err
				}
			}
			var err error
			farID, err = ferry.Enqueue(ctx, tx, "reminder.due", reminder{N: -1}, ferry.DueIn(time.Hour))
			return err
		}))

		// A first relay sees the rows waiting and stops before any is due.
		p1, err := ferry.New(ferry.Config{Pool: bu.pool, Broker: bu.b, Topology: bu.topo, Relay: &outbox.RelayConfig{}})
		require.NoError(t, err)
		ctx1, stop1 := context.WithCancel(ctx)
		done1 := make(chan error, 1)
		go func() { done1 <- p1.Run(ctx1) }()
		time.Sleep(time.Second)
		stop1()
		require.NoError(t, <-done1)
		require.True(t, time.Now().Before(first), "the first relay ran past the first due time; the test machine is too slow")

		bu.start(t, ferry.Config{
			Relay:   &outbox.RelayConfig{},
			Workers: []worker.Config{{Queue: bu.queue, Handler: mux.HandleMessage}},
		})
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(handled) >= n
		}, within+30*time.Second, 100*time.Millisecond)

		mu.Lock()
		defer mu.Unlock()
		require.Empty(t, twice, "handled twice")
		require.Len(t, handled, n, "the event due in an hour was handled")
		var worst, sum time.Duration
		for i, d := range due {
			at := handled[i]
			require.False(t, at.Before(d), "event %d handled %v before it was due", i, d.Sub(at))
			late := at.Sub(d)
			require.LessOrEqual(t, late, resolution, "event %d handled %v after it was due", i, late)
			worst, sum = max(worst, late), sum+late
		}
		t.Logf("%s: %d scheduled events handled %v after due on average, %v at worst", name, n, sum/n, worst)

		var processed bool
		var attempts int
		var next time.Time
		require.NoError(t, bu.pool.QueryRow(ctx, `SELECT processed_at IS NOT NULL, attempts, next_attempt_at FROM outbox WHERE id = $1`, farID).
			Scan(&processed, &attempts, &next))
		require.False(t, processed, "the event due in an hour was published")
		require.Zero(t, attempts, "the relay spent attempts on a waiting event")
		require.WithinDuration(t, start.Add(time.Hour), next, 5*time.Second)
	})
}
