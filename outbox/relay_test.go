package outbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// rig is what a relay test needs: a migrated database, the real RabbitMQ
// adapter with a fresh topology, and the work queue bound to "test.#".
type rig struct {
	pool  *pgxpool.Pool
	b     broker.Broker
	queue string
}

func setup(t testing.TB) rig {
	t.Helper()
	ctx := testCtx(t)
	pool := migratedPool(t)
	b := newBroker(t)
	ex := testenv.UniqueName("outbox-test")
	q := ex + ".work"
	require.NoError(t, b.Declare(ctx, broker.Topology{
		Exchange: ex,
		Queues:   []broker.Queue{{Name: q, Bindings: []string{"test.#"}}},
	}))
	t.Cleanup(func() { deleteRabbitObjects(t, ex) })
	return rig{pool: pool, b: b, queue: q}
}

func newBroker(t testing.TB) broker.Broker {
	t.Helper()
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
	b, err := rabbitmq.New(testCtx(t), rabbitmq.Config{URL: testenv.RabbitMQURL()})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

// deleteRabbitObjects deletes, through the management API, the queues and
// exchanges whose names start with prefix (this test's own objects only).
func deleteRabbitObjects(t testing.TB, prefix string) {
	base, err := url.Parse(testenv.RabbitMQManagementURL())
	if err != nil {
		t.Logf("management URL: %v", err)
		return
	}
	user := base.User
	base.User = nil
	do := func(method, path string) (*http.Response, error) {
		req, err := http.NewRequest(method, base.String()+path, nil)
		if err != nil {
			return nil, err
		}
		if user != nil {
			pw, _ := user.Password()
			req.SetBasicAuth(user.Username(), pw)
		}
		return http.DefaultClient.Do(req)
	}
	for _, kind := range []string{"queues", "exchanges"} {
		resp, err := do("GET", "/api/"+kind+"/%2F?columns=name")
		if err != nil {
			t.Logf("list %s: %v", kind, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, part := range strings.Split(string(body), `"name":"`)[1:] {
			name := part[:strings.IndexByte(part, '"')]
			if strings.HasPrefix(name, prefix) {
				if resp, err := do("DELETE", "/api/"+kind+"/%2F/"+url.PathEscape(name)); err == nil {
					resp.Body.Close()
				}
			}
		}
	}
}

// collect receives from the queue until want distinct IDs arrived, then
// keeps receiving for linger to catch duplicates, and returns how often
// each ID arrived, with the last message seen per ID.
func collect(t testing.TB, b broker.Broker, queue string, want int, linger time.Duration) (map[string]int, map[string]*broker.Message) {
	t.Helper()
	ctx := testCtx(t)
	sub, err := b.Subscribe(ctx, queue, broker.SubscribeOptions{Prefetch: 500})
	require.NoError(t, err)
	defer sub.Close()
	counts := map[string]int{}
	msgs := map[string]*broker.Message{}
	deadline := time.Now().Add(60 * time.Second)
	for len(counts) < want {
		rctx, cancel := context.WithDeadline(ctx, deadline)
		d, err := sub.Receive(rctx)
		cancel()
		require.NoError(t, err, "received %d of %d distinct messages", len(counts), want)
		m := d.Message()
		counts[m.ID]++
		msgs[m.ID] = m
		require.NoError(t, d.Ack(ctx))
	}
	for {
		rctx, cancel := context.WithTimeout(ctx, linger)
		d, err := sub.Receive(rctx)
		cancel()
		if err != nil {
			require.ErrorIs(t, err, context.DeadlineExceeded)
			return counts, msgs
		}
		m := d.Message()
		counts[m.ID]++
		msgs[m.ID] = m
		require.NoError(t, d.Ack(ctx))
	}
}

func newRelay(t testing.TB, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	r, err := outbox.NewRelay(cfg)
	require.NoError(t, err)
	return r
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// runRelay runs r until the test ends and checks that Run returned nil.
func runRelay(t testing.TB, r *outbox.Relay) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("Run did not return within 30s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func idStrings(ids []int64) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = strconv.FormatInt(id, 10)
	}
	return out
}

func unprocessed(t testing.TB, pool *pgxpool.Pool) int {
	var n int
	require.NoError(t, pool.QueryRow(testCtx(t), `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&n))
	return n
}

func TestRelayPublishesAndMarks(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	evs := events(10, "test.created")
	evs[3].Headers = map[string]string{broker.HeaderTraceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	before := time.Now().Add(-time.Minute)
	ids := enqueue(t, rg.pool, evs...)

	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b})
	n, err := r.ProcessBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 10, n)
	require.Zero(t, unprocessed(t, rg.pool))
	n, err = r.ProcessBatch(ctx)
	require.NoError(t, err)
	require.Zero(t, n)

	counts, msgs := collect(t, rg.b, rg.queue, 10, 300*time.Millisecond)
	require.Len(t, counts, 10)
	for i, id := range idStrings(ids) {
		require.Equal(t, 1, counts[id], id)
		m := msgs[id]
		require.Equal(t, evs[i].Type, m.Type)
		require.Equal(t, evs[i].Key, m.Key)
		require.Equal(t, string(evs[i].Body), string(m.Body))
		created := broker.ParseTime(m.Headers[broker.HeaderCreatedAt])
		require.True(t, created.After(before) && created.Before(time.Now().Add(time.Minute)), "created at %q", m.Headers[broker.HeaderCreatedAt])
		if evs[i].Headers != nil {
			require.Equal(t, evs[i].Headers[broker.HeaderTraceparent], m.Headers[broker.HeaderTraceparent])
		}
	}
}

// The relay dies between publishing and marking: the rows stay
// unprocessed and are published again, under the same IDs.
func TestRelayCrashBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"hook error", "backend killed"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			rg := setup(t)
			ids := enqueue(t, rg.pool, events(5, "test.crash")...)

			crash := func(ctx context.Context, got []int64) error {
				require.Equal(t, ids, got)
				if mode == "hook error" {
					return errors.New("simulated crash")
				}
				// Kill the relay's own backend, whose transaction holds the rows.
				_, err := rg.pool.Exec(ctx, `SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
					WHERE datname = current_database() AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()`)
				return err
			}
			crashing := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, AfterPublish: crash})
			n, err := crashing.ProcessBatch(ctx)
			require.Error(t, err)
			require.Zero(t, n)
			require.Equal(t, 5, unprocessed(t, rg.pool))
			var attempts int
			require.NoError(t, rg.pool.QueryRow(ctx, `SELECT max(attempts) FROM outbox`).Scan(&attempts))
			require.Zero(t, attempts)

			r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b})
			n, err = r.ProcessBatch(ctx)
			require.NoError(t, err)
			require.Equal(t, 5, n)
			require.Zero(t, unprocessed(t, rg.pool))

			counts, _ := collect(t, rg.b, rg.queue, 5, 300*time.Millisecond)
			for _, id := range idStrings(ids) {
				require.Equal(t, 2, counts[id], "message %s published before the crash and again after it", id)
			}
			require.Len(t, counts, 5)
		})
	}
}

// Two relays (each with several claim loops) over 5,000 rows: every row
// is published exactly once and marked.
func TestTwoRelaysInParallel(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	const total = 5000
	var ids []int64
	for range total / 2 / 500 {
		ids = append(ids, enqueue(t, rg.pool, events(500, "test.parallel")...)...)
	}
	for _, c := range []int{2, 3} {
		runRelay(t, newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Concurrency: c, BatchSize: 50, Retention: -1}))
	}
	// The second half arrives while both relays run.
	for range total / 2 / 100 {
		ids = append(ids, enqueue(t, rg.pool, events(100, "test.parallel")...)...)
	}
	counts, _ := collect(t, rg.b, rg.queue, total, time.Second)
	require.Len(t, counts, total)
	for _, id := range idStrings(ids) {
		require.Equal(t, 1, counts[id], "message %s", id)
	}
	require.Eventually(t, func() bool { return unprocessed(t, rg.pool) == 0 }, 30*time.Second, 50*time.Millisecond)
	var attempts int
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT COALESCE(max(attempts), 0) FROM outbox`).Scan(&attempts))
	require.Zero(t, attempts)
}

// A row nothing is bound to fails with ErrUnroutable: it is counted and
// parked with backoff, and the rows behind it are published.
func TestRelayFailingRowDoesNotBlock(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	bad := enqueue(t, rg.pool, outbox.Event{Type: "unbound.event", Body: []byte("poison")})[0]
	good := enqueue(t, rg.pool, events(5, "test.good")...)

	var stats []outbox.BatchStats
	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, RetryBackoff: 200 * time.Millisecond, MaxRetryBackoff: time.Hour,
		OnBatch: func(s outbox.BatchStats) { stats = append(stats, s) }})
	n, err := r.ProcessBatch(ctx)
	require.Equal(t, 5, n)
	require.ErrorIs(t, err, broker.ErrUnroutable)
	var pe *broker.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 1)
	require.Equal(t, strconv.FormatInt(bad, 10), pe.Failed[0].ID)
	require.Len(t, stats, 1)
	require.Equal(t, outbox.BatchStats{Claimed: 6, Published: 5, Failed: 1, Duration: stats[0].Duration,
		PublishDuration: stats[0].PublishDuration, MarkDuration: stats[0].MarkDuration, Err: stats[0].Err}, stats[0])
	require.Positive(t, stats[0].PublishDuration)
	require.Positive(t, stats[0].MarkDuration)
	require.LessOrEqual(t, stats[0].PublishDuration+stats[0].MarkDuration, stats[0].Duration)

	var attempts int
	var lastErr string
	var processed, nextAt *time.Time
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT attempts, last_error, processed_at, next_attempt_at FROM outbox WHERE id = $1`, bad).
		Scan(&attempts, &lastErr, &processed, &nextAt))
	require.Equal(t, 1, attempts)
	require.Contains(t, lastErr, "unroutable")
	require.Nil(t, processed)
	require.NotNil(t, nextAt)
	require.Equal(t, 1, unprocessed(t, rg.pool))

	// Not due yet: the next batch skips it and publishes newer rows.
	more := enqueue(t, rg.pool, events(3, "test.good")...)
	n, err = r.ProcessBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)

	st, err := outbox.ReadStats(ctx, rg.pool)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Unprocessed)
	require.EqualValues(t, 1, st.Parked)
	require.EqualValues(t, 8, st.ProcessedLastMinute)
	require.EqualValues(t, 8, st.ProcessedLastHour)
	require.Positive(t, st.OldestUnprocessedAge)
	require.Len(t, st.ParkedRows, 1)
	require.Equal(t, bad, st.ParkedRows[0].ID)
	require.Equal(t, "unbound.event", st.ParkedRows[0].Type)
	require.Equal(t, 1, st.ParkedRows[0].Attempts)
	require.Contains(t, st.ParkedRows[0].LastError, "unroutable")
	require.False(t, st.ParkedRows[0].NextAttemptAt.IsZero())

	// Once due, it is retried (forever) and counted; the backoff doubles.
	require.Eventually(t, func() bool {
		_, err := r.ProcessBatch(ctx)
		require.True(t, err == nil || errors.Is(err, broker.ErrUnroutable), "%v", err)
		require.NoError(t, rg.pool.QueryRow(ctx, `SELECT attempts FROM outbox WHERE id = $1`, bad).Scan(&attempts))
		return attempts == 2
	}, 10*time.Second, 50*time.Millisecond)
	var delay time.Duration
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT next_attempt_at - now() FROM outbox WHERE id = $1`, bad).Scan(&delay))
	require.Greater(t, delay, 250*time.Millisecond)

	counts, _ := collect(t, rg.b, rg.queue, 8, 300*time.Millisecond)
	require.Len(t, counts, 8)
	for _, id := range idStrings(append(good, more...)) {
		require.Equal(t, 1, counts[id])
	}
}

