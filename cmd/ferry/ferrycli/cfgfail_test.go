package ferrycli_test

import (
	"bytes"
	"context"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/testenv"
)

// binaryDeadline is how long a run of the ferry binary may take in these
// tests: generous next to the seconds a refusal takes, far below the
// 10-minute --timeout of the demo that a retried mistake used to wait out.
const binaryDeadline = 30 * time.Second

// binResult is what a run of the ferry binary gave.
type binResult struct {
	code   int
	first  string // first line of stderr
	stderr string
	took   time.Duration
}

// childEnv is the environment of the ferry binary: this process's, without
// the FERRY_* variables (they would set flags the test does not give),
// and with FERRY_TEST_RUN_MAIN=1, which makes the test binary run Main as
// cmd/ferry does (see TestMain).
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FERRY_") {
			env = append(env, kv)
		}
	}
	return append(env, "FERRY_TEST_RUN_MAIN=1")
}

// runBinaryTimed runs the ferry binary with args and requires that it exits
// before binaryDeadline.
func runBinaryTimed(t *testing.T, args ...string) binResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), binaryDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = childEnv()
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	start := time.Now()
	_ = cmd.Run()
	r := binResult{code: cmd.ProcessState.ExitCode(), stderr: stderr.String(), took: time.Since(start)}
	r.first, _, _ = strings.Cut(r.stderr, "\n")
	t.Logf("ferry %s\n  exit %d after %v; stderr's first line: %s", strings.Join(args, " "), r.code, r.took.Round(time.Millisecond), r.first)
	require.NoError(t, ctx.Err(), "ferry still running after %v (it retries instead of failing); stderr:\n%s", binaryDeadline, r.stderr)
	return r
}

// migratedDatabase returns a fresh database with ferry's schema.
func migratedDatabase(t *testing.T) string {
	t.Helper()
	db := testenv.NewDatabase(t)
	code, _, errOut := run(t, "migrate", "--database-url", db)
	require.Equal(t, 0, code, errOut)
	return db
}

// withURL returns raw with f applied to its parsed form.
func withURL(t *testing.T, raw string, f func(u *url.URL)) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	f(u)
	return u.String()
}

// A configuration mistake fails at start, on every broker and on
// PostgreSQL: a malformed flag value with exit 2 naming the flag and what
// is wanted, credentials or a vhost the server refuses with exit 1 naming
// the flag and keeping the server's words, on the first line of stderr.
// They used to be retried as "broker not reachable" until killed.
func TestConfigMistakesFailAtStart(t *testing.T) {
	db := migratedDatabase(t)
	relay := func(args ...string) []string {
		return append([]string{"relay", "--database-url", db, "--metrics-addr", "127.0.0.1:0",
			"--exchange", testenv.UniqueName("cfg-ex"), "--queue", testenv.UniqueName("cfg-q"),
			// The relay logs before it connects (metrics, the stuck-outbox
			// alert, which may warn as it stops); Main prints the error
			// last, so only errors are logged here.
			"--log-level", "error"}, args...)
	}
	wrongPassword := func(raw string) string {
		return withURL(t, raw, func(u *url.URL) { u.User = url.UserPassword(u.User.Username(), "wrong") })
	}
	cases := []struct {
		name string
		args []string
		code int
		want []string // in stderr's first line
	}{
		{"rabbitmq http scheme", relay("--broker", "rabbitmq", "--rabbitmq-url", "http://127.0.0.1:5672/"),
			2, []string{`--rabbitmq-url "http://127.0.0.1:5672/"`, "want amqp://"}},
		{"rabbitmq wrong password", relay("--broker", "rabbitmq", "--rabbitmq-url", wrongPassword(testenv.RabbitMQURL())),
			1, []string{"--rabbitmq-url", "refused by the server", `username or password not allowed`}},
		{"rabbitmq unknown vhost", relay("--broker", "rabbitmq", "--rabbitmq-url",
			withURL(t, testenv.RabbitMQURL(), func(u *url.URL) { u.Path = "/no-such-vhost" })),
			1, []string{"--rabbitmq-url", "vhost no-such-vhost not found"}},
		{"kafka without port", relay("--broker", "kafka", "--kafka-brokers", "127.0.0.1"),
			2, []string{`--kafka-brokers "127.0.0.1": want host:port`}},
		{"nats http scheme", relay("--broker", "nats", "--nats-url", "http://"+testenv.HostPort(testenv.NATSURL())),
			2, []string{"--nats-url", `unknown scheme "http"`, "want nats://"}},
		{"nats wrong password", relay("--broker", "nats", "--nats-url", wrongPassword(testenv.NATSURL())),
			1, []string{"--nats-url", "refused by the server", "Authorization Violation"}},
		{"sqs endpoint not a URL", relay("--broker", "sqs", "--sqs-endpoint", "notaurl"),
			2, []string{`--sqs-endpoint "notaurl"`, "want an http:// or https:// URL"}},
		{"sqs region", relay("--broker", "sqs", "--aws-region", "US East"),
			2, []string{`--aws-region "US East"`, "us-east-1"}},
		{"sqs credentials refused", relay("--broker", "sqs", "--sqs-endpoint", testenv.RefusingSQS(t)),
			1, []string{"--sqs-endpoint", "refused by the server", "AWS credentials", "security token included in the request is invalid"}},
		{"worker too", []string{"worker", "--database-url", db, "--metrics-addr", "127.0.0.1:0", "--log-level", "error",
			"--smtp-addr", testenv.SMTPAddr(), "--broker", "nats", "--nats-url", wrongPassword(testenv.NATSURL())},
			1, []string{"--nats-url", "Authorization Violation"}},
		{"postgres wrong password", relay("--database-url", wrongPassword(db)),
			1, []string{"--database-url", "refused by the server", "password authentication failed", "28P01"}},
		{"dlq with a malformed flag", []string{"dlq", "list", "--broker", "rabbitmq", "--rabbitmq-url", "http://127.0.0.1:5672/"},
			2, []string{`--rabbitmq-url "http://127.0.0.1:5672/"`, "want amqp://"}},
		{"dlq with refused credentials", []string{"dlq", "list", "--broker", "nats", "--nats-url", wrongPassword(testenv.NATSURL())},
			1, []string{"--nats-url", "Authorization Violation"}},
		{"demo with a malformed flag", []string{"demo", "--broker", "kafka", "--kafka-brokers", "127.0.0.1"},
			2, []string{`--kafka-brokers "127.0.0.1": want host:port`}},
		{"demo with refused credentials", []string{"demo", "--database-url", testenv.NewDatabase(t), "--nats-url", wrongPassword(testenv.NATSURL())},
			1, []string{"--nats-url", "Authorization Violation"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runBinaryTimed(t, tc.args...)
			require.Equal(t, tc.code, r.code, "stderr:\n%s", r.stderr)
			for _, w := range tc.want {
				require.Contains(t, r.first, w, "stderr:\n%s", r.stderr)
			}
			require.NotContains(t, r.stderr, "retrying")
			require.NotContains(t, r.stderr, ":wrong@", "no password in the message")
		})
	}
}

