package cluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Script runs compose/local/services.sh (or a script with its interface)
// for the cluster roles: `up|down|reset|env ROLE`, `node ROLE N
// kill|pause|resume|stop|start`, `promote postgres-ha`
// (compose/local/cluster.sh documents them). The failover tests and
// ferry bench's failover scenario share it.
type Script struct {
	// Path is the script's path; it is run with bash. Required.
	Path string
}

// Run runs the script with args and returns its standard output; the
// error carries both outputs when it fails.
func (s Script) Run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{s.Path}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s%s", s.Path, strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String(), nil
}

// Up starts role's nodes that are not running and returns once the
// cluster is ready (cluster.sh's ready_ROLE).
func (s Script) Up(ctx context.Context, role string) error {
	_, err := s.Run(ctx, "up", role)
	return err
}

// Down stops role's nodes and forgets their ports (the data stays).
func (s Script) Down(ctx context.Context, role string) error {
	_, err := s.Run(ctx, "down", role)
	return err
}

// Env returns the variables `env ROLE` prints for a running cluster
// (export K=V lines; comment lines are skipped).
func (s Script) Env(ctx context.Context, role string) (map[string]string, error) {
	out, err := s.Run(ctx, "env", role)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "=")
		if ok && !strings.HasPrefix(k, "#") {
			env[k] = v
		}
	}
	return env, nil
}

// Node runs `node ROLE N what`: kill (SIGKILL), pause (SIGSTOP), resume
// (SIGCONT), stop, or start (returns once the node serves again).
func (s Script) Node(ctx context.Context, role string, n int, what string) error {
	_, err := s.Run(ctx, "node", role, strconv.Itoa(n), what)
	return err
}
