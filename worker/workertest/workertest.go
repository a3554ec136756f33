// Package workertest is the integration suite of package worker, generic
// over the broker: every adapter's tests can run it against its real
// server, next to the broker conformance suite (broker/brokertest).
//
// The suite needs a real PostgreSQL (testenv.NewPool: one fresh database
// per test) and a connected broker from the constructor it is given. It
// uses short retry delays (150 ms), so it runs in a few seconds.
package workertest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// NewBrokerFunc returns a broker connected to a real server, closed when
// the test ends (tb.Cleanup). It fails tb when the server is unreachable.
// Each call returns a new connection.
type NewBrokerFunc func(tb testing.TB) broker.Broker

// retryDelay is the suite's short retry delay.
const retryDelay = 150 * time.Millisecond

// waitTimeout bounds every wait for an outcome.
const waitTimeout = 30 * time.Second

// RunWorkerSuite runs the worker's integration tests against the brokers
// newBroker returns, with the worker's default Config.BatchSize (1).
func RunWorkerSuite(t *testing.T, newBroker NewBrokerFunc) {
	RunWorkerSuiteWith(t, newBroker, SuiteOptions{})
}

// SuiteOptions tune RunWorkerSuiteWith. The zero value is RunWorkerSuite.
type SuiteOptions struct {
	// BatchSize is every worker's Config.BatchSize (0: the default, 1).
	// Above 1 the suite also runs the tests of batches: one failing,
	// panicking or duplicate message in a batch, a batch whose commit
	// fails, and a worker process killed (SIGKILL) between a batch's
	// commit and its settles or in the middle of a batch. The kill tests
	// run the test binary again as the worker process, with
	// -test.run selecting the same test and an environment variable
	// telling it to be the child.
	BatchSize int
}

// RunWorkerSuiteWith runs the worker's integration tests against the
// brokers newBroker returns, with the workers configured by opts.
func RunWorkerSuiteWith(t *testing.T, newBroker NewBrokerFunc, opts SuiteOptions) {
	s := suite{newBroker: newBroker, opts: opts}
	if opts.BatchSize > 1 {
		t.Run("BatchOneFailureRetriesOnlyIt", func(t *testing.T) { testBatchFailure(t, s) })
		t.Run("BatchWithDuplicates", func(t *testing.T) { testBatchDuplicates(t, s) })
		t.Run("BatchPanicFailsOnlyItsMessage", func(t *testing.T) { testBatchPanic(t, s) })
		t.Run("BatchCommitFailureSpendsNoAttempt", func(t *testing.T) { testBatchCommitFailure(t, s) })
		t.Run("BatchSQLHandler", func(t *testing.T) { testBatchSQL(t, s) })
		t.Run("BatchKilledAfterCommitIsDuplicates", func(t *testing.T) { testBatchKilledAfterCommit(t, s) })
		t.Run("BatchKilledMidBatchCommitsNothing", func(t *testing.T) { testBatchKilledMidBatch(t, s) })
	}
	t.Run("DuplicateMessageHandledOnce", func(t *testing.T) { testDuplicate(t, s) })
	t.Run("AlreadyProcessedIsDuplicate", func(t *testing.T) { testAlreadyProcessed(t, s) })
	t.Run("ManyMessagesEachOnce", func(t *testing.T) { testMany(t, s) })
	t.Run("OrderedHandlesAKeyInOrder", func(t *testing.T) { testOrdered(t, s) })
	t.Run("RetriesThenDeadLetter", func(t *testing.T) { testRetriesThenDLQ(t, s) })
	t.Run("LostSettlementsKeepAttempts", func(t *testing.T) { testLostSettlements(t, s) })
	t.Run("AttemptRecordClearedOnSuccess", func(t *testing.T) { testAttemptRecordClearedOnSuccess(t, s) })
	t.Run("LostAckIsDuplicateNotRetry", func(t *testing.T) { testLostAck(t, s) })
	t.Run("SettleFailuresCountedNotAcked", func(t *testing.T) { testSettleFailuresCounted(t, s) })
	t.Run("PermanentGoesToDLQAtOnce", func(t *testing.T) { testPermanent(t, s) })
	t.Run("TwoConsumersEachOnce", func(t *testing.T) { testTwoConsumers(t, s) })
	t.Run("ErrorRollsBackThenRetrySucceeds", func(t *testing.T) { testRollbackThenSuccess(t, s) })
	t.Run("RetryAfter", func(t *testing.T) { testRetryAfter(t, s) })
	t.Run("PanicIsRetried", func(t *testing.T) { testPanic(t, s) })
	t.Run("DatabaseTroubleHoldsMessage", func(t *testing.T) { testDatabaseTrouble(t, s) })
	t.Run("LongHandlerKeepsItsDelivery", func(t *testing.T) { testLongHandler(t, s) })
	t.Run("ShutdownFinishesInFlight", func(t *testing.T) { testShutdown(t, s) })
	t.Run("ShutdownTimeoutLeavesMessageForRedelivery", func(t *testing.T) { testShutdownTimeout(t, s) })
	t.Run("ShutdownTimeoutCommitsFinishedWork", func(t *testing.T) { testShutdownTimeoutCommits(t, s) })
	t.Run("ShutdownBoundedWhenHandlerIgnoresCtx", func(t *testing.T) { testShutdownBounded(t, s) })
	t.Run("TypeMaxAttempts", func(t *testing.T) { testTypeMaxAttempts(t, s) })
	t.Run("TypeTimeoutAbandonsDeafHandler", func(t *testing.T) { testTypeTimeout(t, s) })
	t.Run("TypeOptionsCheckedAgainstCapabilities", func(t *testing.T) { testTypeOptionsChecked(t, s) })
}

