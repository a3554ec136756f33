package workertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/worker"
)

// The kill tests: a worker process is killed with SIGKILL at a chosen
// point of a batch, and a second worker (in the test's own process) takes
// over. The worker process is the test binary run again
// (os.Args[0] -test.run=<this test>) with crashEnv set to the test's name:
// the test then runs crashChild instead of its body. The child reads its
// database, topology and consumer from the variables below.
const (
	crashEnv      = "FERRY_WORKERTEST_CRASH"      // the test's name (t.Name()) in the child
	crashDSNEnv   = "FERRY_WORKERTEST_CRASH_DSN"  // the database URL
	crashTopoEnv  = "FERRY_WORKERTEST_CRASH_TOPO" // the topology, as JSON
	crashModeEnv  = "FERRY_WORKERTEST_CRASH_MODE" // crashAfterCommit or crashMidBatch
	crashBatch    = 8                             // the messages of the killed batch
	crashConsumer = "crash"
)

// The points where the child kills itself.
const (
	// crashAfterCommit: when the COMMIT of a transaction in which the
	// handler ran more than once returns successfully, before any settle.
	crashAfterCommit = "after-commit"
	// crashMidBatch: in the handler, at its 4th call.
	crashMidBatch = "mid-batch"
)

// crashAckDeadline is the kill tests' Config.AckDeadline: on a broker
// with an ack deadline (NATS AckWait, SQS visibility timeout) the
// deliveries of the killed worker come back this long after it took them.
const crashAckDeadline = 2 * time.Second

// RunBatchKillSuite runs only the kill tests of batches (see
// SuiteOptions.BatchSize), with a BatchSize of 8, for an adapter whose
// worker suite runs without batches. Call it from a test function of its
// own: the test binary is run again with -test.run naming the test.
func RunBatchKillSuite(t *testing.T, newBroker NewBrokerFunc) {
	s := suite{newBroker: newBroker, opts: SuiteOptions{BatchSize: crashBatch}}
	t.Run("BatchKilledAfterCommitIsDuplicates", func(t *testing.T) { testBatchKilledAfterCommit(t, s) })
	t.Run("BatchKilledMidBatchCommitsNothing", func(t *testing.T) { testBatchKilledMidBatch(t, s) })
}

// killSelf ends the process the way kill -9 does.
func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is delivered before this returns in practice
}

// commitKiller is the child's pgx tracer: it counts the handler calls of
// each connection's transaction and kills the process when a COMMIT of a
// transaction with more than one returns successfully — between a
// batch's commit and its settles, without a hook in package worker.
type commitKiller struct {
	mu    sync.Mutex
	calls map[*pgx.Conn]int // handler calls since the connection's last COMMIT
}

// handled records a handler call in tx.
func (k *commitKiller) handled(tx pgx.Tx) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls[tx.Conn()]++
}

func (k *commitKiller) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (k *commitKiller) TraceQueryEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if data.Err != nil || data.CommandTag.String() != "COMMIT" {
		return
	}
	k.mu.Lock()
	n := k.calls[conn]
	delete(k.calls, conn)
	k.mu.Unlock()
	if n > 1 {
		killSelf()
	}
}

// crashChild runs, in the child, a worker with BatchSize crashBatch on the
// parent's database and queue, and kills its own process at the point
// crashModeEnv names. It reports whether this process is the child of t
// (the caller then returns).
func crashChild(t *testing.T, s suite) bool {
	if os.Getenv(crashEnv) != t.Name() {
		return false
	}
	var topo broker.Topology
	require.NoError(t, json.Unmarshal([]byte(os.Getenv(crashTopoEnv)), &topo))
	pcfg, err := pgxpool.ParseConfig(os.Getenv(crashDSNEnv))
	require.NoError(t, err)
	killer := &commitKiller{calls: map[*pgx.Conn]int{}}
	mode := os.Getenv(crashModeEnv)
	if mode == crashAfterCommit {
		pcfg.ConnConfig.Tracer = killer
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	f := &fixture{opts: s.opts, pool: pool, b: s.newBroker(t), topo: topo, queue: topo.Queues[0].Name, typ: "ferry.test.created"}
	var calls atomic.Int32
	cfg := f.config(crashConsumer, f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		if mode == crashMidBatch && calls.Add(1) == 4 {
			killSelf()
		}
		if err := recordSideEffect(ctx, tx, crashConsumer, msg); err != nil {
			return err
		}
		killer.handled(tx)
		return nil
	})
	cfg.BatchSize = crashBatch
	cfg.AckDeadline = crashAckDeadline
	f.oneBatch(&cfg)
	w, err := worker.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	err = w.Run(ctx)
	t.Fatalf("workertest: the crash child was not killed (%s) within %v: Run returned %v", mode, waitTimeout, err)
	return true
}

