package ferrycli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestEmbeddedDemoLeavesNothingInTempDir runs `ferry demo` on its
// embedded servers (this test binary as the ferry binary, see TestMain)
// with TMPDIR set to a fresh folder, and checks that the folder holds
// nothing afterwards but, as root, the extracted PostgreSQL binaries the
// README names ($TMPDIR/ferry-embedded-postgres-<version>): no
// embedded_postgres_log… file of embedded-postgres, no data folder. The
// fresh folder keeps the check to this run's files while other tests on
// the machine use the system temp folder.
func TestEmbeddedDemoLeavesNothingInTempDir(t *testing.T) {
	tmp, err := os.MkdirTemp("", "ferry-tmpdir-test-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(tmp) })
	require.NoError(t, os.Chmod(tmp, 0o755)) // as root, PostgreSQL runs as nobody from under it

	exe, err := os.Executable()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "demo")
	cmd.Env = []string{"FERRY_TEST_RUN_MAIN=1", "TMPDIR=" + tmp}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FERRY_") && !strings.HasPrefix(kv, "TMPDIR=") {
			cmd.Env = append(cmd.Env, kv) // no FERRY_DATABASE_URL: the embedded PostgreSQL
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "ferry demo:\n%s\n%s", stdout.String(), stderr.String())
	require.Contains(t, stdout.String(), "embedded PostgreSQL")

	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	var left []string
	for _, e := range entries {
		if os.Geteuid() == 0 && e.Name() == "ferry-embedded-postgres-"+string(embeddedPGVersion) {
			continue
		}
		left = append(left, e.Name())
	}
	require.Empty(t, left, "ferry demo left these in its TMPDIR %s", tmp)
}