// CreateSchema migrates the pool's database with outbox.Migrate (which
// creates processed_messages) and adds the suite's side_effects table.
func CreateSchema(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	require.NoError(tb, outbox.Migrate(context.Background(), pool))
	_, err := pool.Exec(context.Background(), `
CREATE TABLE IF NOT EXISTS side_effects (
	consumer   TEXT NOT NULL,
	message_id TEXT NOT NULL,
	attempt    INT NOT NULL
)`)
	require.NoError(tb, err)
}

// suite is what every test of the suite is given.
type suite struct {
	newBroker NewBrokerFunc
	opts      SuiteOptions
}

// fixture is what one test needs.
type fixture struct {
	opts  SuiteOptions
	pool  *pgxpool.Pool
	dsn   string // the URL of pool's database
	b     broker.Broker
	topo  broker.Topology
	queue string
	typ   string
}

// setup gives a fresh database, a broker and a declared topology with
// queues (one per name suffix) bound to one event type.
func setup(t *testing.T, s suite, queues int) *fixture {
	t.Helper()
	pool, dsn := testenv.NewPool(t)
	CreateSchema(t, pool)
	b := s.newBroker(t)
	f := &fixture{opts: s.opts, pool: pool, dsn: dsn, b: b, typ: "ferry.test.created"}
	f.topo = broker.Topology{Exchange: testenv.UniqueName("wt-ex")}
	for i := range queues {
		f.topo.Queues = append(f.topo.Queues, broker.Queue{
			Name:        testenv.UniqueName(fmt.Sprintf("wt-q%d", i)),
			Bindings:    []string{f.typ},
			RetryDelays: []time.Duration{retryDelay},
		})
	}
	f.queue = f.topo.Queues[0].Name
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	require.NoError(t, b.Declare(ctx, f.topo))
	return f
}

func (f *fixture) publish(t *testing.T, msgs ...*broker.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for i := 0; i < len(msgs); i += 500 {
		require.NoError(t, f.b.Publish(ctx, msgs[i:min(i+500, len(msgs))]))
	}
}

func (f *fixture) msg(id string) *broker.Message {
	return &broker.Message{ID: id, Type: f.typ, Body: []byte(`{"n":` + strconv.Quote(id) + `}`), Headers: map[string]string{"app-header": "kept-" + id}}
}

// config returns a worker config for queue with the suite's defaults.
func (f *fixture) config(consumer, queue string, h worker.Handler) worker.Config {
	return worker.Config{
		Consumer:        consumer,
		Queue:           queue,
		Pool:            f.pool,
		Broker:          f.b,
		Handler:         h,
		Topology:        f.topo,
		Concurrency:     4,
		BatchSize:       f.opts.BatchSize,
		Policy:          worker.BackoffPolicy{MaxAttempts: 3, Delays: []time.Duration{retryDelay}},
		ShutdownTimeout: 10 * time.Second,
	}
}