// With a batch of one, a failing first row does not hold back Run either.
func TestRelayRunSkipsFailingRow(t *testing.T) {
	t.Parallel()
	rg := setup(t)
	enqueue(t, rg.pool, outbox.Event{Type: "unbound.event", Body: []byte("poison")})
	good := enqueue(t, rg.pool, events(20, "test.good")...)
	runRelay(t, newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, BatchSize: 1, Concurrency: 1, RetryBackoff: time.Hour, MaxRetryBackoff: time.Hour}))
	counts, _ := collect(t, rg.b, rg.queue, 20, 300*time.Millisecond)
	for _, id := range idStrings(good) {
		require.Equal(t, 1, counts[id])
	}
	require.Eventually(t, func() bool { return unprocessed(t, rg.pool) == 1 }, 10*time.Second, 50*time.Millisecond)
}

// With a one-hour poll interval, only LISTEN/NOTIFY can make the relay
// publish a row enqueued after it went idle. With a one-hour RecheckDelay
// too, a NOTIFY that comes while a claim loop waits for its recheck must
// still make it claim at once (with one loop the wake-up reaches it; with
// several, the idle loop that receives it hands it over).
func TestRelayWakesOnNotify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		conc    int
		recheck time.Duration
	}{{"defaults", 0, 0}, {"one loop, recheck in an hour", 1, time.Hour}, {"two loops, recheck in an hour", 2, time.Hour}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rg := setup(t)
			r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, PollInterval: time.Hour,
				Concurrency: tc.conc, RecheckDelay: tc.recheck, Retention: -1})
			runRelay(t, r)
			waitListening(t, rg.pool)

			for round := range 3 {
				ids := enqueue(t, rg.pool, events(1, "test.notified")...)
				counts, _ := collect(t, rg.b, rg.queue, 1, 10*time.Millisecond)
				require.Equal(t, map[string]int{strconv.FormatInt(ids[0], 10): 1}, counts, "round %d", round)
			}
			// The consumer may see the last message before the relay's
			// mark commits.
			require.Eventually(t, func() bool { return unprocessed(t, rg.pool) == 0 }, 10*time.Second, 20*time.Millisecond)
		})
	}
}

