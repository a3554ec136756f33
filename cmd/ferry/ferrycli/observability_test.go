package ferrycli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/alert"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// parseObs parses args with the observability flags of a relay-like
// command.
func parseObs(t *testing.T, args ...string) (*obsSettings, error) {
	t.Helper()
	var got *obsSettings
	var gotErr error
	a := &cli.App{
		Name: "ferry", Writer: io.Discard, ErrWriter: io.Discard,
		ExitErrHandler: func(*cli.Context, error) {},
		Commands: []*cli.Command{{
			Name:  "relay",
			Flags: concat(metricsFlags(""), alertFlags()),
			Action: func(c *cli.Context) error {
				got, gotErr = loadObsSettings(c)
				return nil
			},
		}},
	}
	require.NoError(t, a.Run(append([]string{"ferry", "relay"}, args...)))
	return got, gotErr
}

func TestObservabilityFlags(t *testing.T) {
	s, err := parseObs(t)
	require.NoError(t, err)
	require.Equal(t, "", s.metricsAddr)
	require.True(t, s.alertEnabled)
	require.Equal(t, 100, s.alertThreshold)
	require.Equal(t, 5*time.Minute, s.alertFor)
	require.Empty(t, s.notifiers)

	s, err = parseObs(t, "--metrics-addr", "127.0.0.1:9464", "--alert-threshold", "7", "--alert-for", "1m",
		"--alert-webhook-url", "http://127.0.0.1:9/a", "--alert-webhook-url", "http://127.0.0.1:9/b",
		"--alert-telegram-token", "1:x", "--alert-telegram-chat-id", "42")
	require.NoError(t, err)
	require.Equal(t, 7, s.alertThreshold)
	require.Len(t, s.notifiers, 3)

	for _, bad := range [][]string{
		{"--alert-threshold", "0"},
		{"--alert-for", "0s"},
		{"--alert-telegram-token", "1:x"},
		{"--alert-webhook-url", "not-a-url"},
		{"--metrics-addr", "9464"},
	} {
		_, err := parseObs(t, bad...)
		require.ErrorIs(t, err, ErrUsage, "%v", bad)
	}
}

// TestObservabilityOnRealDatabase: GET /metrics next to the API shows the
// outbox backlog of a real database, the API request gets a traceparent,
// and the alert posts to a webhook once the backlog stays above the
// threshold.
func TestObservabilityOnRealDatabase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))

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

	set, err := parseObs(t, "--alert-threshold", "1", "--alert-for", "50ms", "--alert-interval", "20ms",
		"--alert-webhook-url", hook.URL)
	require.NoError(t, err)
	o, err := newObservability(ctx, set, "rabbitmq", pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer o.close()

	var seenTraceparent string
	api := httptest.NewServer(o.apiHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenTraceparent = r.Header.Get("traceparent")
		w.WriteHeader(http.StatusCreated)
	})))
	defer api.Close()
	resp, err := http.Post(api.URL+"/notifications", "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, seenTraceparent)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.Enqueue(ctx, tx,
		outbox.Event{Type: "a.b", Body: []byte("1")}, outbox.Event{Type: "a.b", Body: []byte("2")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	resp, err = http.Get(api.URL + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(body), `ferry_outbox_unprocessed_rows{broker="rabbitmq"} 2`)
	require.Contains(t, string(body), `ferry_worker_messages_total{broker="rabbitmq",outcome="ack"} 0`)

	actx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- o.runAlert(actx) }()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(posts) == 1
	}, 10*time.Second, 10*time.Millisecond)
	_, err = pool.Exec(ctx, `UPDATE outbox SET processed_at = now()`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(posts) == 2
	}, 10*time.Second, 10*time.Millisecond)
	stop()
	require.NoError(t, <-done)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, "firing", posts[0]["status"])
	require.Equal(t, 2.0, posts[0]["unprocessed_rows"])
	require.Equal(t, map[string]any{"broker": "rabbitmq"}, posts[0]["labels"])
	require.Equal(t, "resolved", posts[1]["status"])
}