// outcomes records the OnOutcome calls.
type outcomes struct {
	mu   sync.Mutex
	list []outcomeRec
	ch   chan struct{}
}

type outcomeRec struct {
	id      string
	attempt int
	outcome worker.Outcome
	at      time.Time
}

func newOutcomes() *outcomes { return &outcomes{ch: make(chan struct{}, 1)} }

func (o *outcomes) hook(msg *broker.Message, out worker.Outcome, _ time.Duration) {
	o.mu.Lock()
	o.list = append(o.list, outcomeRec{id: msg.ID, attempt: msg.Attempt, outcome: out, at: time.Now()})
	o.mu.Unlock()
	select {
	case o.ch <- struct{}{}:
	default:
	}
}

func (o *outcomes) snapshot() []outcomeRec {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]outcomeRec(nil), o.list...)
}

func (o *outcomes) count(out worker.Outcome) int {
	n := 0
	for _, r := range o.snapshot() {
		if r.outcome == out {
			n++
		}
	}
	return n
}

// settle waits until no outcome arrived for 500 ms, so that a late
// duplicate or redelivery would have been recorded.
func (o *outcomes) settle() {
	n := -1
	for {
		cur := len(o.snapshot())
		if cur == n {
			return
		}
		n = cur
		time.Sleep(500 * time.Millisecond)
	}
}

// waitCount waits until at least n outcomes out were recorded.
func (o *outcomes) waitCount(t *testing.T, out worker.Outcome, n int) {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for o.count(out) < n {
		select {
		case <-o.ch:
		case <-time.After(50 * time.Millisecond):
		case <-deadline.C:
			t.Fatalf("workertest: waited %v for %d %v outcomes; have %+v", waitTimeout, n, out, o.snapshot())
		}
	}
}

// start runs a worker built from cfg until the returned stop is called (or
// the test ends); stop cancels Run's ctx, waits for Run and requires nil.
func start(t *testing.T, cfg worker.Config) (stop func()) {
	t.Helper()
	w, err := worker.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(waitTimeout):
				t.Errorf("workertest: Run did not return %v after its ctx was cancelled", waitTimeout)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// recordSideEffect is the handlers' database side effect.
func recordSideEffect(ctx context.Context, tx pgx.Tx, consumer string, msg *broker.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO side_effects (consumer, message_id, attempt) VALUES ($1, $2, $3)`, consumer, msg.ID, msg.Attempt)
	return err
}

func testDuplicate(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	var calls atomic.Int32
	cfg := f.config("dup", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		calls.Add(1)
		return recordSideEffect(ctx, tx, "dup", msg)
	})
	cfg.OnOutcome = out.hook
	start(t, cfg)
	// The same event published twice with the same ID, as the relay does
	// when a confirm was lost. Brokers that deduplicate publishes (JetStream
	// Nats-Msg-Id within its window) store it once; the others deliver it
	// twice and the worker drops the second.
	f.publish(t, f.msg("42"))
	f.publish(t, f.msg("42"))
	out.waitCount(t, worker.OutcomeAck, 1)
	out.settle()
	require.Equal(t, 1, out.count(worker.OutcomeAck))
	require.LessOrEqual(t, out.count(worker.OutcomeDuplicate), 1)
	require.Equal(t, int32(1), calls.Load(), "the handler ran once")
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE message_id = '42'`))
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'dup' AND message_id = '42'`))
}

// testAlreadyProcessed delivers a message whose dedup row is already
// committed, as after a crash between the commit and the ack: the worker
// acks it as a duplicate without calling the handler, on every broker.
func testAlreadyProcessed(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	var calls atomic.Int32
	cfg := f.config("again", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		calls.Add(1)
		return recordSideEffect(ctx, tx, "again", msg)
	})
	cfg.OnOutcome = out.hook
	_, err := f.pool.Exec(context.Background(), `INSERT INTO processed_messages (consumer, message_id) VALUES ('again', '8')`)
	require.NoError(t, err)
	start(t, cfg)
	f.publish(t, f.msg("8"), f.msg("9"))
	out.waitCount(t, worker.OutcomeDuplicate, 1)
	out.waitCount(t, worker.OutcomeAck, 1)
	out.settle()
	require.Len(t, out.snapshot(), 2)
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE message_id = '8'`))
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE message_id = '9'`))
	require.Equal(t, 2, count(t, f.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'again'`))
}

