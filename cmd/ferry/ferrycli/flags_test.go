package ferrycli_test

import (
	"bytes"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/testenv"
)

// Flag sets shared by the declarations below.
var (
	logFlagNames    = []string{"log-format", "log-level"}
	brokerConnNames = []string{"broker", "rabbitmq-url", "rabbitmq-queue-type", "nats-url", "kafka-brokers", "sqs-endpoint", "aws-region"}
	topologyNames   = []string{"exchange", "queue", "retry-delay"}
	// The adapters' settings the worker's start-up check compares with
	// its own: declared with the queue (relay too), or read only by the
	// worker's check.
	redriveNames     = []string{"sqs-max-receive-count"}
	brokerLimitNames = []string{"rabbitmq-management-url", "rabbitmq-consumer-timeout", "sqs-max-receive-count"}
	metricsNames     = []string{"metrics-addr", "otlp-endpoint"}
	alertNames       = []string{"alert-threshold", "alert-for", "alert-interval", "alert-webhook-url",
		"alert-telegram-token", "alert-telegram-chat-id", "alert-telegram-api-url"}
	relayNames   = []string{"batch-size", "poll-interval", "relay-mode", "wal-slot", "retention"}
	workerNames  = []string{"max-attempts", "prefetch", "concurrency", "handler-timeout", "worker-batch-size", "worker-batch-linger"}
	smtpNames    = []string{"smtp-addr", "smtp-timeout", "smtp-data-timeout"}
	consoleNames = []string{"console-addr", "console-token", "console-read-only"}
	benchBroker  = []string{"rabbitmq-url", "nats-url", "kafka-brokers", "sqs-endpoint", "aws-region"}
)

func names(sets ...[]string) []string {
	var out []string
	for _, s := range sets {
		out = append(out, s...)
	}
	return out
}

// usedFlags declares, per command, the flags it uses: each changes what
// the command does (where it connects, what it declares, how it runs or
// logs). A flag a command lists must be here, and a flag of ferry that is
// not here for a command must be refused by it.
var usedFlags = map[string][]string{
	"migrate": names([]string{"database-url"}, logFlagNames),
	// The API only writes the outbox: no broker, topology or SMTP flags
	// (--destination names the outbox it writes).
	"api": names([]string{"database-url", "destination", "addr", "debug-fail-after-outbox", "shutdown-timeout"}, metricsNames, logFlagNames),
	"relay": names([]string{"database-url", "destination"}, brokerConnNames, redriveNames, topologyNames, relayNames, []string{"shutdown-timeout"},
		metricsNames, alertNames, logFlagNames),
	"worker": names([]string{"database-url"}, brokerConnNames, brokerLimitNames, topologyNames, workerNames, smtpNames, []string{"shutdown-timeout"},
		metricsNames, logFlagNames),
	"run": names([]string{"database-url", "destination"}, brokerConnNames, brokerLimitNames, topologyNames, []string{"addr", "debug-fail-after-outbox"}, relayNames,
		workerNames, smtpNames, []string{"shutdown-timeout", "data-dir"}, metricsNames, alertNames, consoleNames, logFlagNames),
	"demo": names([]string{"database-url", "destination"}, brokerConnNames, brokerLimitNames, topologyNames, relayNames, workerNames, smtpNames,
		[]string{"shutdown-timeout", "data-dir"}, logFlagNames, consoleNames, []string{"console-hold", "file", "timeout", "clients"}),
	"console":          names([]string{"database-url", "console-addr", "console-token", "console-read-only", "shutdown-timeout"}, brokerConnNames, []string{"exchange", "queue"}, logFlagNames),
	"dlq":              nil,
	"dlq list":         names(brokerConnNames, []string{"exchange", "queue"}, logFlagNames, []string{"limit", "error-contains", "app-id", "format"}),
	"dlq replay":       names(slices.DeleteFunc(slices.Clone(brokerConnNames), isQueueType), []string{"exchange", "queue"}, logFlagNames, []string{"id", "all", "dry-run"}),
	"dlq purge":        names(slices.DeleteFunc(slices.Clone(brokerConnNames), isQueueType), []string{"exchange", "queue"}, logFlagNames, []string{"id", "all", "yes"}),
	"replay":           names(slices.DeleteFunc(slices.Clone(brokerConnNames), isQueueType), []string{"queue"}, logFlagNames, []string{"since"}),
	"outbox":           nil,
	"outbox stats":     names([]string{"database-url"}, logFlagNames, []string{"format"}),
	"outbox retry":     names([]string{"database-url"}, logFlagNames, []string{"id"}),
	"outbox drop":      names([]string{"database-url"}, logFlagNames, []string{"id", "yes"}),
	"outbox wal-reset": names([]string{"database-url", "destination", "wal-slot", "yes"}, logFlagNames),
	"jobs":             nil,
	"jobs get":         names([]string{"database-url"}, logFlagNames, []string{"app-id", "format"}),
	"jobs list":        names([]string{"database-url"}, logFlagNames, []string{"state", "type", "limit", "format"}),
	"jobs cancel":      names([]string{"database-url"}, logFlagNames, []string{"app-id", "yes"}),
	"jobs workflow":    names([]string{"database-url"}, logFlagNames, []string{"format"}),
	"bench": names([]string{"brokers", "scenarios", "messages", "size", "rate", "workers", "out", "database-url",
		"restart-broker", "peer-dir", "sqs-latency", "soak-duration", "soak-fault-every"}, benchBroker, []string{"cluster-script", "rabbitmq-cluster-url",
		"rabbitmq-cluster-management-url", "kafka-cluster-brokers", "nats-cluster-url"}, []string{"data-dir"}, logFlagNames),
	"bench-child": names(benchBroker, []string{"role", "database-url", "broker", "exchange", "workers", "stats-file"}, logFlagNames),
	"version":     nil,
	"help":        nil,
}

