package testenv

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMissingServerIsNamed runs other packages' Examples and integration
// tests as `go test` subprocesses with an environment that points at a
// server that is not there (a closed port) or that refuses the login (the
// real PostgreSQL with a wrong password, or a database it does not have),
// as on a clean clone without `services.sh up` and its env. Each must fail
// (exit status not 0, no skip) with one line that names the server, the
// address tried, the variable that sets it and the commands that start it
// and point the tests at it. The shared servers are not touched.
func TestMissingServerIsNamed(t *testing.T) {
	Require(t, "postgres") // the cases below change one thing of a working setup
	closed := ClosedPort(t)
	pg, err := url.Parse(DatabaseURL())
	require.NoError(t, err)
	pgAddr := pg.Host
	withPassword := func(pw string) string {
		u := *pg
		u.User = url.UserPassword(u.User.Username(), pw)
		return u.String()
	}
	withDatabase := func(db string) string {
		u := *pg
		u.Path = "/" + db
		return u.String()
	}
	withHost := func(host string) string {
		u := *pg
		u.Host = host
		return u.String()
	}
	for _, c := range []struct {
		name string
		pkg  string // go test's package and -run pattern
		run  string
		env  []string
		// clean drops every FERRY_ variable first: a clean clone without
		// eval "$(compose/local/services.sh env)".
		clean bool
		// want is the start of the line, then what it must name.
		want, addr, variable, role string
	}{
		{name: "example, postgres refused", pkg: "./outbox", run: "^ExampleJobCancel$",
			env:  []string{"FERRY_DATABASE_URL=" + withHost(closed)},
			want: "testenv: PostgreSQL at " + closed + " (FERRY_DATABASE_URL) cannot be reached", addr: closed, variable: "FERRY_DATABASE_URL", role: "postgres"},
		{name: "example, wrong password", pkg: "./outbox", run: "^ExampleJobCancel$",
			env:  []string{"FERRY_DATABASE_URL=" + withPassword("not-the-password")},
			want: "testenv: PostgreSQL at " + pgAddr + " (FERRY_DATABASE_URL) refused the login", addr: pgAddr, variable: "FERRY_DATABASE_URL", role: "postgres"},
		{name: "example, clean clone without the env", pkg: "./outbox", run: "^ExampleJobCancel$", clean: true,
			want: "testenv: PostgreSQL at 127.0.0.1:5432 (FERRY_DATABASE_URL) refused the login", addr: "127.0.0.1:5432", variable: "FERRY_DATABASE_URL", role: "postgres"},
		{name: "example, broker refused", pkg: ".", run: "^Example$",
			env:  []string{"FERRY_NATS_URL=nats://" + closed},
			want: "testenv: NATS at " + closed + " (FERRY_NATS_URL) cannot be reached", addr: closed, variable: "FERRY_NATS_URL", role: "nats"},
		{name: "integration test, no such database", pkg: "./app", run: "^TestMigrateIsIdempotent$",
			env:  []string{"FERRY_DATABASE_URL=" + withDatabase("ferry_no_such_database")},
			want: "testenv: PostgreSQL at " + pgAddr + " (FERRY_DATABASE_URL) has no such database", addr: pgAddr, variable: "FERRY_DATABASE_URL", role: "postgres"},
		{name: "integration test, broker refused", pkg: "./worker", run: "^TestWorkerRabbitMQ$",
			env:  []string{"FERRY_RABBITMQ_URL=amqp://guest:guest@" + closed + "/"},
			want: "testenv: RabbitMQ at " + closed + " (FERRY_RABBITMQ_URL) cannot be reached", addr: closed, variable: "FERRY_RABBITMQ_URL", role: "rabbitmq"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "go", "test", c.pkg, "-count=1", "-run", c.run)
			cmd.Dir = RepoRoot()
			for _, kv := range os.Environ() {
				if !c.clean || !strings.HasPrefix(kv, "FERRY_") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, c.env...)
			out, err := cmd.CombinedOutput()
			t.Logf("go test %s -run %s with %v:\n%s", c.pkg, c.run, c.env, out)
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "go test must fail: %v", err)
			require.NotContains(t, string(out), "--- SKIP", "a missing server is a failure, never a skip")
			var line string
			for _, l := range strings.Split(string(out), "\n") {
				if i := strings.Index(l, c.want); i >= 0 {
					line = l[i:]
					break
				}
			}
			require.NotEmpty(t, line, "no line starting %q", c.want)
			require.Contains(t, line, c.addr)
			require.Contains(t, line, c.variable)
			require.Contains(t, line, "compose/local/services.sh up "+c.role+",")
			require.Contains(t, line, `eval "$(compose/local/services.sh env)"`)
			require.Contains(t, line, "make test")
			require.NotContains(t, line, "not-the-password", "the message must not carry the password")
		})
	}
}