// TestAlertOnePerDatabase: the alerts of two relays on one database (each
// with its own pool, as two processes) post one "firing" between them;
// when the leading one stops and the outbox drains, the other posts one
// "resolved".
func TestAlertOnePerDatabase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, dsn := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, db))

	var mu sync.Mutex
	var statuses []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		statuses = append(statuses, fmt.Sprint(body["status"]))
		mu.Unlock()
	}))
	defer hook.Close()
	posted := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), statuses...) }

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.Enqueue(ctx, tx,
		outbox.Event{Type: "a.b", Body: []byte("1")}, outbox.Event{Type: "a.b", Body: []byte("2")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	type relay struct {
		stop func()
		done chan error
	}
	relays := map[string]relay{}
	for _, name := range []string{"relay1", "relay2"} {
		cfg, err := pgxpool.ParseConfig(dsn)
		require.NoError(t, err)
		cfg.ConnConfig.RuntimeParams["application_name"] = name // tells the lock holder apart
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		set, err := parseObs(t, "--alert-threshold", "1", "--alert-for", "100ms", "--alert-interval", "20ms",
			"--alert-webhook-url", hook.URL)
		require.NoError(t, err)
		o, err := newObservability(ctx, set, "rabbitmq", pool, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		t.Cleanup(o.close)
		actx, stop := context.WithCancel(ctx)
		r := relay{stop: stop, done: make(chan error, 1)}
		go func() { r.done <- o.runAlert(actx) }()
		relays[name] = r
	}
	// leader is the application_name of the session holding the lock ("" for none).
	leader := func() string {
		var name string
		err := db.QueryRow(ctx, `SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE l.locktype = 'advisory' AND l.classid = $1 AND l.granted AND l.database =
			(SELECT oid FROM pg_database WHERE datname = current_database())`, alert.LockClassID).Scan(&name)
		if err != nil {
			return ""
		}
		return name
	}

	require.Eventually(t, func() bool { return len(posted()) >= 1 }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // many ticks of both
	require.Equal(t, []string{"firing"}, posted(), "one notification per database, not per relay")

	first := leader()
	require.Contains(t, relays, first)
	relays[first].stop()
	require.NoError(t, <-relays[first].done)
	second := "relay1"
	if first == "relay1" {
		second = "relay2"
	}
	require.Eventually(t, func() bool { return leader() == second }, 10*time.Second, 10*time.Millisecond,
		"the remaining relay takes the lead")

	_, err = db.Exec(ctx, `UPDATE outbox SET processed_at = now()`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(posted()) >= 2 }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, []string{"firing", "resolved"}, posted())
	relays[second].stop()
	require.NoError(t, <-relays[second].done)

	var state string
	require.NoError(t, db.QueryRow(ctx, `SELECT state FROM ferry_alerts WHERE name = $1`, alert.DefaultName).Scan(&state))
	require.Equal(t, "inactive", state)
}

func TestNilObservabilityChangesNothing(t *testing.T) {
	var o *observability
	h := http.NotFoundHandler()
	require.NotNil(t, o.apiHandler(h))
	require.Nil(t, o.onBatch())
	require.Nil(t, o.onOutcome(nil))
	require.Nil(t, o.onSettleFailure())
	require.Nil(t, o.onBlocked())
	require.Empty(t, o.blockedReason())
	require.NoError(t, o.serveMetrics(context.Background()))
	require.NoError(t, o.runAlert(context.Background()))
	o.startAlert(context.Background())()
	ran := false
	require.NoError(t, o.withMetrics(context.Background(), func(context.Context) error { ran = true; return nil }))
	require.True(t, ran)
	o.close()
}

func TestWithMetricsServesWhileFRuns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	set, err := parseObs(t, "--metrics-addr", addr)
	require.NoError(t, err)
	o, err := newObservability(ctx, set, "nats", pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer o.close()

	var body string
	err = o.withMetrics(ctx, func(ctx context.Context) error {
		for {
			resp, err := http.Get("http://" + addr + "/metrics")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				body = string(b)
				return nil
			}
			select {
			case <-ctx.Done():
				return err
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	require.NoError(t, err)
	require.Contains(t, body, `ferry_outbox_unprocessed_rows{broker="nats"} 0`)
	require.Contains(t, body, `ferry_relay_published_total{broker="nats"} 0`)
	// The server stopped with f.
	_, err = http.Get("http://" + addr + "/metrics")
	require.Error(t, err)

	// A taken port is an error, and f is stopped.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	o.set.metricsAddr = busy.Addr().String()
	err = o.withMetrics(ctx, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	require.ErrorContains(t, err, "--metrics-addr")
}

// TestRelayBlockedReadyz (issue 29): while the relay reports a broker
// without room (outbox.RelayConfig.OnBlocked), GET /readyz answers 503
// with the broker's reason, on the API's address (ferry run) and on
// --metrics-addr (ferry relay), and ferry_relay_blocked is 1 with that
// reason; once it ends, /readyz is the API's own answer again (200 on the
// metrics server) and the gauge is 0 with reason="".
func TestRelayBlockedReadyz(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, _ := testenv.NewPool(t)
	set, err := parseObs(t)
	require.NoError(t, err)
	o, err := newObservability(ctx, set, "rabbitmq", pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer o.close()
	api := httptest.NewServer(o.apiHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot) // the API's own readiness answer
	})))
	defer api.Close()
	relay := httptest.NewServer(o.readyz(nil))
	defer relay.Close()
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	code, _ := get(api.URL + "/readyz")
	require.Equal(t, http.StatusTeapot, code)
	code, _ = get(relay.URL + "/readyz")
	require.Equal(t, http.StatusOK, code)
	_, m := get(api.URL + "/metrics")
	require.Contains(t, m, `ferry_relay_blocked{broker="rabbitmq",reason=""} 0`)

	o.onBlocked()("low on memory")
	for _, u := range []string{api.URL, relay.URL} {
		code, body := get(u + "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Contains(t, body, `"status":"blocked"`)
		require.Contains(t, body, "the broker has no room (low on memory)")
	}
	_, m = get(api.URL + "/metrics")
	require.Contains(t, m, `ferry_relay_blocked{broker="rabbitmq",reason="low on memory"} 1`)
	require.NotContains(t, m, `reason=""} 0`)

	o.onBlocked()("")
	code, _ = get(api.URL + "/readyz")
	require.Equal(t, http.StatusTeapot, code)
	code, _ = get(relay.URL + "/readyz")
	require.Equal(t, http.StatusOK, code)
	_, m = get(api.URL + "/metrics")
	require.Contains(t, m, `ferry_relay_blocked{broker="rabbitmq",reason=""} 0`)
	require.NotContains(t, m, "low on memory")
}
