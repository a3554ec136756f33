package ferrycli_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
)

// ferry console with a broker that does not answer serves the outbox
// pages and says the DLQ pages are off: during a broker outage, when the
// on-call person needs the page most, it used to exit 1 after the dial
// timeout ("ferry: dlq: rabbitmq at ...: context deadline exceeded").
func TestConsoleServesWithTheBrokerDown(t *testing.T) {
	_, db := testenv.NewPool(t)
	code, _, migrateErr := runBinaryEnv(t, nil, "migrate", "--database-url", db)
	require.Equal(t, 0, code, migrateErr)

	// A port nothing listens on: connection refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())

	ctx, cancel := context.WithTimeout(context.Background(), binaryDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "console", "--database-url", db, "--addr", "127.0.0.1:0",
		"--broker", "rabbitmq", "--rabbitmq-url", "amqp://guest:guest@"+dead+"/")
	cmd.Env = childEnv()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	errOut := &testenv.LockedBuffer{}
	cmd.Stderr = errOut
	require.NoError(t, cmd.Start())
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	sc := bufio.NewScanner(stdout)
	var url string
	for sc.Scan() {
		if u, ok := strings.CutPrefix(sc.Text(), "ferry console: "); ok {
			url = u
			break
		}
	}
	require.NotEmpty(t, url, "ferry console printed its URL; stderr:\n%s", errOut.String())
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	resp, err := http.Get(url)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Contains(t, string(body), "Outbox backlog")
	require.Eventually(t, func() bool {
		return strings.Contains(errOut.String(), "the DLQ pages are off")
	}, 10*time.Second, 50*time.Millisecond, "the log says why the DLQ pages are off: %s", errOut.String())
}
