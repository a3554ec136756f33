package ferry_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// prioJob is a job of the priority tests: its priority, repeated in the
// body so the handler records it.
type prioJob struct {
	P int `json:"p"`
}

// handledOrder records the priorities of the "job.work" jobs in the order
// their handlers started.
type handledOrder struct {
	mu   sync.Mutex
	prio []int
	warm int
}

func (h *handledOrder) add(p int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.prio = append(h.prio, p)
}

func (h *handledOrder) snapshot() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.prio...)
}

// runPriorityBacklog runs a worker of a queue with three priority levels
// with weights and conc handlers, holds every handler on a gate job while
// a backlog of 20 jobs of priority 0, 10 of priority 1 and 10 of priority
// 2 is enqueued (in that order, the worst case for a FIFO queue) and
// published, then lets it go and returns the priorities in the order
// they were handled.
func runPriorityBacklog(t *testing.T, name string, weights []int, conc int) []int {
	bu := setup(t, name, "job.#")
	bu.topo.Queues[0].Priorities = 3
	bu.pool = bu.newPool(t)
	ctx := bu.ctx
	var (
		order   handledOrder
		warm    = make(chan struct{}, 3)
		gateIn  = make(chan struct{}, conc)
		release = make(chan struct{})
		once    sync.Once
	)
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	mux := ferry.NewMux()
	require.NoError(t, ferry.Handle(mux, "job.warm", func(ctx context.Context, tx pgx.Tx, j *ferry.Job[prioJob]) error {
		warm <- struct{}{}
		return nil
	}))
	require.NoError(t, ferry.Handle(mux, "job.gate", func(ctx context.Context, tx pgx.Tx, j *ferry.Job[prioJob]) error {
		gateIn <- struct{}{}
		<-release
		return nil
	}))
	require.NoError(t, ferry.Handle(mux, "job.work", func(ctx context.Context, tx pgx.Tx, j *ferry.Job[prioJob]) error {
		// Recorded as the handler starts: the order the worker handed
		// the jobs out in (with several handlers they end in any order).
		order.add(j.Args.P)
		// A handler's work: long enough for each level's subscription
		// to fetch its next delivery meanwhile (a real handler's commit
		// takes a few milliseconds).
		time.Sleep(20 * time.Millisecond)
		return nil
	}))
	bu.start(t, ferry.Config{
		Relay:   &outbox.RelayConfig{},
		Workers: []worker.Config{{Queue: bu.queue, Router: mux, Concurrency: conc, PriorityWeights: weights}},
		Logger:  slog.New(slog.DiscardHandler),
	})
	enqueue := func(typ string, ps ...int) {
		require.NoError(t, pgx.BeginFunc(ctx, bu.pool, func(tx pgx.Tx) error {
			for _, p := range ps {
				if _, err := ferry.Enqueue(ctx, tx, typ, prioJob{P: p}, ferry.WithPriority(p)); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	// One job per level first: every level's subscription is live
	// (a Kafka consumer group has joined) before the backlog comes.
	enqueue("job.warm", 0, 1, 2)
	for range 3 {
		select {
		case <-warm:
		case <-time.After(90 * time.Second):
			t.Fatal("the warm-up job of each priority level was not handled within 90 s")
		}
	}
	enqueue("job.gate", make([]int, conc)...)
	for range conc {
		select {
		case <-gateIn:
		case <-time.After(60 * time.Second):
			t.Fatal("the gate jobs were not all handled within 60 s")
		}
	}
	var backlog []int
	for range 20 {
		backlog = append(backlog, 0)
	}
	for range 10 {
		backlog = append(backlog, 1)
	}
	for range 10 {
		backlog = append(backlog, 2)
	}
	enqueue("job.work", backlog...)
	require.Eventually(t, func() bool {
		st, err := outbox.ReadStats(ctx, bu.pool)
		return err == nil && st.Unprocessed == 0
	}, 60*time.Second, 50*time.Millisecond, "the relay publishes the backlog")
	time.Sleep(2 * time.Second) // the levels' subscriptions fetch theirs
	once.Do(func() { close(release) })
	require.Eventually(t, func() bool { return len(order.snapshot()) == len(backlog) }, 60*time.Second, 50*time.Millisecond,
		"every job of the backlog handled")
	got := order.snapshot()
	t.Logf("%s: handled in the order %v", name, got)
	return got
}

func countOf(ps []int, p int) int {
	n := 0
	for _, x := range ps {
		if x == p {
			n++
		}
	}
	return n
}

// Strict priorities: with a backlog on every level, enqueued lowest
// first, the worker hands out the highest level's jobs first, then the
// middle's, then the lowest's, on every broker, with 8 handlers at once:
// every free handler takes the highest level's next delivery, which the
// level's prefetch (twice the handlers by default on a queue with
// priorities) has ready. (With one handler the same code picks; the
// weighted test runs with one.)
func TestPrioritiesStrictWithConcurrencyOnEveryBroker(t *testing.T) {
	forEachBroker(t, func(t *testing.T, name string) {
		got := runPriorityBacklog(t, name, nil, 8)
		// Handlers that take a job at the same moment start in any
		// order, so a position or two of slack at each level's end.
		require.GreaterOrEqual(t, countOf(got[:10], 2), 8, "the first 10 handled are the priority-2 jobs: %v", got)
		require.LessOrEqual(t, countOf(got[:20], 0), 3, "no priority-0 job while the others wait: %v", got)
		require.GreaterOrEqual(t, countOf(got[20:], 0), 17, "the priority-0 jobs last: %v", got)
	})
}

// Weighted priorities (1:1:4): every level is served while all have jobs
// ready, the top one four times as often, so the lowest is not starved.
func TestPrioritiesWeightedOnEveryBroker(t *testing.T) {
	forEachBroker(t, func(t *testing.T, name string) {
		got := runPriorityBacklog(t, name, []int{1, 1, 4}, 1)
		first := got[:12] // two rounds of 6: 1, 1 and 4
		require.GreaterOrEqual(t, countOf(first, 2), 6, "priority 2 takes most of the first 12: %v", got)
		require.GreaterOrEqual(t, countOf(first, 1), 1, "priority 1 is not starved: %v", got)
		require.GreaterOrEqual(t, countOf(first, 0), 1, "priority 0 is not starved: %v", got)
	})
}

// A priority out of range, a wildcard-first binding on a queue with
// priorities and weights not matching the levels are refused with errors
// that say so.
func TestPrioritiesRefused(t *testing.T) {
	_, err := ferry.NewEvent("job.work", prioJob{}, ferry.WithPriority(broker.MaxPriority+1))
	require.ErrorIs(t, err, outbox.ErrInvalidEvent)
	require.ErrorContains(t, err, "Priority 5: want 0..4")

	err = broker.Topology{Exchange: "x", Queues: []broker.Queue{{Name: "q", Bindings: []string{"#"}, Priorities: 2}}}.Validate()
	require.ErrorContains(t, err, `a queue with priorities cannot bind a pattern whose first word is a wildcard`)
	err = broker.Topology{Exchange: "x", Queues: []broker.Queue{{Name: "q", Bindings: []string{"a"}, Priorities: 9}}}.Validate()
	require.ErrorContains(t, err, "Priorities 9: want 0 (none) or 2..5 levels")
	_, err = ferry.NewEvent("ferry-p1.job", prioJob{})
	require.ErrorContains(t, err, `must not start with "ferry-p"`)
}
