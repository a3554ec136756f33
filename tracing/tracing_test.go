package tracing_test

// These tests change OpenTelemetry's global TracerProvider, so none of them
// runs in parallel.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/tracing"
)

// setupMemory installs a provider exporting to a fresh in-memory exporter.
func setupMemory(t *testing.T) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	shutdown, err := tracing.Setup(context.Background(), tracing.Config{Exporter: exp, ServiceName: "ferry-test"})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = shutdown(context.Background())
		otel.SetTracerProvider(noop.NewTracerProvider())
	})
	return exp
}

// apiServer is a real HTTP server behind tracing.Middleware whose POST
// /notifications stores the request's trace context into event headers,
// as the app does before outbox.Enqueue.
func apiServer(t *testing.T) (*httptest.Server, <-chan map[string]string) {
	t.Helper()
	got := make(chan map[string]string, 10)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /notifications", func(w http.ResponseWriter, r *http.Request) {
		h := map[string]string{"content-type": "application/json"}
		tracing.Inject(r.Context(), h)
		h["request-header"] = r.Header.Get(broker.HeaderTraceparent)
		got <- h
		w.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		h := map[string]string{}
		tracing.Inject(r.Context(), h)
		got <- h
	})
	srv := httptest.NewServer(tracing.Middleware(mux))
	t.Cleanup(srv.Close)
	return srv, got
}

func post(t *testing.T, url string, traceparent string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
	require.NoError(t, err)
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
}

func byName(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	var names []string
	for _, s := range spans {
		names = append(names, s.Name)
	}
	t.Fatalf("no span %q among %v", name, names)
	return tracetest.SpanStub{}
}

// TestOneTraceFromRequestToHandler follows one event through the three
// hand-offs: request headers -> outbox headers -> broker headers -> handler.
func TestOneTraceFromRequestToHandler(t *testing.T) {
	exp := setupMemory(t)
	srv, got := apiServer(t)

	post(t, srv.URL+"/notifications", "")
	stored := <-got
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, stored[broker.HeaderTraceparent])
	require.Equal(t, stored[broker.HeaderTraceparent], stored["request-header"],
		"the handler's request header carries the API span too")
	delete(stored, "request-header")

	// The relay publishes the row: a copy of the stored headers.
	msg := &broker.Message{ID: "42", Type: "notification.requested", Key: "user-1", Body: []byte(`{}`), Headers: stored}
	_, pub := tracing.StartPublish(context.Background(), msg)
	tracing.End(pub, nil)

	// The worker receives the message as published.
	delivered := msg.Clone()
	delivered.Attempt = 1
	var handlerSpan trace.SpanContext
	h := tracing.WrapHandler(func(ctx context.Context, tx struct{}, m *broker.Message) error {
		handlerSpan = trace.SpanContextFromContext(ctx)
		return nil
	})
	require.NoError(t, h(context.Background(), struct{}{}, delivered))

	spans := exp.GetSpans()
	require.Len(t, spans, 3)
	api := byName(t, spans, "POST /notifications")
	relay := byName(t, spans, "publish notification.requested")
	work := byName(t, spans, "process notification.requested")

	traceID := api.SpanContext.TraceID()
	require.True(t, traceID.IsValid())
	require.Equal(t, traceID, relay.SpanContext.TraceID())
	require.Equal(t, traceID, work.SpanContext.TraceID())
	require.Equal(t, api.SpanContext.SpanID(), relay.Parent.SpanID(), "relay span is a child of the API span")
	require.Equal(t, relay.SpanContext.SpanID(), work.Parent.SpanID(), "worker span is a child of the relay span")
	require.Equal(t, work.SpanContext, handlerSpan, "the handler's ctx carries the process span")

	require.Equal(t, trace.SpanKindServer, api.SpanKind)
	require.Equal(t, trace.SpanKindProducer, relay.SpanKind)
	require.Equal(t, trace.SpanKindConsumer, work.SpanKind)
	require.Contains(t, relay.Attributes, attr("messaging.message.id", "42"))
	require.Contains(t, work.Attributes, attr("messaging.ferry.attempt", "1"))
	require.Contains(t, delivered.Headers[broker.HeaderTraceparent], relay.SpanContext.SpanID().String(),
		"the relay re-injected its own traceparent")
}

func TestIncomingTraceparentIsContinued(t *testing.T) {
	exp := setupMemory(t)
	srv, got := apiServer(t)
	const caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	post(t, srv.URL+"/notifications", caller)
	stored := <-got
	require.True(t, strings.HasPrefix(stored[broker.HeaderTraceparent], "00-4bf92f3577b34da6a3ce929d0e0e4736-"))
	require.NotEqual(t, caller, stored[broker.HeaderTraceparent], "a new span of the same trace")
	require.Equal(t, stored[broker.HeaderTraceparent], stored["request-header"], "the caller's header is replaced by the API span's")
	api := byName(t, exp.GetSpans(), "POST /notifications")
	require.Equal(t, "00f067aa0ba902b7", api.Parent.SpanID().String())
}

func TestMetricsEndpointNotTraced(t *testing.T) {
	exp := setupMemory(t)
	srv, got := apiServer(t)
	resp, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	require.Empty(t, (<-got)[broker.HeaderTraceparent])
	require.Empty(t, exp.GetSpans())
}