func isQueueType(s string) bool { return s == "rabbitmq-queue-type" }

// commands returns every command of the ferry app by its path ("dlq
// list"), and every flag name any command has.
func commands(t *testing.T) (map[string]*cli.Command, []string) {
	t.Helper()
	app := ferrycli.NewApp(io.Discard, io.Discard)
	// urfave/cli adds the help command when the app runs; run it once.
	require.NoError(t, app.Run([]string{"ferry", "--help"}))
	cmds := map[string]*cli.Command{}
	all := map[string]bool{}
	var walk func(prefix string, cs []*cli.Command)
	walk = func(prefix string, cs []*cli.Command) {
		for _, c := range cs {
			path := strings.TrimSpace(prefix + " " + c.Name)
			cmds[path] = c
			for _, f := range c.Flags {
				if n := f.Names()[0]; n != "help" {
					all[n] = true
				}
			}
			walk(path, c.Subcommands)
		}
	}
	walk("", app.Commands)
	var flags []string
	for n := range all {
		flags = append(flags, n)
	}
	sort.Strings(flags)
	return cmds, flags
}

// TestEveryListedFlagIsUsed: each command lists exactly the flags declared
// in usedFlags (api lists no broker flag, migrate and outbox none of the
// demo's), its help shows exactly those, and every other flag of ferry is
// refused by it with a usage error (exit 2) naming the flag.
func TestEveryListedFlagIsUsed(t *testing.T) {
	cmds, all := commands(t)
	var paths []string
	for p := range cmds {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, path := range paths {
		t.Run(path, func(t *testing.T) {
			want, declared := usedFlags[path]
			require.True(t, declared, "declare the flags of %q in usedFlags", path)
			var got []string
			for _, f := range cmds[path].Flags {
				if n := f.Names()[0]; n != "help" {
					got = append(got, n)
				}
			}
			require.ElementsMatch(t, want, got, "flags of ferry %s", path)
			if path == "help" {
				return
			}

			code, out, errOut := run(t, append(strings.Fields(path), "--help")...)
			require.Equal(t, 0, code, errOut)
			require.ElementsMatch(t, append(slices.Clone(want), "help"), helpFlagNames(out), "help of ferry %s:\n%s", path, out)

			var aliases []string // another spelling of a used flag (console's --addr)
			for _, f := range cmds[path].Flags {
				aliases = append(aliases, f.Names()[1:]...)
			}
			for _, name := range all {
				if slices.Contains(want, name) || slices.Contains(aliases, name) {
					continue
				}
				code, _, errOut := run(t, append(strings.Fields(path), "--"+name, "x")...)
				require.Equal(t, 2, code, "ferry %s --%s must be refused: %s", path, name, errOut)
				require.Contains(t, firstLine(errOut), "flag provided but not defined: --"+name, "ferry %s --%s", path, name)
			}
		})
	}
}

// helpFlagNames are the flag names a help page lists (lines "   --name").
func helpFlagNames(help string) []string {
	var out []string
	for _, l := range strings.Split(help, "\n") {
		if rest, ok := strings.CutPrefix(l, "   --"); ok {
			out = append(out, strings.FieldsFunc(rest, func(r rune) bool { return r == ' ' || r == ',' })[0])
		}
	}
	return out
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// TestHelpFits100Columns: no line of any help page (the app's, every
// command's, `ferry help`) is wider than 100 columns, whatever the flags
// (a repeatable flag used to widen every line past 300).
func TestHelpFits100Columns(t *testing.T) {
	cmds, _ := commands(t)
	pages := [][]string{{"--help"}, {"help"}, {"help", "relay"}}
	for path := range cmds {
		pages = append(pages, append(strings.Fields(path), "--help"))
	}
	for _, args := range pages {
		code, out, errOut := run(t, args...)
		require.Equal(t, 0, code, "ferry %v: %s", args, errOut)
		require.NotEmpty(t, out, "ferry %v", args)
		for _, l := range strings.Split(out, "\n") {
			require.LessOrEqual(t, len([]rune(l)), ferrycli.HelpWidth, "ferry %s: line too wide:\n%s", strings.Join(args, " "), l)
		}
	}
}

// TestHelpSaysWhatTheCommandDoes: the usage text is the command's own.
// demo and run say that they start embedded servers without
// --database-url, --broker and --smtp-addr (not a 5432 URL and rabbitmq
// as defaults); the other commands do not mention the embedded servers;
// no command carries another's "(demo: warn unless given)".
func TestHelpSaysWhatTheCommandDoes(t *testing.T) {
	helpOf := func(args ...string) string { // with the lines joined
		code, out, errOut := run(t, append(args, "--help")...)
		require.Equal(t, 0, code, errOut)
		return strings.Join(strings.Fields(out), " ")
	}
	for _, c := range []string{"demo", "run"} {
		out := helpOf(c)
		require.Contains(t, out, "default: an embedded PostgreSQL in this process", c)
		require.Contains(t, out, "default: nats: an embedded NATS JetStream server in this process", c)
		require.Contains(t, out, "default: a built-in SMTP sink in this process", c)
		require.Contains(t, out, "without --data-dir counts and discards it", c) // what the demo summary says then
		require.NotContains(t, out, "127.0.0.1:5432", c)
		require.NotContains(t, out, `(default: "rabbitmq")`, c)
	}
	for _, args := range [][]string{{"migrate"}, {"api"}, {"relay"}, {"worker"}, {"outbox", "stats"}, {"dlq", "list"}, {"replay"}} {
		out := helpOf(args...)
		require.NotContains(t, out, "embedded", args)
		require.NotContains(t, out, "demo:", args)
	}
	require.Contains(t, helpOf("demo"), `log level: debug, info, warn or error (default: "warn")`)
	require.Contains(t, helpOf("relay"), `log level: debug, info, warn or error (default: "info")`)
}

// The listen addresses default to loopback like every other address of
// ferry; 0.0.0.0 must be asked for.
func TestListenDefaultsAreLoopback(t *testing.T) {
	for _, addr := range []string{ferrycli.DefaultAddr, ferrycli.DefaultRelayMetricsAddr, ferrycli.DefaultWorkerMetricsAddr, ferrycli.DefaultConsoleAddr} {
		host, _, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		require.True(t, net.ParseIP(host).IsLoopback(), "%s listens beyond loopback", addr)
	}
}

// runBinary runs ferry as its own process: the test binary, which runs
// Main instead of the tests under FERRY_TEST_RUN_MAIN=1 (TestMain), with
// stdout and stderr that are not terminals.
func runBinary(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "FERRY_TEST_RUN_MAIN=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil {
		require.ErrorAs(t, err, &ee, "running ferry %v", args)
		return ee.ExitCode(), out.String(), errOut.String()
	}
	return 0, out.String(), errOut.String()
}

// TestBinaryFlagsHelpVersion runs the binary: flags a command does not
// use are refused with exit 2 and a one-line error naming them; help and
// version exit 0; a --database-url of another scheme names the scheme,
// shows the URL with only the password hidden, and says what is wanted.
func TestBinaryFlagsHelpVersion(t *testing.T) {
	cases := []struct {
		args      []string
		code      int
		firstErr  string // the first line of stderr, exactly ("" for none)
		outPrefix string
	}{
		{[]string{"api", "--rabbitmq-url", "amqp://guest:guest@127.0.0.1:1/"}, 2,
			"ferry: usage: api: flag provided but not defined: --rabbitmq-url (see ferry api --help)", ""},
		{[]string{"api", "--broker", "nats"}, 2, "ferry: usage: api: flag provided but not defined: --broker (see ferry api --help)", ""},
		{[]string{"api", "--retry-delay", "1s"}, 2, "ferry: usage: api: flag provided but not defined: --retry-delay (see ferry api --help)", ""},
		{[]string{"migrate", "--smtp-addr", "127.0.0.1:25"}, 2, "ferry: usage: migrate: flag provided but not defined: --smtp-addr (see ferry migrate --help)", ""},
		{[]string{"dlq", "list", "--retry-delay", "1s"}, 2, "ferry: usage: dlq list: flag provided but not defined: --retry-delay (see ferry dlq list --help)", ""},
		{[]string{"replay", "--since", "1m", "--rabbitmq-queue-type", "quorum"}, 2,
			"ferry: usage: replay: flag provided but not defined: --rabbitmq-queue-type (see ferry replay --help)", ""},
		{[]string{"help"}, 0, "", "NAME:\n   ferry - "},
		{[]string{"help", "relay"}, 0, "", "NAME:\n   ferry relay - "},
		{[]string{"dlq", "help", "list"}, 0, "", "NAME:\n   ferry dlq list - "},
		{[]string{"version"}, 0, "", "ferry "},
		{[]string{"--version"}, 0, "", "ferry "},
		{[]string{"help", "fly"}, 2, `ferry: usage: no command "fly"; run ferry --help`, ""},
		{[]string{"migrate", "--database-url", "mysql://x@127.0.0.1/db"}, 2,
			`ferry: usage: --database-url "mysql://x@127.0.0.1/db": scheme "mysql": want a PostgreSQL URL, postgres://user:password@host:port/database`, ""},
		{[]string{"migrate", "--database-url", "mysql://x:s3cret@127.0.0.1/db"}, 2,
			`ferry: usage: --database-url "mysql://x:xxxxx@127.0.0.1/db": scheme "mysql": want a PostgreSQL URL, postgres://user:password@host:port/database`, ""},
		{[]string{"migrate", "--database-url", "postgres://u:s3cret@127.0.0.1:99999/x"}, 2,
			`ferry: usage: --database-url "postgres://u:xxxxx@127.0.0.1:99999/x": invalid port; want a PostgreSQL URL, postgres://user:password@host:port/database`, ""},
		{[]string{"migrate", "--database-url", "host=db password=s3cret port=zz"}, 2,
			`ferry: usage: --database-url "host=db password=xxxxx port=zz": invalid port; want a PostgreSQL URL, postgres://user:password@host:port/database`, ""},
	}
	for _, tc := range cases {
		code, out, errOut := runBinary(t, tc.args...)
		require.Equal(t, tc.code, code, "ferry %v: stderr %s", tc.args, errOut)
		require.Equal(t, tc.firstErr, firstLine(errOut), "ferry %v", tc.args)
		require.NotContains(t, errOut, "s3cret", "ferry %v", tc.args)
		if tc.outPrefix != "" {
			require.True(t, strings.HasPrefix(out, tc.outPrefix), "ferry %v: stdout %q", tc.args, out)
		}
	}
	_, v1, _ := runBinary(t, "version")
	_, v2, _ := runBinary(t, "--version")
	require.Equal(t, v1, v2)
	require.Equal(t, ferrycli.VersionLine()+"\n", v1)
}

// TestBinaryDemoDrawsNoBarWhenNotATerminal: with stdout a pipe, the demo
// prints its lines and summary but no progress bar (no bar glyphs, no
// carriage returns); it used to print a bar line every 2 s.
func TestBinaryDemoDrawsNoBarWhenNotATerminal(t *testing.T) {
	input := filepath.Join(t.TempDir(), "two.ndjson")
	require.NoError(t, os.WriteFile(input, []byte(
		`{"user_id":"u1","channel":"email","to":"a@example.com","subject":"s","body":"b"}`+"\n"+
			`{"user_id":"u2","channel":"email","to":"b@example.com","subject":"s","body":"b"}`+"\n"), 0o644))
	code, out, errOut := runBinary(t, "demo", "--file", input,
		"--database-url", testenv.NewDatabase(t), "--broker", "rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(),
		"--exchange", testenv.UniqueName("demo-ex"), "--queue", testenv.UniqueName("demo-q"), "--retry-delay", "1s",
		"--smtp-addr", testenv.SMTPAddr(), "--timeout", "2m")
	require.Equal(t, 0, code, "stdout %s\nstderr %s", out, errOut)
	require.Equal(t, "", firstLine(errOut))
	require.Contains(t, out, "ferry demo: summary")
	require.Contains(t, out, "OK: all ")
	require.NotContains(t, out, "█")
	require.NotContains(t, out, "░")
	require.NotContains(t, out, "\r")
}

// TestGoRunVersionSaysHowToGetTheCommit: `go run ./cmd/ferry version`,
// as a new user types it in a clean clone, records no commit; it says so
// and how to get it, and a binary built by go build in the checkout
// names the commit.
func TestGoRunVersionSaysHowToGetTheCommit(t *testing.T) {
	root := testenv.RepoRoot()
	cmd := exec.Command("go", "run", "./cmd/ferry", "version")
	cmd.Dir = root
	out, err := cmd.Output()
	require.NoError(t, err)
	require.Contains(t, string(out), "no VCS information")
	require.Contains(t, string(out), "make build && ./ferry version")

	bin := filepath.Join(t.TempDir(), "ferry")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./cmd/ferry") // as make build: GOFLAGS may say -buildvcs=false
	build.Dir = root
	b, err := build.CombinedOutput()
	require.NoError(t, err, "%s", b)
	out, err = exec.Command(bin, "version").Output()
	require.NoError(t, err)
	head, err := exec.Command("git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	require.NoError(t, err)
	require.Contains(t, string(out), "revision "+strings.TrimSpace(string(head)))
}
