package nats

import (
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ferrymq/ferry/broker"
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
	// PublishResend is how long Publish waits for a message's PubAck
	// before it publishes the message again, with the same Nats-Msg-Id, and
	// again at that interval until the PubAck comes, PublishTimeout ends or
	// the resends would fall outside DuplicateWindow. A message that reached
	// a stream leader which died before it answered gets no PubAck at all
	// (nothing tells the client: its connection may be on another server),
	// and without a resend the Publish waits out PublishTimeout; the new
	// leader, elected within JetStream's Raft election timeout (4-9 s in
	// nats-server), stores the resend, or drops it as a duplicate when the
	// first copy was stored (https://docs.nats.io/using-nats/developer/develop_jetstream/model_deep_dive#message-deduplication).
	// Defaults to 2 s; negative: never resend. At least 100 ms when set.
	PublishResend time.Duration
	// SettleTimeout bounds Ack, Retry, Extend and the Term of DeadLetter
	// (each waits for the server's confirmation) when the caller's ctx has
	// no deadline. Defaults to 10 s.
	SettleTimeout time.Duration
	// ReconnectWait is the pause between reconnect attempts; the adapter
	// reconnects forever. Defaults to 250 ms.
	ReconnectWait time.Duration
	// Replicas is the replication factor of the streams and consumers
	// (1 on a single server, 3 in a typical cluster). Defaults to 1 on a
	// single server and to 3 (or the cluster's size when smaller) when the
	// server New reaches is part of a cluster. An explicit 1 on a cluster
	// is logged as a WARN: a stream with one replica lives on one server and
	// its messages are unavailable, or lost with its disk, while that
	// server is down (https://docs.nats.io/nats-concepts/jetstream/streams#replicas:
	// "Replicas=3 - Can tolerate the loss of one server servicing the stream").
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
	// messages before it is renewed (JetStream pull "expires"), once a
	// short pull for the prefetch's room found the queue empty. Defaults
	// to 2 s.
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
	if c.PublishResend == 0 {
		c.PublishResend = 2 * time.Second
	}
	if c.SettleTimeout == 0 {
		c.SettleTimeout = 10 * time.Second
	}
	if c.ReconnectWait == 0 {
		c.ReconnectWait = 250 * time.Millisecond
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

// Validate checks c with the defaults applied, as New does before it
// connects: every URL of the comma list must be nats://, tls://, ws:// or
// wss:// (or a bare host:port, which nats.go reads as nats://) with a host
// and, when given, a port 1..65535; the durations and counts must be in
// range. It needs no server. The error is a *broker.ConfigError naming the
// field, wrapping broker.ErrInvalidConfig.
func (c Config) Validate() error { return c.withDefaults().validate() }

func (c Config) validate() error {
	bad := func(field, value, format string, args ...any) error {
		return &broker.ConfigError{Adapter: "nats", Field: field, Value: value, Reason: fmt.Sprintf(format, args...)}
	}
	for _, raw := range strings.Split(c.URL, ",") {
		if reason := checkURL(strings.TrimSpace(raw)); reason != "" {
			return bad("URL", redact(strings.TrimSpace(raw)), "%s", reason)
		}
	}
	switch {
	case c.DuplicateWindow < 0:
		return bad("DuplicateWindow", "", "%v: must not be negative", c.DuplicateWindow)
	case c.PublishTimeout < 0:
		return bad("PublishTimeout", "", "%v: must not be negative", c.PublishTimeout)
	case c.PublishResend > 0 && c.PublishResend < 100*time.Millisecond:
		return bad("PublishResend", "", "%v: must be at least 100ms (or negative: never resend)", c.PublishResend)
	case c.SettleTimeout < 0:
		return bad("SettleTimeout", "", "%v: must not be negative", c.SettleTimeout)
	case c.ReconnectWait < 0:
		return bad("ReconnectWait", "", "%v: must not be negative", c.ReconnectWait)
	case c.Replicas < 0 || c.Replicas > 5:
		return bad("Replicas", "", "%d: want 1 to 5", c.Replicas)
	case c.MaxAckPending < 0:
		return bad("MaxAckPending", "", "%d: must not be negative", c.MaxAckPending)
	case c.MinRetryDelay < 0:
		return bad("MinRetryDelay", "", "%v: must not be negative", c.MinRetryDelay)
	case c.PullWait < 0:
		return bad("PullWait", "", "%v: must not be negative", c.PullWait)
	case c.PullWait > 0 && c.PullWait < 100*time.Millisecond:
		return bad("PullWait", "", "%v: must be at least 100ms", c.PullWait)
	}
	if c.LookupExchange != "" {
		if err := validName("exchange", c.LookupExchange); err != nil {
			return bad("LookupExchange", c.LookupExchange, "%v", err)
		}
	}
	return nil
}

// urlSchemes are the schemes nats.go connects with.
var urlSchemes = map[string]bool{"nats": true, "tls": true, "ws": true, "wss": true}

// checkURL returns what is wrong with one server URL, or "".
func checkURL(raw string) string {
	const want = "want nats://[user:password@]host[:port] (or tls://, ws://, wss://)"
	if raw == "" {
		return "empty server URL in the list; " + want
	}
	if !strings.Contains(raw, "://") {
		raw = "nats://" + raw // as nats.go reads it
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Sprintf("%v; %s", err, want)
	}
	if !urlSchemes[u.Scheme] {
		return fmt.Sprintf("unknown scheme %q; %s", u.Scheme, want)
	}
	if u.Hostname() == "" {
		return "no host; " + want
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("port %q: want 1..65535", p)
		}
	}
	return ""
}