func TestHandlerErrorMarksSpan(t *testing.T) {
	exp := setupMemory(t)
	h := tracing.WrapHandler(func(ctx context.Context, tx int, m *broker.Message) error {
		return errors.New("smtp: 451 try later")
	})
	err := h(context.Background(), 0, &broker.Message{ID: "1", Type: "a.b"})
	require.EqualError(t, err, "smtp: 451 try later")
	s := byName(t, exp.GetSpans(), "process a.b")
	require.Equal(t, "Error", s.Status.Code.String())
	require.Equal(t, "smtp: 451 try later", s.Status.Description)
	require.False(t, s.Parent.IsValid(), "a message without traceparent starts a new trace")
}

// TestPropagationWithoutExport: with Setup and no exporter the relay still
// makes a new span of the same trace; with no Setup at all the trace
// context passes through unchanged.
func TestPropagationWithoutExport(t *testing.T) {
	const stored = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	shutdown, err := tracing.Setup(context.Background(), tracing.Config{})
	require.NoError(t, err)
	msg := &broker.Message{ID: "1", Type: "a.b", Headers: map[string]string{broker.HeaderTraceparent: stored}}
	_, s := tracing.StartPublish(context.Background(), msg)
	tracing.End(s, nil)
	require.True(t, strings.HasPrefix(msg.Headers[broker.HeaderTraceparent], "00-4bf92f3577b34da6a3ce929d0e0e4736-"))
	require.NotEqual(t, stored, msg.Headers[broker.HeaderTraceparent])
	require.NoError(t, shutdown(context.Background()))

	otel.SetTracerProvider(noop.NewTracerProvider())
	msg = &broker.Message{ID: "1", Type: "a.b", Headers: map[string]string{broker.HeaderTraceparent: stored}}
	_, s = tracing.StartPublish(context.Background(), msg)
	tracing.End(s, nil)
	require.Equal(t, stored, msg.Headers[broker.HeaderTraceparent])

	// Nil headers get a map; no trace context means no header.
	msg = &broker.Message{ID: "2", Type: "a.b"}
	_, s = tracing.StartPublish(context.Background(), msg)
	tracing.End(s, nil)
	require.NotNil(t, msg.Headers)
	require.NotContains(t, msg.Headers, broker.HeaderTraceparent)
}

func TestInjectExtract(t *testing.T) {
	exp := setupMemory(t)
	_ = exp
	ctx, span := tracing.Tracer().Start(context.Background(), "x")
	defer span.End()
	h := map[string]string{}
	tracing.Inject(ctx, h)
	got := trace.SpanContextFromContext(tracing.Extract(context.Background(), h))
	require.Equal(t, span.SpanContext().TraceID(), got.TraceID())
	require.Equal(t, span.SpanContext().SpanID(), got.SpanID())
	require.True(t, got.IsRemote())

	tracing.Inject(ctx, nil) // no panic
	for _, bad := range []map[string]string{nil, {}, {"traceparent": "garbage"}, {"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}} {
		require.False(t, trace.SpanContextFromContext(tracing.Extract(context.Background(), bad)).IsValid(), "%v", bad)
	}
}

func TestSetupRejectsBadEndpoint(t *testing.T) {
	for _, ep := range []string{"127.0.0.1:4318", "grpc://x:4317", "http://"} {
		_, err := tracing.Setup(context.Background(), tracing.Config{OTLPEndpoint: ep})
		require.ErrorIs(t, err, tracing.ErrConfig, ep)
	}
}

// TestOTLPExportToLocalReceiver points the OTLP/HTTP exporter at a real
// HTTP receiver on loopback and decodes what it posts.
func TestOTLPExportToLocalReceiver(t *testing.T) {
	var mu sync.Mutex
	var reqs []*collectortrace.ExportTraceServiceRequest
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		reqs = append(reqs, &req)
		paths = append(paths, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	defer srv.Close()

	shutdown, err := tracing.Setup(context.Background(), tracing.Config{OTLPEndpoint: srv.URL, ServiceName: "ferry-relay"})
	require.NoError(t, err)
	defer otel.SetTracerProvider(noop.NewTracerProvider())
	msg := &broker.Message{ID: "7", Type: "notification.requested"}
	_, s := tracing.StartPublish(context.Background(), msg)
	tracing.End(s, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, shutdown(ctx), "shutdown flushes the batch")

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, reqs)
	require.Equal(t, "POST /v1/traces application/x-protobuf", paths[0])
	rs := reqs[0].GetResourceSpans()[0]
	var service string
	for _, kv := range rs.GetResource().GetAttributes() {
		if kv.GetKey() == "service.name" {
			service = kv.GetValue().GetStringValue()
		}
	}
	require.Equal(t, "ferry-relay", service)
	span := rs.GetScopeSpans()[0].GetSpans()[0]
	require.Equal(t, "publish notification.requested", span.GetName())
	require.Equal(t, "github.com/ferrymq/ferry", rs.GetScopeSpans()[0].GetScope().GetName())
}

var _ sdktrace.SpanExporter = (*tracetest.InMemoryExporter)(nil)

func attr(k, v string) attribute.KeyValue { return attribute.String(k, v) }
