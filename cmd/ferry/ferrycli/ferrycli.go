// Package ferrycli is the ferry command: its flags, its commands and the
// explicit map from --broker name to adapter constructor (Brokers).
// cmd/ferry/main.go only calls Main, so the whole command can be run and
// tested in-process with any arguments.
//
// Commands: migrate, api, relay, worker, run (api+relay+worker in one
// process), demo, dlq list|replay|purge, replay --since (brokers with the
// Replay capability: Kafka), outbox stats|retry|drop, jobs get|list|cancel
// (find, inspect and cancel a job), console (the web console of package
// console; run and demo serve it too, on --console-addr), bench (the broker comparison
// of package bench/suite), version and help. A flag can also be set by an environment
// variable (docs/flags.md states the rule, and readme_test.go
// checks it): FERRY_<FLAG_NAME> (for example --database-url and
// FERRY_DATABASE_URL), FERRY_DEMO_<FLAG_NAME> and FERRY_BENCH_<FLAG_NAME>
// for the flags of demo and bench alone (--file, --timeout, --clients;
// --brokers, --messages, ...), and none for the flags that pick the
// messages or rows a dlq, outbox, jobs or replay command acts on, or
// confirm it (--id, --all, --yes, --dry-run, --since, --limit,
// --error-contains, --app-id, --state, --type). Their --queue and --exchange read FERRY_QUEUE and
// FERRY_EXCHANGE, as the worker's do: the queue of that environment.
//
// Each command takes only the flags it uses (api none of the broker's: it
// only writes the outbox) and refuses the others with a usage error; its
// help (help.go) fits HelpWidth columns. Every listen address defaults to
// loopback.
//
// demo, run and bench start embedded servers for what the flags leave out
// (bench: PostgreSQL, and NATS when --brokers is not given):
// PostgreSQL (github.com/fergusstrange/embedded-postgres, binaries
// downloaded once into ~/.embedded-postgres-go) without --database-url,
// NATS JetStream without --broker and --nats-url, and an in-process SMTP
// sink without --smtp-addr. The other commands use the flags' defaults
// (RabbitMQ, PostgreSQL and SMTP on 127.0.0.1).
package ferrycli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"regexp"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// Main runs the ferry command with args (args[0] is the program name),
// writing output to stdout and errors and logs to stderr, and returns the
// exit code: 0 on success (also after a graceful stop by ctx, e.g. on
// SIGINT/SIGTERM), 2 for a command-line error (see isUsageError), 1 for
// any other error.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := NewApp(stdout, stderr)
	err := a.RunContext(ctx, args)
	if e, ok := a.Metadata[helpTopicKey].(error); ok && err == nil {
		err = e
	}
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		if isUsageError(err) {
			return 2
		}
		return 1
	}
	return 0
}

// cmdName is the running command's name after "ferry", e.g. "dlq list".
func cmdName(c *cli.Context) string {
	if c.Command == nil {
		return ""
	}
	if name := strings.TrimPrefix(c.Command.HelpName, "ferry "); name != "" {
		return name
	}
	return c.Command.Name
}

// isUsageError reports whether err is about the command line: ErrUsage, an
// unknown or unavailable broker, a configuration a package refused
// (app, outbox, worker, a broker adapter's Config), or a flag urfave/cli
// could not parse.
func isUsageError(err error) bool {
	for _, target := range []error{ErrUsage, ErrUnknownBroker, app.ErrConfig, outbox.ErrInvalidConfig, worker.ErrInvalidConfig, broker.ErrInvalidConfig} {
		if errors.Is(err, target) {
			return true
		}
	}
	return isFlagError(err)
}

