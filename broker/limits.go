package broker

import (
	"context"
	"time"
)

// Limits are settings on the broker's side (the adapter's Config, the
// queue's attributes on the server, the server's own configuration) that
// a worker's settings must agree with, or the broker moves, drops or
// redelivers a message before the worker is done with it. A zero field
// means no such limit. Each limit comes with the name of the setting that
// sets it, as an operator writes it (the adapter's config field, the CLI
// flag where there is one, and what it maps to on the broker), so that an
// error about a contradiction names both sides.
//
// Package worker reads them at start (LimitReporter) and refuses a
// configuration that contradicts them, naming both settings and a value
// that works (CONVENTIONS: the framework refuses at start-up a
// configuration the broker cannot honour).
type Limits struct {
	// DeliveryLimit is the number of deliveries after which the broker
	// itself moves the message away from the queue, to a DLQ of its own
	// or nowhere, whatever the worker decided: SQS the maxReceiveCount of
	// the queue's RedrivePolicy, JetStream the consumer's MaxDeliver,
	// RabbitMQ the quorum queue's delivery-limit. On a broker whose
	// Capabilities.CountsRedeliveries is true every attempt is one
	// delivery more, so the worker needs DeliveryLimit > its max attempts
	// (one delivery kept for a redelivery after a crash).
	DeliveryLimit int
	// DeliveryLimitSetting names the setting of DeliveryLimit, e.g.
	// `sqs.Config.MaxReceiveCount (maxReceiveCount of the RedrivePolicy of
	// SQS queue "x")`.
	DeliveryLimitSetting string
	// MaxAckDeadline is the longest SubscribeOptions.AckDeadline the
	// broker can hold (SQS: a visibility timeout of at most 12 hours, the
	// SQS developer guide "Amazon SQS visibility timeout").
	MaxAckDeadline time.Duration
	// MaxAckDeadlineSetting names the setting or rule of MaxAckDeadline.
	MaxAckDeadlineSetting string
	// SettleTimeout is the longest a delivery may stay unsettled however
	// often Delivery.Extend is called; past it the broker takes the
	// message back and redelivers it (RabbitMQ: consumer_timeout, which
	// closes the channel; SQS: the visibility of one receive cannot be
	// extended past 12 hours after it). The worker needs its
	// HandlerTimeout shorter.
	SettleTimeout time.Duration
	// SettleTimeoutSetting names the setting of SettleTimeout.
	SettleTimeoutSetting string
	// Retention is how long the broker keeps a message from the time it
	// was first stored, read or not; a message retried in place keeps that
	// time (SQS: MessageRetentionPeriod counts from the SendMessage, also
	// across ChangeMessageVisibility). The worker needs the sum of its
	// retry delays over all attempts shorter. 0 also for a broker whose
	// retry writes a new copy (RabbitMQ retry levels, Kafka retry topics
	// with a retention of their own, JetStream without MaxAge).
	Retention time.Duration
	// RetentionSetting names the setting of Retention.
	RetentionSetting string
}

// LimitReporter is implemented by adapters whose broker has Limits. The
// worker calls it at the start of Run, after Declare and before
// Subscribe; an adapter without it has no limits.
type LimitReporter interface {
	// Limits returns the limits in force for the named declared queue. It
	// may read them from the server (the queue's attributes, the
	// consumer's configuration), so it does I/O and honours ctx. Returns
	// ErrUnknownQueue (wrapped) for a queue Declare did not declare, and
	// ErrClosed after Close.
	Limits(ctx context.Context, queue string) (Limits, error)
}

// Backlog is what waits in one queue, for the brokers that delete unread
// messages by age and cannot send them to a DLQ (Kafka retention, SQS
// MessageRetentionPeriod, a JetStream MaxAge): an operator is warned
// while OldestAge is still well below Retention (the Prometheus rule
// FerryQueueNearRetention, compose/prometheus/alerts.yml).
type Backlog struct {
	// Messages is the number of messages stored and not yet settled by the
	// queue's consumers (Kafka: the consumer group's lag, records after
	// its committed offsets; NATS: the consumer's pending and
	// unacknowledged messages; SQS: ApproximateNumberOfMessages, visible,
	// in flight and delayed). Approximate on every broker.
	Messages int64
	// OldestAge is the age of the oldest of them (Kafka: the timestamp of
	// the record at the committed offset; NATS: of the first unacknowledged
	// stream message); 0 when there is none or the broker does not tell
	// (SQS reports it only as the CloudWatch metric
	// ApproximateAgeOfOldestMessage).
	OldestAge time.Duration
	// Retention is the age at which the broker deletes a message whether
	// or not it was read (Kafka: the topic's retention.ms; SQS: the
	// queue's MessageRetentionPeriod; NATS: the stream's MaxAge); 0:
	// never.
	Retention time.Duration
}

// BacklogReporter is implemented by adapters that can tell a queue's
// Backlog. ferry's metrics read it at every scrape
// (ferry_queue_messages, ferry_queue_oldest_message_age_seconds,
// ferry_queue_retention_seconds).
type BacklogReporter interface {
	// Backlog reads the backlog of the named declared queue from the
	// server; it honours ctx. Returns ErrUnknownQueue (wrapped) for a
	// queue Declare did not declare, and ErrClosed after Close.
	Backlog(ctx context.Context, queue string) (Backlog, error)
}
