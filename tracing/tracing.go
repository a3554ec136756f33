package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferrymq/ferry/broker"
)

// TracerName is the instrumentation scope of ferry's spans.
const TracerName = "github.com/ferrymq/ferry"

// DefaultServiceName is Config.ServiceName when empty.
const DefaultServiceName = "ferry"

// ErrConfig is wrapped by the errors Setup returns for a bad Config.
var ErrConfig = errors.New("tracing: invalid config")

// Config configures Setup. The zero value propagates trace context and
// exports nothing.
type Config struct {
	// OTLPEndpoint is the base URL of an OTLP/HTTP trace receiver, e.g.
	// "http://127.0.0.1:4318"; spans are posted to its /v1/traces in
	// batches. http:// means no TLS. Empty (the default) exports nothing.
	// The CLI flag is --otlp-endpoint.
	OTLPEndpoint string
	// ServiceName is the service.name resource attribute, e.g.
	// "ferry-relay". Defaults to "ferry".
	ServiceName string
	// Exporter, when set, receives every span synchronously as it ends,
	// instead of (or besides) the OTLP exporter. Meant for tests
	// (tracetest.NewInMemoryExporter).
	Exporter sdktrace.SpanExporter
	// Logger receives export errors. Defaults to slog.Default().
	Logger *slog.Logger
}

// propagator is the one ferry uses everywhere: W3C traceparent/tracestate.
var propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Propagator returns the W3C Trace Context propagator the helpers use.
func Propagator() propagation.TextMapPropagator { return propagator }

// Setup installs a global OpenTelemetry TracerProvider (always-on sampling
// that respects the parent's sampled flag) and the W3C Trace Context
// propagator, exporting as cfg says. Call it once per process, early; call
// shutdown (which flushes pending spans) before exiting. Errors wrap
// ErrConfig for a bad endpoint.
func Setup(ctx context.Context, cfg Config) (shutdown func(context.Context) error, err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	name := cfg.ServiceName
	if name == "" {
		name = DefaultServiceName
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", name)))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
	}
	if cfg.OTLPEndpoint != "" {
		u, err := url.Parse(cfg.OTLPEndpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: OTLPEndpoint %q: want an http:// or https:// URL such as http://127.0.0.1:4318", ErrConfig, cfg.OTLPEndpoint)
		}
		eopts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host)}
		if u.Scheme == "http" {
			eopts = append(eopts, otlptracehttp.WithInsecure())
		}
		path := u.Path
		if path == "" || path == "/" {
			path = "/v1/traces"
		}
		eopts = append(eopts, otlptracehttp.WithURLPath(path))
		exp, err := otlptracehttp.New(ctx, eopts...)
		if err != nil {
			return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	if cfg.Exporter != nil {
		opts = append(opts, sdktrace.WithSyncer(cfg.Exporter))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagator)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("tracing: OpenTelemetry error", "err", err)
	}))
	return tp.Shutdown, nil
}

// Tracer returns ferry's tracer from the global TracerProvider.
func Tracer() trace.Tracer { return otel.Tracer(TracerName) }

// Inject writes ctx's trace context into headers as broker.HeaderTraceparent
// (and "tracestate" when there is one). headers must not be nil; with no
// valid span in ctx nothing is written.
func Inject(ctx context.Context, headers map[string]string) {
	if headers == nil {
		return
	}
	propagator.Inject(ctx, propagation.MapCarrier(headers))
}

// Extract returns ctx carrying the remote span context found in headers'
// traceparent, or ctx unchanged when there is none or it is malformed.
func Extract(ctx context.Context, headers map[string]string) context.Context {
	if len(headers) == 0 {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier(headers))
}

