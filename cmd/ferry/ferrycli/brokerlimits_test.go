package ferrycli_test

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
)

// The adapters' settings that the worker's start-up check compares with
// its own (worker.CheckLimits) are flags, and a contradiction is refused
// with exit 2 and a first line of stderr naming both flags and values
// that work. They used to be out of a CLI user's reach: the error named
// sqs.Config.MaxReceiveCount, which no flag set, and RabbitMQ's
// delivery-limit was never read from the CLI.

// SQS: --sqs-max-receive-count 3 with --max-attempts 5 is refused before
// anything is declared; 6 starts; and a relay declaring the same queue
// with another count (the default 100) is refused, naming the flag.
func TestSQSMaxReceiveCountFlag(t *testing.T) {
	db := migratedDatabase(t)
	name := testenv.UniqueName("cli-redrive")
	common := []string{"--database-url", db, "--metrics-addr", "127.0.0.1:0", "--broker", "sqs",
		"--sqs-endpoint", testenv.SQSEndpoint(), "--aws-region", testenv.AWSRegion(),
		"--exchange", name, "--queue", name + "-work"}
	worker := append([]string{"worker", "--smtp-addr", testenv.SMTPAddr()}, common...)

	r := runBinaryTimed(t, append(worker, "--log-level", "error", "--sqs-max-receive-count", "3", "--max-attempts", "5")...)
	require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
	for _, w := range []string{"--max-attempts 5 must be below --sqs-max-receive-count", "sqs.Config.MaxReceiveCount", ") 3:",
		"set --max-attempts 2 or --sqs-max-receive-count 6"} {
		require.Contains(t, r.first, w, "stderr:\n%s", r.stderr)
	}

	// The value the error names works: the worker starts.
	startAndStop(t, append(worker, "--sqs-max-receive-count", "6", "--max-attempts", "5")...)

	// The queue now has maxReceiveCount 6; a relay with the default 100
	// is refused at once, naming the flag both must agree on.
	r = runBinaryTimed(t, append([]string{"relay", "--log-level", "error"}, common...)...)
	require.Equal(t, 1, r.code, "stderr:\n%s", r.stderr)
	for _, w := range []string{"RedrivePolicy", `"maxReceiveCount":100`, "--sqs-max-receive-count"} {
		require.Contains(t, r.first, w, "stderr:\n%s", r.stderr)
	}

	code, _, errOut := run(t, "relay", "--sqs-max-receive-count", "0")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "--sqs-max-receive-count 0: want 1..1000")
}

// RabbitMQ: with --rabbitmq-management-url the worker reads the delivery-
// limit of an operator's policy on its quorum work queue and refuses
// --max-attempts 5 against a limit of 3; --rabbitmq-consumer-timeout is
// what --handler-timeout is checked against.
func TestRabbitMQLimitFlags(t *testing.T) {
	db := migratedDatabase(t)
	name := testenv.UniqueName("cli-rlimits")
	queue := name + ".work"
	t.Cleanup(func() { deleteRabbitTopology(t, name, queue) })
	// Set before the worker declares the queue: RabbitMQ applies it at
	// declaration.
	setRabbitPolicy(t, queue, map[string]any{"delivery-limit": 3})
	worker := []string{"worker", "--database-url", db, "--metrics-addr", "127.0.0.1:0", "--log-level", "error",
		"--smtp-addr", testenv.SMTPAddr(), "--broker", "rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(),
		"--rabbitmq-queue-type", "quorum", "--exchange", name, "--queue", queue}

	r := runBinaryTimed(t, append(worker, "--rabbitmq-management-url", testenv.RabbitMQManagementURL(), "--max-attempts", "5")...)
	require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
	for _, w := range []string{"--max-attempts", "= 5", "delivery-limit of RabbitMQ queue", "ferry-test-" + queue, "= 3",
		"set --max-attempts to at most 2", "at least 6"} {
		require.Contains(t, r.first, w, "stderr:\n%s", r.stderr)
	}

	r = runBinaryTimed(t, append(worker, "--rabbitmq-consumer-timeout", "10m", "--handler-timeout", "15m")...)
	require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
	for _, w := range []string{"--handler-timeout", "= 15m0s", "--rabbitmq-consumer-timeout", "= 10m0s", "below 10m0s, e.g. 9m0s"} {
		require.Contains(t, r.first, w, "stderr:\n%s", r.stderr)
	}

	for _, tc := range []struct{ args, want []string }{
		{[]string{"worker", "--rabbitmq-management-url", "127.0.0.1:15672"}, []string{`--rabbitmq-management-url "127.0.0.1:15672"`, "want http(s)://"}},
		{[]string{"worker", "--rabbitmq-consumer-timeout", "-1s"}, []string{"--rabbitmq-consumer-timeout -1s: must not be negative"}},
	} {
		code, _, errOut := run(t, tc.args...)
		require.Equal(t, 2, code, errOut)
		for _, w := range tc.want {
			require.Contains(t, errOut, w)
		}
	}
}

// startAndStop runs the ferry binary with args until it logs that its
// worker runs (past the start-up checks), then stops it with SIGTERM and
// requires exit 0.
func startAndStop(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = childEnv()
	var stderr bytes.Buffer
	lw := &lockedWriter{w: &stderr}
	cmd.Stdout, cmd.Stderr = io.Discard, lw
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	text := func() string { lw.mu.Lock(); defer lw.mu.Unlock(); return stderr.String() }
	deadline := time.After(binaryDeadline)
	for !strings.Contains(text(), "worker running") {
		select {
		case err := <-done:
			t.Fatalf("ferry stopped by itself (%v):\n%s", err, text())
		case <-deadline:
			_ = cmd.Process.Kill()
			t.Fatalf("no worker running after %v:\n%s", binaryDeadline, text())
		case <-time.After(100 * time.Millisecond):
		}
	}
	// The limits are checked in the worker's Run, just after that line.
	time.Sleep(time.Second)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-done:
	case <-time.After(binaryDeadline):
		_ = cmd.Process.Kill()
		t.Fatalf("no exit after SIGTERM:\n%s", text())
	}
	require.Equal(t, 0, cmd.ProcessState.ExitCode(), text())
	require.NotContains(t, text(), "level=ERROR", text())
}
