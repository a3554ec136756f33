package ferrycli

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/brokers/sqs"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// Defaults of the flags.
const (
	// DefaultDatabaseURL is --database-url's default (demo and run start
	// an embedded PostgreSQL instead when the flag is not given).
	DefaultDatabaseURL = "postgres://ferry:ferry@127.0.0.1:5432/ferry"
	// DefaultBroker is --broker's default (demo and run use NATS when the
	// flag is not given).
	DefaultBroker = "rabbitmq"
	// DefaultRabbitMQURL is --rabbitmq-url's default.
	DefaultRabbitMQURL = "amqp://guest:guest@127.0.0.1:5672/"
	// DefaultNATSURL is --nats-url's default (demo and run start an
	// embedded NATS server when neither --broker nor --nats-url is given).
	DefaultNATSURL = "nats://127.0.0.1:4222"
	// DefaultKafkaBrokers is --kafka-brokers' default: a comma list of
	// host:port bootstrap addresses.
	DefaultKafkaBrokers = "127.0.0.1:9092"
	// DefaultSQSEndpoint is --sqs-endpoint's default, ElasticMQ's port on
	// loopback; empty means AWS's own endpoint for --aws-region.
	DefaultSQSEndpoint = "http://127.0.0.1:9324"
	// DefaultAWSRegion is --aws-region's default.
	DefaultAWSRegion = "us-east-1"
	// DefaultSMTPAddr is --smtp-addr's default, Mailpit's SMTP port (demo
	// and run use a built-in SMTP sink when the flag is not given).
	DefaultSMTPAddr = "127.0.0.1:1025"
	// DefaultAddr is --addr's default, the API's listen address: loopback,
	// like every default address of ferry (0.0.0.0:3000 listens on every
	// interface, as compose/compose.yaml does in its containers).
	DefaultAddr = "127.0.0.1:3000"
)

// ErrUsage is wrapped by errors about the command line itself (a bad flag
// value, a missing required flag); Main exits 2 for them.
var ErrUsage = errors.New("ferry: usage")

func usagef(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUsage}, args...)...)
}

// Flag names, shared by several commands.
const (
	flagDatabaseURL     = "database-url"
	flagBroker          = "broker"
	flagRabbitMQURL     = "rabbitmq-url"
	flagRabbitQueueType = "rabbitmq-queue-type"
	flagRabbitMgmtURL   = "rabbitmq-management-url"
	flagRabbitConsumerT = "rabbitmq-consumer-timeout"
	flagSQSMaxReceive   = "sqs-max-receive-count"
	flagNATSURL         = "nats-url"
	flagKafkaBrokers    = "kafka-brokers"
	flagSQSEndpoint     = "sqs-endpoint"
	flagAWSRegion       = "aws-region"
	flagSMTPAddr        = "smtp-addr"
	flagSMTPTimeout     = "smtp-timeout"
	flagSMTPDataTimeout = "smtp-data-timeout"
	flagLogFormat       = "log-format"
	flagLogLevel        = "log-level"
	flagAddr            = "addr"
	flagExchange        = "exchange"
	flagDestination     = "destination"
	flagQueue           = "queue"
	flagMaxAttempts     = "max-attempts"
	flagRetryDelay      = "retry-delay"
	flagPrefetch        = "prefetch"
	flagConcurrency     = "concurrency"
	flagBatchSize       = "batch-size"
	flagWorkerBatch     = "worker-batch-size"
	flagWorkerLinger    = "worker-batch-linger"
	flagPollInterval    = "poll-interval"
	flagRetention       = "retention"
	flagRelayMode       = "relay-mode"
	flagWALSlot         = "wal-slot"
	flagShutdownTimeout = "shutdown-timeout"
	flagHandlerTimeout  = "handler-timeout"
	flagDebugFail       = "debug-fail-after-outbox"
	flagDataDir         = "data-dir"
	flagFormat          = "format"
)