// isFlagError reports whether err comes from urfave/cli's flag parsing.
func isFlagError(err error) bool {
	msg := err.Error()
	for _, s := range []string{"flag provided but not defined", "invalid value", "flag needs an argument", "Required flag", "No help topic"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// NewApp returns the ferry command-line application writing to stdout
// and stderr.
func NewApp(stdout, stderr io.Writer) *cli.App {
	a := &cli.App{
		Name:  "ferry",
		Usage: "transactional outbox to message broker, idempotent workers, and a sample notification service",
		Description: "A flag can also be set by its environment variable, shown as [$FERRY_...] in a command's help.\n" +
			"demo and run start embedded PostgreSQL, NATS and an SMTP sink for what their flags leave out;\n" +
			"the other commands default to the servers on 127.0.0.1 (PostgreSQL, RabbitMQ, Mailpit).\n" +
			"Every command shows only the flags it uses: ferry help COMMAND, or ferry COMMAND --help.",
		Version:                VersionLine(),
		CustomAppHelpTemplate:  appHelpTemplate,
		Writer:                 stdout,
		ErrWriter:              stderr,
		UseShortOptionHandling: false,
		ExitErrHandler:         func(*cli.Context, error) {}, // Main turns errors into exit codes
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return usagef("%s", flagErrorText(nil, err))
		},
		CommandNotFound: commandNotFound,
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return noCommand("", c.Args().First())
			}
			return cli.ShowAppHelp(c)
		},
		Commands: []*cli.Command{
			migrateCommand(),
			apiCommand(),
			relayCommand(),
			workerCommand(),
			runCommand(),
			demoCommand(),
			dlqCommand(),
			replayCommand(),
			outboxCommand(),
			jobsCommand(),
			consoleCommand(),
			benchCommand(),
			benchChildCommand(),
			versionCommand(),
		},
	}
	quietUsageErrors(a.Commands)
	unknownSubcommands(a.Commands)
	useHelpTemplates(a.Commands)
	return a
}

// quietUsageErrors makes a flag error of every command an ErrUsage error
// naming the command, printed once by Main, instead of urfave/cli's
// "Incorrect Usage" followed by the whole help text.
func quietUsageErrors(cmds []*cli.Command) {
	for _, cmd := range cmds {
		cmd.OnUsageError = func(c *cli.Context, err error, _ bool) error {
			return usagef("%s: %s (see ferry %s --help)", cmdName(c), flagErrorText(c.Command, err), cmdName(c))
		}
		quietRequiredFlags(cmd)
		quietUsageErrors(cmd.Subcommands)
	}
}

// requiredFlagExamples gives, by flag name, the example that the error of
// a missing required flag shows (quietRequiredFlags).
var requiredFlagExamples = map[string]string{
	flagSince: "--since 90m (or --since 2026-12-01T09:00:00Z)",
}

// quietRequiredFlags makes a missing required flag of cmd an ErrUsage
// error of one line that names the flag and shows an example
// (requiredFlagExamples), printed once by Main: urfave/cli's own check of
// Required flags prints the whole help page before its error. It clears
// the flags' Required field (marking "(required)" in their usage text
// instead) and checks them in cmd.Before, which urfave/cli runs after
// --help is handled.
func quietRequiredFlags(cmd *cli.Command) {
	var required []string
	for _, f := range cmd.Flags {
		if unrequire(f) {
			required = append(required, f.Names()[0])
		}
	}
	if len(required) == 0 {
		return
	}
	before := cmd.Before
	cmd.Before = func(c *cli.Context) error {
		var missing []string
		for _, r := range required {
			if !c.IsSet(r) {
				missing = append(missing, r)
			}
		}
		name := cmdName(c)
		switch {
		case len(missing) == 1 && requiredFlagExamples[missing[0]] != "":
			return usagef("%s: missing required flag --%s; for example: ferry %s %s", name, missing[0], name, requiredFlagExamples[missing[0]])
		case len(missing) > 0:
			return usagef("%s: missing required flag(s) --%s (see ferry %s --help)", name, strings.Join(missing, ", --"), name)
		case before != nil:
			return before(c)
		}
		return nil
	}
}

