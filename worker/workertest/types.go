package workertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker"
)

// router is a worker.Router with one exact event type per route, so the
// suite tests the worker's side of per-type options without package
// ferry's Mux (whose own tests run it on every broker too).
type router struct {
	mu     sync.Mutex
	routes []worker.Route
	h      map[string]worker.Handler
}

func (r *router) add(typ string, o worker.TypeOptions, h worker.Handler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		r.h = map[string]worker.Handler{}
	}
	r.routes = append(r.routes, worker.Route{Pattern: typ, Options: o})
	r.h[typ] = h
}

func (r *router) HandleMessage(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
	r.mu.Lock()
	h := r.h[msg.Type]
	r.mu.Unlock()
	if h == nil {
		return worker.Permanent(fmt.Errorf("no handler for %q", msg.Type))
	}
	return h(ctx, tx, msg)
}

func (r *router) Route(eventType string) (worker.Route, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rt := range r.routes {
		if rt.Pattern == eventType {
			return rt, true
		}
	}
	return worker.Route{}, false
}

func (r *router) Routes() []worker.Route {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]worker.Route(nil), r.routes...)
}

// setupTypes is setup with one queue bound to each of types.
func setupTypes(t *testing.T, s suite, types ...string) *fixture {
	t.Helper()
	pool, _ := testenv.NewPool(t)
	CreateSchema(t, pool)
	f := &fixture{opts: s.opts, pool: pool, b: s.newBroker(t), typ: types[0]}
	f.queue = testenv.UniqueName("wt-types")
	f.topo = broker.Topology{Exchange: testenv.UniqueName("wt-ex"), Queues: []broker.Queue{
		{Name: f.queue, Bindings: types, RetryDelays: []time.Duration{retryDelay}},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	require.NoError(t, f.b.Declare(ctx, f.topo))
	return f
}

// typedFailures records OnFailure calls by message type.
type typedFailures struct {
	mu sync.Mutex
	m  map[string][]failureRec
}

func (fs *typedFailures) hook(_ context.Context, _ pgx.Tx, msg *broker.Message, err error, dead bool) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.m == nil {
		fs.m = map[string][]failureRec{}
	}
	fs.m[msg.Type] = append(fs.m[msg.Type], failureRec{attempt: msg.Attempt, dead: dead, err: err.Error()})
	return nil
}

func (fs *typedFailures) of(typ string) []failureRec {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return append([]failureRec(nil), fs.m[typ]...)
}

// testTypeMaxAttempts: a type with its own max attempts (1 and 2) goes to
// the DLQ after that many attempts, while a type without options on the
// same queue and worker uses the worker's policy (3 attempts).
func testTypeMaxAttempts(t *testing.T, s suite) {
	f := setupTypes(t, s, "wt.once", "wt.twice", "wt.default")
	out := newOutcomes()
	fails := &typedFailures{}
	failing := func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		if err := recordSideEffect(ctx, tx, "types", msg); err != nil {
			return err
		}
		return fmt.Errorf("%s fails (attempt %d)", msg.Type, msg.Attempt)
	}
	r := &router{}
	r.add("wt.once", worker.TypeOptions{MaxAttempts: 1}, failing)
	r.add("wt.twice", worker.TypeOptions{MaxAttempts: 2, RetryDelays: []time.Duration{retryDelay}}, failing)
	r.add("wt.default", worker.TypeOptions{}, failing)
	cfg := f.config("types", f.queue, nil)
	cfg.Router = r
	cfg.OnOutcome = out.hook
	cfg.OnFailure = fails.hook
	start(t, cfg)
	f.publish(t,
		&broker.Message{ID: "once-1", Type: "wt.once", Body: []byte(`{}`)},
		&broker.Message{ID: "twice-1", Type: "wt.twice", Body: []byte(`{}`)},
		&broker.Message{ID: "default-1", Type: "wt.default", Body: []byte(`{}`)})
	out.waitCount(t, worker.OutcomeDead, 3)
	out.settle()

	require.Equal(t, []failureRec{{attempt: 1, dead: true, err: "wt.once fails (attempt 1)"}}, fails.of("wt.once"))
	require.Equal(t, []failureRec{
		{attempt: 1, dead: false, err: "wt.twice fails (attempt 1)"},
		{attempt: 2, dead: true, err: "wt.twice fails (attempt 2)"},
	}, fails.of("wt.twice"))
	require.Equal(t, []failureRec{
		{attempt: 1, dead: false, err: "wt.default fails (attempt 1)"},
		{attempt: 2, dead: false, err: "wt.default fails (attempt 2)"},
		{attempt: 3, dead: true, err: "wt.default fails (attempt 3)"},
	}, fails.of("wt.default"), "a type without options keeps the worker's MaxAttempts (3)")
	require.Equal(t, 3, out.count(worker.OutcomeRetry))
	dead := waitDLQ(t, f.b, f.queue, 3)
	got := map[string]string{}
	for _, d := range dead {
		got[d.Message.ID] = d.LastError
	}
	require.Equal(t, map[string]string{
		"once-1":    "wt.once fails (attempt 1)",
		"twice-1":   "wt.twice fails (attempt 2)",
		"default-1": "wt.default fails (attempt 3)",
	}, got)
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM side_effects`), "every attempt rolled back")
	require.Equal(t, 0, count(t, f.pool, `SELECT count(*) FROM worker_attempts`))
}

// testTypeTimeout: a handler that overruns its type's timeout and ignores
// its ctx is abandoned: the attempt fails with ErrHandlerTimeout, its
// transaction (its side effect and the dedup row) is rolled back at once,
// and the retry succeeds while the first handler is still blocked. A
// handler of another type that honours its ctx is bounded by the worker's
// HandlerTimeout and retried the same way.
func testTypeTimeout(t *testing.T, s suite) {
	f := setupTypes(t, s, "wt.deaf", "wt.polite")
	out := newOutcomes()
	fails := &typedFailures{}
	release := make(chan struct{})
	returned := make(chan error, 1)
	defer close(release)
	r := &router{}
	r.add("wt.deaf", worker.TypeOptions{Timeout: 300 * time.Millisecond}, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		if err := recordSideEffect(ctx, tx, "timeout", msg); err != nil {
			return err
		}
		if msg.Attempt == 1 {
			<-release // deaf to ctx, holding its transaction
			returned <- nil
			return nil // too late: the worker rolled this attempt back
		}
		return nil
	})
	r.add("wt.polite", worker.TypeOptions{}, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		if err := recordSideEffect(ctx, tx, "timeout", msg); err != nil {
			return err
		}
		if msg.Attempt == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	cfg := f.config("timeout", f.queue, nil)
	cfg.Router = r
	cfg.HandlerTimeout = 200 * time.Millisecond
	cfg.OnOutcome = out.hook
	cfg.OnFailure = fails.hook
	start(t, cfg)
	began := time.Now()
	f.publish(t,
		&broker.Message{ID: "deaf-1", Type: "wt.deaf", Body: []byte(`{}`)},
		&broker.Message{ID: "polite-1", Type: "wt.polite", Body: []byte(`{}`)})
	out.waitCount(t, worker.OutcomeAck, 2)
	t.Logf("both acked %v after publishing (deaf: timeout 300ms + grace %v + retry delay %v)", time.Since(began), worker.HandlerTimeoutGrace, retryDelay)

	deaf := fails.of("wt.deaf")
	require.Len(t, deaf, 1)
	require.False(t, deaf[0].dead)
	require.Contains(t, deaf[0].err, worker.ErrHandlerTimeout.Error())
	require.Contains(t, deaf[0].err, "abandoned")
	polite := fails.of("wt.polite")
	require.Len(t, polite, 1)
	require.Contains(t, polite[0].err, worker.ErrHandlerTimeout.Error()+" after 200ms")
	require.Contains(t, polite[0].err, context.DeadlineExceeded.Error())

	// The retries committed while the deaf first attempt still blocks:
	// its transaction no longer holds the dedup row.
	select {
	case <-returned:
		t.Fatal("workertest: the deaf handler returned before it was released")
	default:
	}
	release <- struct{}{}
	select {
	case <-returned:
	case <-time.After(waitTimeout):
		t.Fatal("workertest: the released handler did not return")
	}
	out.settle()
	require.Equal(t, 2, count(t, f.pool, `SELECT count(*) FROM side_effects`), "one side effect per message, the retry's")
	require.Equal(t, 2, count(t, f.pool, `SELECT count(*) FROM side_effects WHERE attempt = 2`))
	require.Equal(t, 2, count(t, f.pool, `SELECT count(*) FROM processed_messages`))
	require.Equal(t, 2, out.count(worker.OutcomeRetry))
	require.Equal(t, 2, out.count(worker.OutcomeAck))
}

// testTypeOptionsChecked: New refuses a type's retry delay that the
// broker cannot keep, like the worker's own: on a broker without native
// delays one that is not a declared retry level, on every broker one
// above Capabilities.MaxDelay; a delay that is a level is accepted
// everywhere.
func testTypeOptionsChecked(t *testing.T, s suite) {
	f := setupTypes(t, s, "wt.checked")
	caps := f.b.Capabilities()
	newWith := func(o worker.TypeOptions) error {
		r := &router{}
		r.add("wt.checked", o, func(context.Context, pgx.Tx, *broker.Message) error { return nil })
		cfg := f.config("checked", f.queue, nil)
		cfg.Router = r
		_, err := worker.New(cfg)
		return err
	}
	require.NoError(t, newWith(worker.TypeOptions{RetryDelays: []time.Duration{retryDelay}, MaxAttempts: 7, Timeout: time.Second}))
	err := newWith(worker.TypeOptions{RetryDelays: []time.Duration{retryDelay, 3 * retryDelay}})
	if caps.NativeDelay {
		require.NoError(t, err, "%s redelivers after any delay", caps.Name)
	} else {
		require.ErrorIs(t, err, broker.ErrUnsupported, "%s keeps only the declared retry levels", caps.Name)
		require.ErrorContains(t, err, `pattern "wt.checked"`)
		require.ErrorContains(t, err, (3 * retryDelay).String())
	}
	if caps.MaxDelay > 0 {
		err := newWith(worker.TypeOptions{RetryDelays: []time.Duration{caps.MaxDelay + time.Hour}})
		require.ErrorIs(t, err, broker.ErrUnsupported)
	}
	err = newWith(worker.TypeOptions{MaxAttempts: -1})
	require.True(t, errors.Is(err, worker.ErrInvalidConfig), "%v", err)
}