func testMany(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	cfg := f.config("many", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		return recordSideEffect(ctx, tx, "many", msg)
	})
	cfg.Concurrency = 8
	cfg.OnOutcome = out.hook
	const n = 300
	msgs := make([]*broker.Message, 0, n+50)
	for i := range n {
		msgs = append(msgs, f.msg(strconv.Itoa(i+1)))
	}
	for i := range 50 { // re-published duplicates mixed in
		msgs = append(msgs, f.msg(strconv.Itoa(i*5+1)))
	}
	f.publish(t, msgs...)
	start(t, cfg)
	out.waitCount(t, worker.OutcomeAck, n)
	out.settle()
	require.Equal(t, n, out.count(worker.OutcomeAck))
	require.Equal(t, len(out.snapshot()), n+out.count(worker.OutcomeDuplicate))
	require.Equal(t, n, count(t, f.pool, `SELECT count(*) FROM side_effects`))
	require.Equal(t, n, count(t, f.pool, `SELECT count(DISTINCT message_id) FROM side_effects`))
	require.Equal(t, n, count(t, f.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'many'`))
}

// testOrdered: with Config.Ordered and 8 concurrent handlers, the
// messages of one key are handled one after the other, in publish order,
// while other keys run alongside. On a broker whose Capabilities.Ordering
// is OrderingNone the worker refuses Ordered with ErrUnsupported.
func testOrdered(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	var (
		mu       sync.Mutex
		order    = map[string][]int{}
		inFlight = map[string]bool{}
		overlaps int
		running  int
		maxRun   int
	)
	cfg := f.config("ordered", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		n, _ := strconv.Atoi(msg.ID)
		mu.Lock()
		if inFlight[msg.Key] {
			overlaps++
		}
		inFlight[msg.Key] = true
		order[msg.Key] = append(order[msg.Key], n)
		running++
		maxRun = max(maxRun, running)
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		inFlight[msg.Key] = false
		running--
		mu.Unlock()
		return nil
	})
	cfg.Concurrency = 8
	cfg.Ordered = true
	cfg.OnOutcome = out.hook
	if f.b.Capabilities().Ordering == broker.OrderingNone {
		// Capability branch: the broker promises no order (SQS standard
		// queues), so an ordered worker must refuse to run, not run
		// unordered.
		w, err := worker.New(cfg)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			defer cancel()
			err = w.Run(ctx)
		}
		require.ErrorIs(t, err, broker.ErrUnsupported, "Config.Ordered on a broker with OrderingNone")
		return
	}
	const keys, perKey = 4, 40
	var msgs []*broker.Message
	for i := range perKey {
		for k := range keys {
			m := f.msg(strconv.Itoa(1 + i*keys + k))
			m.Key = "key-" + strconv.Itoa(k)
			msgs = append(msgs, m)
		}
	}
	f.publish(t, msgs...)
	start(t, cfg)
	out.waitCount(t, worker.OutcomeAck, keys*perKey)
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, overlaps, "two messages of one key were handled at once")
	for k, ns := range order {
		require.Len(t, ns, perKey, k)
		for i := 1; i < len(ns); i++ {
			require.Less(t, ns[i-1], ns[i], "key %s handled out of order: %v", k, ns)
		}
	}
	require.Greater(t, maxRun, 1, "other keys run alongside")
}

// failureRec records an OnFailure call.
type failureRec struct {
	attempt int
	dead    bool
	err     string
}

type failures struct {
	mu   sync.Mutex
	list []failureRec
}

func (fs *failures) hook(_ context.Context, _ pgx.Tx, msg *broker.Message, err error, dead bool) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.list = append(fs.list, failureRec{attempt: msg.Attempt, dead: dead, err: err.Error()})
	return nil
}

func (fs *failures) snapshot() []failureRec {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return append([]failureRec(nil), fs.list...)
}

func listDLQ(t *testing.T, b broker.Broker, queue string) []broker.DeadMessage {
	t.Helper()
	dlq, err := b.DLQ(queue)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	dead, err := dlq.List(ctx, 0)
	require.NoError(t, err)
	return dead
}

// waitDLQ waits until the DLQ of queue holds n messages (the DLQ copy may
// become visible a moment after DeadLetter returned on some brokers).
func waitDLQ(t *testing.T, b broker.Broker, queue string, n int) []broker.DeadMessage {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		dead := listDLQ(t, b, queue)
		if len(dead) >= n || time.Now().After(deadline) {
			require.Len(t, dead, n)
			return dead
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func testRetriesThenDLQ(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	fails := &failures{}
	var (
		mu       sync.Mutex
		attempts []int
		times    []time.Time
		reasons  []string
	)
	cfg := f.config("retry", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		mu.Lock()
		attempts = append(attempts, msg.Attempt)
		times = append(times, time.Now())
		reasons = append(reasons, msg.Headers[broker.HeaderLastError])
		mu.Unlock()
		if err := recordSideEffect(ctx, tx, "retry", msg); err != nil {
			return err
		}
		return fmt.Errorf("smtp: 451 try later (attempt %d)", msg.Attempt)
	})
	cfg.OnOutcome = out.hook
	cfg.OnFailure = fails.hook
	start(t, cfg)
	f.publish(t, f.msg("7"))
	out.waitCount(t, worker.OutcomeDead, 1)

	mu.Lock()
	require.Equal(t, []int{1, 2, 3}, attempts, "exactly MaxAttempts attempts")
	require.Equal(t, []string{"", "smtp: 451 try later (attempt 1)", "smtp: 451 try later (attempt 2)"}, reasons,
		"each retry carries the previous attempt's error as HeaderLastError (from the attempt record where the broker retries in place)")
	for i := 1; i < len(times); i++ {
		gap := times[i].Sub(times[i-1])
		require.GreaterOrEqual(t, gap, retryDelay*8/10, "attempt %d came %v after the previous one; the retry delay is %v", i+1, gap, retryDelay)
	}
	mu.Unlock()
	require.Equal(t, []failureRec{
		{attempt: 1, dead: false, err: "smtp: 451 try later (attempt 1)"},
		{attempt: 2, dead: false, err: "smtp: 451 try later (attempt 2)"},
		{attempt: 3, dead: true, err: "smtp: 451 try later (attempt 3)"},
	}, fails.snapshot())
	require.Equal(t, 2, out.count(worker.OutcomeRetry))

	dead := waitDLQ(t, f.b, f.queue, 1)
	require.Equal(t, "7", dead[0].Message.ID)
	require.Equal(t, "smtp: 451 try later (attempt 3)", dead[0].LastError)
	require.Equal(t, "smtp: 451 try later (attempt 3)", dead[0].Message.Headers[broker.HeaderLastError])
	require.Equal(t, "kept-7", dead[0].Message.Headers["app-header"], "the DLQ copy keeps the headers")
	require.Equal(t, f.msg("7").Body, dead[0].Message.Body)
	// Every attempt was rolled back: no dedup row, no side effect.
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM processed_messages`))
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM side_effects`))
}

func testPermanent(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	fails := &failures{}
	var calls atomic.Int32
	cfg := f.config("perm", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		calls.Add(1)
		return worker.Permanent(errors.New("invalid payload: no recipient"))
	})
	cfg.OnOutcome = out.hook
	cfg.OnFailure = fails.hook
	start(t, cfg)
	f.publish(t, f.msg("9"))
	out.waitCount(t, worker.OutcomeDead, 1)
	dead := waitDLQ(t, f.b, f.queue, 1)
	require.Equal(t, "invalid payload: no recipient", dead[0].LastError)
	require.Equal(t, 1, dead[0].Message.Attempt)
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, []failureRec{{attempt: 1, dead: true, err: "invalid payload: no recipient"}}, fails.snapshot())
	require.Equal(t, 0, out.count(worker.OutcomeRetry))
}

func testTwoConsumers(t *testing.T, s suite) {
	f := setup(t, s, 2)
	outA, outB := newOutcomes(), newOutcomes()
	h := func(consumer string) worker.Handler {
		return func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
			return recordSideEffect(ctx, tx, consumer, msg)
		}
	}
	cfgA := f.config("mailer", f.topo.Queues[0].Name, h("mailer"))
	cfgA.OnOutcome = outA.hook
	cfgB := f.config("audit", f.topo.Queues[1].Name, h("audit"))
	cfgB.OnOutcome = outB.hook
	start(t, cfgA)
	start(t, cfgB)
	f.publish(t, f.msg("100"))
	f.publish(t, f.msg("100")) // a re-publish reaches both queues too (unless the broker drops it)
	outA.waitCount(t, worker.OutcomeAck, 1)
	outB.waitCount(t, worker.OutcomeAck, 1)
	outA.settle()
	outB.settle()
	require.Equal(t, 1, outA.count(worker.OutcomeAck))
	require.Equal(t, 1, outB.count(worker.OutcomeAck))
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE consumer = 'mailer'`))
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE consumer = 'audit'`))
	require.Equal(t, 2, count(t, f.pool, `SELECT count(*) FROM processed_messages WHERE message_id = '100'`))
}

func testRollbackThenSuccess(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	var dedupRowsAtFailure atomic.Int32
	dedupRowsAtFailure.Store(-1)
	cfg := f.config("rb", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		if err := recordSideEffect(ctx, tx, "rb", msg); err != nil {
			return err
		}
		if msg.Attempt == 1 {
			return errors.New("transient failure")
		}
		return nil
	})
	cfg.OnOutcome = out.hook
	cfg.OnFailure = func(ctx context.Context, tx pgx.Tx, msg *broker.Message, err error, dead bool) error {
		// Runs after the rollback: the dedup row must be gone.
		var n int
		if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE message_id = $1`, msg.ID).Scan(&n); err != nil {
			return err
		}
		dedupRowsAtFailure.Store(int32(n))
		return nil
	}
	start(t, cfg)
	f.publish(t, f.msg("5"))
	out.waitCount(t, worker.OutcomeAck, 1)
	require.Equal(t, int32(0), dedupRowsAtFailure.Load(), "a failed attempt leaves no dedup row")
	require.Equal(t, 1, out.count(worker.OutcomeRetry))
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'rb' AND message_id = '5'`))
	// Only the successful attempt's write survived.
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM side_effects`))
	require.Equal(t, 2, count(t, f.pool, `SELECT attempt FROM side_effects`))
}

