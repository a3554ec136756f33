package ferrycli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/bench/suite"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/cluster"
	"github.com/ferrymq/ferry/internal/latencyproxy"
)

const (
	flagBrokers   = "brokers"
	flagScenarios = "scenarios"
	flagMessages  = "messages"
	flagSize      = "size"
	flagRate      = "rate"
	flagWorkers   = "workers"
	flagOut       = "out"
	flagRestart   = "restart-broker"
	flagRole      = "role"
	flagPeerDir   = "peer-dir"

	flagClusterScript      = "cluster-script"
	flagRabbitMQClusterURL = "rabbitmq-cluster-url"
	flagRabbitMQClusterMgt = "rabbitmq-cluster-management-url"
	flagKafkaClusterBroker = "kafka-cluster-brokers"
	flagNATSClusterURL     = "nats-cluster-url"
	flagSQSDelay           = "sqs-latency"
	flagStatsFile          = "stats-file"
	flagSoakDuration       = "soak-duration"
	flagSoakFaultEvery     = "soak-fault-every"
)

// defaultClusterScript is --cluster-script's default when the current
// folder is a ferry checkout.
const defaultClusterScript = "compose/local/services.sh"

// defaultPeerDir is --peer-dir's default when the current folder is a
// ferry checkout.
const defaultPeerDir = "bench/watermill"

// benchExecutable is the program bench starts as `ferry bench-child` for
// the faults scenario; benchChildEnv is added to its environment. Tests
// point them at the test binary (see TestMain).
var (
	benchExecutable = os.Executable
	benchChildEnv   []string
)

// defaultRestart is --restart-broker's default when the current folder
// is a ferry checkout with its services script.
const defaultRestart = "compose/local/services.sh restart {broker}"

// benchChildCommand is the hidden command the faults scenario runs as a
// child process: a relay or a worker it can kill with SIGKILL.
func benchChildCommand() *cli.Command {
	return &cli.Command{
		Name:   "bench-child",
		Hidden: true,
		Usage:  "run a relay or worker of ferry bench's faults scenario (started by ferry bench)",
		Flags: concat(benchBrokerFlags(), []cli.Flag{
			&cli.StringFlag{Name: flagRole, Required: true, Usage: "relay or worker"},
			&cli.StringFlag{Name: flagDatabaseURL, Required: true, Usage: "the scenario's database"},
			&cli.StringFlag{Name: flagBroker, Required: true, Usage: "broker name"},
			&cli.StringFlag{Name: flagExchange, Required: true, Usage: "the scenario's exchange"},
			&cli.IntFlag{Name: flagWorkers, Value: 20, Usage: "worker concurrency"},
			&cli.StringFlag{Name: flagStatsFile, Usage: "file the child writes its heap in use and goroutines to every second, as JSON (the soak scenario)"},
		}, logFlags("warn")),
		Action: func(c *cli.Context) error {
			log, err := newLogger(c, "warn")
			if err != nil {
				return err
			}
			f, err := lookupBroker(c.String(flagBroker))
			if err != nil {
				return err
			}
			opts := benchBrokerOptions(c, log)
			return suite.RunChild(c.Context, suite.ChildConfig{
				Role: c.String(flagRole), DatabaseURL: c.String(flagDatabaseURL), Exchange: c.String(flagExchange),
				Workers: c.Int(flagWorkers), Logger: log, StatsFile: c.String(flagStatsFile),
				Open: func(ctx context.Context) (broker.Broker, error) { return f(ctx, opts) },
			})
		},
	}
}

