package ferry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
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

// step is the arguments of a workflow test job: its index in the
// workflow and the indexes of the jobs it runs after.
type step struct {
	Idx  int   `json:"idx"`
	Deps []int `json:"deps"`
}

// The child worker process of TestWorkflowKilledWorker: the test binary
// run again with these variables.
const (
	wfChildEnv  = "FERRY_WF_CHILD" // the test's name in the child
	wfDSNEnv    = "FERRY_WF_DSN"
	wfTopoEnv   = "FERRY_WF_TOPO"
	wfBrokerEnv = "FERRY_WF_BROKER"
	wfKillAtEnv = "FERRY_WF_KILL_AT" // the child kills itself at this handler call
	wfConsumer  = "wf"
	// wfKillsEnv sets how many worker processes TestWorkflowKilledWorker
	// kills one after the other (1 to 4; default 1, each a few seconds
	// more), e.g. FERRY_WORKFLOW_KILLS=4 go test -run TestWorkflowKilledWorker .
	wfKillsEnv = "FERRY_WORKFLOW_KILLS"
)

// wfLayers are the layers of the 100-job workflow: each job runs after
// every job of the layer before (fan-out from one job, fan-in to one).
var wfLayers = []int{1, 20, 1, 30, 1, 46, 1}

// wfMux handles "wf.step" by recording it in wf_handled in the handler's
// transaction, with the number of its dependencies whose own record is
// committed (all of them, if the job was published after they completed).
func wfMux(t *testing.T, onCall func()) *ferry.Mux {
	mux := ferry.NewMux()
	require.NoError(t, ferry.Handle(mux, "wf.step", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[step]) error {
		if onCall != nil {
			onCall()
		}
		_, err := tx.Exec(ctx, `INSERT INTO wf_handled (idx, msg_id, pid, deps_seen)
SELECT $1, $2, $3, (SELECT count(*) FROM wf_handled WHERE idx = ANY($4::int[]))`, job.Args.Idx, job.ID, os.Getpid(), job.Args.Deps)
		return err
	}))
	return mux
}

func wfWorker(queue string, mux *ferry.Mux) worker.Config {
	return worker.Config{Queue: queue, Consumer: wfConsumer, Handler: mux.HandleMessage, AckDeadline: 2 * time.Second}
}