func testRetryAfter(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	var (
		mu    sync.Mutex
		times []time.Time
	)
	cfg := f.config("ra", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		if msg.Attempt == 1 {
			return worker.RetryAfter(errors.New("rate limited"), retryDelay)
		}
		return nil
	})
	// The policy's own delay is far longer: the retry must use RetryAfter's.
	cfg.Policy = worker.BackoffPolicy{MaxAttempts: 3, Delays: []time.Duration{time.Hour}}
	cfg.OnOutcome = out.hook
	start(t, cfg)
	f.publish(t, f.msg("11"))
	out.waitCount(t, worker.OutcomeAck, 1)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, times, 2)
	require.GreaterOrEqual(t, times[1].Sub(times[0]), retryDelay*8/10)
}

func testPanic(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	fails := &failures{}
	cfg := f.config("panic", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		if msg.ID == "1" && msg.Attempt == 1 {
			panic("nil map write in handler")
		}
		return recordSideEffect(ctx, tx, "panic", msg)
	})
	cfg.OnOutcome = out.hook
	cfg.OnFailure = fails.hook
	start(t, cfg)
	f.publish(t, f.msg("1"))
	out.waitCount(t, worker.OutcomeRetry, 1)
	out.waitCount(t, worker.OutcomeAck, 1)
	// The worker is alive and keeps handling.
	f.publish(t, f.msg("2"))
	out.waitCount(t, worker.OutcomeAck, 2)
	got := fails.snapshot()
	require.Len(t, got, 1)
	require.False(t, got[0].dead)
	require.Contains(t, got[0].err, "nil map write in handler")
	require.Equal(t, 2, count(t, f.pool, `SELECT count(*) FROM processed_messages`))
}