// unrequire clears f's Required field and marks its usage text
// "(required)"; it reports whether f was required. It knows the flag
// types ferry uses; any other required flag stays with urfave/cli's check.
func unrequire(f cli.Flag) bool {
	mark := func(req *bool, usage *string) bool {
		if !*req {
			return false
		}
		*req = false
		*usage += " (required)"
		return true
	}
	switch f := f.(type) {
	case *cli.StringFlag:
		return mark(&f.Required, &f.Usage)
	case *cli.IntFlag:
		return mark(&f.Required, &f.Usage)
	case *cli.DurationFlag:
		return mark(&f.Required, &f.Usage)
	case *cli.BoolFlag:
		return mark(&f.Required, &f.Usage)
	case *cli.StringSliceFlag:
		return mark(&f.Required, &f.Usage)
	}
	return false
}

// newLogger builds the slog logger of --log-format and --log-level.
func newLogger(c *cli.Context, defaultLevel string) (*slog.Logger, error) {
	lvlName := c.String(flagLogLevel)
	if !c.IsSet(flagLogLevel) && defaultLevel != "" {
		lvlName = defaultLevel
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(lvlName)); err != nil {
		return nil, usagef("--%s %q: want debug, info, warn or error", flagLogLevel, lvlName)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch f := c.String(flagLogFormat); f {
	case "text":
		h = slog.NewTextHandler(c.App.ErrWriter, opts)
	case "json":
		h = slog.NewJSONHandler(c.App.ErrWriter, opts)
	default:
		return nil, usagef("--%s %q: want text or json", flagLogFormat, f)
	}
	return slog.New(h), nil
}

// setup parses the settings and builds the logger of a command.
func setup(c *cli.Context, defaultLevel string) (*settings, *slog.Logger, error) {
	if c.Args().Present() {
		return nil, nil, usagef("%s: unexpected argument %q (flags come as --name value)", cmdName(c), c.Args().First())
	}
	return setupWithArgs(c, defaultLevel)
}

// setupWithArgs is setup for a command that reads its own arguments
// (jobs get and cancel take the job's ID).
func setupWithArgs(c *cli.Context, defaultLevel string) (*settings, *slog.Logger, error) {
	log, err := newLogger(c, defaultLevel)
	if err != nil {
		return nil, nil, err
	}
	s, err := loadSettings(c)
	if err != nil {
		return nil, nil, err
	}
	return s, log, nil
}

// redactURL hides the password of a URL (user:xxxxx@host), whatever its
// scheme, and the password=... of a keyword/value connection string
// ("host=db password=s3cret"); the rest is shown as given.
func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Scheme != "" && u.User != nil {
		return u.Redacted()
	}
	return kvPassword.ReplaceAllString(raw, "${1}xxxxx")
}

