package ferrycli_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/testenv"
)

// A bad --worker-batch-size or --worker-batch-linger is a usage error (exit
// 2, one line naming the flag, the value and what is wanted).
func TestWorkerBatchFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"worker", "--worker-batch-size", "0"}, "ferry: usage: --worker-batch-size 0: want 1..64 (1: one transaction per message)"},
		{[]string{"worker", "--worker-batch-size", "65"}, "ferry: usage: --worker-batch-size 65: want 1..64"},
		{[]string{"run", "--worker-batch-size", "-2"}, "ferry: usage: --worker-batch-size -2: want 1..64"},
		{[]string{"worker", "--worker-batch-linger", "soon"}, `ferry: usage: --worker-batch-linger "soon": want milliseconds (a whole number such as 5) or a Go duration such as 500us or 20ms`},
		{[]string{"worker", "--worker-batch-linger", "2s"}, `ferry: usage: --worker-batch-linger "2s": want more than 0 and at most 1s (default 200µs)`},
		{[]string{"demo", "--worker-batch-linger", "0"}, `ferry: usage: --worker-batch-linger "0": want more than 0 and at most 1s`},
		{[]string{"worker", "--worker-batch-linger", "1001"}, `ferry: usage: --worker-batch-linger "1001": want more than 0 and at most 1s`},
	} {
		code, out, errOut := run(t, tc.args...)
		require.Equal(t, 2, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, tc.args)
		require.Equal(t, 1, strings.Count(strings.TrimSpace(errOut), "\n")+1, "stderr: %s", errOut)
		require.NotContains(t, out, "USAGE:")
	}
}

// TestWorkerBatchesHandleABacklog: 40 notifications are published (ferry
// api, then ferry relay) before "ferry worker --worker-batch-size 8"
// starts; it sends them all, in batches: the dedup rows of one batch share
// their processed_at (the transaction's start), so there are at most
// 40/8 distinct ones plus stragglers, where one transaction per message
// would give 40.
func TestWorkerBatchesHandleABacklog(t *testing.T) {
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
	db := migratedDatabase(t)
	name := testenv.UniqueName("cli-wbatch")
	queue := name + ".work"
	t.Cleanup(func() { deleteRabbitTopology(t, name, queue) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	defer pool.Close()
	count := func(sql string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql).Scan(&n))
		return n
	}
	common := []string{"--database-url", db, "--log-level", "error", "--metrics-addr", ""}
	broker := []string{"--broker", "rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(), "--exchange", name, "--queue", queue}
	// start runs a ferry command until the returned stop, which requires
	// exit code 0.
	start := func(args ...string) (stop func()) {
		cctx, cstop := context.WithCancel(ctx)
		done := make(chan int, 1)
		go func() { done <- ferrycli.Main(cctx, append([]string{"ferry"}, args...), io.Discard, io.Discard) }()
		return func() {
			cstop()
			select {
			case code := <-done:
				require.Equal(t, 0, code, "ferry %s", args[0])
			case <-time.After(time.Minute):
				t.Fatalf("ferry %s did not stop", args[0])
			}
		}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	stopAPI := start(append([]string{"api", "--addr", addr}, common...)...)
	require.Eventually(t, func() bool {
		res, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond)
	const n = 40
	for i := range n {
		body := fmt.Sprintf(`{"user_id":"u%d","channel":"email","to":"u%d@example.com","subject":"s","body":"b"}`, i, i)
		res, err := http.Post("http://"+addr+"/notifications", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusCreated, res.StatusCode)
	}
	stopAPI()

	stopRelay := start(append(append([]string{"relay"}, common...), broker...)...)
	require.Eventually(t, func() bool { return count(`SELECT count(*) FROM outbox WHERE processed_at IS NULL`) == 0 }, time.Minute, 50*time.Millisecond,
		"the relay publishes the backlog")
	stopRelay()
	require.Zero(t, count(`SELECT count(*) FROM processed_messages`))

	begin := time.Now()
	stopWorker := start(append(append([]string{"worker", "--smtp-addr", testenv.SMTPAddr(), "--concurrency", "1",
		"--worker-batch-size", "8", "--worker-batch-linger", "100"}, common...), broker...)...)
	require.Eventually(t, func() bool { return count(`SELECT count(*) FROM notifications WHERE status = 'sent'`) == n }, time.Minute, 50*time.Millisecond,
		"the worker sends the backlog")
	took := time.Since(begin)
	stopWorker()
	require.Equal(t, n, count(`SELECT count(*) FROM processed_messages`))
	require.Equal(t, n, count(`SELECT count(*) FROM notifications WHERE attempts = 1`), "each notification was sent at its first attempt, once")
	txs := count(`SELECT count(DISTINCT processed_at) FROM processed_messages`)
	require.LessOrEqual(t, txs, n/8+2, "the backlog was handled in batches of up to 8")
	t.Logf("%d notifications sent in %d transactions in %v", n, txs, took.Round(time.Millisecond))
}