func testShutdown(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	started := make(chan struct{})
	var ctxErrAtEnd atomic.Value
	cfg := f.config("shutdown", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		close(started)
		time.Sleep(time.Second) // a slow handler, e.g. an SMTP call
		ctxErrAtEnd.Store(fmt.Sprint(ctx.Err()))
		return recordSideEffect(ctx, tx, "shutdown", msg)
	})
	cfg.OnOutcome = out.hook
	stop := start(t, cfg)
	f.publish(t, f.msg("77"))
	select {
	case <-started:
	case <-time.After(waitTimeout):
		t.Fatal("workertest: the handler did not start")
	}
	stop() // cancels Run's ctx while the handler runs; requires Run to return nil
	require.Equal(t, "<nil>", ctxErrAtEnd.Load(), "the handler's ctx must stay alive during the shutdown timeout")
	require.Equal(t, 1, out.count(worker.OutcomeAck), "the in-flight message was acked before Run returned")
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM processed_messages WHERE message_id = '77'`))
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM side_effects`))
}

func testShutdownTimeout(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	started := make(chan struct{})
	var once sync.Once
	cfg := f.config("stuck", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		once.Do(func() { close(started) })
		<-ctx.Done() // ignores the shutdown until its ctx is cancelled
		return ctx.Err()
	})
	cfg.ShutdownTimeout = 300 * time.Millisecond
	cfg.OnOutcome = out.hook
	stop := start(t, cfg)
	f.publish(t, f.msg("13"))
	select {
	case <-started:
	case <-time.After(waitTimeout):
		t.Fatal("workertest: the handler did not start")
	}
	stop()
	require.Empty(t, out.snapshot(), "a handler cancelled by the shutdown timeout settles nothing")
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM processed_messages`))
	require.NoError(t, f.b.Close()) // unsettled deliveries go back to the queue

	// A new worker process gets the message again and handles it.
	f.b = s.newBroker(t)
	require.NoError(t, f.b.Declare(context.Background(), f.topo))
	out2 := newOutcomes()
	cfg2 := f.config("stuck", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		return recordSideEffect(ctx, tx, "stuck", msg)
	})
	cfg2.OnOutcome = out2.hook
	start(t, cfg2)
	out2.waitCount(t, worker.OutcomeAck, 1)
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE message_id = '13'`))
	require.Empty(t, listDLQ(t, f.b, f.queue))
}

