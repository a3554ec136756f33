package ferrycli

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/metrics"
)

// registerBacklog exports the backlog gauges of queue (metrics.QueueCollector:
// ferry_queue_messages, ferry_queue_oldest_message_age_seconds,
// ferry_queue_retention_seconds) when the broker reports a backlog
// (broker.BacklogReporter: Kafka, NATS, SQS). The worker registers its
// queue once; a second registration (run: the same process) is ignored.
// A nil o does nothing.
func (o *observability) registerBacklog(b broker.Broker, queue string) {
	if o == nil {
		return
	}
	br, ok := b.(broker.BacklogReporter)
	if !ok {
		return
	}
	c, err := metrics.NewQueueCollector(o.broker, queue, br, 0)
	if err != nil {
		o.log.Warn("metrics: queue backlog gauges not exported", "queue", queue, "err", err)
		return
	}
	if err := o.reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			o.log.Warn("metrics: queue backlog gauges not exported", "queue", queue, "err", err)
		}
	}
}
