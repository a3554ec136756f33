package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferry/broker"
)

// Names of the queue backlog gauges (QueueCollector).
const (
	QueueMessages         = "ferry_queue_messages"
	QueueOldestAgeSeconds = "ferry_queue_oldest_message_age_seconds"
	QueueRetentionSeconds = "ferry_queue_retention_seconds"
	QueueLabel            = "queue"
)

// QueueCollector is a prometheus.Collector that reads a queue's
// broker.Backlog at every scrape and exports ferry_queue_messages,
// ferry_queue_oldest_message_age_seconds and ferry_queue_retention_seconds
// (0: the broker keeps messages until they are consumed) with the labels
// broker and queue. The alert rule FerryQueueNearRetention
// (compose/prometheus/alerts.yml) compares the last two, so an operator
// hears of a backlog before Kafka's retention.ms (or SQS's retention, or
// a JetStream MaxAge) deletes unread messages. When the read fails or
// exceeds its timeout the scrape omits the three series.
type QueueCollector struct {
	backlog   broker.BacklogReporter
	queue     string
	timeout   time.Duration
	messages  *prometheus.Desc
	age       *prometheus.Desc
	retention *prometheus.Desc
}

var _ prometheus.Collector = (*QueueCollector)(nil)

// NewQueueCollector returns a QueueCollector for queue on b. timeout
// bounds one Backlog call; 0 means DefaultOutboxStatTimeout (2 s). It
// fails (wrapping ErrConfig) on an empty name or a nil b.
func NewQueueCollector(brokerName, queue string, b broker.BacklogReporter, timeout time.Duration) (*QueueCollector, error) {
	switch {
	case brokerName == "":
		return nil, fmt.Errorf("%w: broker name is empty", ErrConfig)
	case queue == "":
		return nil, fmt.Errorf("%w: queue is empty", ErrConfig)
	case b == nil:
		return nil, fmt.Errorf("%w: backlog reporter is nil", ErrConfig)
	case timeout < 0:
		return nil, fmt.Errorf("%w: timeout %s is negative", ErrConfig, timeout)
	}
	if timeout == 0 {
		timeout = DefaultOutboxStatTimeout
	}
	labels := prometheus.Labels{BrokerLabel: brokerName, QueueLabel: queue}
	return &QueueCollector{
		backlog: b, queue: queue, timeout: timeout,
		messages: prometheus.NewDesc(QueueMessages,
			"Messages stored in the queue and not yet settled (Kafka: consumer group lag), read from the broker at scrape time.", nil, labels),
		age: prometheus.NewDesc(QueueOldestAgeSeconds,
			"Age of the oldest unsettled message of the queue in seconds; 0 when there is none or the broker does not tell (SQS).", nil, labels),
		retention: prometheus.NewDesc(QueueRetentionSeconds,
			"Age in seconds at which the broker deletes a message of the queue whether or not it was read (Kafka retention.ms, SQS MessageRetentionPeriod, JetStream MaxAge); 0: never.", nil, labels),
	}, nil
}

// Describe implements prometheus.Collector.
func (c *QueueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.messages
	ch <- c.age
	ch <- c.retention
}

// Collect implements prometheus.Collector: one Backlog call per scrape.
func (c *QueueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	bl, err := c.backlog.Backlog(ctx, c.queue)
	if err != nil {
		err = fmt.Errorf("metrics: backlog of %s: %w", c.queue, err)
		ch <- prometheus.NewInvalidMetric(c.messages, err)
		ch <- prometheus.NewInvalidMetric(c.age, err)
		ch <- prometheus.NewInvalidMetric(c.retention, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.messages, prometheus.GaugeValue, float64(bl.Messages))
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, bl.OldestAge.Seconds())
	ch <- prometheus.MustNewConstMetric(c.retention, prometheus.GaugeValue, bl.Retention.Seconds())
}