// benchBrokerFlags are the flags that reach the brokers.
func benchBrokerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagRabbitMQURL, Value: DefaultRabbitMQURL, EnvVars: env(flagRabbitMQURL), Usage: "RabbitMQ URL"},
		&cli.StringFlag{Name: flagNATSURL, Value: DefaultNATSURL, EnvVars: env(flagNATSURL), Usage: "NATS URL (with --brokers)"},
		&cli.StringFlag{Name: flagKafkaBrokers, Value: DefaultKafkaBrokers, EnvVars: env(flagKafkaBrokers), Usage: "Kafka bootstrap brokers, a comma list of host:port"},
		&cli.StringFlag{Name: flagSQSEndpoint, Value: DefaultSQSEndpoint, EnvVars: env(flagSQSEndpoint), Usage: "SQS endpoint URL"},
		&cli.StringFlag{Name: flagAWSRegion, Value: DefaultAWSRegion, EnvVars: env(flagAWSRegion), Usage: "AWS region (sqs)"},
	}
}

// benchClusterFlags are the flags of the failover scenario's clusters.
func benchClusterFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagClusterScript, EnvVars: env("bench-cluster-script"), Usage: "script that starts (up ROLE), stops (down ROLE), describes (env ROLE) a cluster and kills or starts one of its nodes (node ROLE N kill|start), ROLE being BROKER-cluster: the failover scenario's clusters (default: " + defaultClusterScript + " when run in a ferry checkout; none: failover not supported)"},
		&cli.StringFlag{Name: flagRabbitMQClusterURL, EnvVars: env("bench-" + flagRabbitMQClusterURL), Usage: "failover: a running RabbitMQ cluster, one amqp:// URL per node, comma separated (default: the script starts one)"},
		&cli.StringFlag{Name: flagRabbitMQClusterMgt, EnvVars: env("bench-" + flagRabbitMQClusterMgt), Usage: "failover: the management API of each node of --" + flagRabbitMQClusterURL + ", in the same order (http://user:password@host:port), where the queue's leader is read"},
		&cli.StringFlag{Name: flagKafkaClusterBroker, EnvVars: env("bench-" + flagKafkaClusterBroker), Usage: "failover: a running Kafka cluster, one host:port per broker, comma separated (default: the script starts one)"},
		&cli.StringFlag{Name: flagNATSClusterURL, EnvVars: env("bench-" + flagNATSClusterURL), Usage: "failover: a running NATS cluster, one nats:// URL per server, comma separated (default: the script starts one)"},
	}
}

func benchBrokerOptions(c *cli.Context, log *slog.Logger) BrokerOptions {
	return BrokerOptions{
		RabbitMQURL:  c.String(flagRabbitMQURL),
		NATSURL:      c.String(flagNATSURL),
		KafkaBrokers: splitList(c.String(flagKafkaBrokers)),
		SQSEndpoint:  c.String(flagSQSEndpoint),
		AWSRegion:    c.String(flagAWSRegion),
		Logger:       log,
	}
}

