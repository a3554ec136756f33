package outbox_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

func wfJob(name string, after ...int) outbox.WorkflowJob {
	return outbox.WorkflowJob{Name: name, Event: outbox.Event{Type: "wf." + name, Body: []byte(`{}`)}, After: after}
}

func enqueueWorkflow(t *testing.T, pool *pgxpool.Pool, w outbox.Workflow) (int64, []int64) {
	t.Helper()
	ctx := testCtx(t)
	var id int64
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		id, ids, err = outbox.EnqueueWorkflow(ctx, tx, w)
		return err
	}))
	return id, ids
}

// inOutbox returns which of ids have a row in the outbox table (what a
// relay can claim).
func inOutbox(t *testing.T, pool *pgxpool.Pool, ids ...int64) []bool {
	t.Helper()
	out := make([]bool, len(ids))
	for i, id := range ids {
		require.NoError(t, pool.QueryRow(testCtx(t), `SELECT EXISTS (SELECT 1 FROM outbox WHERE id = $1)`, id).Scan(&out[i]))
	}
	return out
}

// handled commits a worker's dedup row for id as the worker does
// (worker.DedupTable, in the handler's transaction).
func handled(t *testing.T, pool *pgxpool.Pool, consumer string, id int64) {
	t.Helper()
	_, err := pool.Exec(testCtx(t), `INSERT INTO `+worker.DedupTable+` (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, consumer, strconv.FormatInt(id, 10))
	require.NoError(t, err)
}

func state(t *testing.T, pool *pgxpool.Pool, id int64) outbox.JobState {
	t.Helper()
	j, err := outbox.JobGet(testCtx(t), pool, id)
	require.NoError(t, err)
	return j.State
}

// TestWorkflowCycleRefused: a cycle, an edge out of the workflow and a
// unique job are refused with their sentinel errors, and nothing is
// written.
func TestWorkflowCycleRefused(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	for _, c := range []struct {
		w    outbox.Workflow
		want error
		msg  string
	}{
		{outbox.Workflow{Name: "loop", Jobs: []outbox.WorkflowJob{wfJob("a", 2), wfJob("b", 0), wfJob("c", 1)}}, outbox.ErrWorkflowCycle,
			`job 0 (a) waits for 2 (c) waits for 1 (b) waits for 0 (a)`},
		{outbox.Workflow{Name: "self", Jobs: []outbox.WorkflowJob{wfJob("a"), wfJob("b", 1)}}, outbox.ErrWorkflowCycle, `job 1 (b) waits for 1 (b)`},
		{outbox.Workflow{Name: "out", Jobs: []outbox.WorkflowJob{wfJob("a", 5)}}, outbox.ErrInvalidWorkflow, `depends on job 5, which is not in the workflow`},
		{outbox.Workflow{Name: "uniq", Jobs: []outbox.WorkflowJob{{Event: outbox.Event{Type: "a.b", Body: []byte{}, UniqueKey: "k", UniqueFor: 1e9}}}}, outbox.ErrInvalidWorkflow, `cannot have a UniqueKey`},
		{outbox.Workflow{Name: "bad", Jobs: []outbox.WorkflowJob{{Event: outbox.Event{Type: "a b", Body: []byte{}}}}}, outbox.ErrInvalidEvent, `Type`},
		{outbox.Workflow{Name: "empty"}, outbox.ErrInvalidWorkflow, `has 0 jobs`},
	} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, _, err := outbox.EnqueueWorkflow(ctx, tx, c.w)
			return err
		})
		require.ErrorIs(t, err, c.want, c.w.Name)
		require.ErrorContains(t, err, c.msg, c.w.Name)
	}
	for _, table := range []string{"outbox", "outbox_held", "outbox_workflows", "outbox_workflow_jobs", "outbox_workflow_edges"} {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
		require.Zero(t, n, table)
	}
}

// TestWorkflowRelease: a fan-out/fan-in graph a → (b, c) → d. Only a is in
// the outbox at first; b and c enter it when a's handler commits; d only
// when both b and c did. A dedup row deleted in its own transaction (the
// batch worker's failed message) releases nothing; a second consumer's
// record of a settled job changes nothing; a job naming its consumer
// waits for that one.
func TestWorkflowRelease(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	c := wfJob("c", 0)
	c.Consumer = "billing"
	wid, ids := enqueueWorkflow(t, pool, outbox.Workflow{Name: "diamond", Jobs: []outbox.WorkflowJob{wfJob("a"), wfJob("b", 0), c, wfJob("d", 1, 2, 1)}})
	a, b, cc, d := ids[0], ids[1], ids[2], ids[3]
	require.Equal(t, []bool{true, false, false, false}, inOutbox(t, pool, ids...))
	require.Equal(t, outbox.JobHeld, state(t, pool, d))
	list, err := outbox.JobList(ctx, pool, outbox.JobFilter{State: outbox.JobHeld})
	require.NoError(t, err)
	require.Len(t, list, 3)

	// The batch worker's failed message: its dedup row is deleted in the
	// transaction that inserted it.
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id) VALUES ('mail', $1)`, strconv.FormatInt(a, 10)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM processed_messages WHERE consumer = 'mail' AND message_id = $1`, strconv.FormatInt(a, 10))
		return err
	}))
	require.Equal(t, []bool{true, false, false, false}, inOutbox(t, pool, ids...), "a deleted dedup row releases nothing")

	handled(t, pool, "mail", a)
	require.Equal(t, []bool{true, true, true, false}, inOutbox(t, pool, ids...), "a completed: b and c released")
	handled(t, pool, "mail", b)
	handled(t, pool, "mail", cc) // not c's consumer
	require.Equal(t, []bool{true, true, true, false}, inOutbox(t, pool, ids...), "c waits for billing")
	handled(t, pool, "billing", cc)
	require.Equal(t, []bool{true, true, true, true}, inOutbox(t, pool, ids...), "b and c completed: d released")

	wf, err := outbox.WorkflowGet(ctx, pool, wid)
	require.NoError(t, err)
	require.Equal(t, "diamond", wf.Name)
	require.Len(t, wf.Jobs, 4)
	require.Equal(t, []int64{b, cc}, wf.Jobs[3].After, "the duplicate edge is stored once")
	require.Equal(t, []int{0, 1, 1, 2}, []int{wf.Jobs[0].Layer, wf.Jobs[1].Layer, wf.Jobs[2].Layer, wf.Jobs[3].Layer})
	require.Equal(t, "billing", wf.Jobs[2].SettledBy)
	require.Equal(t, 3, wf.Done)
	require.Equal(t, outbox.JobPending, wf.Jobs[3].State)
	require.Equal(t, wid, wf.Jobs[3].WorkflowID)
	require.False(t, wf.Jobs[3].ReleasedAt.IsZero())

	_, err = outbox.WorkflowGet(ctx, pool, wid+1000)
	require.ErrorIs(t, err, outbox.ErrWorkflowNotFound)
	sums, err := outbox.WorkflowList(ctx, pool, 0)
	require.NoError(t, err)
	require.Equal(t, []outbox.WorkflowSummary{{ID: wid, Name: "diamond", CreatedAt: wf.CreatedAt, Jobs: 4, Done: 3}}, sums)

	// Retention: a workflow with a held job stays; one without goes.
	_, held := enqueueWorkflow(t, pool, outbox.Workflow{Name: "waiting", Jobs: []outbox.WorkflowJob{wfJob("a"), wfJob("b", 0)}})
	res, err := outbox.Prune(ctx, pool, 0, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Workflows)
	_, err = outbox.WorkflowGet(ctx, pool, wid)
	require.ErrorIs(t, err, outbox.ErrWorkflowNotFound)
	require.Equal(t, outbox.JobHeld, state(t, pool, held[1]))
	for _, table := range []string{"outbox_workflow_jobs", "outbox_workflow_edges"} {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
		require.Equal(t, map[string]int{"outbox_workflow_jobs": 2, "outbox_workflow_edges": 1}[table], n, table)
	}
}

// TestWorkflowFailureAndCancel: a dead-lettered dependency cancels its
// dependents down the graph, except a job that releases on failure; a
// cancelled held job cancels its own dependents.
func TestWorkflowFailureAndCancel(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	rel := wfJob("tolerant", 0)
	rel.ReleaseOnFailure = true
	// a → b → c; a → tolerant; x → y → z
	_, ids := enqueueWorkflow(t, pool, outbox.Workflow{Name: "fail", Jobs: []outbox.WorkflowJob{
		wfJob("a"), wfJob("b", 0), wfJob("c", 1), rel, wfJob("x"), wfJob("y", 4), wfJob("z", 5)}})
	_, err := pool.Exec(ctx, `INSERT INTO `+worker.DeadTable+` (consumer, message_id, attempts, last_error) VALUES ('mail', $1, 3, 'boom')`, strconv.FormatInt(ids[0], 10))
	require.NoError(t, err)
	require.Equal(t, outbox.JobCancelled, state(t, pool, ids[1]))
	require.Equal(t, outbox.JobCancelled, state(t, pool, ids[2]), "cancelled down the graph")
	require.Equal(t, outbox.JobPending, state(t, pool, ids[3]), "released on failure")
	j, err := outbox.JobGet(ctx, pool, ids[2])
	require.NoError(t, err)
	require.Equal(t, "workflow: dependency "+strconv.FormatInt(ids[1], 10)+" cancelled", j.CancelReason)

	j, err = outbox.JobCancel(ctx, pool, ids[5])
	require.NoError(t, err, "a held job can be cancelled")
	require.Equal(t, outbox.JobCancelled, j.State)
	require.Equal(t, outbox.JobCancelled, state(t, pool, ids[6]), "its dependent is cancelled with it")
	handled(t, pool, "mail", ids[4])
	require.Equal(t, []bool{true, false, false}, inOutbox(t, pool, ids[4:]...), "x completing releases nothing cancelled")
}

// TestWorkflowWALRelay: with the WAL relay streaming, a held job is not
// in the stream; the transaction that completes its dependency inserts it
// into the outbox, and the stream publishes it then, once. A chain
// a → b → c arrives one job per completion. (The polling relay's claim
// is the same: a held row is not in the outbox table.)
func TestWorkflowWALRelay(t *testing.T) {
	t.Parallel()
	rg := setup(t)
	slot := walSlot(t)
	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot})
	stop := runRelay(t, r)
	defer stop()
	waitStreaming(t, rg.pool, slot)
	job := func(name string, after ...int) outbox.WorkflowJob {
		return outbox.WorkflowJob{Name: name, Event: outbox.Event{Type: "test.wf." + name, Body: []byte(`{}`)}, After: after}
	}
	_, ids := enqueueWorkflow(t, rg.pool, outbox.Workflow{Name: "chain", Jobs: []outbox.WorkflowJob{job("a"), job("b", 0), job("c", 1)}})
	id := func(i int) string { return strconv.FormatInt(ids[i], 10) }
	require.Equal(t, []string{id(0)}, receiveOrdered(t, rg.b, rg.queue, 1, time.Second), "only a is published")
	handled(t, rg.pool, "mail", ids[0])
	require.Equal(t, []string{id(1)}, receiveOrdered(t, rg.b, rg.queue, 1, time.Second), "a completed: b")
	handled(t, rg.pool, "mail", ids[1])
	require.Equal(t, []string{id(2)}, receiveOrdered(t, rg.b, rg.queue, 1, time.Second), "b completed: c")
}
