package outbox_test

import (
	"context"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// logCounter counts log records by message, and passes them on to the test
// log.
type logCounter struct {
	next slog.Handler
	mu   *sync.Mutex
	msgs map[string]int
}

func (h logCounter) Enabled(ctx context.Context, l slog.Level) bool { return true }
func (h logCounter) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	h.msgs[r.Message]++
	h.mu.Unlock()
	return h.next.Handle(ctx, r)
}
func (h logCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return logCounter{h.next.WithAttrs(as), h.mu, h.msgs}
}
func (h logCounter) WithGroup(g string) slog.Handler {
	return logCounter{h.next.WithGroup(g), h.mu, h.msgs}
}

func (h logCounter) count(substr string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for m, c := range h.msgs {
		if strings.Contains(m, substr) {
			n += c
		}
	}
	return n
}

// While RabbitMQ is down the relay backs off instead of spinning, logs the
// outage once, keeps the rows, and publishes them all once it is back.
// Not parallel: it stops the shared RabbitMQ (compose/local/services.sh).
func TestRelayBrokerOutage(t *testing.T) {
	ctx := testCtx(t)
	rg := setup(t)
	logs := logCounter{next: slog.NewTextHandler(testWriter{t}, nil), mu: &sync.Mutex{}, msgs: map[string]int{}}
	var failedBatches atomic.Int64
	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Concurrency: 2, PublishTimeout: time.Second,
		MaxBackoff: 300 * time.Millisecond, Retention: -1, Logger: slog.New(logs),
		OnBatch: func(s outbox.BatchStats) {
			if s.Err != nil {
				failedBatches.Add(1)
			}
		}})
	stop := runRelay(t, r)

	before := enqueue(t, rg.pool, events(10, "test.outage")...)
	require.Eventually(t, func() bool { return unprocessed(t, rg.pool) == 0 }, 30*time.Second, 20*time.Millisecond)

	requireServicesNode(t)
	testenv.Services(t, "stop", "rabbitmq")
	addr := testenv.HostPort(testenv.RabbitMQURL())
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("RabbitMQ at %s still accepts connections after services.sh stop", addr)
	}
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			testenv.Services(t, "start", "rabbitmq")
		}
	})
	during := enqueue(t, rg.pool, events(20, "test.outage")...)
	time.Sleep(3 * time.Second)
	require.Equal(t, 20, unprocessed(t, rg.pool), "nothing is marked while the broker is down")
	require.Equal(t, 1, logs.count("unavailable"), "the outage is logged once, not per batch")
	// Backing off: 2 loops, ≥100 ms pauses plus up to 1 s publish timeouts
	// allow a few dozen failed batches in 3 s; spinning would make thousands.
	require.Less(t, failedBatches.Load(), int64(80))
	require.Positive(t, failedBatches.Load())

	testenv.Services(t, "start", "rabbitmq")
	restarted = true
	require.Eventually(t, func() bool { return unprocessed(t, rg.pool) == 0 }, 60*time.Second, 50*time.Millisecond)
	require.Equal(t, 1, logs.count("publishing again"))
	stop()

	counts, _ := collect(t, rg.b, rg.queue, 30, 300*time.Millisecond)
	for _, id := range idStrings(append(before, during...)) {
		require.GreaterOrEqual(t, counts[id], 1, id)
	}
	st, err := outbox.ReadStats(ctx, rg.pool)
	require.NoError(t, err)
	require.Zero(t, st.Unprocessed)
}

// requireServicesNode fails the test, before anything is stopped, unless
// the RabbitMQ the tests use is the node compose/local/services.sh manages
// (the one its stop and start act on).
func requireServicesNode(t *testing.T) {
	t.Helper()
	out, err := exec.Command("bash", filepath.Join(testenv.RepoRoot(), "compose", "local", "services.sh"), "env", "rabbitmq").Output()
	require.NoError(t, err, "services.sh env rabbitmq")
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "export FERRY_RABBITMQ_URL="); ok {
			v = strings.Trim(v, `'"`)
			if testenv.HostPort(v) == testenv.HostPort(testenv.RabbitMQURL()) {
				return
			}
			t.Fatalf("the tests use RabbitMQ at %s but services.sh manages %s: run with eval \"$(compose/local/services.sh env)\"",
				testenv.HostPort(testenv.RabbitMQURL()), testenv.HostPort(v))
		}
	}
	t.Fatalf("services.sh reports no running RabbitMQ (start it: compose/local/services.sh up rabbitmq):\n%s", out)
}