// testShutdownBounded: a handler that ignores its ctx altogether (a mail
// server that takes its time to answer) does not hold Run past
// ShutdownTimeout + worker.ShutdownGrace; its message is left for
// redelivery and handled by the next worker.
func testShutdownBounded(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	started := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	cfg := f.config("deaf", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		once.Do(func() { close(started) })
		<-release // deaf to ctx
		return errors.New("released after the shutdown")
	})
	cfg.ShutdownTimeout = 300 * time.Millisecond
	cfg.OnOutcome = out.hook
	w, err := worker.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	f.publish(t, f.msg("15"))
	select {
	case <-started:
	case <-time.After(waitTimeout):
		t.Fatal("workertest: the handler did not start")
	}
	begin := time.Now()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitTimeout):
		t.Fatal("workertest: Run did not return")
	}
	took := time.Since(begin)
	bound := cfg.ShutdownTimeout + worker.ShutdownGrace + time.Second // 1 s for the scheduler and Subscription.Close
	require.Less(t, took, bound, "Run returns within ShutdownTimeout + ShutdownGrace")
	require.GreaterOrEqual(t, took, cfg.ShutdownTimeout)
	require.NoError(t, f.b.Close()) // the unsettled delivery goes back to the queue
	close(release)                  // the deaf handler rolls back, as when the process exits

	f.b = s.newBroker(t)
	require.NoError(t, f.b.Declare(context.Background(), f.topo))
	out2 := newOutcomes()
	cfg2 := f.config("deaf", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		return recordSideEffect(ctx, tx, "deaf", msg)
	})
	cfg2.OnOutcome = out2.hook
	start(t, cfg2)
	out2.waitCount(t, worker.OutcomeAck, 1)
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE message_id = '15'`))
}

// testShutdownTimeoutCommits: a handler that is still running when the
// shutdown timeout cancels its ctx, and then completes its work and returns
// nil (as the app does after the SMTP server accepted a mail), has that work
// committed and acked: a new worker does not handle the message again.
func testShutdownTimeoutCommits(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	started := make(chan struct{})
	var once sync.Once
	cfg := f.config("late", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		once.Do(func() { close(started) })
		<-ctx.Done() // the external side effect outlives the shutdown timeout
		return recordSideEffect(context.WithoutCancel(ctx), tx, "late", msg)
	})
	cfg.ShutdownTimeout = 300 * time.Millisecond
	cfg.OnOutcome = out.hook
	stop := start(t, cfg)
	f.publish(t, f.msg("14"))
	select {
	case <-started:
	case <-time.After(waitTimeout):
		t.Fatal("workertest: the handler did not start")
	}
	stop()
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE message_id = '14'`),
		"the work the handler finished after the cancel is committed")
	require.NoError(t, f.b.Close())

	f.b = s.newBroker(t)
	require.NoError(t, f.b.Declare(context.Background(), f.topo))
	var calls atomic.Int32
	cfg2 := f.config("late", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		calls.Add(1)
		return recordSideEffect(ctx, tx, "late", msg)
	})
	start(t, cfg2)
	time.Sleep(500 * time.Millisecond) // a redelivery, if any, arrives at once
	require.Zero(t, calls.Load(), "the message was handled again after its work was committed")
	require.Equal(t, 1, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE message_id = '14'`))
}

// testLongHandler runs handlers longer than the ack deadline, three
// messages published before the worker starts, so that with a BatchSize
// above 1 they form batches held up to three handler runs (4.5 ack
// deadlines) long: the worker's Extend calls, for every delivery of a
// batch, keep a broker with an ack deadline from redelivering them
// meanwhile (brokers without one ignore AckDeadline).
func testLongHandler(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	var calls atomic.Int32
	cfg := f.config("long", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		calls.Add(1)
		time.Sleep(1500 * time.Millisecond)
		return recordSideEffect(ctx, tx, "long", msg)
	})
	cfg.AckDeadline = time.Second
	cfg.OnOutcome = out.hook
	f.oneBatch(&cfg)
	if cfg.BatchSize > 1 {
		// A second goroutine waits in Receive meanwhile: a pull-based
		// broker hands it any redelivery of the batch's messages.
		cfg.Concurrency = 2
	}
	f.publish(t, f.msg("21"), f.msg("22"), f.msg("23"))
	start(t, cfg)
	out.waitCount(t, worker.OutcomeAck, 3)
	time.Sleep(1500 * time.Millisecond) // a redelivery would show up here
	require.Equal(t, int32(3), calls.Load(), "each handler ran once: no redelivery while they worked")
	require.Len(t, out.snapshot(), 3)
	require.Equal(t, 3, count(t, f.pool, `SELECT count(*) FROM side_effects`))
}

// testDatabaseTrouble makes the dedup insert fail for a reason that is not
// the message's (the table is missing, as when migrations were not run):
// the worker holds the message and tries again, spending no attempt, and
// handles it once the table is back.
func testDatabaseTrouble(t *testing.T, s suite) {
	f := setup(t, s, 1)
	ctx := context.Background()
	out := newOutcomes()
	fails := &failures{}
	var attempts atomic.Int32 // the highest attempt seen
	cfg := f.config("db", f.queue, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		for {
			cur := attempts.Load()
			if int32(msg.Attempt) <= cur || attempts.CompareAndSwap(cur, int32(msg.Attempt)) {
				break
			}
		}
		return recordSideEffect(ctx, tx, "db", msg)
	})
	cfg.OnOutcome = out.hook
	cfg.OnFailure = fails.hook
	f.oneBatch(&cfg)
	_, err := f.pool.Exec(ctx, `ALTER TABLE processed_messages RENAME TO processed_messages_away`)
	require.NoError(t, err)
	// Three messages published before the start: with a BatchSize above 1
	// they are held as one batch.
	f.publish(t, f.msg("31"), f.msg("32"), f.msg("33"))
	start(t, cfg)
	time.Sleep(time.Second)
	require.Empty(t, out.snapshot(), "nothing is settled while the dedup table is missing")
	require.Equal(t, int32(0), attempts.Load())
	_, err = f.pool.Exec(ctx, `ALTER TABLE processed_messages_away RENAME TO processed_messages`)
	require.NoError(t, err)
	out.waitCount(t, worker.OutcomeAck, 3)
	require.Equal(t, int32(1), attempts.Load(), "the wait spent no attempt")
	require.Empty(t, fails.snapshot())
	require.Len(t, out.snapshot(), 3)
	require.Equal(t, 3, count(t, f.pool, `SELECT count(*) FROM side_effects`))
}
