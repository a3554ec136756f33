package ferrycli_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
)

// runBinaryEnv runs the ferry binary with args in childEnv plus env
// (KEY=value), before binaryDeadline, and returns its exit code, stdout
// and stderr.
func runBinaryEnv(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), binaryDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(childEnv(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	_ = cmd.Run()
	require.NoError(t, ctx.Err(), "ferry %v still running after %v; stderr:\n%s", args, binaryDeadline, errOut.String())
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// cliCase is a run of the binary that must fail with code and the first
// line of stderr exactly first.
type cliCase struct {
	env   []string
	args  []string
	code  int
	first string
}

func checkCases(t *testing.T, cases []cliCase) {
	t.Helper()
	for _, tc := range cases {
		code, out, errOut := runBinaryEnv(t, tc.env, tc.args...)
		require.Equal(t, tc.code, code, "ferry %v %v: stderr %s", tc.env, tc.args, errOut)
		require.Equal(t, tc.first, firstLine(errOut), "ferry %v %v", tc.env, tc.args)
		require.Empty(t, out, "ferry %v %v prints nothing on stdout", tc.env, tc.args)
	}
}

// An empty value of a flag where empty means nothing is refused, naming
// the flag and what is wanted, on the command line and in the
// environment; it used to select the default (an empty --addr listened
// on a random port of every interface, an empty --queue consumed
// notifications.send, an empty --nats-url dialled 127.0.0.1:4222).
func TestEmptyFlagValuesRefused(t *testing.T) {
	const anyIface = "want host:port; 0.0.0.0:PORT listens on every interface"
	const consoleAddr = "want host:port (port 0: a free port, printed) or off; 0.0.0.0:PORT listens on every interface"
	checkCases(t, []cliCase{
		{nil, []string{"api", "--addr", ""}, 2, `ferry: usage: --addr "": ` + anyIface},
		{nil, []string{"run", "--addr="}, 2, `ferry: usage: --addr "": ` + anyIface},
		{[]string{"FERRY_ADDR="}, []string{"api"}, 2, `ferry: usage: --addr "": ` + anyIface + " ($FERRY_ADDR is set to it)"},
		{nil, []string{"worker", "--queue="}, 2, `ferry: usage: --queue "": want a queue name: letters, digits, '-', '_' or '.'`},
		{[]string{"FERRY_QUEUE="}, []string{"worker"}, 2,
			`ferry: usage: --queue "": want a queue name: letters, digits, '-', '_' or '.' ($FERRY_QUEUE is set to it)`},
		{nil, []string{"dlq", "list", "--queue", ""}, 2, `ferry: usage: --queue "": want a queue name: letters, digits, '-', '_' or '.'`},
		{nil, []string{"relay", "--exchange="}, 2, `ferry: usage: --exchange "": want an exchange name: letters, digits, '-', '_' or '.'`},
		{nil, []string{"relay", "--kafka-brokers="}, 2, `ferry: usage: --kafka-brokers "": want a comma list of host:port such as 127.0.0.1:9092`},
		{nil, []string{"relay", "--kafka-brokers", " , "}, 2, `ferry: usage: --kafka-brokers " , ": want a comma list of host:port such as 127.0.0.1:9092`},
		{nil, []string{"relay", "--rabbitmq-url="}, 2, `ferry: usage: --rabbitmq-url "": want an amqp:// URL such as amqp://guest:guest@127.0.0.1:5672/`},
		{nil, []string{"relay", "--broker", "nats", "--nats-url", ""}, 2, `ferry: usage: --nats-url "": want a nats:// URL such as nats://127.0.0.1:4222`},
		{nil, []string{"relay", "--broker="}, 2, `ferry: usage: --broker "": want one of: kafka, nats, rabbitmq, sqs`},
		{nil, []string{"worker", "--rabbitmq-queue-type="}, 2, `ferry: usage: --rabbitmq-queue-type "": want classic or quorum`},
		{nil, []string{"migrate", "--database-url="}, 2, `ferry: usage: --database-url "": want a PostgreSQL URL, postgres://user:password@host:port/database`},
		{nil, []string{"demo", "--smtp-addr="}, 2, `ferry: usage: --smtp-addr "": want host:port`},
		// The console's address: empty listened on every interface.
		{nil, []string{"run", "--console-addr="}, 2, `ferry: usage: --console-addr "": ` + consoleAddr},
		{[]string{"FERRY_CONSOLE_ADDR="}, []string{"demo"}, 2, `ferry: usage: --console-addr "": ` + consoleAddr + " ($FERRY_CONSOLE_ADDR is set to it)"},
		// ferry console's --addr is --console-addr: FERRY_CONSOLE_ADDR, not the API's FERRY_ADDR.
		{[]string{"FERRY_CONSOLE_ADDR="}, []string{"console"}, 2, `ferry: usage: --console-addr "": ` + consoleAddr + " ($FERRY_CONSOLE_ADDR is set to it)"},
		{nil, []string{"console", "--addr="}, 2, `ferry: usage: --console-addr "": ` + consoleAddr},
		{[]string{"FERRY_RELAY_MODE="}, []string{"relay"}, 2, `ferry: usage: --relay-mode "": want poll or wal ($FERRY_RELAY_MODE is set to it)`},
	})
	code, out, errOut := runBinaryEnv(t, nil, "api", "--help")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, strings.Join(strings.Fields(out), " "), "listens on every interface, an empty value is refused")
}

// A flag value the notification service, the relay or the flag package
// would refuse is a usage error naming the flag (--name, as the help
// shows it) and what is wanted, with the range in the help; they used to
// name a Config field (BatchSize, SMTPAddr, Exchange/Queue) or say
// "parse error" for -poll-interval.
func TestFlagValueErrorsNameTheFlag(t *testing.T) {
	checkCases(t, []cliCase{
		{nil, []string{"relay", "--batch-size", "1000000"}, 2, "ferry: usage: --batch-size 1000000: want 1..10000"},
		{nil, []string{"worker", "--smtp-addr", "nohostport"}, 2, `ferry: usage: --smtp-addr "nohostport": want host:port such as 127.0.0.1:1025`},
		{nil, []string{"worker", "--smtp-addr", "127.0.0.1:0"}, 2, `ferry: usage: --smtp-addr "127.0.0.1:0": port must be 1..65535`},
		{nil, []string{"api", "--addr", "3000"}, 2, `ferry: usage: --addr "3000": want host:port; 0.0.0.0:PORT listens on every interface`},
		// Refused before any server starts (the demo used to start its
		// embedded servers, run its API, then fail to listen: exit 1).
		{nil, []string{"demo", "--console-addr", "nonsense"}, 2,
			`ferry: usage: --console-addr "nonsense": want host:port (port 0: a free port, printed) or off; 0.0.0.0:PORT listens on every interface`},
		{nil, []string{"run", "--console-addr", "127.0.0.1:99999"}, 2,
			`ferry: usage: --console-addr "127.0.0.1:99999": want host:port (port 0: a free port, printed) or off; 0.0.0.0:PORT listens on every interface`},
		{nil, []string{"console", "--addr", "127.0.0.1:99999"}, 2,
			`ferry: usage: --console-addr "127.0.0.1:99999": want host:port (port 0: a free port, printed) or off; 0.0.0.0:PORT listens on every interface`},
		{nil, []string{"relay", "--exchange", "bad name with spaces"}, 2,
			`ferry: usage: --exchange "bad name with spaces": want letters, digits, '-', '_' or '.'`},
		{nil, []string{"worker", "--queue", "a/b"}, 2, `ferry: usage: --queue "a/b": want letters, digits, '-', '_' or '.'`},
		{nil, []string{"relay", "--poll-interval", "fast"}, 2,
			`ferry: usage: relay: --poll-interval "fast": want a Go duration such as 500ms, 30s or 5m (see ferry relay --help)`},
		{nil, []string{"worker", "--prefetch", "ten"}, 2, `ferry: usage: worker: --prefetch "ten": want a whole number (see ferry worker --help)`},
		{nil, []string{"api", "--rabbitmq-url", "x"}, 2, "ferry: usage: api: flag provided but not defined: --rabbitmq-url (see ferry api --help)"},
		{nil, []string{"relay", "--queue"}, 2, "ferry: usage: relay: flag needs an argument: --queue (see ferry relay --help)"},
		{nil, []string{"--nosuch"}, 2, "ferry: usage: flag provided but not defined: --nosuch"},
	})
	code, out, errOut := runBinaryEnv(t, nil, "relay", "--help")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, strings.Join(strings.Fields(out), " "), "outbox rows published per relay transaction, 1..10000")
}

