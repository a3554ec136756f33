// Package tracing sets up OpenTelemetry for ferry and carries the W3C Trace
// Context (https://www.w3.org/TR/trace-context/) from the API request,
// through the outbox row and the broker, to the worker, so that one trace
// shows the request, the relay's publication and the handler:
//
//	API      Middleware starts the server span "POST /notifications";
//	         the app calls Inject(ctx, event.Headers) before outbox.Enqueue,
//	         so the row's headers hold the request's traceparent.
//	relay    WrapBroker (around the broker given to outbox.RelayConfig)
//	         starts one producer span "publish <type>" per message, parented
//	         on the row's traceparent, and re-injects its own traceparent
//	         into the message headers.
//	worker   WrapHandler (around the worker.Handler) starts the consumer
//	         span "process <type>", parented on the message's traceparent.
//
// The traceparent header is broker.HeaderTraceparent; tracestate travels
// beside it when set. Propagation always works, whether or not Setup was
// called and whether or not spans are exported: the helpers use the W3C
// TraceContext propagator directly, not the global one. Without Setup the
// global TracerProvider is OpenTelemetry's no-op one, whose spans carry the
// incoming trace context unchanged, so the trace ID still flows end to end.
//
// Export is off by default. Setup with Config.OTLPEndpoint (an
// http://host:4318 URL of an OTLP/HTTP receiver: the OpenTelemetry
// Collector, Jaeger, Tempo) exports spans in batches; Config.Exporter
// installs any SpanExporter synchronously (tests use
// go.opentelemetry.io/otel/sdk/trace/tracetest's in-memory exporter).
//
// A redelivered or retried message gets a new "process" span in the same
// trace each time; the relay's span belongs to the first publication that
// the broker confirmed, plus one per republication of an unconfirmed row.
package tracing