// brokerArgs are the flags that give a child process the same brokers.
func (o BrokerOptions) brokerArgs() []string {
	return []string{
		"--" + flagRabbitMQURL, o.RabbitMQURL, "--" + flagNATSURL, o.NATSURL,
		"--" + flagKafkaBrokers, strings.Join(o.KafkaBrokers, ","), "--" + flagSQSEndpoint, o.SQSEndpoint,
		"--" + flagAWSRegion, o.AWSRegion,
	}
}

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "benchmark the same workload on every broker: raw baseline, pipeline, end to end, latency, faults, ordering, routing, retry, replay, Watermill peer (every broker, beside ferry), failover on a 3-node cluster, a soak; writes results.json, results.md and charts",
		Description: "Without --brokers, bench starts embedded PostgreSQL and NATS JetStream in its own process, so it\n" +
			"runs on a machine with nothing installed. With --brokers it uses the servers of --database-url\n" +
			"(embedded PostgreSQL when not given) and of each broker's URL flag. Every scenario runs on every\n" +
			"broker, each on a fresh database and fresh queues; figures are printed and written to --out.\n\n" +
			"The failover scenario runs only when named (--scenarios failover or all): on a 3-node cluster of\n" +
			"RabbitMQ, Kafka or NATS it kills the node that leads the work queue under a steady load, starts\n" +
			"it again once the pipeline caught up, and measures how long publishing and handling stood, what\n" +
			"was lost or applied twice, and what the cluster takes to run. --cluster-script starts, kills and\n" +
			"stops the nodes (in a ferry checkout compose/local/services.sh: up BROKER-cluster, node\n" +
			"BROKER-cluster N kill|start, down BROKER-cluster), one cluster at a time, each stopped after its\n" +
			"run. A --BROKER-cluster-url flag names a running cluster instead, left running; node N is its Nth\n" +
			"URL and must be the script's node N.\n\n" +
			"The soak scenario runs only when named too (--scenarios soak or all): --rate (200/s when 0)\n" +
			"for --soak-duration with a fault every --soak-fault-every, cycling through SIGKILL of the relay,\n" +
			"SIGKILL of the worker and a broker restart (--restart-broker); at the start and at each fault it\n" +
			"prints one row (heap, goroutines, open files and RSS of relay and worker, the outbox's size, the\n" +
			"WAL the replication slots hold, events committed, handled, lost, applied twice), at the end whether\n" +
			"each series stayed flat; it fails on any event lost or effect applied twice.",
		Flags: concat([]cli.Flag{
			&cli.StringFlag{Name: flagBrokers, EnvVars: env("bench-brokers"), Usage: "comma list of brokers (" + strings.Join(BrokerNames(), ", ") + ") or all; default: embedded NATS"},
			&cli.StringFlag{Name: flagScenarios, Value: strings.Join(suite.BuiltScenarios, ","), EnvVars: env("bench-scenarios"), Usage: "comma list of scenarios (" + strings.Join(suite.Scenarios, ", ") + ") or all"},
			&cli.IntFlag{Name: flagMessages, Value: 20000, EnvVars: env("bench-messages"), Usage: "messages per scenario run (latency: at most 10 s at each rate; ordering at most 5,000; routing at most 3,000; retry at most 200)"},
			&cli.IntFlag{Name: flagSize, Value: suite.DefaultSize, EnvVars: env("bench-size"), Usage: "event body in bytes"},
			&cli.IntFlag{Name: flagRate, EnvVars: env("bench-rate"), Usage: "producers' events/s in end-to-end, latency, faults, failover and soak; 0: end-to-end flat out, latency at 200/s and 1000/s, the others at 200/s"},
			&cli.IntFlag{Name: flagWorkers, Value: 20, EnvVars: env("bench-workers"), Usage: "worker concurrency (messages handled at once)"},
			&cli.StringFlag{Name: flagOut, Value: "bench-results", EnvVars: env("bench-out"), Usage: "folder for results.json, results.md and the charts (created when missing)"},
			&cli.StringFlag{Name: flagDatabaseURL, EnvVars: env(flagDatabaseURL), Usage: "PostgreSQL URL of a user that may create databases (default: embedded PostgreSQL)"},
			&cli.StringFlag{Name: flagRestart, EnvVars: env("bench-restart-broker"), Usage: "shell command that restarts a broker's server for the faults scenario, {broker} replaced by its name (default: " + defaultRestart + " when run in a ferry checkout; none: no broker restart)"},
			&cli.StringFlag{Name: flagPeerDir, EnvVars: env("bench-peer-dir"), Usage: "folder of the Watermill peer module, run with the go command by the peer scenario (default: " + defaultPeerDir + " when run in a ferry checkout)"},
			&cli.DurationFlag{Name: flagSoakDuration, Value: time.Hour, EnvVars: env("bench-" + flagSoakDuration), Usage: "soak: how long the producers commit at --rate (200/s when 0)"},
			&cli.DurationFlag{Name: flagSoakFaultEvery, Value: 3 * time.Minute, EnvVars: env("bench-" + flagSoakFaultEvery), Usage: "soak: time between two faults, which cycle through SIGKILL of the relay, SIGKILL of the worker and a broker restart (--restart-broker)"},
			&cli.DurationFlag{Name: flagSQSDelay, EnvVars: env("bench-sqs-latency"), Usage: "time added to every SQS call by a loopback proxy in front of --sqs-endpoint, e.g. 15ms (what AWS SQS costs from inside its region); 0: none"},
		}, benchBrokerFlags(), benchClusterFlags(), []cli.Flag{
			&cli.StringFlag{Name: flagDataDir, EnvVars: env(flagDataDir), Category: catProcess,
				Usage: "folder for the data of the embedded PostgreSQL and NATS server", DefaultText: "a temporary folder removed at exit"},
		}, logFlags("warn")),
		Action: runBench,
	}
}