// A --handler-timeout RabbitMQ's consumer_timeout (30m) contradicts is
// the worker's only error, a usage error printed before it logs that it
// runs (it used to follow an INFO "worker running" line).
func TestHandlerTimeoutRefusedBeforeWorkerRuns(t *testing.T) {
	db := migratedDatabase(t)
	name := testenv.UniqueName("htfirst")
	t.Cleanup(func() { deleteRabbitTopology(t, name, name+".work") })
	code, _, errOut := runBinaryEnv(t, nil, "worker", "--database-url", db, "--broker", "rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(),
		"--exchange", name, "--queue", name+".work", "--smtp-addr", testenv.SMTPAddr(), "--metrics-addr", "127.0.0.1:0", "--handler-timeout", "31m")
	require.Equal(t, 2, code, errOut)
	require.NotContains(t, errOut, "worker running")
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	last := lines[len(lines)-1]
	require.True(t, strings.HasPrefix(last, "ferry: usage: "), "the line Main prints: %s", last)
	require.Contains(t, last, "--handler-timeout")
	require.Contains(t, last, "consumer_timeout")
	for _, l := range lines[:len(lines)-1] {
		require.NotContains(t, l, "level=ERROR", "one error line: %s", errOut)
	}
}

// An unknown subcommand of dlq, outbox or help is reported like an
// unknown command (it was "No help topic for 'nosuch'").
func TestUnknownSubcommand(t *testing.T) {
	checkCases(t, []cliCase{
		{nil, []string{"dlq", "nosuch"}, 2, `ferry: usage: no command "dlq nosuch"; run ferry dlq --help`},
		{nil, []string{"dlq", "help", "nosuch"}, 2, `ferry: usage: no command "dlq nosuch"; run ferry dlq --help`},
		{nil, []string{"outbox", "nosuch"}, 2, `ferry: usage: no command "outbox nosuch"; run ferry outbox --help`},
		{nil, []string{"help", "nosuch"}, 2, `ferry: usage: no command "nosuch"; run ferry --help`},
		{nil, []string{"nosuch"}, 2, `ferry: usage: no command "nosuch"; run ferry --help`},
	})
	for _, args := range [][]string{{"dlq"}, {"outbox"}, {"help", "dlq"}, {"dlq", "help", "list"}} {
		code, out, errOut := runBinaryEnv(t, nil, args...)
		require.Equal(t, 0, code, "ferry %v: %s", args, errOut)
		require.Contains(t, out, "NAME:", "ferry %v", args)
	}
}