func TestRelayRunReturnsNilOnCancel(t *testing.T) {
	t.Parallel()
	rg := setup(t)
	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	time.Sleep(200 * time.Millisecond)
	require.Error(t, r.Run(context.Background()), "a second concurrent Run")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestNewRelayValidation(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testenv.DatabaseURL()) // lazy: never connects here
	require.NoError(t, err)
	defer pool.Close()
	b := newBroker(t)
	for _, tc := range []struct {
		cfg  outbox.RelayConfig
		want string
	}{
		{outbox.RelayConfig{Broker: b}, "Pool"},
		{outbox.RelayConfig{Pool: pool}, "Broker"},
		{outbox.RelayConfig{Pool: pool, Broker: b, BatchSize: -1}, "BatchSize"},
		{outbox.RelayConfig{Pool: pool, Broker: b, BatchSize: outbox.MaxBatchSize + 1}, "BatchSize"},
		{outbox.RelayConfig{Pool: pool, Broker: b, Concurrency: -2}, "Concurrency"},
		{outbox.RelayConfig{Pool: pool, Broker: b, PollInterval: -time.Second}, "PollInterval"},
		{outbox.RelayConfig{Pool: pool, Broker: b, RetryBackoff: time.Hour}, "MaxRetryBackoff"},
		{outbox.RelayConfig{Pool: pool, Broker: b, RetentionBatch: -1}, "RetentionBatch"},
		// A retention shorter than a redelivery would prune the dedup rows
		// a redelivered copy needs.
		{outbox.RelayConfig{Pool: pool, Broker: b, Retention: time.Second}, "Retention 1s: must be at least 1h0m0s"},
		{outbox.RelayConfig{Pool: pool, Broker: b, Retention: outbox.MinRetention - time.Nanosecond}, "Retention"},
		{outbox.RelayConfig{Pool: pool, Broker: b, Retention: 2 * time.Hour, RedeliveryWindow: 3 * time.Hour}, "Retention 2h0m0s: must be at least 3h0m0s"},
		{outbox.RelayConfig{Pool: pool, Broker: b, RedeliveryWindow: -time.Second}, "RedeliveryWindow"},
	} {
		_, err := outbox.NewRelay(tc.cfg)
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		require.Contains(t, err.Error(), tc.want)
	}
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: b})
	require.NoError(t, err)
	cfg := r.Config()
	require.Equal(t, 500, cfg.BatchSize)
	require.Equal(t, 500*time.Millisecond, cfg.PollInterval)
	require.Equal(t, 7*24*time.Hour, cfg.Retention)
	require.Equal(t, 1000, cfg.RetentionBatch)
	for _, ok := range []outbox.RelayConfig{
		{Pool: pool, Broker: b, Retention: outbox.MinRetention},
		{Pool: pool, Broker: b, Retention: -1},
		{Pool: pool, Broker: b, Retention: 3 * time.Hour, RedeliveryWindow: 3 * time.Hour},
	} {
		_, err := outbox.NewRelay(ok)
		require.NoError(t, err, "Retention %v RedeliveryWindow %v", ok.Retention, ok.RedeliveryWindow)
	}
}