// parseChoice splits a comma list of names, all of which must be in
// choices; "all" means all of them.
func parseChoice(flag, s string, choices []string) ([]string, error) {
	items := splitList(s)
	if len(items) == 1 && items[0] == "all" {
		return choices, nil
	}
	if len(items) == 0 {
		return nil, usagef("--%s: empty; want some of %s or all", flag, strings.Join(choices, ","))
	}
	for _, it := range items {
		if !slices.Contains(choices, it) {
			return nil, usagef("--%s: %q: want some of %s or all", flag, it, strings.Join(choices, ","))
		}
	}
	return items, nil
}

func runBench(c *cli.Context) error {
	if c.Args().Present() {
		return usagef("bench: unexpected argument %q (flags come as --name value)", c.Args().First())
	}
	log, err := newLogger(c, "warn")
	if err != nil {
		return err
	}
	scenarios, err := parseChoice(flagScenarios, c.String(flagScenarios), suite.Scenarios)
	if err != nil {
		return err
	}
	for _, f := range []string{flagMessages, flagSize, flagWorkers} {
		if c.Int(f) < 1 {
			return usagef("--%s %d: must be at least 1", f, c.Int(f))
		}
	}
	if c.Int(flagRate) < 0 {
		return usagef("--%s %d: must not be negative (0: flat out)", flagRate, c.Int(flagRate))
	}
	for _, f := range []string{flagSoakDuration, flagSoakFaultEvery} {
		if c.Duration(f) < time.Second {
			return usagef("--%s %v: must be at least 1s", f, c.Duration(f))
		}
	}
	opts := benchBrokerOptions(c, log)
	var names []string
	embeddedNATS := !c.IsSet(flagBrokers)
	if embeddedNATS {
		names = []string{"nats"}
	} else {
		names = splitList(c.String(flagBrokers))
		if len(names) == 1 && names[0] == "all" {
			names = BrokerNames()
		}
		if len(names) == 0 {
			return usagef("--%s: empty; want some of %s or all", flagBrokers, strings.Join(BrokerNames(), ","))
		}
		for _, n := range names {
			if _, err := lookupBroker(n); err != nil {
				return err
			}
		}
	}

	ctx := c.Context
	out := c.App.Writer
	var stops stopper
	defer stops.stop()
	dir := c.String(flagDataDir)
	if dir == "" && (embeddedNATS || !c.IsSet(flagDatabaseURL)) {
		tmp, err := os.MkdirTemp("", "ferry-bench-")
		if err != nil {
			return fmt.Errorf("ferry bench: data folder: %w", err)
		}
		stops.add(func() { _ = os.RemoveAll(tmp) })
		dir = tmp
	} else if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("ferry bench: --%s %s: %w", flagDataDir, dir, err)
		}
	}
	dbURL, dbWhere := c.String(flagDatabaseURL), "PostgreSQL at "+redactURL(c.String(flagDatabaseURL))
	if !c.IsSet(flagDatabaseURL) {
		fmt.Fprintln(out, "ferry bench: starting embedded PostgreSQL…")
		pg, err := startEmbeddedPG(ctx, dir, log)
		if err != nil {
			return err
		}
		stops.add(func() {
			if err := pg.Stop(); err != nil {
				log.Warn("stopping embedded PostgreSQL", "error", err)
			}
		})
		dbURL, dbWhere = pg.URL(), "embedded PostgreSQL "+string(embeddedPGVersion)+" at "+redactURL(pg.URL())
	}
	var nsWhere string
	if embeddedNATS {
		ns, err := startEmbeddedNATS(dir)
		if err != nil {
			return err
		}
		stops.add(ns.Stop)
		opts.NATSURL = ns.URL()
		nsWhere = "embedded NATS JetStream in the ferry process at " + ns.URL()
	}

	// --sqs-latency: every SQS call, the relay's, the worker's, the raw
	// baseline's and the child processes', goes through the proxy; the
	// server's CPU is still found by its own port.
	sqsServer, sqsWhere := opts.SQSEndpoint, ""
	if d := c.Duration(flagSQSDelay); d < 0 {
		return usagef("--%s %v: must not be negative", flagSQSDelay, d)
	} else if d > 0 && slices.Contains(names, "sqs") {
		p, err := latencyproxy.Start(opts.SQSEndpoint, d)
		if err != nil {
			return usagef("--%s: %v", flagSQSDelay, err)
		}
		stops.add(func() { _ = p.Close() })
		opts.SQSEndpoint = p.URL()
		sqsWhere = fmt.Sprintf("sqs at %s through a proxy adding %v to every call (%s)", redactURL(sqsServer), d, p.URL())
	}

	targets := make([]suite.Target, 0, len(names))
	for _, n := range names {
		f, _ := lookupBroker(n)
		t := suite.Target{Name: n, URL: benchURL(n, opts), Cleanup: benchCleanup(n, opts),
			Open: func(ctx context.Context) (broker.Broker, error) { return f(ctx, opts) }}
		switch {
		case n == "nats" && nsWhere != "":
			t.Where = nsWhere
		case n == "sqs" && sqsWhere != "":
			t.Where, t.ServerURL = sqsWhere, sqsServer
		default:
			t.Where = n + " at " + redactURL(t.URL)
		}
		if t.Cluster, err = benchCluster(c, n, opts); err != nil {
			return err
		}
		targets = append(targets, t)
	}
	fmt.Fprintf(out, "ferry bench: database %s; brokers %s; scenarios %s; %d messages of %d body bytes\n",
		dbWhere, strings.Join(names, ", "), strings.Join(scenarios, ", "), c.Int(flagMessages), c.Int(flagSize))
	exe, err := benchExecutable()
	if err != nil {
		return fmt.Errorf("ferry bench: own executable: %w", err)
	}
	spawn := func(ctx context.Context, args []string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, exe, append(append([]string{"bench-child"}, args...), opts.brokerArgs()...)...)
		cmd.Env = append(os.Environ(), benchChildEnv...)
		return cmd
	}
	restart := c.String(flagRestart)
	if !c.IsSet(flagRestart) {
		if _, err := os.Stat("compose/local/services.sh"); err == nil {
			restart = defaultRestart
		}
	}
	var restartBroker func(ctx context.Context, name string) error
	if restart != "" && restart != "none" && !embeddedNATS {
		restartBroker = func(ctx context.Context, name string) error {
			out, err := exec.CommandContext(ctx, "sh", "-c", strings.ReplaceAll(restart, "{broker}", name)).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s: %w: %s", restart, err, strings.TrimSpace(string(out)))
			}
			return nil
		}
	}
	peerDir := c.String(flagPeerDir)
	if !c.IsSet(flagPeerDir) {
		if _, err := os.Stat(defaultPeerDir + "/go.mod"); err == nil {
			peerDir = defaultPeerDir
		}
	}
	res, err := suite.Run(ctx, suite.Config{
		Spawn: spawn, RestartBroker: restartBroker, PeerDir: peerDir,
		Targets: targets, DatabaseURL: dbURL, Database: dbWhere, Scenarios: scenarios,
		Messages: c.Int(flagMessages), Size: c.Int(flagSize), Rate: c.Int(flagRate), Workers: c.Int(flagWorkers),
		Out: c.String(flagOut), Command: benchCommandLine(os.Args[1:]), Progress: out, Logger: log,
		SoakDuration: c.Duration(flagSoakDuration), SoakFaultEvery: c.Duration(flagSoakFaultEvery),
	})
	if errors.Is(err, suite.ErrConfig) {
		return usagef("ferry bench: %v", err)
	}
	if err != nil {
		return fmt.Errorf("ferry bench: %w", err)
	}
	failed := 0
	for _, r := range res.Results {
		if r.Status == "failed" {
			failed++
		}
	}
	fmt.Fprintf(out, "ferry bench: done in %s; wrote results.json, results.md and the charts to %s\n", suite.FormatSeconds(res.Seconds), c.String(flagOut))
	if failed > 0 {
		return fmt.Errorf("ferry bench: %d scenario run(s) failed; see %s/results.md", failed, c.String(flagOut))
	}
	return nil
}

