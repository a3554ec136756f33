package local

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

// servicesOut runs services.sh with the state folder state and returns
// its standard output; it fails the test when the script fails.
func servicesOut(t *testing.T, state string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{"services.sh"}, args...)...)
	cmd.Env = append(os.Environ(), "FERRY_STATE_DIR="+state, "FERRY_SERVICES_TIMEOUT=60")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	require.NoError(t, cmd.Run(), "services.sh %v: %s", args, stderr.String())
	return out.String()
}

// The cluster roles start on demand, each node on ports of its own; env
// names every node; one node can be killed and started again on the ports
// env printed; down stops them all. nats-cluster stands for the roles: it
// starts in seconds (the failover tests, internal/cluster, start the
// others).
func TestClusterRole(t *testing.T) {
	state := t.TempDir()
	t.Cleanup(func() { servicesOut(t, state, "down", "nats-cluster") })
	servicesOut(t, state, "up", "nats-cluster")
	env := servicesOut(t, state, "env", "nats-cluster")
	var urls string
	for _, line := range strings.Split(env, "\n") {
		if v, ok := strings.CutPrefix(line, "export FERRY_NATS_CLUSTER_URL="); ok {
			urls = v
		}
	}
	nodes := strings.Split(urls, ",")
	require.Len(t, nodes, 3, "env names the three nodes: %q", env)
	seen := map[string]bool{}
	for _, u := range nodes {
		host := u[strings.LastIndex(u, "@")+1:]
		require.False(t, seen[host], "node address %s twice", host)
		seen[host] = true
	}

	pid := strings.TrimSpace(servicesOut(t, state, "node", "nats-cluster", "2", "pid"))
	require.NotEmpty(t, pid)
	servicesOut(t, state, "node", "nats-cluster", "2", "kill")
	require.Empty(t, strings.TrimSpace(servicesOut(t, state, "node", "nats-cluster", "2", "pid")), "killed")
	servicesOut(t, state, "node", "nats-cluster", "2", "start")
	require.NotEqual(t, pid, strings.TrimSpace(servicesOut(t, state, "node", "nats-cluster", "2", "pid")), "a new process")
	require.Equal(t, env, servicesOut(t, state, "env", "nats-cluster"), "the same ports after the restart")

	require.Contains(t, servicesOut(t, state, "status", "nats-cluster"), "node 3  running")
	servicesOut(t, state, "down", "nats-cluster")
	require.Contains(t, servicesOut(t, state, "env", "nats-cluster"), "# nats-cluster is not running")
}
