package ferrycli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/brokers/sqs"
)

// BrokerOptions are the command-line settings a broker constructor may use.
type BrokerOptions struct {
	// RabbitMQURL is --rabbitmq-url, an amqp:// URL.
	RabbitMQURL string
	// RabbitMQQueueType is --rabbitmq-queue-type, rabbitmq.Config.QueueType:
	// "classic" or "quorum"; empty means classic.
	RabbitMQQueueType string
	// RabbitMQManagementURL is --rabbitmq-management-url,
	// rabbitmq.Config.ManagementURL: the management API's base URL, from
	// which the worker reads a queue's delivery-limit; empty: not read.
	RabbitMQManagementURL string
	// RabbitMQConsumerTimeout is --rabbitmq-consumer-timeout,
	// rabbitmq.Config.ConsumerTimeout: 0 is the adapter's default (30 min),
	// negative means the server has none.
	RabbitMQConsumerTimeout time.Duration
	// NATSURL is --nats-url, a nats:// URL.
	NATSURL string
	// KafkaBrokers is --kafka-brokers: Kafka bootstrap addresses, host:port.
	KafkaBrokers []string
	// SQSEndpoint is --sqs-endpoint, an http(s):// URL; empty means AWS's
	// endpoint for AWSRegion.
	SQSEndpoint string
	// AWSRegion is --aws-region, e.g. "us-east-1".
	AWSRegion string
	// SQSMaxReceiveCount is --sqs-max-receive-count,
	// sqs.Config.MaxReceiveCount (1..1000); 0 is the adapter's default
	// (100).
	SQSMaxReceiveCount int
	// LookupExchange is the exchange on which the DLQ of a queue this
	// process did not declare is looked for (ferry dlq's --exchange when
	// given); brokers whose DLQ lookup needs no exchange ignore it. Empty:
	// the adapter searches (NATS: every exchange stream).
	LookupExchange string
	// Logger receives the adapter's logs.
	Logger *slog.Logger
}

// BrokerFunc opens a broker. It returns an error when the broker cannot be
// reached; callers that must wait for a broker retry it.
type BrokerFunc func(ctx context.Context, o BrokerOptions) (broker.Broker, error)

// Brokers maps each --broker name to its adapter's constructor: the one
// place where an adapter is wired into the command. The end-to-end tests
// range over it, so a broker added here is tested end to end.
var Brokers = map[string]BrokerFunc{
	"rabbitmq": func(ctx context.Context, o BrokerOptions) (broker.Broker, error) {
		return rabbitmq.New(ctx, rabbitConfig(o))
	},
	"nats": func(ctx context.Context, o BrokerOptions) (broker.Broker, error) {
		return nats.New(ctx, natsConfig(o))
	},
	"kafka": func(ctx context.Context, o BrokerOptions) (broker.Broker, error) {
		return kafka.New(ctx, kafkaConfig(o))
	},
	"sqs": func(ctx context.Context, o BrokerOptions) (broker.Broker, error) {
		return sqs.New(ctx, sqsConfig(o))
	},
}

func rabbitConfig(o BrokerOptions) rabbitmq.Config {
	return rabbitmq.Config{URL: o.RabbitMQURL, QueueType: o.RabbitMQQueueType, ManagementURL: o.RabbitMQManagementURL,
		ConsumerTimeout: o.RabbitMQConsumerTimeout, Logger: o.Logger}
}

func natsConfig(o BrokerOptions) nats.Config {
	return nats.Config{URL: o.NATSURL, LookupExchange: o.LookupExchange, Logger: o.Logger}
}

func kafkaConfig(o BrokerOptions) kafka.Config {
	return kafka.Config{Brokers: o.KafkaBrokers, Logger: o.Logger}
}

func sqsConfig(o BrokerOptions) sqs.Config {
	return sqs.Config{Endpoint: o.SQSEndpoint, Region: o.AWSRegion, MaxReceiveCount: o.SQSMaxReceiveCount,
		LookupExchange: o.LookupExchange, Logger: o.Logger}
}

// brokerChecks validates, per --broker name, the adapter's Config built
// from the flags as Brokers builds it, without any network access.
var brokerChecks = map[string]func(BrokerOptions) error{
	"rabbitmq": func(o BrokerOptions) error { return rabbitConfig(o).Validate() },
	"nats":     func(o BrokerOptions) error { return natsConfig(o).Validate() },
	"kafka":    func(o BrokerOptions) error { return kafkaConfig(o).Validate() },
	"sqs":      func(o BrokerOptions) error { return sqsConfig(o).Validate() },
}