// benchCommandLine is the command line results.json records, with the
// password of every URL in it (--database-url, --rabbitmq-url, …)
// replaced by xxxxx.
func benchCommandLine(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if name, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "--") {
			out[i] = name + "=" + redactList(v)
		} else {
			out[i] = redactList(a)
		}
	}
	return strings.Join(append([]string{"ferry"}, out...), " ")
}

// redactList is redactURL of each item of a comma list.
func redactList(s string) string {
	items := strings.Split(s, ",")
	for i, it := range items {
		items[i] = redactURL(it)
	}
	return strings.Join(items, ",")
}

// benchURL is the server URL of broker name: the raw client connects to
// it and its port finds the server's process for the CPU figures.
func benchURL(name string, o BrokerOptions) string {
	switch name {
	case "rabbitmq":
		return o.RabbitMQURL
	case "nats":
		return o.NATSURL
	case "kafka":
		if len(o.KafkaBrokers) > 0 {
			return "kafka://" + o.KafkaBrokers[0]
		}
	case "sqs":
		return o.SQSEndpoint
	}
	return ""
}

// benchCleanup returns the function that removes a bench run's topology
// from broker name's server, or nil for a broker without one (its
// uniquely named queues stay).
func benchCleanup(name string, o BrokerOptions) func(context.Context, broker.Topology) error {
	switch name {
	case "rabbitmq":
		return func(_ context.Context, tp broker.Topology) error {
			// --rabbitmq-url may list a cluster's nodes, comma separated:
			// the first that answers takes the deletes.
			var (
				conn *amqp.Connection
				err  error
			)
			for _, u := range strings.Split(o.RabbitMQURL, ",") {
				if conn, err = amqp.Dial(strings.TrimSpace(u)); err == nil {
					break
				}
			}
			if err != nil {
				return err
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				return err
			}
			defer ch.Close()
			for _, q := range tp.Queues {
				for _, n := range rabbitmq.QueueNames(q) {
					if _, err := ch.QueueDelete(n, false, false, false); err != nil {
						return fmt.Errorf("delete queue %s: %w", n, err)
					}
				}
			}
			return ch.ExchangeDelete(tp.Exchange, false, false)
		}
	case "nats":
		return func(ctx context.Context, tp broker.Topology) error {
			nc, err := natsgo.Connect(o.NATSURL)
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			for _, s := range []string{nats.StreamName(tp.Exchange), nats.StreamName(tp.Exchange) + "-dlq"} {
				if err := js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
					return fmt.Errorf("delete stream %s: %w", s, err)
				}
			}
			return nil
		}
	}
	return nil
}

