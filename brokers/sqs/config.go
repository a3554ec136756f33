package sqs

import (
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strconv"
	"time"

	"github.com/aws/smithy-go/middleware"

	"github.com/ferrymq/ferry/broker"
)

// Config configures the SQS adapter. The zero value of every field means
// its documented default. Credentials come from the AWS SDK's default chain
// (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, shared profiles, instance and
// task roles).
type Config struct {
	// Endpoint is the SQS endpoint URL, e.g. "http://127.0.0.1:9324" for
	// ElasticMQ or LocalStack. Empty: AWS's endpoint of Region.
	Endpoint string
	// Region is the AWS region, e.g. "us-east-1". Defaults to DefaultRegion.
	Region string
	// FIFO makes every queue a FIFO queue (name suffix ".fifo"):
	// MessageGroupId is the message's Key (its ID when Key is empty) and
	// MessageDeduplicationId its ID, so Capabilities.Ordering is
	// broker.OrderingKey. Default false: standard queues, no order.
	FIFO bool
	// MaxReceiveCount is the maxReceiveCount of each work queue's
	// RedrivePolicy: after that many receives SQS itself moves a message
	// to the DLQ. ferry dead-letters on the worker's last attempt, so this
	// is only a safety net and must be above the worker's MaxAttempts.
	// 1..1000 (AWS's range). Defaults to DefaultMaxReceiveCount (100).
	MaxReceiveCount int
	// WaitTime is the long-polling wait of each ReceiveMessage
	// (WaitTimeSeconds), whole seconds 1..20. Defaults to 20 s. The HTTP
	// client's timeout is WaitTime + 15 s, so a long poll never times out
	// on the client.
	WaitTime time.Duration
	// PublishTimeout bounds Publish, DeadLetter and the DLQ operations when
	// the caller's ctx has no deadline. Defaults to 30 s.
	PublishTimeout time.Duration
	// SettleTimeout bounds Ack, Retry and Extend when the caller's ctx has
	// no deadline. Defaults to 10 s.
	SettleTimeout time.Duration
	// FallbackMessageBytes is the size limit (bytes) used for a queue whose
	// server does not report its MaximumMessageSize attribute (ElasticMQ
	// 1.6.11 does not; AWS does, and its default has changed over time).
	// Defaults to 262144 (256 KiB, the limit ElasticMQ enforces with
	// sqs-limits = strict).
	FallbackMessageBytes int
	// LookupExchange is the exchange on which DLQ looks for a queue this
	// broker did not Declare (ferry dlq's --exchange). Empty: the queues
	// on the server are listed and the one whose name ends with the
	// queue's DLQ name and whose tags name the queue is used; it must be
	// unique.
	LookupExchange string
	// SendConcurrency is the number of SendMessageBatch calls (10
	// messages each) one Publish keeps in flight on a standard queue; a
	// FIFO queue's calls go one after another. A relay batch of n rows
	// takes ceil(n / (10 × SendConcurrency)) round trips, each 10-20 ms
	// on AWS. 1..MaxSendConcurrency. Defaults to DefaultSendConcurrency
	// (16).
	SendConcurrency int
	// ReceivePollers is the number of ReceiveMessage loops (10 messages a
	// call) of one subscription: under load all of them receive at once,
	// while the queue is idle one at a time long-polls. A poller asks only
	// for what SubscribeOptions.Prefetch leaves room for, so more than
	// ceil(Prefetch / 10) pollers never all run. 1..MaxReceivePollers.
	// Defaults to ceil(Prefetch / 10), at most DefaultMaxReceivePollers
	// (16).
	ReceivePollers int
	// APIOptions are added to the SDK client's middleware stack
	// (service/sqs Options.APIOptions), e.g. a request counter or
	// OpenTelemetry's otelaws instrumentation. Nil: none.
	APIOptions []func(*middleware.Stack) error
	// Logger receives the adapter's logs (receive errors, re-declares).
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// DefaultRegion is Config.Region's default.
const DefaultRegion = "us-east-1"

// DefaultMaxReceiveCount is Config.MaxReceiveCount's default.
const DefaultMaxReceiveCount = 100

// Defaults and limits of the calls the adapter keeps in flight, chosen
// with BenchmarkSQSScaling (bench/README.md, "SQS scaling"): with 15 ms
// added to every call, 16 sends in flight per Publish instead of 8 took a
// relay with one claim loop of 100-row batches from 1,923-1,966 to
// 2,785-2,809 events/s (one round trip per batch instead of two); at the
// relay's defaults (4 claim loops) the loops already overlap and both
// did 3,900-4,350. A worker at 3,000 messages/s needs about 5 receives of
// 10 in flight at 15 ms, which 4 pollers could not give (Concurrency 64,
// Prefetch 128: 1,638-1,740 events/s with 4 pollers, 1,807-1,872 with the
// default 13).
const (
	// DefaultSendConcurrency is Config.SendConcurrency's default.
	DefaultSendConcurrency = 16
	// MaxSendConcurrency is the largest Config.SendConcurrency.
	MaxSendConcurrency = 256
	// DefaultMaxReceivePollers caps Config.ReceivePollers' default.
	DefaultMaxReceivePollers = 16
	// MaxReceivePollers is the largest Config.ReceivePollers.
	MaxReceivePollers = 256
)

// Limits from the SQS developer guide ("Amazon SQS quotas").
const (
	// MaxBatchEntries is the most entries one SendMessageBatch,
	// DeleteMessageBatch or ChangeMessageVisibilityBatch takes.
	MaxBatchEntries = 10
	// MaxVisibility is the longest visibility timeout: 12 hours. It is
	// Capabilities.MaxDelay.
	MaxVisibility = 12 * time.Hour
	// MaxQueueNameLen is the longest queue name, ".fifo" included.
	MaxQueueNameLen = 80
	// retention is the queues' MessageRetentionPeriod, the maximum (14
	// days, seconds).
	retention = "1209600"
	// dlqReserve is what Capabilities.MaxMessageBytes keeps free below the
	// queue's MaximumMessageSize: ferry's attributes and the headers
	// DeadLetter adds (reason up to broker.MaxReasonBytes, times).
	dlqReserve = 2048
)

func (c Config) withDefaults() Config {
	if c.Region == "" {
		c.Region = DefaultRegion
	}
	if c.MaxReceiveCount <= 0 {
		c.MaxReceiveCount = DefaultMaxReceiveCount
	}
	if c.MaxReceiveCount > 1000 {
		c.MaxReceiveCount = 1000
	}
	if c.WaitTime <= 0 {
		c.WaitTime = 20 * time.Second
	}
	if c.WaitTime < time.Second {
		c.WaitTime = time.Second
	}
	if c.WaitTime > 20*time.Second {
		c.WaitTime = 20 * time.Second
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = 30 * time.Second
	}
	if c.SettleTimeout <= 0 {
		c.SettleTimeout = 10 * time.Second
	}
	if c.FallbackMessageBytes <= dlqReserve {
		c.FallbackMessageBytes = 262144
	}
	if c.SendConcurrency == 0 {
		c.SendConcurrency = DefaultSendConcurrency
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks c with the defaults applied, as New does before it
// connects: Endpoint, when set, must be an http:// or https:// URL with a
// host (a port, when given, 1..65535); Region must be an AWS region name
// (lower-case letters, digits and '-', e.g. "us-east-1"); SendConcurrency
// and ReceivePollers, when set, within their ranges. It needs no server. The error is a *broker.ConfigError naming the field, wrapping
// broker.ErrInvalidConfig.
func (c Config) Validate() error { return c.withDefaults().validate() }

func (c Config) validate() error {
	bad := func(field, value, reason string) error {
		return &broker.ConfigError{Adapter: "sqs", Field: field, Value: value, Reason: reason}
	}
	if c.Endpoint != "" {
		const want = "want an http:// or https:// URL such as http://127.0.0.1:9324, or empty for AWS's endpoint of Region"
		u, err := url.Parse(c.Endpoint)
		switch {
		case err != nil:
			return bad("Endpoint", c.Endpoint, err.Error()+"; "+want)
		case u.Scheme != "http" && u.Scheme != "https":
			return bad("Endpoint", c.Endpoint, want)
		case u.Hostname() == "":
			return bad("Endpoint", c.Endpoint, "no host; "+want)
		case u.User != nil:
			return bad("Endpoint", u.Redacted(), "credentials do not go in the URL (the AWS SDK's chain: AWS_ACCESS_KEY_ID, profiles, roles); "+want)
		}
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				return bad("Endpoint", c.Endpoint, fmt.Sprintf("port %q: want 1..65535", p))
			}
		}
	}
	if !regionRE.MatchString(c.Region) {
		return bad("Region", c.Region, `want an AWS region name such as "us-east-1"`)
	}
	if c.SendConcurrency < 1 || c.SendConcurrency > MaxSendConcurrency {
		return bad("SendConcurrency", strconv.Itoa(c.SendConcurrency), fmt.Sprintf("want 1..%d SendMessageBatch calls in flight", MaxSendConcurrency))
	}
	if c.ReceivePollers < 0 || c.ReceivePollers > MaxReceivePollers {
		return bad("ReceivePollers", strconv.Itoa(c.ReceivePollers), fmt.Sprintf("want 1..%d ReceiveMessage calls in flight, or 0 for the default", MaxReceivePollers))
	}
	return nil
}

// regionRE matches AWS region names (us-east-1, eu-central-2,
// us-gov-west-1, cn-north-1).
var regionRE = regexp.MustCompile(`^[a-z]{2,}(-[a-z0-9]+)+$`)