// configFlags names, per broker and adapter Config field, the flag the
// field comes from (brokerError).
var configFlags = map[string]map[string]string{
	"rabbitmq": {"URL": flagRabbitMQURL, "QueueType": flagRabbitQueueType, "ManagementURL": flagRabbitMgmtURL},
	"nats":     {"URL": flagNATSURL, "LookupExchange": flagExchange},
	"kafka":    {"Brokers": flagKafkaBrokers},
	"sqs":      {"Endpoint": flagSQSEndpoint, "Region": flagAWSRegion, "LookupExchange": flagExchange},
}

// addressFlags names each broker's address flag, and what to check when
// the server refuses the connection (broker.ErrRefused).
var addressFlags = map[string]struct{ flag, hint string }{
	"rabbitmq": {flagRabbitMQURL, "check the user, password and vhost in the URL, and the user's permissions"},
	"nats":     {flagNATSURL, "check the user and password (or token) in the URL"},
	"kafka":    {flagKafkaBrokers, "check the addresses"},
	"sqs":      {flagSQSEndpoint, "check the AWS credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE) and --" + flagAWSRegion},
}

// checkBroker validates the flags of the broker named name (see
// brokerChecks) and returns brokerError's usage error for a flag the
// adapter refuses, nil for an unknown name (lookupBroker reports it).
func checkBroker(name string, o BrokerOptions) error {
	check, ok := brokerChecks[name]
	if !ok {
		return nil
	}
	if err := check(o); err != nil {
		return brokerError(name, o, err)
	}
	return nil
}

// brokerError maps an adapter's error about its configuration or a
// refused connection to the flag it comes from: a *broker.ConfigError
// becomes a usage error (exit 2) naming the flag, the refused value and
// what is wanted; broker.ErrRefused an error (exit 1) naming the address
// flag, what to check, and the server's words. Other errors are returned
// unchanged.
func brokerError(name string, o BrokerOptions, err error) error {
	var ce *broker.ConfigError
	if errors.As(err, &ce) {
		flag := configFlags[name][ce.Field]
		if flag == "" {
			return usagef("--%s %s: %v", flagBroker, name, err)
		}
		if ce.Value == "" {
			return usagef("--%s: %s", flag, ce.Reason)
		}
		return usagef("--%s %q: %s", flag, ce.Value, ce.Reason)
	}
	if errors.Is(err, broker.ErrRefused) {
		a := addressFlags[name]
		return fmt.Errorf("ferry: --%s %s: refused by the server, not retried (%s): %w", a.flag, redactURL(brokerAddress(name, o)), a.hint, err)
	}
	return err
}

// brokerAddress is what the broker named name connects to, from o.
func brokerAddress(name string, o BrokerOptions) string {
	switch name {
	case "rabbitmq":
		return o.RabbitMQURL
	case "nats":
		return o.NATSURL
	case "kafka":
		return strings.Join(o.KafkaBrokers, ",")
	case "sqs":
		if o.SQSEndpoint == "" {
			return "AWS SQS " + o.AWSRegion
		}
		return o.SQSEndpoint
	}
	return ""
}

// Errors of OpenBroker.
var (
	// ErrUnknownBroker is returned for a --broker name ferry does not know.
	ErrUnknownBroker = errors.New("ferry: unknown broker")
)

