package tracing_test

import (
	"context"
	"fmt"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/tracing"
)

// The hand-offs of one event's trace context: API request -> outbox row
// headers -> published message -> handler.
func Example() {
	ctx := context.Background()
	shutdown, err := tracing.Setup(ctx, tracing.Config{}) // --otlp-endpoint empty: no export
	if err != nil {
		panic(err)
	}
	defer shutdown(ctx)

	// API (behind tracing.Middleware): store the request's trace context.
	reqCtx, apiSpan := tracing.Tracer().Start(ctx, "POST /notifications")
	headers := map[string]string{}
	tracing.Inject(reqCtx, headers) // outbox.Event.Headers
	apiSpan.End()

	// Relay (tracing.WrapBroker does this per message).
	msg := &broker.Message{ID: "1", Type: "notification.requested", Headers: headers}
	_, pub := tracing.StartPublish(ctx, msg)
	tracing.End(pub, nil)

	// Worker (tracing.WrapHandler does this around the handler).
	_, proc := tracing.StartProcess(ctx, msg)
	tracing.End(proc, nil)

	fmt.Println("one trace:", apiSpan.SpanContext().TraceID() == proc.SpanContext().TraceID())
	fmt.Println("relay is the worker's parent:", msg.Headers[broker.HeaderTraceparent][36:52] == pub.SpanContext().SpanID().String())
	// Output:
	// one trace: true
	// relay is the worker's parent: true
}