func TestRedeliveryWindowFor(t *testing.T) {
	t.Parallel()
	require.Equal(t, 150*time.Second, outbox.RedeliveryWindowFor([]time.Duration{30 * time.Second}, 5))
	require.Equal(t, 10*time.Hour, outbox.RedeliveryWindowFor([]time.Duration{time.Second, time.Hour, time.Minute}, 10))
	require.Zero(t, outbox.RedeliveryWindowFor(nil, 5))
	require.Zero(t, outbox.RedeliveryWindowFor([]time.Duration{time.Second}, 0))
	require.Equal(t, time.Duration(math.MaxInt64), outbox.RedeliveryWindowFor([]time.Duration{1000 * time.Hour}, math.MaxInt32))
}

// The duplicate a crash between publish and mark produces is absorbed by an
// idempotent consumer (package worker): the handler runs once per event.
func TestRelayCrashDuplicateAbsorbedByWorker(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	ids := enqueue(t, rg.pool, events(5, "test.crash")...)
	crashing := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b,
		AfterPublish: func(context.Context, []int64) error { return errors.New("simulated crash") }})
	_, err := crashing.ProcessBatch(ctx)
	require.Error(t, err)
	n, err := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b}).ProcessBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, n)

	var mu sync.Mutex
	handled := map[string]int{}
	outcomes := map[worker.Outcome]int{}
	settled := make(chan struct{}, 100)
	w, err := worker.New(worker.Config{Consumer: "outbox-test", Queue: rg.queue, Pool: rg.pool, Broker: rg.b,
		Handler: func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
			mu.Lock()
			handled[msg.ID]++
			mu.Unlock()
			return nil
		},
		OnOutcome: func(msg *broker.Message, o worker.Outcome, _ time.Duration) {
			mu.Lock()
			outcomes[o]++
			mu.Unlock()
			settled <- struct{}{}
		},
		Concurrency: 2,
	})
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	for range 10 {
		select {
		case <-settled:
		case <-time.After(60 * time.Second):
			t.Fatalf("worker settled fewer than 10 deliveries: %v", outcomes)
		}
	}
	cancel()
	require.NoError(t, <-done)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[worker.Outcome]int{worker.OutcomeAck: 5, worker.OutcomeDuplicate: 5}, outcomes)
	for _, id := range idStrings(ids) {
		require.Equal(t, 1, handled[id], id)
	}
}