// Middleware wraps an HTTP handler so that every request gets a server span
// (named "METHOD /route" once the http.ServeMux pattern is known),
// continuing the caller's traceparent when the request carries one. GET
// /metrics is not traced.
//
// The wrapped handler sees the server span two ways: in r.Context() (so
// Inject(r.Context(), headers) stores it), and in the request's own
// traceparent header, which Middleware rewrites to the server span's
// (dropping the caller's tracestate), as a tracing proxy in front of the
// handler would. A handler that copies r.Header.Get("traceparent") into
// its outbox event therefore stores the API span, and the relay's span
// becomes its child.
func Middleware(next http.Handler) http.Handler {
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if trace.SpanContextFromContext(r.Context()).IsValid() {
			r.Header.Del("tracestate")
			propagator.Inject(r.Context(), propagation.HeaderCarrier(r.Header))
		}
		next.ServeHTTP(w, r)
	})
	return otelhttp.NewHandler(inner, "ferry.api",
		otelhttp.WithPropagators(propagator),
		otelhttp.WithFilter(func(r *http.Request) bool { return r.URL.Path != "/metrics" }),
	)
}

// Attribute keys of ferry's messaging spans (OpenTelemetry messaging
// semantic conventions).
const (
	attrSystem      = "messaging.system"
	attrOperation   = "messaging.operation.type"
	attrDestination = "messaging.destination.name"
	attrMessageID   = "messaging.message.id"
	attrKey         = "messaging.ferry.key"
	attrAttempt     = "messaging.ferry.attempt"
)

// StartPublish starts the producer span "publish <msg.Type>" for one
// message. Its parent is the trace context in msg.Headers (the API
// request's, stored with the outbox row), or ctx's span when the message
// carries none. It then writes the new span's traceparent into
// msg.Headers (creating the map when nil), so the consumer continues from
// the publication. The caller ends the span with End.
func StartPublish(ctx context.Context, msg *broker.Message) (context.Context, trace.Span) {
	parent := Extract(ctx, msg.Headers)
	sctx, span := Tracer().Start(parent, "publish "+msg.Type,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String(attrSystem, "ferry"),
			attribute.String(attrOperation, "publish"),
			attribute.String(attrDestination, msg.Type),
			attribute.String(attrMessageID, msg.ID),
			attribute.String(attrKey, msg.Key),
		))
	if msg.Headers == nil {
		msg.Headers = map[string]string{}
	}
	Inject(sctx, msg.Headers)
	return sctx, span
}

// StartProcess starts the consumer span "process <msg.Type>", parented on
// the trace context in msg.Headers (the relay's publish span), or ctx's
// span when the message carries none. The returned context carries the
// span, so the handler's own spans and any outbox events it writes (via
// Inject) continue the trace. The caller ends the span with End.
func StartProcess(ctx context.Context, msg *broker.Message) (context.Context, trace.Span) {
	parent := Extract(ctx, msg.Headers)
	return Tracer().Start(parent, "process "+msg.Type,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String(attrSystem, "ferry"),
			attribute.String(attrOperation, "process"),
			attribute.String(attrDestination, msg.Type),
			attribute.String(attrMessageID, msg.ID),
			attribute.String(attrKey, msg.Key),
			attribute.String(attrAttempt, strconv.Itoa(msg.Attempt)),
		))
}

// End records err on span (status Error with err's text) when it is not
// nil, and ends the span.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// WrapHandler returns a handler that runs h inside a StartProcess span and
// ends it with h's error. It fits worker.Handler (T is pgx.Tx):
//
//	cfg.Handler = tracing.WrapHandler(handler)
func WrapHandler[T any](h func(ctx context.Context, tx T, msg *broker.Message) error) func(ctx context.Context, tx T, msg *broker.Message) error {
	return func(ctx context.Context, tx T, msg *broker.Message) (err error) {
		ctx, span := StartProcess(ctx, msg)
		defer func() {
			if r := recover(); r != nil {
				End(span, fmt.Errorf("panic: %v", r))
				panic(r)
			}
			End(span, err)
		}()
		return h(ctx, tx, msg)
	}
}
