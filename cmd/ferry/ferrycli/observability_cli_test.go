package ferrycli_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// TestRelayAlertsAndServesMetricsWhileBrokerDown runs `ferry relay` against
// a broker address where nothing listens: the outbox backlog cannot drain,
// the built-in alert posts "firing" to the webhook, and GET /metrics on
// --metrics-addr shows the backlog meanwhile.
func TestRelayAlertsAndServesMetricsWhileBrokerDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dsn := testenv.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, outbox.Migrate(ctx, pool))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.Enqueue(ctx, tx, outbox.Event{Type: "notification.requested", Body: []byte("{}")},
		outbox.Event{Type: "notification.requested", Body: []byte("{}")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	var mu sync.Mutex
	var posts []map[string]any
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		posts = append(posts, body)
		mu.Unlock()
	}))
	defer hook.Close()

	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		return ln.Addr().String()
	}
	metricsAddr, deadBroker := free(), free()

	rctx, stop := context.WithCancel(ctx)
	done := make(chan int, 1)
	var stderr strings.Builder
	go func() {
		done <- ferrycli.Main(rctx, []string{"ferry", "relay",
			"--database-url", dsn, "--broker", "rabbitmq", "--rabbitmq-url", "amqp://guest:guest@" + deadBroker + "/",
			"--metrics-addr", metricsAddr,
			"--alert-threshold", "1", "--alert-for", "100ms", "--alert-interval", "50ms",
			"--alert-webhook-url", hook.URL,
		}, io.Discard, &lockedWriter{w: &stderr})
	}()

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(posts) >= 1
	}, 30*time.Second, 20*time.Millisecond, "no alert posted")
	mu.Lock()
	require.Len(t, posts, 1, "sent once, not on every tick")
	require.Equal(t, "firing", posts[0]["status"])
	require.Equal(t, 2.0, posts[0]["unprocessed_rows"])
	mu.Unlock()

	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(body), `ferry_outbox_unprocessed_rows{broker="rabbitmq"} 2`)

	stop()
	select {
	case code := <-done:
		require.Equal(t, 0, code, "stderr: %s", stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("ferry relay did not stop")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, posts, 1)
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestRunExportsOneTracePerNotification runs `ferry run` on real servers
// with --otlp-endpoint pointing at a local OTLP/HTTP receiver, posts one
// notification, and finds the API, relay and worker spans of one trace in
// what the receiver got.
func TestRunExportsOneTracePerNotification(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	var mu sync.Mutex
	type span struct{ name, traceID, spanID, parentID string }
	var spans []span
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					spans = append(spans, span{s.GetName(), hex.EncodeToString(s.GetTraceId()),
						hex.EncodeToString(s.GetSpanId()), hex.EncodeToString(s.GetParentSpanId())})
				}
			}
		}
		mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	defer receiver.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	apiAddr := ln.Addr().String()
	require.NoError(t, ln.Close())

	// "ferry run" migrates only its embedded PostgreSQL; a given database
	// is migrated explicitly.
	db := testenv.NewDatabase(t)
	require.Equal(t, 0, ferrycli.Main(ctx, []string{"ferry", "migrate", "--database-url", db}, io.Discard, io.Discard))

	rctx, stop := context.WithCancel(ctx)
	done := make(chan int, 1)
	var stderr strings.Builder
	lw := &lockedWriter{w: &stderr}
	go func() {
		done <- ferrycli.Main(rctx, []string{"ferry", "run",
			"--database-url", db, "--broker", "rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(),
			"--exchange", testenv.UniqueName("otel"), "--queue", testenv.UniqueName("otel.send"),
			"--addr", apiAddr, "--otlp-endpoint", receiver.URL, "--log-level", "warn",
		}, io.Discard, lw)
	}()
	defer func() {
		if t.Failed() {
			lw.mu.Lock()
			t.Logf("ferry run stderr:\n%s", stderr.String())
			lw.mu.Unlock()
		}
	}()

	var location string
	require.Eventually(t, func() bool {
		resp, err := http.Post("http://"+apiAddr+"/notifications", "application/json", strings.NewReader(
			`{"user_id":"u-1","channel":"email","to":"a@example.com","subject":"hi","body":"hello"}`))
		if err != nil {
			return false
		}
		resp.Body.Close()
		location = resp.Header.Get("Location")
		return resp.StatusCode == http.StatusCreated
	}, 60*time.Second, 50*time.Millisecond, "API did not accept the notification")
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + apiAddr + location)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var n struct {
			Status string `json:"status"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&n)
		return n.Status == "sent"
	}, 60*time.Second, 50*time.Millisecond, "notification not sent")

	// The same process's GET /metrics (on the API address) counted it; the
	// hooks run just after the commit the status shows, so poll.
	wants := []string{
		`ferry_relay_published_total{broker="rabbitmq"} 1`,
		`ferry_worker_messages_total{broker="rabbitmq",outcome="ack"} 1`,
		`ferry_worker_end_to_end_latency_seconds_count{broker="rabbitmq"} 1`,
		`ferry_outbox_unprocessed_rows{broker="rabbitmq"} 0`,
	}
	var metricsText string
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + apiAddr + "/metrics")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		metricsText = string(b)
		for _, w := range wants {
			if !strings.Contains(metricsText, w) {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "metrics: want %q in\n%s", wants, metricsText)

	stop() // shutdown flushes the batched spans
	select {
	case code := <-done:
		require.Equal(t, 0, code)
	case <-time.After(60 * time.Second):
		t.Fatal("ferry run did not stop")
	}

	mu.Lock()
	defer mu.Unlock()
	find := func(name string) span {
		for _, s := range spans {
			if s.name == name {
				return s
			}
		}
		t.Fatalf("no span %q in %v", name, spans)
		return span{}
	}
	api := find("POST /notifications")
	pub := find("publish notification.requested")
	proc := find("process notification.requested")
	require.Equal(t, api.traceID, pub.traceID)
	require.Equal(t, api.traceID, proc.traceID)
	require.Equal(t, api.spanID, pub.parentID)
	require.Equal(t, pub.spanID, proc.parentID)
}