// A dlq or outbox command given an ID it cannot act on fails (exit 1)
// with no result line on stdout ("replayed 0 message(s)" used to come
// first); the error says what was done to the other IDs.
func TestFailingCommandsPrintNoResult(t *testing.T) {
	base := testenv.UniqueName("cli-nores")
	tp := broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{
		Name: base + ".work", Bindings: []string{"notification.requested"}, RetryDelays: []time.Duration{30 * time.Second}}}}
	q := tp.Queues[0].Name
	t.Cleanup(func() { deleteRabbit(t, tp.Exchange, rabbitQueues(q)...) })
	deadLetters(t, rabbitBroker(t), tp, "m1", "m2")
	dlqNot := "1 of 1 requested ID(s) not in the DLQ " + q + `.dlq (RabbitMQ queue "` + q + `.dlq"): 999999`
	db := migratedDatabase(t)
	checkCases(t, []cliCase{
		{nil, append([]string{"dlq", "replay", "--id", "999999"}, rabbitArgs(q)...), 1, "ferry: dlq replay: " + dlqNot + "; nothing replayed"},
		{nil, append([]string{"dlq", "replay", "--id", "999999", "--dry-run"}, rabbitArgs(q)...), 1, "ferry: dlq replay: " + dlqNot + "; dry run: nothing replayed"},
		{nil, append([]string{"dlq", "purge", "--id", "999999", "--yes"}, rabbitArgs(q)...), 1, "ferry: dlq purge: " + dlqNot + "; nothing purged"},
		{nil, []string{"outbox", "retry", "--database-url", db, "--id", "999999"}, 1,
			"ferry: outbox retry: 1 of 1 id(s) are not parked rows (no unprocessed row with failed attempts): 999999; see ferry outbox stats; nothing made due now"},
		{nil, []string{"outbox", "drop", "--database-url", db, "--id", "999999", "--yes"}, 1,
			"ferry: outbox drop: 1 of 1 id(s) are not parked rows (no unprocessed row with failed attempts): 999999; see ferry outbox stats; nothing dropped"},
	})
	// Partly done: the error names what was done, stdout stays empty.
	code, out, errOut := runBinaryEnv(t, nil, append([]string{"dlq", "replay", "--id", "m1,999999", "--log-level", "error"}, rabbitArgs(q)...)...)
	require.Equal(t, 1, code, errOut)
	require.Empty(t, out)
	require.Equal(t, "ferry: dlq replay: 1 of 2 requested ID(s) not in the DLQ "+q+`.dlq (RabbitMQ queue "`+q+`.dlq"): 999999; the other 1 replayed to `+q+": m1", firstLine(errOut))
}
