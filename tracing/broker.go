package tracing

import (
	"context"
	"maps"

	"go.opentelemetry.io/otel/trace"

	"github.com/ferrymq/ferry/broker"
)

// WrapBroker returns b with a producer span around every published message
// (StartPublish, one span per message, ended with that message's own
// result from broker.FailedIndexes). Publish sends copies of the messages
// whose Headers carry the publish span's traceparent; the caller's messages
// are not modified, and Body is shared, not copied. Every other method is
// b's own. Give the wrapped broker to the relay:
//
//	relayCfg.Broker = tracing.WrapBroker(b)
func WrapBroker(b broker.Broker) broker.Broker {
	if b == nil {
		return nil
	}
	return &tracedBroker{Broker: b}
}

type tracedBroker struct {
	broker.Broker
}

var _ broker.Broker = (*tracedBroker)(nil)

// Publish implements broker.Broker.
func (t *tracedBroker) Publish(ctx context.Context, msgs []*broker.Message) error {
	out := make([]*broker.Message, len(msgs))
	spans := make([]trace.Span, len(msgs))
	for i, m := range msgs {
		if m == nil { // let the adapter report it
			out[i] = nil
			continue
		}
		c := *m
		c.Headers = maps.Clone(m.Headers)
		_, spans[i] = StartPublish(ctx, &c)
		out[i] = &c
	}
	err := t.Broker.Publish(ctx, out)
	failed := broker.FailedIndexes(err, len(msgs))
	for i, s := range spans {
		if s != nil {
			End(s, failed[i])
		}
	}
	return err
}

// Unwrap returns the wrapped broker, for code that needs an adapter's own
// type.
func (t *tracedBroker) Unwrap() broker.Broker { return t.Broker }
