package ferrycli_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/testenv"
)

// run runs the ferry command in-process and returns its exit code, stdout
// and stderr.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	code := ferrycli.Main(ctx, append([]string{"ferry"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"unknown broker", []string{"relay", "--broker", "pigeon"}, []string{"unknown broker", `"pigeon"`, "rabbitmq"}},
		{"retry delay item", []string{"worker", "--retry-delay", "1s,abc"}, []string{"--retry-delay", `item 2 "abc"`}},
		{"retry delay zero", []string{"worker", "--retry-delay", "0s"}, []string{"--retry-delay", "must be positive"}},
		{"retention", []string{"relay", "--retention", "7 days"}, []string{"--retention", "7d"}},
		{"retention zero", []string{"relay", "--retention", "0"}, []string{"--retention", "use a negative value to keep rows forever"}},
		{"retention short", []string{"relay", "--retention", "1s"}, []string{"--retention 1s", "at least 1h0m0s"}},
		{"retention below retries", []string{"relay", "--retry-delay", "1s,1h", "--retention", "2h"}, []string{"--retention 2h0m0s", "at least 5h0m0s", "--retry-delay"}},
		{"retention below run's retries", []string{"run", "--retry-delay", "1h", "--max-attempts", "10", "--retention", "9h"}, []string{"--retention 9h0m0s", "at least 10h0m0s"}},
		{"destination", []string{"relay", "--destination", "two words"}, []string{`--destination "two words"`, "printable ASCII without spaces"}},
		{"max attempts", []string{"worker", "--max-attempts", "0"}, []string{"--max-attempts 0", "at least 1"}},
		{"batch size", []string{"relay", "--batch-size", "-3"}, []string{"--batch-size -3"}},
		{"log format", []string{"migrate", "--log-format", "xml"}, []string{"--log-format", "text or json"}},
		{"log level", []string{"migrate", "--log-level", "loud"}, []string{"--log-level"}},
		{"unknown flag", []string{"api", "--no-such-flag"}, []string{"no-such-flag"}},
		{"not a duration", []string{"relay", "--poll-interval", "soon"}, []string{"poll-interval"}},
		{"stray argument", []string{"api", "extra"}, []string{`unexpected argument "extra"`}},
		{"purge without --yes", []string{"dlq", "purge", "--all"}, []string{"add --yes", "every message", "notifications.send"}},
		{"purge ids without --yes", []string{"dlq", "purge", "--id", "1,2"}, []string{"add --yes", "2 given message(s)"}},
		{"purge without selection", []string{"dlq", "purge", "--yes"}, []string{"--id ID", "--all"}},
		{"replay id and all", []string{"dlq", "replay", "--id", "7", "--all"}, []string{"not both"}},
		{"list format", []string{"dlq", "list", "--format", "xml"}, []string{"--format", "table or json"}},
		{"demo missing file", []string{"demo", "--file", "/no/such/file.ndjson"}, []string{"--file", "no such file"}},
		{"demo clients", []string{"demo", "--clients", "0"}, []string{"--clients 0"}},
		{"unknown command", []string{"fly"}, []string{`no command "fly"`}},
		{"replay without --since", []string{"replay"}, []string{"replay: missing required flag --since; for example: ferry replay --since 90m"}},
		{"bench-child without its flags", []string{"bench-child", "--broker", "nats"}, []string{"missing required flag(s) --role, --database-url, --exchange"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := run(t, tc.args...)
			require.Equal(t, 2, code, "stderr: %s", errOut)
			for _, w := range tc.want {
				require.Contains(t, errOut, w)
			}
			// One line on stderr, no help page on stdout.
			require.Equal(t, 1, strings.Count(strings.TrimSpace(errOut), "\n")+1, "stderr: %s", errOut)
			require.NotContains(t, out, "USAGE:")
			require.NotContains(t, errOut, "panic")
		})
	}
}

func TestBrokerFromEnv(t *testing.T) {
	t.Setenv("FERRY_BROKER", "kafak")
	code, _, errOut := run(t, "relay")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `--broker "kafak": want one of: kafka, nats, rabbitmq, sqs`)
}

func TestBrokersMap(t *testing.T) {
	require.Contains(t, ferrycli.BrokerNames(), "rabbitmq")
	require.Equal(t, []string{"kafka", "nats", "rabbitmq", "sqs"}, ferrycli.BrokerNames())
	_, err := ferrycli.OpenBroker(context.Background(), "", ferrycli.BrokerOptions{})
	require.ErrorIs(t, err, ferrycli.ErrUnknownBroker)
}

func TestHelp(t *testing.T) {
	code, out, _ := run(t, "--help")
	require.Equal(t, 0, code)
	for _, c := range []string{"migrate", "api", "relay", "worker", "run", "demo", "dlq", "outbox"} {
		require.Contains(t, out, c)
	}
	code, out, _ = run(t, "demo", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "FERRY_DATABASE_URL")
	require.Contains(t, out, "embedded")
}

// A configuration a package refuses is a command-line error too (exit 2),
// naming the flag (the CLI checks it before connecting).
func TestConfigErrorExit2(t *testing.T) {
	db := testenv.NewDatabase(t)
	code, _, errOut := run(t, "migrate", "--database-url", db)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = run(t, "worker", "--database-url", db, "--smtp-addr", "nohost")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, `ferry: usage: --smtp-addr "nohost": want host:port`)
	code, _, errOut = run(t, "worker", "--database-url", db, "--rabbitmq-queue-type", "stream")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, `--rabbitmq-queue-type "stream": want classic or quorum`)
	code, _, errOut = run(t, "api", "--database-url", "postgres://ferry:ferry@127.0.0.1:1/none?connect_timeout=2")
	require.Equal(t, 1, code, "an unreachable database is not a usage error")
	require.Contains(t, errOut, "ferry: database")
}
