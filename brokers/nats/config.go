package nats

import (
	"fmt"
	"log/slog"
	"time"
)

// Config configures the NATS JetStream adapter. The zero value of every
// field means its documented default.
type Config struct {
	// URL of the NATS server (several may be given, comma-separated), e.g.
	// "nats://127.0.0.1:4222". Defaults to DefaultURL.
	URL string
	// Name is the client connection name shown by the server's monitoring.
	// Defaults to "ferry".
	Name string
	// DuplicateWindow is the streams' duplicate window: a message published
	// again with the same Nats-Msg-Id within it is dropped by the server
	// (the publish is still confirmed). A relay re-publish later than the
	// window is stored again and the worker's deduplication drops it.
	// Defaults to 2 minutes (the JetStream default).
	DuplicateWindow time.Duration
	// PublishTimeout bounds Publish, DeadLetter and the DLQ operations when
	// the caller's ctx has no deadline, and is the time after which an
	// unconfirmed asynchronous publish is given up. Defaults to 30 s.
	PublishTimeout time.Duration
	// SettleTimeout bounds Ack, Retry, Extend and the Term of DeadLetter
	// (each waits for the server's confirmation) when the caller's ctx has
	// no deadline. Defaults to 10 s.
	SettleTimeout time.Duration
	// ReconnectWait is the pause between reconnect attempts; the adapter
	// reconnects forever. Defaults to 250 ms.
	ReconnectWait time.Duration
	// Replicas is the replication factor of the streams and consumers
	// (1 on a single server, 3 in a typical cluster). Defaults to 1.
	Replicas int
	// MaxAckPending is the server-side bound on unacknowledged deliveries
	// of one queue's consumer across all its subscribers (JetStream
	// MaxAckPending). Each subscription additionally holds at most its own
	// SubscribeOptions.Prefetch; Subscribe raises MaxAckPending to the
	// prefetch when the prefetch is larger. Defaults to 1000.
	MaxAckPending int
	// MinRetryDelay is the shortest redelivery delay Delivery.Retry asks
	// for: a smaller (or zero) delay is raised to it, so that attempts are
	// never burned by an immediate Nak. Defaults to 100 ms.
	MinRetryDelay time.Duration
	// PullWait is how long one pull request waits on the server for
	// messages before it is renewed (JetStream pull "expires"). Defaults to
	// 2 s.
	PullWait time.Duration
	// LookupExchange is the exchange on which DLQ looks for a queue this
	// broker did not Declare (an operator's tool such as ferry dlq, which
	// declares nothing): the queue's consumer must be on that exchange's
	// stream. Empty: every exchange stream on the server that has a DLQ
	// stream beside it is searched, and the queue must be on exactly one.
	// Queues this broker declared are always found on their exchange.
	LookupExchange string
	// Logger receives connection events (disconnect, reconnect, errors of
	// the background pull loop). Defaults to slog.Default(). The adapter
	// adds the attribute broker=nats to every line, so do not add a
	// "broker" attribute to Logger yourself.
	Logger *slog.Logger
}

// DefaultURL is the server URL when Config.URL is empty.
const DefaultURL = "nats://127.0.0.1:4222"

func (c Config) withDefaults() Config {
	if c.URL == "" {
		c.URL = DefaultURL
	}
	if c.Name == "" {
		c.Name = "ferry"
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = 2 * time.Minute
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = 30 * time.Second
	}
	if c.SettleTimeout == 0 {
		c.SettleTimeout = 10 * time.Second
	}
	if c.ReconnectWait == 0 {
		c.ReconnectWait = 250 * time.Millisecond
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 1000
	}
	if c.MinRetryDelay == 0 {
		c.MinRetryDelay = 100 * time.Millisecond
	}
	if c.PullWait == 0 {
		c.PullWait = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.DuplicateWindow < 0:
		return fmt.Errorf("nats: config: DuplicateWindow %v: must not be negative", c.DuplicateWindow)
	case c.PublishTimeout < 0:
		return fmt.Errorf("nats: config: PublishTimeout %v: must not be negative", c.PublishTimeout)
	case c.SettleTimeout < 0:
		return fmt.Errorf("nats: config: SettleTimeout %v: must not be negative", c.SettleTimeout)
	case c.ReconnectWait < 0:
		return fmt.Errorf("nats: config: ReconnectWait %v: must not be negative", c.ReconnectWait)
	case c.Replicas < 0 || c.Replicas > 5:
		return fmt.Errorf("nats: config: Replicas %d: want 1 to 5", c.Replicas)
	case c.MaxAckPending < 0:
		return fmt.Errorf("nats: config: MaxAckPending %d: must not be negative", c.MaxAckPending)
	case c.MinRetryDelay < 0:
		return fmt.Errorf("nats: config: MinRetryDelay %v: must not be negative", c.MinRetryDelay)
	case c.PullWait < 0:
		return fmt.Errorf("nats: config: PullWait %v: must not be negative", c.PullWait)
	case c.PullWait > 0 && c.PullWait < 100*time.Millisecond:
		return fmt.Errorf("nats: config: PullWait %v: must be at least 100ms", c.PullWait)
	}
	if c.LookupExchange != "" {
		if err := validName("exchange", c.LookupExchange); err != nil {
			return fmt.Errorf("nats: config: LookupExchange: %w", err)
		}
	}
	return nil
}
