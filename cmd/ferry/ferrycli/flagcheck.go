package ferrycli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// nonEmptyFlags says, per flag whose empty value means nothing (it used
// to select the flag's default, or the library's), what is wanted; an
// empty value given on the command line or in the environment is refused
// (checkFlagValues). Flags where empty has a documented meaning are not
// here: --metrics-addr (no server), --sqs-endpoint (AWS's endpoint),
// --data-dir (a temporary folder), --otlp-endpoint (no tracing).
var nonEmptyFlags = map[string]string{
	flagDatabaseURL:     "want a PostgreSQL URL, postgres://user:password@host:port/database",
	flagBroker:          "want one of the brokers",
	flagRabbitMQURL:     "want an amqp:// URL such as " + DefaultRabbitMQURL,
	flagRabbitQueueType: "want classic or quorum",
	flagNATSURL:         "want a nats:// URL such as " + DefaultNATSURL,
	flagKafkaBrokers:    "want a comma list of host:port such as " + DefaultKafkaBrokers,
	flagAWSRegion:       "want an AWS region such as " + DefaultAWSRegion,
	flagExchange:        "want an exchange name: letters, digits, '-', '_' or '.'",
	flagQueue:           "want a queue name: letters, digits, '-', '_' or '.'",
	flagAddr:            "want host:port; 0.0.0.0:PORT listens on every interface",
	flagSMTPAddr:        "want host:port",
	flagRelayMode:       "want poll or wal",
	flagConsoleAddr:     "want host:port (port 0: a free port, printed) or off; 0.0.0.0:PORT listens on every interface",
}

// checkFlagValues refuses, with a usage error naming the flag, the values
// of c's flags that the libraries would refuse later (in a message naming
// their Config field, not the flag) or would silently replace by their
// default: an empty value in nonEmptyFlags, an --addr or --smtp-addr that
// is not host:port, an --exchange or --queue that is not a valid name
// (broker.Topology.Validate), a --batch-size above outbox.MaxBatchSize.
func checkFlagValues(c *cli.Context, s *settings) error {
	for _, f := range c.Command.Flags {
		name := f.Names()[0]
		want, ok := nonEmptyFlags[name]
		if !ok || !c.IsSet(name) {
			continue
		}
		v := c.String(name)
		if name == flagBroker {
			want = "want one of: " + strings.Join(BrokerNames(), ", ")
		}
		if strings.TrimSpace(v) != "" && (name != flagKafkaBrokers || len(splitList(v)) > 0) {
			continue
		}
		e := env(name)[0]
		if sf, ok := f.(*cli.StringFlag); ok && len(sf.EnvVars) > 0 {
			e = sf.EnvVars[0] // console's --addr reads FERRY_CONSOLE_ADDR
		}
		if os.Getenv(e) == v {
			if _, set := os.LookupEnv(e); set {
				want += " ($" + e + " is set to it)"
			}
		}
		return usagef("--%s %q: %s", name, v, want)
	}
	if hasFlag(c, flagAddr) {
		if err := checkListenAddr(s.addr); err != nil {
			return usagef("--%s %q: %s", flagAddr, s.addr, nonEmptyFlags[flagAddr])
		}
	}
	if hasFlag(c, flagConsoleAddr) {
		if v := c.String(flagConsoleAddr); v != "off" || c.Command.Name == "console" {
			if err := checkListenAddr(v); err != nil {
				return usagef("--%s %q: %s", flagConsoleAddr, v, nonEmptyFlags[flagConsoleAddr])
			}
		}
	}
	if hasFlag(c, flagSMTPAddr) {
		host, port, err := net.SplitHostPort(s.smtpAddr)
		if err != nil || host == "" {
			return usagef("--%s %q: want host:port such as %s", flagSMTPAddr, s.smtpAddr, DefaultSMTPAddr)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return usagef("--%s %q: port must be 1..65535", flagSMTPAddr, s.smtpAddr)
		}
	}
	for _, n := range []struct{ flag, exchange, queue string }{
		{flagExchange, s.exchange, app.DefaultQueue},
		{flagQueue, app.DefaultExchange, s.queue},
	} {
		if !c.IsSet(n.flag) {
			continue
		}
		t := broker.Topology{Exchange: n.exchange, Queues: []broker.Queue{{Name: n.queue, Bindings: []string{app.EventNotificationRequested}}}}
		if err := t.Validate(); err != nil {
			v := n.exchange
			if n.flag == flagQueue {
				v = n.queue
			}
			return usagef("--%s %q: %s", n.flag, v, afterValue(err))
		}
	}
	if hasFlag(c, flagBatchSize) && s.batchSize > outbox.MaxBatchSize {
		return usagef("--%s %d: want 1..%d", flagBatchSize, s.batchSize, outbox.MaxBatchSize)
	}
	return nil
}

