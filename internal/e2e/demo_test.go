package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
)

// summaryCount reads "  <label>   <n>" from the demo's summary.
func summaryCount(t *testing.T, out, label string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(label) + `\s+(\d+)`).FindStringSubmatch(out)
	require.NotNil(t, m, "no %q line in the summary:\n%s", label, out)
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return n
}

// TestDemoEmbedded runs `ferry demo` with no flags and no FERRY_*
// variables: embedded PostgreSQL (downloaded once), embedded NATS and the
// built-in SMTP sink; it must reach its summary and exit 0.
func TestDemoEmbedded(t *testing.T) {
	unsetFerryEnv(t)
	dir := t.TempDir()
	start := time.Now()
	code, out, errOut := ferry(t, "demo", "--data-dir", dir)
	t.Logf("ferry demo took %v:\n%s", time.Since(start), out)
	require.Equal(t, 0, code, "stderr:\n%s", errOut)
	require.Equal(t, 50, summaryCount(t, out, "accepted"))
	require.Equal(t, 5, summaryCount(t, out, "rejected"))
	require.Equal(t, 50, summaryCount(t, out, "sent"))
	require.Equal(t, 0, summaryCount(t, out, "dead"))
	require.Contains(t, out, "embedded PostgreSQL")
	require.Contains(t, out, "embedded NATS JetStream")
	require.Contains(t, out, "built-in SMTP sink")
	require.Contains(t, out, "50 message(s)")
	require.Contains(t, out, "OK: all ")
	mails, err := filepath.Glob(filepath.Join(dir, "mail", "*.eml"))
	require.NoError(t, err)
	require.Len(t, mails, 50, "the sink keeps each mail under --data-dir")
}

// TestDemoRabbitMQFile runs the demo on the shared 1,000-line sample with
// the real PostgreSQL, RabbitMQ and Mailpit: 968 accepted, 32 rejected,
// every accepted one final, exit 0.
func TestDemoRabbitMQFile(t *testing.T) {
	file := filepath.Join(testenv.RepoRoot(), "..", "shared", "data", "notifications-1000.ndjson")
	args := []string{"demo", "--broker=rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(),
		"--database-url", testenv.NewDatabase(t), "--smtp-addr", testenv.SMTPAddr(),
		"--exchange", testenv.UniqueName("e2e-demo-ex"), "--queue", testenv.UniqueName("e2e-demo-q"),
		"--file", file}
	code, out, errOut := ferry(t, args...)
	t.Logf("%s", out)
	require.Equal(t, 0, code, "stderr:\n%s", tail(errOut, 8<<10))
	require.Equal(t, 968, summaryCount(t, out, "accepted"))
	require.Equal(t, 32, summaryCount(t, out, "rejected"))
	require.Equal(t, 968, summaryCount(t, out, "sent")+summaryCount(t, out, "dead"))
	require.Contains(t, out, "OK: all ")
}

// TestDemoWAL runs `ferry demo --relay-mode=wal` twice: with no other
// flag (embedded PostgreSQL 18, which the demo starts with
// wal_level=logical, and embedded NATS), and on the shared sample with the
// real PostgreSQL 15 of services.sh and RabbitMQ: every accepted
// notification final, exit 0.
func TestDemoWAL(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		unsetFerryEnv(t)
		code, out, errOut := ferry(t, "demo", "--relay-mode=wal", "--data-dir", t.TempDir())
		t.Logf("%s", out)
		require.Equal(t, 0, code, "stderr:\n%s", tail(errOut, 8<<10))
		require.Equal(t, 50, summaryCount(t, out, "sent"))
		require.Contains(t, out, "embedded PostgreSQL")
		require.Contains(t, out, "OK: all ")
	})
	t.Run("rabbitmq", func(t *testing.T) {
		file := filepath.Join(testenv.RepoRoot(), "..", "shared", "data", "notifications-1000.ndjson")
		slot := strings.NewReplacer("-", "_").Replace(testenv.UniqueName("ferry_e2e_demo"))
		code, out, errOut := ferry(t, "demo", "--relay-mode=wal", "--wal-slot", slot, "--broker=rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(),
			"--database-url", testenv.NewDatabase(t), "--smtp-addr", testenv.SMTPAddr(),
			"--exchange", testenv.UniqueName("e2e-demo-ex"), "--queue", testenv.UniqueName("e2e-demo-q"), "--file", file)
		t.Logf("%s", out)
		require.Equal(t, 0, code, "stderr:\n%s", tail(errOut, 8<<10))
		require.Equal(t, 968, summaryCount(t, out, "accepted"))
		require.Equal(t, 968, summaryCount(t, out, "sent")+summaryCount(t, out, "dead"))
		require.Contains(t, out, "OK: all ")
	})
}

