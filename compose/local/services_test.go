// Package local holds the tests of services.sh, the script that runs the
// servers of ferry's tests on loopback.
package local

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// bindWithoutListening binds a TCP socket to the first port from first on
// that nobody holds, without listening on it, and returns the port. Such a
// socket is what services.sh loses to: it looks free (nothing LISTENs on
// it, a connection is refused), yet a server's bind fails with "address
// already in use", as when another checkout binds the port between
// services.sh's choice and its server's bind.
func bindWithoutListening(t *testing.T, first int) int {
	t.Helper()
	for p := first; p < first+200; p++ {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
		require.NoError(t, err)
		if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: p, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			syscall.Close(fd)
			continue
		}
		t.Cleanup(func() { syscall.Close(fd) })
		return p
	}
	t.Fatalf("no free port from %d", first)
	return 0
}

// services runs services.sh with the state folder state and returns its
// exit code and stderr.
func services(t *testing.T, state string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{"services.sh"}, args...)...)
	cmd.Env = append(os.Environ(), "FERRY_STATE_DIR="+state, "FERRY_SERVICES_TIMEOUT=30")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "services.sh %v: %s", args, stderr.String())
		code = ee.ExitCode()
	}
	return code, stderr.String()
}

// TestUpRetriesALostBind: `services.sh up smtp` chooses the first free
// port from 1025 for Mailpit's SMTP; when another program holds that port
// by the time Mailpit binds it, Mailpit dies with "address already in
// use" and services.sh starts it again on the next free port, which `env`
// then reports. It runs on a state folder of its own, so it starts a
// Mailpit of its own and leaves the shared servers alone.
func TestUpRetriesALostBind(t *testing.T) {
	state := t.TempDir()
	blocked := bindWithoutListening(t, 1025)
	t.Cleanup(func() {
		if code, out := services(t, state, "down", "smtp"); code != 0 {
			t.Logf("services.sh down smtp: exit %d\n%s", code, out)
		}
	})

	code, out := services(t, state, "up", "smtp")
	t.Logf("services.sh up smtp:\n%s", out)
	require.Equal(t, 0, code, "services.sh up smtp must start Mailpit on another port")
	require.Contains(t, out, "another program took a port between its choice and the bind")

	saved, err := os.ReadFile(filepath.Join(state, "ports", "smtp"))
	require.NoError(t, err)
	port, err := strconv.Atoi(strings.TrimSpace(string(saved)))
	require.NoError(t, err)
	require.NotEqual(t, blocked, port, "the port lost to the other program is not used")
	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 5*time.Second)
	require.NoError(t, err, "Mailpit answers on the port services.sh saved")
	conn.Close()

	cmd := exec.Command("bash", "services.sh", "env", "smtp")
	cmd.Env = append(os.Environ(), "FERRY_STATE_DIR="+state)
	env, err := cmd.Output()
	require.NoError(t, err)
	require.Contains(t, string(env), "export FERRY_SMTP_ADDR=127.0.0.1:"+strconv.Itoa(port))
}