// Rows inserted without a notification (written by hand, or the NOTIFY
// was lost) are found by polling; Run's retention deletes old processed
// rows.
func TestRelayPollsAndRetains(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	var old int64
	require.NoError(t, rg.pool.QueryRow(ctx, `INSERT INTO outbox (event_type, payload, processed_at)
		VALUES ('test.old', 'x', now() - interval '2 hours') RETURNING id`).Scan(&old))
	runRelay(t, newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, PollInterval: 50 * time.Millisecond,
		Retention: time.Hour, RetentionInterval: 50 * time.Millisecond}))
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, rg.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = $1`, old).Scan(&n))
		return n == 0
	}, 30*time.Second, 20*time.Millisecond, "retention did not delete the old processed row")

	waitListening(t, rg.pool)
	var id int64
	require.NoError(t, rg.pool.QueryRow(ctx, `INSERT INTO outbox (event_type, payload) VALUES ('test.polled', 'y') RETURNING id`).Scan(&id))
	counts, msgs := collect(t, rg.b, rg.queue, 1, 10*time.Millisecond)
	require.Equal(t, map[string]int{strconv.FormatInt(id, 10): 1}, counts)
	require.Equal(t, "y", string(msgs[strconv.FormatInt(id, 10)].Body))
	// The fresh processed row is kept.
	require.Eventually(t, func() bool { return unprocessed(t, rg.pool) == 0 }, 10*time.Second, 20*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	var n int
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = $1`, id).Scan(&n))
	require.Equal(t, 1, n)
}