func env(name string) []string {
	return []string{"FERRY_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))}
}

// Categories of the flags in the help (flagHelp prints them in the order a
// command lists its flags).
const (
	catDatabase = "Database"
	catBroker   = "Broker"
	catTopology = "Topology"
	catAPI      = "HTTP API"
	catRelay    = "Relay"
	catWorker   = "Worker"
	catSMTP     = "SMTP"
	catObs      = "Observability"
	catAlert    = "Stuck-outbox alert"
	catProcess  = "Process and logs"
)

// logFlags: --log-format and --log-level; defaultLevel is the command's
// level when --log-level is not given (setup's defaultLevel; "" is info).
func logFlags(defaultLevel string) []cli.Flag {
	if defaultLevel == "" {
		defaultLevel = "info"
	}
	return []cli.Flag{
		&cli.StringFlag{Name: flagLogFormat, Value: "text", EnvVars: env(flagLogFormat), Category: catProcess, Usage: "log format: text or json"},
		&cli.StringFlag{Name: flagLogLevel, Value: defaultLevel, EnvVars: env(flagLogLevel), Category: catProcess, Usage: "log level: debug, info, warn or error"},
	}
}

// databaseFlags: --database-url. embedded (demo, run): without the flag an
// embedded PostgreSQL is started, which the help says instead of a default.
func databaseFlags(embedded bool) []cli.Flag {
	f := &cli.StringFlag{Name: flagDatabaseURL, Value: DefaultDatabaseURL, EnvVars: env(flagDatabaseURL), Category: catDatabase,
		Usage: "PostgreSQL URL, postgres://user:password@host:port/database"}
	if embedded {
		f.DefaultText = "an embedded PostgreSQL in this process, migrated at start; its data is removed at exit unless --data-dir is given"
	}
	return []cli.Flag{f}
}

// brokerFlags: --broker and the connection flags of every adapter.
// embedded (demo, run): without --broker an embedded NATS server is used
// (or --nats-url), which the help says instead of the defaults. quorumNote
// is what --rabbitmq-queue-type changes for the command.
func brokerFlags(embedded bool, queueTypeUsage string) []cli.Flag {
	b := &cli.StringFlag{Name: flagBroker, Value: DefaultBroker, EnvVars: env(flagBroker), Category: catBroker,
		Usage: "message broker: rabbitmq, nats, kafka or sqs"}
	nats := &cli.StringFlag{Name: flagNATSURL, Value: DefaultNATSURL, EnvVars: env(flagNATSURL), Category: catBroker, Usage: "NATS URL (--broker nats)"}
	if embedded {
		b.DefaultText = "nats: an embedded NATS JetStream server in this process, or the server of --nats-url when given"
		nats.Usage = "NATS URL; given without --broker, the broker is nats at this URL instead of the embedded server"
		nats.DefaultText = "the embedded server; with --broker nats, " + DefaultNATSURL
	}
	return []cli.Flag{
		b,
		&cli.StringFlag{Name: flagRabbitMQURL, Value: DefaultRabbitMQURL, EnvVars: env(flagRabbitMQURL), Category: catBroker, Usage: "RabbitMQ URL, or the URLs of a cluster's nodes separated by commas (each connection moves to the next node when it loses one; on a cluster also give --rabbitmq-queue-type quorum) (--broker rabbitmq)"},
		&cli.StringFlag{Name: flagRabbitQueueType, Value: rabbitmq.QueueTypeClassic, EnvVars: env(flagRabbitQueueType), Category: catBroker, Usage: queueTypeUsage},
		nats,
		&cli.StringFlag{Name: flagKafkaBrokers, Value: DefaultKafkaBrokers, EnvVars: env(flagKafkaBrokers), Category: catBroker, Usage: "Kafka bootstrap brokers, a comma list of host:port (--broker kafka)"},
		&cli.StringFlag{Name: flagSQSEndpoint, Value: DefaultSQSEndpoint, EnvVars: env(flagSQSEndpoint), Category: catBroker, Usage: "SQS endpoint URL; empty for AWS's endpoint of --aws-region (--broker sqs)"},
		&cli.StringFlag{Name: flagAWSRegion, Value: DefaultAWSRegion, EnvVars: env(flagAWSRegion), Category: catBroker, Usage: "AWS region (--broker sqs); credentials come from the AWS SDK's default chain (AWS_ACCESS_KEY_ID, profiles, roles)"},
	}
}

// brokerLimitFlags: the adapters' settings that the worker's settings
// must agree with (worker.CheckLimits), for the commands that declare the
// topology (relay, worker, run, demo): --sqs-max-receive-count, which is
// part of the queue's declaration, and, with consumer (worker, run,
// demo), --rabbitmq-management-url and --rabbitmq-consumer-timeout, which
// only the worker's start-up check reads.
func brokerLimitFlags(consumer bool) []cli.Flag {
	var out []cli.Flag
	if consumer {
		out = append(out,
			&cli.StringFlag{Name: flagRabbitMgmtURL, EnvVars: env(flagRabbitMgmtURL), Category: catBroker, DefaultText: "none: a policy's delivery-limit is not checked",
				Usage: "RabbitMQ management API, http://user:password@host:15672 (without credentials, those of --rabbitmq-url); the worker reads the work queue's effective delivery-limit there (a policy's) and refuses to start when --max-attempts is not below it (--broker rabbitmq)"},
			&cli.DurationFlag{Name: flagRabbitConsumerT, Value: rabbitmq.DefaultConsumerTimeout, EnvVars: env(flagRabbitConsumerT), Category: catBroker,
				Usage: "the server's consumer_timeout (rabbitmq.conf; AMQP cannot read it); 0: the server has none. The worker refuses to start when --handler-timeout is not below it (--broker rabbitmq)"},
		)
	}
	return append(out, &cli.IntFlag{Name: flagSQSMaxReceive, Value: sqs.DefaultMaxReceiveCount, EnvVars: env(flagSQSMaxReceive), Category: catBroker,
		Usage: "maxReceiveCount of the work queue's RedrivePolicy, 1..1000: after that many receives SQS moves a message to the DLQ by itself; must be above the worker's --max-attempts (else it refuses to start), and every process declaring the queue must use the same value (--broker sqs)"})
}

// declareQueueType is --rabbitmq-queue-type's usage for the commands that
// declare the topology (relay, worker, run, demo).
const declareQueueType = "RabbitMQ queue type of the work, retry and dead-letter queues: classic or quorum (replicated); every process declaring a queue must use the same type (--broker rabbitmq)"

// topologyFlags: --exchange, --queue and --retry-delay, for the commands
// that declare the topology on the broker (relay, worker, run, demo).
func topologyFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagExchange, Value: app.DefaultExchange, EnvVars: env(flagExchange), Category: catTopology, Usage: "exchange (NATS: stream) the notification events are published to"},
		&cli.StringFlag{Name: flagQueue, Value: app.DefaultQueue, EnvVars: env(flagQueue), Category: catTopology, Usage: "work queue of the notification worker; its DLQ is <queue>.dlq"},
		&cli.StringFlag{Name: flagRetryDelay, Value: "30s", EnvVars: env(flagRetryDelay), Category: catTopology,
			Usage: "delay before a retry; a comma list is a backoff list (retry i waits the i-th, the last repeats), e.g. 1s,10s,1m. Every process declaring the queue must use the same list"},
	}
}