// runCrashChild runs the test binary as the child of t in mode, on f's
// database and topology, and waits until it died of SIGKILL.
func runCrashChild(t *testing.T, f *fixture, mode string) {
	t.Helper()
	topo, err := json.Marshal(f.topo)
	require.NoError(t, err)
	parts := strings.Split(t.Name(), "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+strings.Join(parts, "/"), "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), crashEnv+"="+t.Name(), crashDSNEnv+"="+f.dsn, crashTopoEnv+"="+string(topo), crashModeEnv+"="+mode)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the crash child exited normally:\n%s", out)
	ws, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL,
		"the crash child (%s) was to die of SIGKILL; it ended with %v:\n%s", mode, err, out)
	t.Logf("the worker process was killed (%s)", mode)
}

// crashMessages publishes the crashBatch messages of the kill tests.
func crashMessages(t *testing.T, f *fixture) []string {
	ids := make([]string, crashBatch)
	msgs := make([]*broker.Message, crashBatch)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
		msgs[i] = f.msg(ids[i])
	}
	f.publish(t, msgs...)
	return ids
}

// requireEffectsOnce requires exactly one side effect row and one dedup
// row for each of ids, and nothing else.
func requireEffectsOnce(t *testing.T, f *fixture, ids []string) {
	t.Helper()
	require.Equal(t, len(ids), count(t, f.pool, `SELECT count(*) FROM side_effects`))
	require.Equal(t, len(ids), count(t, f.pool, `SELECT count(DISTINCT message_id) FROM side_effects WHERE message_id = ANY($1)`, ids))
	require.Equal(t, len(ids), count(t, f.pool, `SELECT count(*) FROM processed_messages WHERE consumer = $1 AND message_id = ANY($2)`, crashConsumer, ids))
}

// testBatchKilledAfterCommit: the worker process dies (SIGKILL) right after
// a batch of 8 committed, before it acked any of them. The broker
// redelivers all 8; a second worker acks each as a duplicate without
// running the handler, and each handler effect exists once.
func testBatchKilledAfterCommit(t *testing.T, s suite) {
	if crashChild(t, s) {
		return
	}
	f := setup(t, s, 1)
	ids := crashMessages(t, f)
	begin := time.Now()
	runCrashChild(t, f, crashAfterCommit)
	requireEffectsOnce(t, f, ids) // the whole batch committed before the kill

	out, calls := startSecondWorker(t, f)
	out.waitCount(t, worker.OutcomeDuplicate, len(ids))
	out.settle()
	require.Zero(t, calls.Load(), "no message of the committed batch is handled again")
	for _, id := range ids {
		require.Equal(t, worker.OutcomeDuplicate, single(t, out, id), "message %s", id)
	}
	requireEffectsOnce(t, f, ids)
	t.Logf("killed after the commit of %d messages; all redelivered and acked as duplicates in %v", len(ids), time.Since(begin).Round(time.Millisecond))
}

// startSecondWorker starts, after a crash child died, the worker that
// takes its redeliveries: it records each message's side effect and
// counts its handler calls; its outcomes are recorded in out.
func startSecondWorker(t *testing.T, f *fixture) (out *outcomes, calls *atomic.Int32) {
	out, calls = newOutcomes(), new(atomic.Int32)
	cfg := f.config(crashConsumer, f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		calls.Add(1)
		return recordSideEffect(ctx, tx, crashConsumer, msg)
	})
	cfg.AckDeadline = crashAckDeadline
	cfg.OnOutcome = out.hook
	start(t, cfg)
	return out, calls
}

// testBatchKilledMidBatch: the worker process dies (SIGKILL) in the 4th
// handler of a batch of 8. Nothing of the batch committed (no effect, no
// dedup row); a second worker handles all 8, each once.
func testBatchKilledMidBatch(t *testing.T, s suite) {
	if crashChild(t, s) {
		return
	}
	f := setup(t, s, 1)
	ids := crashMessages(t, f)
	begin := time.Now()
	runCrashChild(t, f, crashMidBatch)
	require.Zero(t, count(t, f.pool, `SELECT count(*) FROM side_effects`), "the killed batch's writes are rolled back")
	require.Zero(t, count(t, f.pool, `SELECT count(*) FROM processed_messages`), "the killed batch's dedup rows are rolled back")

	out, calls := startSecondWorker(t, f)
	out.waitCount(t, worker.OutcomeAck, len(ids))
	out.settle()
	require.Equal(t, int32(len(ids)), calls.Load(), "each message is handled once by the second worker")
	for _, id := range ids {
		require.Equal(t, worker.OutcomeAck, single(t, out, id), "message %s", id)
	}
	requireEffectsOnce(t, f, ids)
	t.Logf("killed in the 4th handler of a batch of %d; all redelivered and handled once in %v", len(ids), time.Since(begin).Round(time.Millisecond))
}

// single returns the one outcome recorded for id.
func single(t *testing.T, out *outcomes, id string) worker.Outcome {
	t.Helper()
	recs := out.outcomesOf(id)
	require.Len(t, recs, 1, fmt.Sprintf("outcomes of %s: %+v", id, recs))
	return recs[0].outcome
}
