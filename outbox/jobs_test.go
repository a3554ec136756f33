package outbox_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// TestJobCancelScheduledAndPending: a scheduled and a pending job are
// cancelled; a relay run afterwards publishes only the other job, the
// cancelled rows are out of the outbox, and their unique key is free.
// Cancelling again changes nothing; a published job is too late; an
// unknown id is not found.
func TestJobCancelScheduledAndPending(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	ids := enqueue(t, rg.pool,
		outbox.Event{Type: "test.sched", Body: []byte(`{}`), AppID: "n-1", DueAt: time.Now().Add(time.Hour)},
		outbox.Event{Type: "test.pend", Body: []byte(`{}`), AppID: "n-2", UniqueKey: "u-1", UniqueFor: time.Hour},
		outbox.Event{Type: "test.keep", Body: []byte(`{}`), AppID: "n-3"},
	)
	sched, pend, keep := ids[0], ids[1], ids[2]

	j, err := outbox.JobGet(ctx, rg.pool, sched)
	require.NoError(t, err)
	require.Equal(t, outbox.JobScheduled, j.State)
	require.Equal(t, "n-1", j.AppID)
	require.Equal(t, "test.sched", j.Type)
	require.False(t, j.DueAt.IsZero())
	byApp, err := outbox.JobGetByAppID(ctx, rg.pool, "n-2")
	require.NoError(t, err)
	require.Len(t, byApp, 1)
	require.Equal(t, pend, byApp[0].ID)
	require.Equal(t, outbox.JobPending, byApp[0].State)

	for _, id := range []int64{sched, pend} {
		j, err := outbox.JobCancel(ctx, rg.pool, id)
		require.NoError(t, err)
		require.Equal(t, outbox.JobCancelled, j.State)
		require.False(t, j.CancelledAt.IsZero())
		require.Equal(t, "cancelled", j.History[len(j.History)-1].What)
	}
	again, err := outbox.JobCancel(ctx, rg.pool, pend)
	require.NoError(t, err, "cancelling a cancelled job changes nothing")
	require.Equal(t, outbox.JobCancelled, again.State)

	list, err := outbox.JobList(ctx, rg.pool, outbox.JobFilter{State: outbox.JobCancelled})
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, []int64{pend, sched}, []int64{list[0].ID, list[1].ID})

	// The unique key of the cancelled event is free: a new enqueue gets a new row.
	again2 := enqueue(t, rg.pool, outbox.Event{Type: "test.pend", Body: []byte(`{}`), UniqueKey: "u-1", UniqueFor: time.Hour})
	require.NotEqual(t, pend, again2[0])

	// A relay run afterwards: the cancelled jobs never go out.
	n, err := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b}).ProcessBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	counts, _ := collect(t, rg.b, rg.queue, 2, 500*time.Millisecond)
	require.Equal(t, map[string]int{strconv.FormatInt(keep, 10): 1, strconv.FormatInt(again2[0], 10): 1}, counts)
	var inOutbox int
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = ANY($1)`, []int64{sched, pend}).Scan(&inOutbox))
	require.Zero(t, inOutbox)

	j, err = outbox.JobGet(ctx, rg.pool, keep)
	require.NoError(t, err)
	require.Equal(t, outbox.JobPublished, j.State)
	_, err = outbox.JobCancel(ctx, rg.pool, keep)
	require.ErrorIs(t, err, outbox.ErrTooLate)
	require.ErrorContains(t, err, "was published at")
	t.Log(err)

	_, err = outbox.JobCancel(ctx, rg.pool, 999999)
	require.ErrorIs(t, err, outbox.ErrJobNotFound)
	_, err = outbox.JobGet(ctx, rg.pool, 999999)
	require.ErrorIs(t, err, outbox.ErrJobNotFound)
	_, err = outbox.JobGetByAppID(ctx, rg.pool, "nobody")
	require.ErrorIs(t, err, outbox.ErrJobNotFound)
	_, err = outbox.JobList(ctx, rg.pool, outbox.JobFilter{State: "gone"})
	require.ErrorContains(t, err, "JobFilter.State")
}

// TestJobCancelWhileARelayHoldsTheRow: a row locked as the relay's claim
// locks it (FOR UPDATE, in a batch being published) is not cancelled:
// ErrTooLate says a relay holds it, and the row is untouched.
func TestJobCancelWhileARelayHoldsTheRow(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	id := enqueue(t, pool, outbox.Event{Type: "test.held", Body: []byte(`{}`)})[0]
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT id FROM outbox WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)

	start := time.Now()
	_, err = outbox.JobCancel(ctx, pool, id)
	require.ErrorIs(t, err, outbox.ErrTooLate)
	require.ErrorContains(t, err, "a relay holds its row")
	t.Logf("refused in %v: %v", time.Since(start), err)
	require.NoError(t, tx.Rollback(ctx))

	j, err := outbox.JobGet(ctx, pool, id)
	require.NoError(t, err)
	require.Equal(t, outbox.JobPending, j.State)
	j, err = outbox.JobCancel(ctx, pool, id)
	require.NoError(t, err, "once the relay let go of the unpublished row, it can be cancelled")
	require.Equal(t, outbox.JobCancelled, j.State)
}

// TestJobStatesThroughAWorker: on RabbitMQ, through a relay and a worker,
// jobs reach published, retrying (with the attempt's error), handled and
// dead (recorded by the worker in worker_dead), and JobList filters by
// state and type.
func TestJobStatesThroughAWorker(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	b := newBroker(t)
	ex := testenv.UniqueName("outbox-jobs")
	topo := broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: ex + ".work", Bindings: []string{"test.#"}, RetryDelays: []time.Duration{time.Hour}}}}
	require.NoError(t, b.Declare(ctx, topo))
	t.Cleanup(func() { deleteRabbitObjects(t, ex) })
	relay := newRelay(t, outbox.RelayConfig{Pool: pool, Broker: b})

	first := enqueue(t, pool, outbox.Event{Type: "test.ok", Body: []byte(`{}`), AppID: "a-ok"})[0]
	_, err := relay.ProcessBatch(ctx)
	require.NoError(t, err)
	j, err := outbox.JobGet(ctx, pool, first)
	require.NoError(t, err)
	require.Equal(t, outbox.JobPublished, j.State, "published, no worker yet")
	require.False(t, j.PublishedAt.IsZero())

	ids := enqueue(t, pool,
		outbox.Event{Type: "test.retry", Body: []byte(`{}`)},
		outbox.Event{Type: "test.dead", Body: []byte(`{}`)},
	)
	retry, dead := ids[0], ids[1]
	_, err = relay.ProcessBatch(ctx)
	require.NoError(t, err)

	var mu sync.Mutex
	outcomes := map[worker.Outcome]int{}
	settled := make(chan struct{}, 10)
	w, err := worker.New(worker.Config{Consumer: "jobs-test", Queue: ex + ".work", Pool: pool, Broker: b, Topology: topo,
		Handler: func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
			switch msg.Type {
			case "test.retry":
				return errors.New("smtp: 421 try later")
			case "test.dead":
				return worker.Permanent(errors.New("bad address"))
			}
			return nil
		},
		OnOutcome: func(msg *broker.Message, o worker.Outcome, _ time.Duration) {
			mu.Lock()
			outcomes[o]++
			mu.Unlock()
			settled <- struct{}{}
		},
	})
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	for range 3 {
		select {
		case <-settled:
		case <-time.After(60 * time.Second):
			t.Fatalf("worker settled fewer than 3 deliveries: %v", outcomes)
		}
	}
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, map[worker.Outcome]int{worker.OutcomeAck: 1, worker.OutcomeRetry: 1, worker.OutcomeDead: 1}, outcomes)

	want := map[int64]outbox.JobState{first: outbox.JobHandled, retry: outbox.JobRetrying, dead: outbox.JobDead}
	for id, st := range want {
		j, err := outbox.JobGet(ctx, pool, id)
		require.NoError(t, err)
		require.Equal(t, st, j.State, "job %d", id)
		require.Len(t, j.Consumers, 1)
		require.Equal(t, "jobs-test", j.Consumers[0].Consumer)
		t.Logf("job %d %s: history %+v", id, j.State, j.History)
		switch st {
		case outbox.JobRetrying:
			require.Equal(t, 1, j.Consumers[0].Attempts)
			require.Contains(t, j.Consumers[0].LastError, "421 try later")
			require.Equal(t, "attempt failed", j.History[len(j.History)-1].What)
		case outbox.JobDead:
			require.Contains(t, j.Consumers[0].LastError, "bad address")
			require.False(t, j.Consumers[0].DeadAt.IsZero())
			require.Equal(t, "dead", j.History[len(j.History)-1].What)
		case outbox.JobHandled:
			require.False(t, j.Consumers[0].HandledAt.IsZero())
		}
	}
	_, err = outbox.JobCancel(ctx, pool, dead)
	require.ErrorIs(t, err, outbox.ErrTooLate)

	for st, id := range map[outbox.JobState]int64{outbox.JobHandled: first, outbox.JobRetrying: retry, outbox.JobDead: dead} {
		list, err := outbox.JobList(ctx, pool, outbox.JobFilter{State: st})
		require.NoError(t, err)
		require.Len(t, list, 1, st)
		require.Equal(t, id, list[0].ID)
	}
	list, err := outbox.JobList(ctx, pool, outbox.JobFilter{Type: "test.dead"})
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, dead, list[0].ID)
	all, err := outbox.JobList(ctx, pool, outbox.JobFilter{Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []int64{dead, retry}, []int64{all[0].ID, all[1].ID})
}

// TestPruneDeletesOldCancelledAndDeadRecords: retention deletes the
// cancelled jobs and the dead-letter records older than its horizon,
// and keeps the newer ones.
func TestPruneDeletesOldCancelledAndDeadRecords(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	ids := enqueue(t, pool, outbox.Event{Type: "test.a", Body: []byte(`{}`)}, outbox.Event{Type: "test.b", Body: []byte(`{}`)})
	for _, id := range ids {
		_, err := outbox.JobCancel(ctx, pool, id)
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, `UPDATE outbox_cancelled SET cancelled_at = now() - interval '2 hours' WHERE id = $1`, ids[0])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO worker_dead (consumer, message_id, attempts, dead_at) VALUES
		('c', '1', 3, now() - interval '2 hours'), ('c', '2', 3, now())`)
	require.NoError(t, err)
	res, err := outbox.Prune(ctx, pool, time.Hour, 0)
	require.NoError(t, err)
	require.Equal(t, outbox.PruneResult{Cancelled: 1, DeadRecords: 1}, res)
	_, err = outbox.JobGet(ctx, pool, ids[0])
	require.ErrorIs(t, err, outbox.ErrJobNotFound)
	j, err := outbox.JobGet(ctx, pool, ids[1])
	require.NoError(t, err)
	require.Equal(t, outbox.JobCancelled, j.State)
}