// destinationFlags: --destination, for the commands that enqueue (api,
// run, demo) or relay (relay, run, demo) the outbox.
func destinationFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagDestination, Value: outbox.DefaultDestination, EnvVars: env(flagDestination), Category: catTopology,
			Usage: "outbox destination: api enqueues its events for it and the relay publishes only its events, so services (or exchanges) sharing a database each use their own"},
	}
}

func apiFlags(defaultAddr string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagAddr, Value: defaultAddr, EnvVars: env(flagAddr), Category: catAPI, Usage: "HTTP listen address of the API, host:port; 0.0.0.0:3000 (or :3000) listens on every interface, an empty value is refused"},
		&cli.BoolFlag{Name: flagDebugFail, EnvVars: env(flagDebugFail), Category: catAPI, Usage: "make POST /notifications fail after the outbox insert (rolled back), to demonstrate the outbox"},
	}
}

// smtpFlags: the SMTP client of the worker. embedded (demo, run): without
// --smtp-addr a built-in SMTP sink is used.
func smtpFlags(embedded bool) []cli.Flag {
	addr := &cli.StringFlag{Name: flagSMTPAddr, Value: DefaultSMTPAddr, EnvVars: env(flagSMTPAddr), Category: catSMTP, Usage: "SMTP server host:port (no TLS, no auth)"}
	if embedded {
		addr.DefaultText = "a built-in SMTP sink in this process, which stores each mail as .eml in <--data-dir>/mail, or without --data-dir counts and discards it"
	}
	return []cli.Flag{
		addr,
		&cli.DurationFlag{Name: flagSMTPTimeout, Value: app.DefaultSMTPTimeout, EnvVars: env(flagSMTPTimeout), Category: catSMTP, Usage: "bound on connecting to the SMTP server and on the dialogue up to the end of the mail data"},
		&cli.DurationFlag{Name: flagSMTPDataTimeout, Value: app.DefaultSMTPDataTimeout, EnvVars: env(flagSMTPDataTimeout), Category: catSMTP,
			Usage: "how long to wait for the SMTP server's reply to the end of the mail data (RFC 5321 4.5.3.2.6: 10 minutes); when it expires the server may have the mail and the retry may send a copy"},
	}
}