// waitListening waits until a relay LISTENs on the test's database, then
// lets its claim loops go idle after their start-up batches.
func waitListening(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(testCtx(t), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query = 'LISTEN `+outbox.NotifyChannel+`'`).Scan(&n))
		return n == 1
	}, 10*time.Second, 20*time.Millisecond, "the relay never LISTENed")
	time.Sleep(100 * time.Millisecond)
}

// TestRelayPoisonRefusingTheCall (issue 16, item 1): one row whose message
// RabbitMQ refuses by closing the publishing channel (a "CC" header that is
// not an array: PRECONDITION_FAILED), among 30 good rows of one batch.
// Today's refusal took every unconfirmed message of the channel along and
// read as an outage; now the batch's good rows are published in that same
// batch, and only the poison row is parked with RabbitMQ's reason and an
// attempt counted.
func TestRelayPoisonRefusingTheCall(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	var stats []outbox.BatchStats
	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, RetryBackoff: time.Hour, MaxRetryBackoff: time.Hour,
		OnBatch: func(s outbox.BatchStats) { stats = append(stats, s) }})
	// The baseline: 30 good rows alone.
	enqueue(t, rg.pool, events(30, "test.good")...)
	n, err := r.ProcessBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 30, n)
	baseline := stats[0].PublishDuration
	stats = nil

	evs := events(31, "test.good")
	evs[12].Headers = map[string]string{"CC": "not-an-array"}
	ids := enqueue(t, rg.pool, evs...)
	bad := ids[12]
	n, err = r.ProcessBatch(ctx)
	require.Equal(t, 30, n, "the good rows are published in the same batch: %v", err)
	var pe *broker.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 1)
	require.Equal(t, strconv.FormatInt(bad, 10), pe.Failed[0].ID)
	require.True(t, broker.IsMessageFault(err), "a refusal caused by the message is not an outage")
	require.Len(t, stats, 1)
	t.Logf("batch of 31 with one poison: published %d, publish took %v (30 good rows alone: %v)", stats[0].Published, stats[0].PublishDuration, baseline)

	var attempts int
	var lastErr string
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT attempts, last_error FROM outbox WHERE id = $1 AND processed_at IS NULL`, bad).
		Scan(&attempts, &lastErr))
	require.Equal(t, 1, attempts)
	require.Contains(t, lastErr, "PRECONDITION_FAILED")
	require.Equal(t, 1, unprocessed(t, rg.pool))

	counts, _ := collect(t, rg.b, rg.queue, 60, 500*time.Millisecond)
	require.Len(t, counts, 60)
	require.Zero(t, counts[strconv.FormatInt(bad, 10)])
	dups := 0
	for _, c := range counts {
		dups += c - 1
	}
	t.Logf("60 good rows delivered, %d duplicate deliveries (confirms RabbitMQ dropped with the closed channel)", dups)
}

// closingMidBatch publishes the first half of each batch through the real
// broker and then reports the rest failed with broker.ErrClosed, as an
// adapter closed between two of its calls does.
type closingMidBatch struct{ broker.Broker }

func (c closingMidBatch) Publish(ctx context.Context, msgs []*broker.Message) error {
	half := len(msgs) / 2
	if err := c.Broker.Publish(ctx, msgs[:half]); err != nil {
		return err
	}
	pe := &broker.PublishError{}
	for i := half; i < len(msgs); i++ {
		pe.Failed = append(pe.Failed, broker.FailedMessage{Index: i, ID: msgs[i].ID, Err: broker.ErrClosed})
	}
	return pe
}

// TestRelayMarksWhatAClosingBrokerConfirmed (issue 16, item 2): a broker
// closed in the middle of a Publish that already had part of the batch
// confirmed: the relay stops (the broker is closed) but first marks the
// confirmed rows published, so they are not sent again by the next relay.
func TestRelayMarksWhatAClosingBrokerConfirmed(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	enqueue(t, rg.pool, events(10, "test.good")...)
	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: closingMidBatch{rg.b}})
	n, err := r.ProcessBatch(ctx)
	require.ErrorIs(t, err, broker.ErrClosed)
	require.Equal(t, 5, n, "the five confirmed rows are marked published")
	require.Equal(t, 5, unprocessed(t, rg.pool))
	require.Error(t, r.Run(ctx), "Run stops on a closed broker")
}