// kvPassword matches the value of password= in a keyword/value
// connection string, quoted or not.
var kvPassword = regexp.MustCompile(`(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// MigratedTables are the tables `ferry migrate` creates, besides the
// migrations' version tables (outbox.MigrationsTable, app.MigrationsTable):
// package outbox's and the notification app's. A test compares them with
// a migrated database and with the README.
var MigratedTables = []string{"outbox", "outbox_unique", "outbox_cancelled", "outbox_held", "outbox_wal_slots",
	"outbox_workflows", "outbox_workflow_jobs", "outbox_workflow_edges", "processed_messages",
	"worker_attempts", "worker_dead", "worker_flow_slots", "worker_flow_rates", "ferry_periodic", "notifications"}

func migrateCommand() *cli.Command {
	return &cli.Command{
		Name:  "migrate",
		Usage: "apply the database migrations (" + strings.Join(MigratedTables, ", ") + ")",
		Flags: concat(databaseFlags(false), logFlags("")),
		Action: func(c *cli.Context) error {
			s, log, err := setup(c, "")
			if err != nil {
				return err
			}
			st, err := openStack(c.Context, s, log, true)
			if err != nil {
				return err
			}
			defer st.close()
			log.Info("migrations applied", "database", redactURL(s.databaseURL))
			return nil
		},
	}
}

func apiCommand() *cli.Command {
	return &cli.Command{
		Name:  "api",
		Usage: "serve the notification HTTP API (POST /notifications, GET /notifications/{id})",
		// No broker flags: the API only writes the outbox, which the relay
		// publishes.
		Flags: concat(databaseFlags(false), destinationFlags(), apiFlags(DefaultAddr), shutdownFlags(), metricsFlags(""), logFlags("")),
		Action: func(c *cli.Context) error {
			return runStack(c, func(ctx context.Context, st *stack) error { return st.runAPI(ctx) })
		},
	}
}

func relayCommand() *cli.Command {
	return &cli.Command{
		Name:  "relay",
		Usage: "publish committed outbox rows to the broker",
		Flags: concat(databaseFlags(false), brokerFlags(false, declareQueueType), brokerLimitFlags(false), topologyFlags(), destinationFlags(), relayFlags(), shutdownFlags(), metricsFlags(DefaultRelayMetricsAddr), alertFlags(), logFlags("")),
		Action: func(c *cli.Context) error {
			return runStack(c, func(ctx context.Context, st *stack) error { return st.runRelay(ctx) })
		},
	}
}

func workerCommand() *cli.Command {
	return &cli.Command{
		Name:  "worker",
		Usage: "consume the notification queue and send the mails",
		Flags: concat(databaseFlags(false), brokerFlags(false, declareQueueType), brokerLimitFlags(true), topologyFlags(), workerFlags(), smtpFlags(false), shutdownFlags(), metricsFlags(DefaultWorkerMetricsAddr), logFlags("")),
		Action: func(c *cli.Context) error {
			return runStack(c, func(ctx context.Context, st *stack) error { return st.runWorker(ctx) })
		},
	}
}

// runStack opens the stack of a long-running command and runs f until
// c.Context is done; it returns at most --shutdown-timeout +
// ShutdownMargin after that (boundShutdown).
func runStack(c *cli.Context, f func(context.Context, *stack) error) error {
	s, log, err := setup(c, "")
	if err != nil {
		return err
	}
	if err := checkBrokerFlags(c, s, false); err != nil {
		return err
	}
	return boundShutdown(c.Context, s.shutdownTimeout, log, func() error {
		st, err := openStack(c.Context, s, log, false)
		if err != nil {
			return ignoreStopped(c.Context, err)
		}
		defer st.close()
		return ignoreCanceled(c.Context, st.obs.withMetrics(c.Context, func(ctx context.Context) error { return f(ctx, st) }))
	})
}

func runCommand() *cli.Command {
	return &cli.Command{
		Name:  "run",
		Usage: "run api, relay and worker in one process (embedded servers for what the flags leave out)",
		Flags: concat(databaseFlags(true), brokerFlags(true, declareQueueType), brokerLimitFlags(true), topologyFlags(), destinationFlags(), apiFlags(DefaultAddr), relayFlags(), workerFlags(), smtpFlags(true), shutdownFlags(), dataDirFlags(), metricsFlags(""), alertFlags(), consoleFlags(true), logFlags("")),
		Action: func(c *cli.Context) error {
			s, log, err := setup(c, "")
			if err != nil {
				return err
			}
			if err := checkBrokerFlags(c, s, true); err != nil {
				return err
			}
			var stops stopper
			defer stops.stop()
			w, err := startEmbedded(c.Context, s, log, &stops)
			if err != nil {
				return ignoreStopped(c.Context, err)
			}
			log.Info("ferry run", "database", w.database, "broker", w.broker, "smtp", w.smtp)
			// Only the embedded PostgreSQL is migrated here; a database
			// given with --database-url is migrated explicitly ("ferry
			// migrate"), and runAll refuses it without the schema.
			return boundShutdown(c.Context, s.shutdownTimeout, log, func() error {
				st, err := openStack(c.Context, s, log, !s.databaseSet)
				if err != nil {
					return ignoreStopped(c.Context, err)
				}
				defer st.close()
				if st.console = loadConsoleOpts(c); st.console != nil {
					st.console.ready = func(url string) { fmt.Fprintf(c.App.Writer, "ferry run: console: %s\n", url) }
				}
				return ignoreCanceled(c.Context, st.obs.withMetrics(c.Context, st.runAll))
			})
		},
	}
}
