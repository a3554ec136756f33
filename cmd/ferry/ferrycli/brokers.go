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
	// NATSURL is --nats-url, a nats:// URL.
	NATSURL string
	// KafkaBrokers is --kafka-brokers: Kafka bootstrap addresses, host:port.
	KafkaBrokers []string
	// SQSEndpoint is --sqs-endpoint, an http(s):// URL; empty means AWS's
	// endpoint for AWSRegion.
	SQSEndpoint string
	// AWSRegion is --aws-region, e.g. "us-east-1".
	AWSRegion string
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
		return rabbitmq.New(ctx, rabbitmq.Config{URL: o.RabbitMQURL, QueueType: o.RabbitMQQueueType, Logger: o.Logger})
	},
	"nats": func(ctx context.Context, o BrokerOptions) (broker.Broker, error) {
		return nats.New(ctx, nats.Config{URL: o.NATSURL, LookupExchange: o.LookupExchange, Logger: o.Logger})
	},
	"kafka": func(ctx context.Context, o BrokerOptions) (broker.Broker, error) {
		return kafka.New(ctx, kafka.Config{Brokers: o.KafkaBrokers, Logger: o.Logger})
	},
	"sqs": func(ctx context.Context, o BrokerOptions) (broker.Broker, error) {
		return sqs.New(ctx, sqs.Config{Endpoint: o.SQSEndpoint, Region: o.AWSRegion, LookupExchange: o.LookupExchange, Logger: o.Logger})
	},
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

// OpenBroker opens the broker named name with o, once.
func OpenBroker(ctx context.Context, name string, o BrokerOptions) (broker.Broker, error) {
	f, err := lookupBroker(name)
	if err != nil {
		return nil, err
	}
	return f(ctx, o)
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
// backoff (0.5 s doubling to 5 s) while the broker cannot be reached, so
// a relay or worker started before its broker waits for it. It returns
// only a lookup error, a topology the broker refuses as unsupported or as
// different from what it already holds (broker.ErrTopologyMismatch, e.g.
// another --retry-delay than the queue was declared with: permanent, so
// not retried), or ctx's error.
func connectBroker(ctx context.Context, name string, o BrokerOptions, t broker.Topology, log *slog.Logger) (broker.Broker, error) {
	f, err := lookupBroker(name)
	if err != nil {
		return nil, err
	}
	backoff := 500 * time.Millisecond
	var lastWarn time.Time
	for attempt := 1; ; attempt++ {
		b, err := f(ctx, o)
		if err == nil {
			// Refuse at start what the broker cannot honour (message
			// size, retry delays, wildcard bindings), instead of failing
			// on the first message.
			if cerr := b.Capabilities().Check(requirements(t)); cerr != nil {
				_ = b.Close()
				return nil, fmt.Errorf("ferry: %s: %w", name, cerr)
			}
			err = b.Declare(ctx, t)
			if err == nil {
				if attempt > 1 {
					log.Info("broker reachable", "broker", name)
				}
				return b, nil
			}
			_ = b.Close()
			if errors.Is(err, broker.ErrUnsupported) || errors.Is(err, broker.ErrTopologyMismatch) {
				return nil, fmt.Errorf("ferry: %s: declare topology: %w", name, err)
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// At most one line per brokerWaitLogEvery, so a long wait shows
		// it is still trying without flooding the log.
		if time.Since(lastWarn) >= brokerWaitLogEvery {
			log.Warn("broker not reachable; retrying", "broker", name, "attempt", attempt, "error", err)
			lastWarn = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}