// checkListenAddr refuses a listen address net.Listen would refuse only
// once the servers run: not host:port, or a port outside 0..65535.
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("port %q is not 0..65535", port)
	}
	return nil
}

// afterValue is the reason of a library's error `... Field "value": reason`.
func afterValue(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, `": `); i >= 0 {
		return msg[i+3:]
	}
	return msg
}

// flagErrorWants says, per flag type, the format a value must have, for
// the error of a value the flag package cannot parse.
func flagErrorWants(f cli.Flag) string {
	switch f.(type) {
	case *cli.DurationFlag:
		return "want a Go duration such as 500ms, 30s or 5m"
	case *cli.IntFlag, *cli.Int64Flag, *cli.UintFlag:
		return "want a whole number"
	case *cli.BoolFlag:
		return "want true or false"
	case *cli.Float64Flag:
		return "want a number"
	}
	return ""
}

// Messages of the Go flag package that urfave/cli passes on, which show
// a flag with one dash (-name).
var (
	flagInvalidValue = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-([A-Za-z0-9-]+): .*$`)
	flagOneDash      = regexp.MustCompile(`(flag provided but not defined|flag needs an argument): -([A-Za-z0-9-])`)
)

// flagErrorText rewrites a flag-parsing error of urfave/cli (the Go flag
// package's) in ferry's terms: a flag is shown as --name, as the help
// shows it, and a value that does not parse says the format wanted (a
// Go duration, a whole number).
func flagErrorText(cmd *cli.Command, err error) string {
	msg := err.Error()
	if m := flagInvalidValue.FindStringSubmatch(msg); m != nil {
		want := "invalid value"
		if cmd != nil {
			for _, f := range cmd.Flags {
				if f.Names()[0] == m[2] {
					if w := flagErrorWants(f); w != "" {
						want = w
					}
				}
			}
		}
		return fmt.Sprintf("--%s %q: %s", m[2], m[1], want)
	}
	return flagOneDash.ReplaceAllString(msg, "$1: --$2")
}

// helpTopicKey is the key in the app's Metadata under which its
// CommandNotFound (commandNotFound) records noCommand's error when `ferry
// help NAME` or `ferry dlq help NAME` names no command; Main returns it
// (urfave/cli would print "No help topic for 'NAME'").
const helpTopicKey = "ferry.helpTopicError"

// noCommand is the usage error of an unknown command NAME under parent
// ("" for the top level, "dlq" for `ferry dlq NAME`).
func noCommand(parent, name string) error {
	if parent == "" {
		return usagef("no command %q; run ferry --help", name)
	}
	return usagef("no command %q; run ferry %s --help", parent+" "+name, parent)
}

// unknownSubcommands gives each command with subcommands (dlq, outbox) an
// Action: its help without arguments, noCommand's usage error for a name
// that is none of its subcommands (urfave/cli's default Action answers
// "No help topic").
func unknownSubcommands(cmds []*cli.Command) {
	for _, cmd := range cmds {
		if len(cmd.Subcommands) == 0 || cmd.Action != nil {
			continue
		}
		cmd.Action = func(c *cli.Context) error {
			if c.Args().Present() {
				return noCommand(cmdName(c), c.Args().First())
			}
			return cli.ShowSubcommandHelp(c)
		}
		unknownSubcommands(cmd.Subcommands)
	}
}

// commandNotFound is the app's CommandNotFound (called by `ferry help
// NAME` and `ferry dlq help NAME` for a NAME that is no command): it
// records noCommand's error for Main.
func commandNotFound(c *cli.Context, name string) {
	parent := ""
	if c.Command != nil && c.Command.HelpName != c.App.HelpName && c.Command.HelpName != "" {
		parent = cmdName(c)
	}
	if c.App.Metadata == nil {
		c.App.Metadata = map[string]any{}
	}
	c.App.Metadata[helpTopicKey] = noCommand(parent, name)
}

// checkWorkerLimits runs, before the worker starts, the check that its
// Run makes of cfg against the limits the broker b reports for the queue
// (worker.CheckLimits), so that a flag contradicting them (--handler-timeout
// above RabbitMQ's consumer_timeout) is the error Main prints, as a usage
// error, before the worker logs that it runs. A broker that reports no
// limits, or cannot read them now, is left to Run.
func checkWorkerLimits(ctx context.Context, b broker.Broker, cfg worker.Config) error {
	lr, ok := worker.LimitReporterOf(b)
	if !ok {
		return nil
	}
	l, err := lr.Limits(ctx, cfg.Queue)
	if err != nil {
		return nil
	}
	if err := worker.CheckLimits(cfg, b.Capabilities(), l); err != nil {
		if errors.Is(err, ErrUsage) {
			return err
		}
		return usagef("%v", err)
	}
	return nil
}