// ferry demo with a broker that is not reachable (connection refused)
// gives up within seconds, on every broker, with the broker's own words,
// instead of waiting its whole --timeout (10 minutes by default).
func TestDemoGivesUpOnUnreachableBroker(t *testing.T) {
	for _, name := range ferrycli.BrokerNames() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			addr := testenv.ClosedPort(t)
			flag := map[string][]string{
				"rabbitmq": {"--rabbitmq-url", "amqp://guest:guest@" + addr + "/"},
				"nats":     {"--nats-url", "nats://" + addr},
				"kafka":    {"--kafka-brokers", addr},
				"sqs":      {"--sqs-endpoint", "http://" + addr},
			}[name]
			require.NotNil(t, flag, "no unreachable address for broker %s in this test", name)
			r := runBinaryTimed(t, append([]string{"demo", "--database-url", testenv.NewDatabase(t), "--broker", name}, flag...)...)
			require.Equal(t, 1, r.code, "stderr:\n%s", r.stderr)
			require.Contains(t, r.first, "not reachable within", "stderr:\n%s", r.stderr)
			require.Contains(t, r.first, "giving up")
			require.Contains(t, r.first, "connect: connection refused", "the broker's own words")
			require.Contains(t, r.first, addr)
		})
	}
}

// What can come back is still waited for: a relay started before its
// broker keeps retrying until it is stopped, and exits 0 on SIGTERM.
func TestRelayWaitsForUnreachableBroker(t *testing.T) {
	db := migratedDatabase(t)
	cmd := exec.Command(os.Args[0], "relay", "--database-url", db, "--metrics-addr", "127.0.0.1:0",
		"--broker", "nats", "--nats-url", "nats://"+testenv.ClosedPort(t))
	cmd.Env = childEnv()
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("the relay stopped by itself (%v):\n%s", err, stderr.String())
	case <-time.After(3 * time.Second):
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-done:
	case <-time.After(binaryDeadline):
		_ = cmd.Process.Kill()
		t.Fatalf("no exit after SIGTERM:\n%s", stderr.String())
	}
	require.Equal(t, 0, cmd.ProcessState.ExitCode(), stderr.String())
	require.Contains(t, stderr.String(), "broker not reachable; retrying")
	require.Contains(t, stderr.String(), "connection refused")
}