// A 60 s outage is one outage (issue 7, item 2): the relay backs off for
// the whole process (one failed batch per pause, the pause doubling from
// 100 ms to MaxBackoff), the rows get no attempts, their last_error says
// "broker unavailable" and names the broker, ReadStats does not call them
// parked, and they are all published once the broker is back.
// Not parallel: it stops the shared RabbitMQ.
func TestRelayLongOutageIsOneOutage(t *testing.T) {
	ctx := testCtx(t)
	rg := setup(t)
	logs := logCounter{next: slog.NewTextHandler(testWriter{t}, nil), mu: &sync.Mutex{}, msgs: map[string]int{}}
	var failedBatches atomic.Int64
	const maxBackoff = 2 * time.Second
	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Concurrency: 4, PublishTimeout: time.Second,
		MaxBackoff: maxBackoff, Retention: -1, Logger: slog.New(logs),
		OnBatch: func(s outbox.BatchStats) {
			if s.Err != nil {
				failedBatches.Add(1)
			}
		}})
	stop := runRelay(t, r)

	requireServicesNode(t)
	testenv.Services(t, "stop", "rabbitmq")
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			testenv.Services(t, "start", "rabbitmq")
		}
	})
	start := time.Now()
	ids := enqueue(t, rg.pool, events(50, "test.outage")...)
	// Keep producing during the outage, so every claim loop has rows.
	for time.Since(start) < 60*time.Second {
		ids = append(ids, enqueue(t, rg.pool, events(5, "test.outage")...)...)
		time.Sleep(500 * time.Millisecond)
	}
	var maxAttempts int
	var lastErr string
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT max(attempts), max(last_error) FROM outbox WHERE processed_at IS NULL`).Scan(&maxAttempts, &lastErr))
	require.Zero(t, maxAttempts, "an outage counts no attempts")
	require.Contains(t, lastErr, "broker unavailable (rabbitmq)")
	st, err := outbox.ReadStats(ctx, rg.pool)
	require.NoError(t, err)
	require.Zero(t, st.Parked, "rows waiting for the broker are not parked")
	require.Empty(t, st.ParkedRows)
	require.Equal(t, 1, logs.count("broker unavailable"), "the outage is logged once")
	// One probe per pause for the whole relay: the pauses 0.1, 0.2, 0.4,
	// 0.8, 1.6 s, then 2 s (±20%), plus the batches of the 4 loops in
	// flight when it began: about 35 in 60 s. Four loops backing off each
	// on its own would make 4 times as many.
	failed := failedBatches.Load()
	t.Logf("%d failed batches in a %v outage", failed, time.Since(start).Round(time.Second))
	require.Less(t, failed, int64(60))

	testenv.Services(t, "start", "rabbitmq")
	restarted = true
	require.Eventually(t, func() bool { return unprocessed(t, rg.pool) == 0 }, 90*time.Second, 100*time.Millisecond)
	require.Equal(t, 1, logs.count("publishing again"))
	stop()
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT max(attempts) FROM outbox`).Scan(&maxAttempts))
	require.Zero(t, maxAttempts)
	counts, _ := collect(t, rg.b, rg.queue, len(ids), 300*time.Millisecond)
	for _, id := range idStrings(ids) {
		require.GreaterOrEqual(t, counts[id], 1, id)
	}
}

// TestRelayClearsLastErrorOnPublish (issue 16, item 7): a row that waited
// out an outage carries last_error "broker unavailable ..."; once it is
// published that reason is gone (NULL), so nothing reads a sent row as
// failing. The outage is real but private to this test: a relay whose
// publish timeout (1 µs) no broker meets, so RabbitMQ is not stopped.
// A parked row that is then published loses its reason too and keeps its
// attempts.
func TestRelayClearsLastErrorOnPublish(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	ids := enqueue(t, rg.pool, events(3, "test.outage")...)
	down := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, PublishTimeout: time.Microsecond, Retention: -1})
	n, err := down.ProcessBatch(ctx)
	require.Error(t, err)
	require.Zero(t, n)
	var withReason int
	var lastErr string
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT count(*), max(last_error) FROM outbox WHERE id = ANY($1) AND last_error IS NOT NULL AND attempts = 0`, ids).
		Scan(&withReason, &lastErr))
	require.Equal(t, len(ids), withReason, "the outage wrote its reason")
	require.Contains(t, lastErr, "broker unavailable (rabbitmq)")

	// A parked row: as a publication of its own that failed before.
	_, err = rg.pool.Exec(ctx, `UPDATE outbox SET attempts = 2, last_error = 'rabbitmq: nacked' WHERE id = $1`, ids[0])
	require.NoError(t, err)

	up := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Retention: -1})
	n, err = up.ProcessBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, len(ids), n)
	rows, err := rg.pool.Query(ctx, `SELECT id, processed_at IS NOT NULL, last_error, attempts FROM outbox WHERE id = ANY($1) ORDER BY id`, ids)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id int64
		var sent bool
		var le *string
		var attempts int
		require.NoError(t, rows.Scan(&id, &sent, &le, &attempts))
		require.True(t, sent, "row %d published", id)
		require.Nil(t, le, "row %d: a sent row keeps no last_error", id)
		if id == ids[0] {
			require.Equal(t, 2, attempts, "attempts stays as history")
		}
	}
	require.NoError(t, rows.Err())
	st, err := outbox.ReadStats(ctx, rg.pool)
	require.NoError(t, err)
	require.Zero(t, st.Parked)
	require.Zero(t, st.Unprocessed)
}