func relayFlags() []cli.Flag {
	return append(append([]cli.Flag{
		&cli.IntFlag{Name: flagBatchSize, Value: outbox.DefaultBatchSize, EnvVars: env(flagBatchSize), Category: catRelay, Usage: "outbox rows published per relay transaction, 1.." + strconv.Itoa(outbox.MaxBatchSize)},
		&cli.DurationFlag{Name: flagPollInterval, Value: 500 * time.Millisecond, EnvVars: env(flagPollInterval), Category: catRelay, Usage: "how often the relay polls the outbox besides LISTEN/NOTIFY, a Go duration such as 500ms or 2s"},
		&cli.StringFlag{Name: flagRelayMode, Aliases: []string{"mode"}, Value: outbox.RelayModePoll, EnvVars: env(flagRelayMode), Category: catRelay,
			Usage: "how the relay reads the outbox: poll (claims and marks rows) or wal (reads the inserts from PostgreSQL's WAL by logical replication; needs wal_level=logical and a role with REPLICATION, see docs/delivery.md, \"The WAL relay\")"},
	}, walSlotFlags()...), relayFlagsTail()...)
}

func walSlotFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagWALSlot, EnvVars: env(flagWALSlot), Category: catRelay, DefaultText: "ferry_<destination>",
			Usage: "--relay-mode=wal: the logical replication slot and publication (lower-case letters, digits, _); relays with the same slot stand by for the one streaming"},
	}
}

func relayFlagsTail() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagRetention, Value: "7d", EnvVars: env(flagRetention), Category: catRelay, Usage: "how long processed outbox and dedup rows are kept (Go duration or Nd days; negative: forever). At least 1h and at least the longest --retry-delay times --max-attempts (the relay alone: times 5), so that a redelivered message still finds its dedup row; 0 is an error"},
	}
}

func workerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: flagMaxAttempts, Value: worker.DefaultMaxAttempts, EnvVars: env(flagMaxAttempts), Category: catWorker, Usage: "attempts per message, the first included, before it goes to the DLQ; must be below the broker's own delivery limit (--sqs-max-receive-count, a RabbitMQ policy's delivery-limit read with --rabbitmq-management-url, a JetStream consumer's MaxDeliver): the worker refuses to start otherwise"},
		&cli.IntFlag{Name: flagPrefetch, Value: 10, EnvVars: env(flagPrefetch), Category: catWorker, Usage: "deliveries received and not yet settled"},
		&cli.IntFlag{Name: flagConcurrency, Value: worker.DefaultConcurrency, EnvVars: env(flagConcurrency), Category: catWorker, Usage: "messages handled at once"},
		&cli.DurationFlag{Name: flagHandlerTimeout, EnvVars: env(flagHandlerTimeout), Category: catWorker,
			Usage: "bound on one handling attempt (its context is cancelled then, and the attempt fails); 0: none. Must be shorter than the broker's settle limit (RabbitMQ consumer_timeout, --rabbitmq-consumer-timeout; SQS 12h): the worker refuses to start otherwise"},
		&cli.IntFlag{Name: flagWorkerBatch, Value: worker.DefaultBatchSize, EnvVars: env(flagWorkerBatch), Category: catWorker,
			Usage: "deliveries handled in one database transaction, 1.." + strconv.Itoa(worker.MaxBatchSize) + " (a savepoint per message; one commit per batch). The status updates stay exactly once; the e-mail, sent outside the database, stays at least once, and a failed commit or a crash sends again every mail of the batch not yet committed (see docs/delivery.md, \"Batches\"). --prefetch, when not given, becomes at least --concurrency × this"},
		&cli.StringFlag{Name: flagWorkerLinger, Value: worker.DefaultBatchLinger.String(), EnvVars: env(flagWorkerLinger), Category: catWorker,
			Usage: "with --worker-batch-size above 1, how long a batch waits for each further delivery: milliseconds (a whole number) or a Go duration such as 500us or 20ms, above 0 and at most " + worker.MaxBatchLinger.String()},
	}
}

func shutdownFlags() []cli.Flag {
	return []cli.Flag{
		&cli.DurationFlag{Name: flagShutdownTimeout, Value: 30 * time.Second, EnvVars: env(flagShutdownTimeout), Category: catProcess, Usage: "on SIGINT/SIGTERM, how long in-flight work may finish; the process exits at most 5s later, leaving unfinished messages to be redelivered"},
	}
}

func dataDirFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagDataDir, EnvVars: env(flagDataDir), Category: catProcess, Usage: "folder for the embedded servers' data and the sink's mail", DefaultText: "a temporary folder removed at exit"},
	}
}

// without returns flags without those named names.
func without(flags []cli.Flag, names ...string) []cli.Flag {
	var out []cli.Flag
	for _, f := range flags {
		if !slices.Contains(names, f.Names()[0]) {
			out = append(out, f)
		}
	}
	return out
}

func concat(sets ...[]cli.Flag) []cli.Flag {
	var out []cli.Flag
	for _, s := range sets {
		out = append(out, s...)
	}
	return out
}

// parseLinger parses --worker-batch-linger: a whole number of
// milliseconds or a Go duration, above 0 and at most
// worker.MaxBatchLinger (0 would be worker.Config's "default").
func parseLinger(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	d, err := time.ParseDuration(v)
	if ms, aerr := strconv.Atoi(v); aerr == nil {
		d, err = time.Duration(ms)*time.Millisecond, nil
	}
	if err != nil {
		return 0, usagef("--%s %q: want milliseconds (a whole number such as 5) or a Go duration such as 500us or 20ms", flagWorkerLinger, v)
	}
	if d <= 0 || d > worker.MaxBatchLinger {
		return 0, usagef("--%s %q: want more than 0 and at most %v (default %v)", flagWorkerLinger, v, worker.MaxBatchLinger, worker.DefaultBatchLinger)
	}
	return d, nil
}