// BrokerNames returns the names in Brokers, sorted.
func BrokerNames() []string {
	names := make([]string, 0, len(Brokers))
	for n := range Brokers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// lookupBroker returns the constructor of name, or an error wrapping
// ErrUnknownBroker that lists the choices.
func lookupBroker(name string) (BrokerFunc, error) {
	if f, ok := Brokers[name]; ok {
		return f, nil
	}
	avail := strings.Join(BrokerNames(), ", ")
	return nil, fmt.Errorf("%w: --broker %q: want one of: %s", ErrUnknownBroker, name, avail)
}

// OpenBroker opens the broker named name with o, once. A flag the adapter
// refuses and a connection the server refuses come back as brokerError
// maps them (naming the flag; see namesFlag); other errors unchanged.
func OpenBroker(ctx context.Context, name string, o BrokerOptions) (broker.Broker, error) {
	f, err := lookupBroker(name)
	if err != nil {
		return nil, err
	}
	b, err := f(ctx, o)
	if err != nil {
		return nil, brokerError(name, o, err)
	}
	return b, nil
}

// namesFlag reports whether err, from OpenBroker or connectBroker, already
// names the flag to fix (a usage error, a refused connection), so a
// caller returns it as it is instead of wrapping it in "<broker> at
// <address>".
func namesFlag(err error) bool {
	return errors.Is(err, ErrUsage) || errors.Is(err, broker.ErrRefused)
}

// requirements is what the notification service asks of a broker with
// topology t: its largest event and every queue's retry delays.
func requirements(t broker.Topology) broker.Requirements {
	r := broker.Requirements{MaxMessageBytes: app.MaxEventBytes, Topology: t}
	for _, q := range t.Queues {
		r.RetryDelays = append(r.RetryDelays, q.Delays()...)
	}
	return r
}

// brokerWaitLogEvery is how often connectBroker logs that it is still
// waiting for an unreachable broker (its retries are 0.5 s doubling to 5 s).
const brokerWaitLogEvery = 5 * time.Second

// connectBroker opens the broker and declares t on it, retrying with
// backoff (0.5 s doubling to 5 s) while the broker cannot be reached
// (connection refused, timeouts, DNS failures), so a relay or worker
// started before its broker waits for it. With giveUp > 0 it stops
// retrying after that long and returns the last error (the demo); it
// bounds the attempts to connect, not a Declare under way. It
// returns at once, without retrying, what waiting cannot cure
// (broker.IsPermanent): a flag the adapter refuses (a usage error naming
// the flag, see brokerError), a connection the server refused (wrong
// credentials, unknown vhost), a topology the broker refuses as
// unsupported or as different from what it already holds
// (broker.ErrTopologyMismatch, e.g. another --retry-delay than the queue
// was declared with); and a lookup error or ctx's error.
func connectBroker(ctx context.Context, name string, o BrokerOptions, t broker.Topology, giveUp time.Duration, log *slog.Logger) (broker.Broker, error) {
	f, err := lookupBroker(name)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	backoff := 500 * time.Millisecond
	var lastWarn time.Time
	var lastErr error // of the last attempt that giveUp did not cut short
	for attempt := 1; ; attempt++ {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if giveUp > 0 {
			actx, cancel = context.WithDeadline(ctx, start.Add(giveUp))
		}
		b, err := f(actx, o)
		if err == nil {
			// Refuse at start what the broker cannot honour (message
			// size, retry delays, wildcard bindings), instead of failing
			// on the first message.
			if cerr := b.Capabilities().Check(requirements(t)); cerr != nil {
				cancel()
				_ = b.Close()
				return nil, fmt.Errorf("ferry: %s: %w", name, cerr)
			}
			// Declare is bounded by ctx only: a broker that answered is
			// given the time it takes (Kafka creating topics).
			err = b.Declare(ctx, t)
			if err == nil {
				cancel()
				if attempt > 1 {
					log.Info("broker reachable", "broker", name)
				}
				return b, nil
			}
			_ = b.Close()
			if errors.Is(err, broker.ErrUnsupported) || errors.Is(err, broker.ErrTopologyMismatch) {
				cancel()
				return nil, fmt.Errorf("ferry: %s: declare topology: %w", name, err)
			}
		}
		cut := actx.Err() != nil
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !cut || lastErr == nil {
			lastErr = err
		}
		if broker.IsPermanent(err) {
			return nil, brokerError(name, o, err)
		}
		left := time.Duration(-1)
		if giveUp > 0 {
			if left = giveUp - time.Since(start); left <= 0 {
				return nil, fmt.Errorf("ferry: %s at %s: not reachable within %v (%d attempt(s)), giving up: %w",
					name, redactURL(brokerAddress(name, o)), giveUp, attempt, lastErr)
			}
		}
		// At most one line per brokerWaitLogEvery, so a long wait shows
		// it is still trying without flooding the log. With giveUp the
		// final error says it all: the retries are logged at INFO.
		if time.Since(lastWarn) >= brokerWaitLogEvery {
			lvl := slog.LevelWarn
			if giveUp > 0 {
				lvl = slog.LevelInfo
			}
			log.Log(ctx, lvl, "broker not reachable; retrying", "broker", name, "attempt", attempt, "error", err)
			lastWarn = time.Now()
		}
		wait := backoff
		if left >= 0 && left < wait {
			wait = left
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}