// benchCluster returns suite.Target.Cluster for broker name: the nodes of
// its --BROKER-cluster-url flag, or else a cluster that --cluster-script
// starts (`up NAME-cluster`, its URLs from `env NAME-cluster`) and stops
// after the run (`down NAME-cluster`); nodes are killed and started with
// the script. Nil when the broker has no cluster role or there is no
// script (the failover scenario then says "not supported"). A cluster
// flag naming fewer than 2 nodes, a node without a port, or RabbitMQ
// nodes without as many management URLs is a usage error.
func benchCluster(c *cli.Context, name string, opts BrokerOptions) (func(ctx context.Context) (*suite.Cluster, error), error) {
	flag := map[string]string{"rabbitmq": flagRabbitMQClusterURL, "kafka": flagKafkaClusterBroker, "nats": flagNATSClusterURL}[name]
	if flag == "" {
		return nil, nil
	}
	given := c.String(flag)
	mgmt := c.String(flagRabbitMQClusterMgt)
	if given != "" {
		nodes := cluster.Nodes{Broker: name, URLs: splitList(given), Management: splitList(mgmt)}
		if len(nodes.URLs) < 2 {
			return nil, usagef("--%s %q: want the URL of every node of the cluster, comma separated (failover kills one)", flag, redactURL(given))
		}
		if _, err := nodes.Ports(); err != nil {
			return nil, usagef("--%s: %v", flag, err)
		}
		if name == "rabbitmq" && len(nodes.Management) != len(nodes.URLs) {
			return nil, usagef("--%s has %d URLs but --%s %d: the failover scenario reads the queue's leader from each node's management API", flagRabbitMQClusterURL, len(nodes.URLs), flagRabbitMQClusterMgt, len(nodes.Management))
		}
	}
	path := c.String(flagClusterScript)
	if !c.IsSet(flagClusterScript) {
		if _, err := os.Stat(defaultClusterScript); err == nil {
			path = defaultClusterScript
		}
	}
	if path == "" || path == "none" {
		return nil, nil
	}
	script := cluster.Script{Path: path}
	role := name + "-cluster"
	f, _ := lookupBroker(name)
	return func(ctx context.Context) (*suite.Cluster, error) {
		var (
			nodes cluster.Nodes
			where string
			stop  func()
		)
		if given != "" {
			nodes = cluster.Nodes{Broker: name, URLs: splitList(given), Management: splitList(mgmt)}
			where = fmt.Sprintf("%d %s nodes at %s (--%s)", len(nodes.URLs), name, redactURL(nodes.URLs[0])+",…", flag)
		} else {
			if err := script.Up(ctx, role); err != nil {
				return nil, err
			}
			stop = func() {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
				defer cancel()
				_ = script.Down(dctx, role)
			}
			env, err := script.Env(ctx, role)
			if err == nil {
				nodes, err = cluster.NodesFromEnv(name, env)
			}
			if err != nil {
				stop()
				return nil, err
			}
			where = fmt.Sprintf("%d %s nodes of %s %s", len(nodes.URLs), name, path, role)
		}
		co := opts
		switch name {
		case "rabbitmq":
			co.RabbitMQURL, co.RabbitMQQueueType, co.RabbitMQManagementURL = strings.Join(nodes.URLs, ","), "", ""
		case "kafka":
			co.KafkaBrokers = nodes.URLs
		case "nats":
			co.NATSURL = strings.Join(nodes.URLs, ",")
		}
		urls := slices.Clone(nodes.URLs)
		if name == "kafka" {
			for i, u := range urls {
				urls[i] = "kafka://" + u
			}
		}
		first := co
		first.RabbitMQURL = nodes.URLs[0]
		return &suite.Cluster{
			Open:    func(ctx context.Context) (broker.Broker, error) { return f(ctx, co) },
			URLs:    urls,
			Leader:  nodes.Leader,
			Node:    func(ctx context.Context, n int, action string) error { return script.Node(ctx, role, n, action) },
			Cleanup: benchCleanup(name, first),
			Where:   where,
			Close:   stop,
		}, nil
	}, nil
}
