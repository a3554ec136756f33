package tracing_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/tracing"
	"github.com/ferrymq/ferry/worker"
)

// pipelineBrokers are the real brokers the pipeline test runs on.
var pipelineBrokers = []struct {
	name string
	open func(ctx context.Context) (broker.Broker, error)
}{
	{"rabbitmq", func(ctx context.Context) (broker.Broker, error) {
		return rabbitmq.New(ctx, rabbitmq.Config{URL: testenv.RabbitMQURL()})
	}},
	{"nats", func(ctx context.Context) (broker.Broker, error) {
		return nats.New(ctx, nats.Config{URL: testenv.NATSURL()})
	}},
}

// TestOneTraceThroughAPIRelayWorker sends a real POST /notifications
// through the app's API (behind Middleware), the outbox relay (with
// WrapBroker) and a worker (with WrapHandler) on a real broker and
// database, and finds the API, relay and worker spans in one trace.
func TestOneTraceThroughAPIRelayWorker(t *testing.T) {
	for _, bk := range pipelineBrokers {
		t.Run(bk.name, func(t *testing.T) { testPipeline(t, bk.open) })
	}
}

func testPipeline(t *testing.T, open func(context.Context) (broker.Broker, error)) {
	exp := setupMemory(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)

	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	require.NoError(t, app.Migrate(ctx, pool))
	svc, err := app.New(app.Config{
		Pool: pool, Logger: log,
		Exchange: testenv.UniqueName("trace"), Queue: testenv.UniqueName("trace.send"),
	})
	require.NoError(t, err)
	topo := svc.Topology([]time.Duration{100 * time.Millisecond})

	b, err := open(ctx)
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.Declare(ctx, topo))

	// API: the app's own handler behind the tracing middleware.
	api := httptest.NewServer(tracing.Middleware(svc.Handler()))
	defer api.Close()
	resp, err := http.Post(api.URL+"/notifications", "application/json", strings.NewReader(
		`{"user_id":"u-1","channel":"email","to":"a@example.com","subject":"hi","body":"hello"}`))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	// Relay: publishes through the traced broker.
	relay, err := outbox.NewRelay(outbox.RelayConfig{
		Pool: pool, Broker: tracing.WrapBroker(b), PollInterval: 50 * time.Millisecond, Logger: log,
	})
	require.NoError(t, err)

	// Worker: a handler that records what it saw (the app's SMTP handler
	// is not the subject here).
	var mu sync.Mutex
	var seen []trace.SpanContext
	handled := make(chan struct{}, 1)
	w, err := worker.New(worker.Config{
		Consumer: "trace-test", Queue: svc.Queue(), Pool: pool, Broker: b, Topology: topo, Logger: log,
		Handler: tracing.WrapHandler(func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
			mu.Lock()
			seen = append(seen, trace.SpanContextFromContext(ctx))
			mu.Unlock()
			select {
			case handled <- struct{}{}:
			default:
			}
			return nil
		}),
	})
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{relay.Run, w.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("run: %v", err)
			}
		}()
	}
	select {
	case <-handled:
	case <-ctx.Done():
		t.Fatal("the message was not handled within 60s")
	}
	stop()
	wg.Wait()

	spans := exp.GetSpans()
	apiSpan := byName(t, spans, "POST /notifications")
	pub := byName(t, spans, "publish notification.requested")
	proc := byName(t, spans, "process notification.requested")

	tid := apiSpan.SpanContext.TraceID()
	require.True(t, tid.IsValid())
	require.Equal(t, tid, pub.SpanContext.TraceID(), "relay span in the request's trace")
	require.Equal(t, tid, proc.SpanContext.TraceID(), "worker span in the request's trace")
	require.Equal(t, apiSpan.SpanContext.SpanID(), pub.Parent.SpanID())
	require.Equal(t, pub.SpanContext.SpanID(), proc.Parent.SpanID())
	mu.Lock()
	require.Equal(t, proc.SpanContext, seen[0], "the handler's ctx carries the worker span")
	mu.Unlock()
	requireOneTrace(t, spans, tid)
}

// requireOneTrace checks that every ferry span recorded belongs to tid.
func requireOneTrace(t *testing.T, spans tracetest.SpanStubs, tid trace.TraceID) {
	t.Helper()
	for _, s := range spans {
		require.Equal(t, tid, s.SpanContext.TraceID(), "span %q", s.Name)
	}
}

// TestWrapBrokerMarksFailedMessages publishes a batch on real RabbitMQ in
// which one message is unroutable: its span ends with an error, the
// other's does not, and the caller's messages are left unmodified.
func TestWrapBrokerMarksFailedMessages(t *testing.T) {
	exp := setupMemory(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: testenv.RabbitMQURL()})
	require.NoError(t, err)
	defer b.Close()
	topo := broker.Topology{Exchange: testenv.UniqueName("wrap"), Queues: []broker.Queue{{
		Name: testenv.UniqueName("wrap.q"), Bindings: []string{"routed.event"},
	}}}
	require.NoError(t, b.Declare(ctx, topo))

	const stored = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	msgs := []*broker.Message{
		{ID: "1", Type: "routed.event", Body: []byte("a"), Headers: map[string]string{broker.HeaderTraceparent: stored}},
		{ID: "2", Type: "nobody.listens", Body: []byte("b")},
	}
	err = tracing.WrapBroker(b).Publish(ctx, msgs)
	require.ErrorIs(t, err, broker.ErrUnroutable)
	require.Equal(t, stored, msgs[0].Headers[broker.HeaderTraceparent], "caller's headers untouched")
	require.Nil(t, msgs[1].Headers)

	spans := exp.GetSpans()
	ok := byName(t, spans, "publish routed.event")
	bad := byName(t, spans, "publish nobody.listens")
	require.Equal(t, "Unset", ok.Status.Code.String())
	require.Equal(t, "Error", bad.Status.Code.String())
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", ok.SpanContext.TraceID().String())
	require.False(t, bad.Parent.IsValid(), "no stored traceparent: a new trace")

	// The consumer gets the publish span's traceparent.
	sub, err := b.Subscribe(ctx, topo.Queues[0].Name, broker.SubscribeOptions{Prefetch: 1})
	require.NoError(t, err)
	defer sub.Close()
	d, err := sub.Receive(ctx)
	require.NoError(t, err)
	require.NoError(t, d.Ack(ctx))
	got := trace.SpanContextFromContext(tracing.Extract(ctx, d.Message().Headers))
	require.Equal(t, ok.SpanContext.SpanID(), got.SpanID())
}