// TestDemoKafkaFile runs the demo on the shared 1,000-line sample with the
// real PostgreSQL, Kafka and Mailpit: 968 accepted, 32 rejected, every
// accepted one final, exit 0.
func TestDemoKafkaFile(t *testing.T) {
	file := filepath.Join(testenv.RepoRoot(), "..", "shared", "data", "notifications-1000.ndjson")
	args := []string{"demo", "--broker=kafka", "--kafka-brokers", strings.Join(testenv.KafkaBrokers(), ","),
		"--database-url", testenv.NewDatabase(t), "--smtp-addr", testenv.SMTPAddr(),
		"--exchange", testenv.UniqueName("e2e-demo-ex"), "--queue", testenv.UniqueName("e2e-demo-q"),
		"--file", file}
	code, out, errOut := ferry(t, args...)
	t.Logf("%s", out)
	require.Equal(t, 0, code, "stderr:\n%s", tail(errOut, 8<<10))
	require.Equal(t, 968, summaryCount(t, out, "accepted"))
	require.Equal(t, 32, summaryCount(t, out, "rejected"))
	require.Equal(t, 968, summaryCount(t, out, "sent")+summaryCount(t, out, "dead"))
	require.Contains(t, out, "OK: all ")
}

// TestDemoRefusedTopologyAcceptsNothing: when the broker refuses the
// topology (here RabbitMQ's 406 PRECONDITION_FAILED for a queue that
// exists as a classic queue while the demo asks for quorum), the demo
// fails naming the cause before its API accepts anything: no
// notification is written that it would then leave pending and leave out
// of its summary.
func TestDemoRefusedTopologyAcceptsNothing(t *testing.T) {
	db := testenv.NewDatabase(t)
	args := []string{"demo", "--broker=rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(),
		"--database-url", db, "--smtp-addr", testenv.SMTPAddr(),
		"--exchange", testenv.UniqueName("e2e-demo-ex"), "--queue", testenv.UniqueName("e2e-demo-q")}
	code, out, errOut := ferry(t, args...) // declares the queues as classic queues
	require.Equal(t, 0, code, "stderr:\n%s", tail(errOut, 8<<10))
	require.Equal(t, 50, summaryCount(t, out, "accepted"))

	code, out, errOut = ferry(t, append(args, "--rabbitmq-queue-type", "quorum")...)
	t.Logf("%s", out)
	require.Equal(t, 1, code)
	pool, err := pgxpool.New(context.Background(), db)
	require.NoError(t, err)
	defer pool.Close()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM notifications`).Scan(&n))
	require.Equal(t, 50, n, "the refused run wrote no notification")
	require.Contains(t, errOut, "nothing was posted")
	require.Contains(t, errOut, "PRECONDITION_FAILED")
	require.Contains(t, errOut, "--rabbitmq-queue-type")
	require.NotContains(t, out, "posting 55 line(s)")
}

// TestDemoEarlyStopSummaryMatchesDatabase: a demo that stops early
// (--timeout while mail cannot be sent and posting is under way) still
// reports every accepted notification: the summary's accepted count is
// the number of notifications in the database, and they all show as
// still pending.
func TestDemoEarlyStopSummaryMatchesDatabase(t *testing.T) {
	db := testenv.NewDatabase(t)
	file := filepath.Join(testenv.RepoRoot(), "..", "shared", "data", "notifications-1000.ndjson")
	code, out, errOut := ferry(t, "demo", "--broker=rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(),
		"--database-url", db, "--smtp-addr", "127.0.0.1:1", // nothing listens: every send fails and waits 30 s to retry
		"--exchange", testenv.UniqueName("e2e-demo-ex"), "--queue", testenv.UniqueName("e2e-demo-q"),
		"--file", file, "--timeout", "1s")
	t.Logf("%s", out)
	require.Equal(t, 1, code, "stderr:\n%s", tail(errOut, 8<<10))
	require.Contains(t, errOut, "within --timeout 1s")
	pool, err := pgxpool.New(context.Background(), db)
	require.NoError(t, err)
	defer pool.Close()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM notifications`).Scan(&n))
	require.Positive(t, n)
	require.Equal(t, n, summaryCount(t, out, "accepted"), "the summary counts every notification the API accepted")
	require.Equal(t, n, summaryCount(t, out, "still pending"))
	require.Equal(t, summaryCount(t, out, "posted"), n+summaryCount(t, out, "rejected"))

	// The summary lists the first 20 still pending, by id with their
	// status and attempts, and counts the rest.
	listed := regexp.MustCompile(`(?m)^\s+id (\d+)\s+(\w+), (\d+) attempt\(s\)`).FindAllStringSubmatch(out, -1)
	require.Len(t, listed, min(n, 20), "the pending notifications are listed, at most 20:\n%s", out)
	for _, m := range listed {
		var status string
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT status FROM notifications WHERE id = $1`, m[1]).Scan(&status))
		require.Equal(t, "pending", status, "notification %s", m[1])
		require.Equal(t, status, m[2])
	}
	if n > 20 {
		require.Regexp(t, fmt.Sprintf(`(?m)^\s+…and %d more$`, n-20), out)
	}
}

// TestDemoNothingSentFails: with the mail server unreachable every
// accepted notification goes to the DLQ; the demo must not call that OK.
// It exits 1, says plainly that nothing was sent, why, and what to do;
// it prints the dead-letter warnings as one count instead of a WARN line
// per message (each comes back with --log-level warn), and says which
// relay ran.
func TestDemoNothingSentFails(t *testing.T) {
	args := []string{"demo", "--broker=rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(),
		"--smtp-addr", "127.0.0.1:1", // nothing listens
		"--max-attempts", "2", "--retry-delay", "100ms"}
	fresh := func() []string {
		return append(args, "--database-url", testenv.NewDatabase(t),
			"--exchange", testenv.UniqueName("e2e-demo-ex"), "--queue", testenv.UniqueName("e2e-demo-q"))
	}
	code, out, errOut := ferry(t, fresh()...)
	t.Logf("%s", out)
	require.Equal(t, 1, code, "stderr:\n%s", tail(errOut, 8<<10))
	require.Equal(t, 0, summaryCount(t, out, "sent"))
	require.Equal(t, 50, summaryCount(t, out, "dead"))
	require.Contains(t, out, "FAILED: ferry demo: nothing was sent: all 50 accepted notifications are dead; 50 of them: app: notification N: smtp <addr>: dial failed")
	require.Contains(t, out, "SMTP server 127.0.0.1:1 cannot be reached: start it, or point --smtp-addr at one")
	require.NotContains(t, out, "OK")
	require.Contains(t, errOut, "nothing was sent")
	require.NotContains(t, errOut, "message dead-lettered", "per-message warnings are counted, not printed")
	require.Contains(t, out, "50 × worker: message dead-lettered")
	require.Regexp(t, `(?m)^ferry demo: relay:\s+poll \(`, out)
	require.Regexp(t, `(?m)^\s+relay\s+poll \(`, out)
	require.Regexp(t, `(?m)^\s+throughput\s+[\d.]+ notifications/s  \(50 reached a final state in [\d.]+s: the first created_at`, out)

	code, out, errOut = ferry(t, append(fresh(), "--log-level", "warn")...)
	require.Equal(t, 1, code)
	require.Equal(t, 50, strings.Count(errOut, "worker: message dead-lettered"), "--log-level warn prints each:\n%s", tail(errOut, 4<<10))
	require.NotContains(t, out, "× worker: message dead-lettered")
}