// parseRetryDelays parses --retry-delay: one Go duration or a comma list.
func parseRetryDelays(s string) ([]time.Duration, error) {
	var out []time.Duration
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		d, err := time.ParseDuration(part)
		if err != nil {
			return nil, usagef("--%s %q: item %d %q: want a Go duration such as 500ms, 30s or 5m", flagRetryDelay, s, i+1, part)
		}
		if d <= 0 {
			return nil, usagef("--%s %q: item %d %q: must be positive", flagRetryDelay, s, i+1, part)
		}
		out = append(out, d)
	}
	return out, nil
}

// parseRetention parses --retention: a Go duration or a whole number of
// days written Nd (7d). Zero is an error (it used to mean the default
// silently); negative keeps the rows forever.
func parseRetention(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	d, err := time.ParseDuration(s)
	if days, ok := strings.CutSuffix(s, "d"); ok && err != nil {
		n, aerr := strconv.Atoi(days)
		if aerr == nil {
			d, err = time.Duration(n)*24*time.Hour, nil
		}
	}
	if err != nil {
		return 0, usagef("--%s %q: want a Go duration (72h) or days (7d)", flagRetention, s)
	}
	if d == 0 {
		return 0, usagef("--%s %q: must not be 0: use a negative value to keep rows forever", flagRetention, s)
	}
	return d, nil
}

// checkRetention maps --retention to outbox.RelayConfig's rule (see
// outbox.MinRetention): a positive retention must be at least
// outbox.MinRetention and at least window, the redelivery window of the
// retry schedule. It returns a usage error naming the flags.
func checkRetention(retention, window time.Duration) error {
	if retention < 0 {
		return nil
	}
	if retention < outbox.MinRetention {
		return usagef("--%s %v: must be at least %v (the dedup rows must outlive a redelivered message), or negative to keep rows forever",
			flagRetention, retention, outbox.MinRetention)
	}
	if retention < window {
		return usagef("--%s %v: must be at least %v, the longest --%s times --%s (a copy in the retry levels must still find its dedup row), or negative to keep rows forever",
			flagRetention, retention, window, flagRetryDelay, flagMaxAttempts)
	}
	return nil
}

// checkRedrive refuses, for --broker sqs, a --max-attempts that is not
// below --sqs-max-receive-count (worker.CheckLimits' rule for
// broker.Limits.DeliveryLimit), before anything is declared: the worker
// would refuse it only after its Declare had created the queue with that
// maxReceiveCount, which a later run with another one is refused for
// (broker.ErrTopologyMismatch). both is whether the command has the two
// flags (worker, run, demo).
func checkRedrive(s *settings, both bool) error {
	if !both || s.broker != "sqs" {
		return nil
	}
	n := s.brokerOpts.SQSMaxReceiveCount
	if s.maxAttempts < n {
		return nil
	}
	return usagef("--%s %d must be below --%s (sqs.Config.MaxReceiveCount, the maxReceiveCount of the work queue's RedrivePolicy) %d: SQS moves a message to the DLQ by itself after that many receives, before the worker's last attempt and without its reason; set --%s %d or --%s %d",
		flagMaxAttempts, s.maxAttempts, flagSQSMaxReceive, n, flagMaxAttempts, max(n-1, 1), flagSQSMaxReceive, s.maxAttempts+1)
}

// settings are the parsed and checked flags of one command.
type settings struct {
	databaseURL     string
	databaseSet     bool
	broker          string
	brokerSet       bool
	brokerOpts      BrokerOptions
	natsSet         bool
	smtpAddr        string
	smtpSet         bool
	smtpTimeout     time.Duration // 0: app's default
	smtpDataTimeout time.Duration // 0: app's default
	addr            string
	exchange        string
	destination     string
	queue           string
	retryDelays     []time.Duration
	maxAttempts     int
	prefetch        int
	concurrency     int
	batchSize       int
	prefetchSet     bool          // --prefetch was given
	workerBatch     int           // --worker-batch-size
	workerLinger    time.Duration // --worker-batch-linger
	pollInterval    time.Duration
	relayMode       string
	walSlot         string
	retention       time.Duration
	retryWindow     time.Duration // outbox.RedeliveryWindowFor(retryDelays, max attempts; relay: worker.DefaultMaxAttempts)
	shutdownTimeout time.Duration
	handlerTimeout  time.Duration // 0: none
	debugFail       bool
	dataDir         string
	// obs are the observability flags (nil for commands without them).
	obs *obsSettings
}