// wfChild runs, in the child process, a worker on the parent's database
// and queue that kills its own process (SIGKILL) in the handler call
// wfKillAtEnv names, with other handlers' transactions open. It reports
// whether this process is the child of t.
func wfChild(t *testing.T) bool {
	if os.Getenv(wfChildEnv) != t.Name() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var topo broker.Topology
	require.NoError(t, json.Unmarshal([]byte(os.Getenv(wfTopoEnv)), &topo))
	pool, err := pgxpool.New(ctx, os.Getenv(wfDSNEnv))
	require.NoError(t, err)
	b, err := ferrycli.OpenBroker(ctx, os.Getenv(wfBrokerEnv), brokerOptions())
	require.NoError(t, err)
	killAt, err := strconv.Atoi(os.Getenv(wfKillAtEnv))
	require.NoError(t, err)
	var calls atomic.Int32
	mux := wfMux(t, func() {
		if calls.Add(1) == int32(killAt) {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	})
	p, err := ferry.New(ferry.Config{Pool: pool, Broker: b, Topology: topo, Workers: []worker.Config{wfWorker(topo.Queues[0].Name, mux)}})
	require.NoError(t, err)
	err = p.Run(ctx)
	t.Fatalf("the workflow child worker was not killed: Run returned %v", err)
	return true
}

// TestWorkflowKilledWorker: a workflow of 100 jobs in fan-out/fan-in
// layers on every broker. A worker process handles the first jobs and is
// killed (SIGKILL) in its 35th handler call (with FERRY_WORKFLOW_KILLS=n,
// n processes one after the other, each in its 20th); a worker of this
// process finishes.
// Every job is handled once, only after every job it depends on was
// handled (checked per edge: its handler saw their committed records, and
// ran after them), and nothing is left held.
func TestWorkflowKilledWorker(t *testing.T) {
	forEachBroker(t, func(t *testing.T, name string) {
		if wfChild(t) {
			return
		}
		start := time.Now()
		bu := setup(t, name, "wf.#")
		if !bu.b.Capabilities().Wildcards {
			bu.topo.Queues[0].Bindings = []string{"wf.step"}
		}
		ctx := bu.ctx
		_, err := bu.pool.Exec(ctx, `CREATE TABLE wf_handled (seq BIGSERIAL, idx INT, msg_id TEXT, pid INT, deps_seen INT)`)
		require.NoError(t, err)

		wf := ferry.NewWorkflow("kill.test")
		var prev []ferry.WorkflowJob
		var deps [][]int
		for l, n := range wfLayers {
			var layer []ferry.WorkflowJob
			var prevIdx []int
			for _, p := range prev {
				prevIdx = append(prevIdx, p.Index())
			}
			for k := 0; k < n; k++ {
				j := ferry.AddJob(wf, "wf.step", step{Idx: wf.Len(), Deps: prevIdx}, ferry.After(prev...), ferry.JobName(fmt.Sprintf("L%d.%d", l, k)))
				layer = append(layer, j)
				deps = append(deps, prevIdx)
			}
			prev = layer
		}
		require.Equal(t, 100, wf.Len())
		var wid int64
		var ids []int64
		require.NoError(t, pgx.BeginFunc(ctx, bu.pool, func(tx pgx.Tx) error {
			wid, ids, err = ferry.EnqueueWorkflow(ctx, tx, wf)
			return err
		}))
		require.Len(t, ids, 100)

		// The relay runs in this process throughout; the first worker in
		// the child, until it is killed.
		bu.start(t, ferry.Config{Relay: &outbox.RelayConfig{}})
		kills, killAt := 1, 35
		if v := os.Getenv(wfKillsEnv); v != "" {
			kills, err = strconv.Atoi(v)
			require.NoError(t, err, wfKillsEnv)
			require.True(t, kills >= 1 && kills <= 4, "%s=%d: want 1 to 4", wfKillsEnv, kills)
			if kills > 1 {
				killAt = 20
			}
		}
		topo, err := json.Marshal(bu.topo)
		require.NoError(t, err)
		parts := strings.Split(t.Name(), "/")
		for i, p := range parts {
			parts[i] = "^" + regexp.QuoteMeta(p) + "$"
		}
		byChild := 0
		for k := 0; k < kills; k++ {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			cmd := exec.CommandContext(cctx, os.Args[0], "-test.run="+strings.Join(parts, "/"), "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), wfChildEnv+"="+t.Name(), wfDSNEnv+"="+bu.dsn, wfTopoEnv+"="+string(topo), wfBrokerEnv+"="+name,
				wfKillAtEnv+"="+strconv.Itoa(killAt))
			out, err := cmd.CombinedOutput()
			cancel()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "the child worker exited normally:\n%s", out)
			ws, ok := exit.Sys().(syscall.WaitStatus)
			require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the child worker was to die of SIGKILL; it ended with %v:\n%s", err, out)
			var n int
			require.NoError(t, bu.pool.QueryRow(ctx, `SELECT count(*) FROM wf_handled`).Scan(&n))
			require.Greater(t, n, byChild, "worker process %d handled jobs before it was killed", k+1)
			byChild = n
		}
		require.Less(t, byChild, 100, "the last child was killed before the end")
		require.GreaterOrEqual(t, byChild, 18, "the children handled the first layers")

		bu.start(t, ferry.Config{Workers: []worker.Config{wfWorker(bu.queue, wfMux(t, nil))}})
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, bu.pool.QueryRow(ctx, `SELECT count(*) FROM wf_handled`).Scan(&n))
			return n >= 100
		}, 90*time.Second, 50*time.Millisecond)
		time.Sleep(500 * time.Millisecond) // a duplicate handling would show now

		rows, err := bu.pool.Query(ctx, `SELECT idx, seq, msg_id, deps_seen FROM wf_handled ORDER BY idx`)
		require.NoError(t, err)
		type rec struct {
			seq      int64
			msg      string
			depsSeen int
		}
		got := map[int]rec{}
		for rows.Next() {
			var idx int
			var r rec
			require.NoError(t, rows.Scan(&idx, &r.seq, &r.msg, &r.depsSeen))
			_, twice := got[idx]
			require.False(t, twice, "job %d handled twice", idx)
			got[idx] = r
		}
		require.NoError(t, rows.Err())
		require.Len(t, got, 100)
		edges := 0
		for idx, ds := range deps {
			r := got[idx]
			require.Equal(t, itoa(ids[idx]), r.msg)
			require.Equal(t, len(ds), r.depsSeen, "job %d ran before all its dependencies were handled", idx)
			for _, d := range ds {
				require.Less(t, got[d].seq, r.seq, "edge %d -> %d: out of order", d, idx)
				edges++
			}
		}
		info, err := outbox.WorkflowGet(ctx, bu.pool, wid)
		require.NoError(t, err)
		require.Equal(t, 100, info.Done)
		var held int
		require.NoError(t, bu.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_held`).Scan(&held))
		require.Zero(t, held)
		t.Logf("%s: 100 jobs, %d edges checked; %d killed worker process(es) handled %d, the last worker %d; %v", name, edges, kills, byChild, 100-byChild, time.Since(start).Round(time.Millisecond))
	})
}

// TestWorkflowDeadLetterCancels: on every broker, a job whose handler
// fails for good is dead-lettered, which cancels the jobs after it (and
// theirs) and releases the one that releases on failure; a job cancelled
// while held cancels its dependents. No handler runs for a cancelled job.
func TestWorkflowDeadLetterCancels(t *testing.T) {
	forEachBroker(t, func(t *testing.T, name string) {
		bu := setup(t, name, "wf.#")
		if !bu.b.Capabilities().Wildcards {
			bu.topo.Queues[0].Bindings = []string{"wf.step", "wf.fail", "wf.slow"}
		}
		ctx := bu.ctx
		_, err := bu.pool.Exec(ctx, `CREATE TABLE wf_handled (seq BIGSERIAL, idx INT, msg_id TEXT, pid INT, deps_seen INT)`)
		require.NoError(t, err)
		mux := wfMux(t, nil)
		require.NoError(t, ferry.Handle(mux, "wf.fail", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[step]) error {
			return worker.Permanent(errors.New("the card was declined"))
		}))
		bu.start(t, ferry.Config{Relay: &outbox.RelayConfig{}, Workers: []worker.Config{wfWorker(bu.queue, mux)}})

		wf := ferry.NewWorkflow("dead.test")
		charge := ferry.AddJob(wf, "wf.fail", step{Idx: 0})
		ship := ferry.AddJob(wf, "wf.step", step{Idx: 1}, ferry.After(charge))
		mail := ferry.AddJob(wf, "wf.step", step{Idx: 2}, ferry.After(ship))
		audit := ferry.AddJob(wf, "wf.step", step{Idx: 3}, ferry.After(charge), ferry.ReleaseOnFailure())
		// gate waits an hour (DueIn), so later is held while this test
		// cancels it.
		gate := ferry.AddJob(wf, "wf.step", step{Idx: 4}, ferry.DueIn(time.Hour))
		later := ferry.AddJob(wf, "wf.step", step{Idx: 5}, ferry.After(gate))
		last := ferry.AddJob(wf, "wf.step", step{Idx: 6}, ferry.After(later, audit))
		var ids []int64
		require.NoError(t, pgx.BeginFunc(ctx, bu.pool, func(tx pgx.Tx) error {
			_, ids, err = ferry.EnqueueWorkflow(ctx, tx, wf)
			return err
		}))
		j, err := outbox.JobCancel(ctx, bu.pool, ids[later.Index()])
		require.NoError(t, err)
		require.Equal(t, outbox.JobCancelled, j.State)

		stateOf := func(job ferry.WorkflowJob) outbox.JobState {
			j, err := outbox.JobGet(ctx, bu.pool, ids[job.Index()])
			require.NoError(t, err)
			return j.State
		}
		require.Eventually(t, func() bool { return stateOf(audit) == outbox.JobHandled }, 30*time.Second, 50*time.Millisecond,
			"audit (released on failure) is handled")
		require.Equal(t, outbox.JobDead, stateOf(charge))
		require.Equal(t, outbox.JobCancelled, stateOf(ship))
		require.Equal(t, outbox.JobCancelled, stateOf(mail))
		require.Equal(t, outbox.JobCancelled, stateOf(last), "last runs after the cancelled later")
		require.Equal(t, outbox.JobScheduled, stateOf(gate))
		var handledIdx []int
		rows, err := bu.pool.Query(ctx, `SELECT idx FROM wf_handled ORDER BY idx`)
		require.NoError(t, err)
		handledIdx, err = pgx.CollectRows(rows, pgx.RowTo[int])
		require.NoError(t, err)
		require.Equal(t, []int{3}, handledIdx, "only audit ran")
	})
}

// TestWorkflowCycleRefusedAtEnqueue: a cycle, and a dependency on a job of
// another workflow, are refused with their errors; nothing is stored.
func TestWorkflowCycleRefusedAtEnqueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))

	wf := ferry.NewWorkflow("loop")
	a := ferry.AddJob(wf, "a.run", step{})
	b := ferry.AddJob(wf, "b.run", step{}, ferry.After(a))
	// a runs after b, which runs after a: built by hand, as After only
	// names jobs already added.
	e, err := ferry.NewEvent("c.run", step{})
	require.NoError(t, err)
	wf.Add(e, ferry.After(b))
	bad := outbox.Workflow{Name: "loop", Jobs: []outbox.WorkflowJob{
		{Event: e, After: []int{2}}, {Event: e, After: []int{0}}, {Event: e, After: []int{1}}}}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, _, err := outbox.EnqueueWorkflow(ctx, tx, bad)
		return err
	})
	require.ErrorIs(t, err, ferry.ErrWorkflowCycle)
	require.EqualError(t, err, `outbox: workflow has a dependency cycle: "loop": job 0 (c.run) waits for 2 (c.run) waits for 1 (c.run) waits for 0 (c.run)`)

	other := ferry.NewWorkflow("other")
	ferry.AddJob(other, "d.run", step{}, ferry.After(a))
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, _, err := ferry.EnqueueWorkflow(ctx, tx, other)
		return err
	})
	require.ErrorIs(t, err, ferry.ErrInvalidWorkflow)
	require.ErrorContains(t, err, "not in this workflow")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM outbox_held) + (SELECT count(*) FROM outbox_workflows)`).Scan(&n))
	require.Zero(t, n, "nothing stored")
}