// loadSettings reads the flags that c defines and checks them.
func loadSettings(c *cli.Context) (*settings, error) {
	s := &settings{
		databaseURL:     c.String(flagDatabaseURL),
		databaseSet:     c.IsSet(flagDatabaseURL),
		broker:          c.String(flagBroker),
		brokerSet:       c.IsSet(flagBroker),
		natsSet:         c.IsSet(flagNATSURL),
		smtpAddr:        c.String(flagSMTPAddr),
		smtpSet:         c.IsSet(flagSMTPAddr),
		smtpTimeout:     c.Duration(flagSMTPTimeout),
		smtpDataTimeout: c.Duration(flagSMTPDataTimeout),
		addr:            c.String(flagAddr),
		exchange:        c.String(flagExchange),
		destination:     c.String(flagDestination),
		queue:           c.String(flagQueue),
		maxAttempts:     c.Int(flagMaxAttempts),
		prefetch:        c.Int(flagPrefetch),
		concurrency:     c.Int(flagConcurrency),
		batchSize:       c.Int(flagBatchSize),
		prefetchSet:     c.IsSet(flagPrefetch),
		workerBatch:     c.Int(flagWorkerBatch),
		pollInterval:    c.Duration(flagPollInterval),
		relayMode:       c.String(flagRelayMode),
		walSlot:         c.String(flagWALSlot),
		shutdownTimeout: c.Duration(flagShutdownTimeout),
		handlerTimeout:  c.Duration(flagHandlerTimeout),
		debugFail:       c.Bool(flagDebugFail),
		dataDir:         c.String(flagDataDir),
		brokerOpts: BrokerOptions{
			RabbitMQURL:           c.String(flagRabbitMQURL),
			RabbitMQQueueType:     c.String(flagRabbitQueueType),
			RabbitMQManagementURL: c.String(flagRabbitMgmtURL),
			NATSURL:               c.String(flagNATSURL),
			KafkaBrokers:          splitList(c.String(flagKafkaBrokers)),
			SQSEndpoint:           c.String(flagSQSEndpoint),
			AWSRegion:             c.String(flagAWSRegion),
		},
	}
	has := func(name string) bool { return hasFlag(c, name) }
	if err := checkFlagValues(c, s); err != nil {
		return nil, err
	}
	obs, err := loadObsSettings(c)
	if err != nil {
		return nil, err
	}
	s.obs = obs
	if has(flagBroker) {
		if _, err := lookupBroker(s.broker); err != nil {
			return nil, err
		}
	}
	if qt := s.brokerOpts.RabbitMQQueueType; qt != "" && qt != rabbitmq.QueueTypeClassic && qt != rabbitmq.QueueTypeQuorum {
		return nil, usagef("--%s %q: want %s or %s", flagRabbitQueueType, qt, rabbitmq.QueueTypeClassic, rabbitmq.QueueTypeQuorum)
	}
	if has(flagRelayMode) && s.relayMode != outbox.RelayModePoll && s.relayMode != outbox.RelayModeWAL {
		return nil, usagef("--%s %q: want %s or %s", flagRelayMode, s.relayMode, outbox.RelayModePoll, outbox.RelayModeWAL)
	}
	if has(flagWALSlot) && s.walSlot != "" {
		if err := outbox.ValidateSlotName(s.walSlot); err != nil {
			return nil, usagef("--%s %q: %v", flagWALSlot, s.walSlot, err)
		}
	}
	if err := outbox.ValidateDestination(s.destination); err != nil {
		return nil, usagef("--%s %q: %v", flagDestination, s.destination, err)
	}
	if has(flagRabbitConsumerT) {
		switch d := c.Duration(flagRabbitConsumerT); {
		case d < 0:
			return nil, usagef("--%s %v: must not be negative (0: the server has no consumer_timeout)", flagRabbitConsumerT, d)
		case d == 0:
			s.brokerOpts.RabbitMQConsumerTimeout = -1 // rabbitmq.Config: negative is none
		default:
			s.brokerOpts.RabbitMQConsumerTimeout = d
		}
	}
	if has(flagSQSMaxReceive) {
		n := c.Int(flagSQSMaxReceive)
		if n < 1 || n > 1000 {
			return nil, usagef("--%s %d: want 1..1000 (AWS's range of maxReceiveCount)", flagSQSMaxReceive, n)
		}
		s.brokerOpts.SQSMaxReceiveCount = n
	}
	if has(flagRetryDelay) {
		d, err := parseRetryDelays(c.String(flagRetryDelay))
		if err != nil {
			return nil, err
		}
		s.retryDelays = d
	}
	if has(flagRetention) {
		d, err := parseRetention(c.String(flagRetention))
		if err != nil {
			return nil, err
		}
		s.retention = d
	}
	positive := []struct {
		name string
		v    int
	}{{flagMaxAttempts, s.maxAttempts}, {flagPrefetch, s.prefetch}, {flagConcurrency, s.concurrency}, {flagBatchSize, s.batchSize}}
	for _, p := range positive {
		if has(p.name) && p.v < 1 {
			return nil, usagef("--%s %d: must be at least 1", p.name, p.v)
		}
	}
	for _, p := range []struct {
		name string
		v    time.Duration
	}{{flagPollInterval, s.pollInterval}, {flagShutdownTimeout, s.shutdownTimeout},
		{flagSMTPTimeout, s.smtpTimeout}, {flagSMTPDataTimeout, s.smtpDataTimeout}} {
		if has(p.name) && p.v <= 0 {
			return nil, usagef("--%s %v: must be positive", p.name, p.v)
		}
	}
	if has(flagWorkerBatch) && (s.workerBatch < 1 || s.workerBatch > worker.MaxBatchSize) {
		return nil, usagef("--%s %d: want 1..%d (1: one transaction per message)", flagWorkerBatch, s.workerBatch, worker.MaxBatchSize)
	}
	if has(flagWorkerLinger) {
		d, err := parseLinger(c.String(flagWorkerLinger))
		if err != nil {
			return nil, err
		}
		s.workerLinger = d
	}
	if has(flagHandlerTimeout) && s.handlerTimeout < 0 {
		return nil, usagef("--%s %v: must not be negative (0: no bound)", flagHandlerTimeout, s.handlerTimeout)
	}
	if err := checkRedrive(s, has(flagMaxAttempts) && has(flagSQSMaxReceive)); err != nil {
		return nil, err
	}
	if has(flagRetention) {
		attempts := worker.DefaultMaxAttempts
		if has(flagMaxAttempts) {
			attempts = s.maxAttempts
		}
		s.retryWindow = outbox.RedeliveryWindowFor(s.retryDelays, attempts)
		if err := checkRetention(s.retention, s.retryWindow); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// workerPrefetch is the worker's Config.Prefetch: --prefetch, unless
// batches are asked for (--worker-batch-size above 1) without it: then 0,
// worker.Config's default (10, or Concurrency × BatchSize when larger),
// so that every handling goroutine can fill its batch.
func (s *settings) workerPrefetch() int {
	if s.workerBatch > 1 && !s.prefetchSet {
		return 0
	}
	return s.prefetch
}

// hasFlag reports whether the running command defines the flag name,
// by its name, not an alias (ferry console's --console-addr is also
// spelt --addr, which is not the API's --addr).
func hasFlag(c *cli.Context, name string) bool {
	if c.Command == nil {
		return false
	}
	for _, f := range c.Command.Flags {
		if f.Names()[0] == name {
			return true
		}
	}
	return false
}

// splitList splits a comma list, trimming spaces and dropping empty
// items; "" gives nil.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
