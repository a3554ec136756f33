package alert_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/alert"
)

// request is one HTTP request a local receiver got.
type request struct {
	Method, Path, ContentType string
	Body                      []byte
}

// receiver is a real HTTP server on loopback that records requests and
// answers with status and body.
type receiver struct {
	mu     sync.Mutex
	reqs   []request
	status int
	answer string
	srv    *httptest.Server
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{status: http.StatusOK, answer: `{"ok":true,"result":{}}`}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.reqs = append(r.reqs, request{req.Method, req.URL.Path, req.Header.Get("Content-Type"), body})
		status, answer := r.status, r.answer
		r.mu.Unlock()
		w.WriteHeader(status)
		_, _ = io.WriteString(w, answer)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) set(status int, answer string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status, r.answer = status, answer
}

func (r *receiver) requests() []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]request(nil), r.reqs...)
}

func sample() alert.Notification {
	at := time.Date(2026, 1, 2, 3, 9, 5, 0, time.UTC)
	return alert.Notification{
		Alert: "FerryOutboxStuck", Status: alert.StatusFiring, Count: 150, OldestAgeSeconds: 420,
		Threshold: 100, ForSeconds: 300, StartsAt: at.Add(-5 * time.Minute), At: at,
		Labels: map[string]string{"broker": "rabbitmq"}, Summary: "150 unprocessed outbox rows",
	}
}

func TestWebhook(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t)
	w, err := alert.NewWebhook(rcv.srv.URL + "/hooks/secret-path?token=s3cret")
	require.NoError(t, err)
	require.NotContains(t, w.String(), "s3cret")

	require.NoError(t, w.Notify(context.Background(), sample()))
	reqs := rcv.requests()
	require.Len(t, reqs, 1)
	require.Equal(t, http.MethodPost, reqs[0].Method)
	require.Equal(t, "/hooks/secret-path", reqs[0].Path)
	require.Equal(t, "application/json", reqs[0].ContentType)
	var got map[string]any
	require.NoError(t, json.Unmarshal(reqs[0].Body, &got))
	require.Equal(t, "FerryOutboxStuck", got["alert"])
	require.Equal(t, "firing", got["status"])
	require.Equal(t, 150.0, got["unprocessed_rows"])
	require.Equal(t, 420.0, got["oldest_unprocessed_age_seconds"])
	require.Equal(t, 100.0, got["threshold"])
	require.Equal(t, 300.0, got["for_seconds"])
	require.Equal(t, "2026-01-02T03:04:05Z", got["starts_at"])
	require.Equal(t, "2026-01-02T03:09:05Z", got["at"])
	require.Equal(t, map[string]any{"broker": "rabbitmq"}, got["labels"])
	require.Contains(t, got["text"], "FIRING FerryOutboxStuck: 150 unprocessed outbox rows")

	rcv.set(http.StatusServiceUnavailable, "maintenance")
	err = w.Notify(context.Background(), sample())
	require.ErrorIs(t, err, alert.ErrNotify)
	require.Contains(t, err.Error(), "503")
	require.Contains(t, err.Error(), "maintenance")
	require.NotContains(t, err.Error(), "s3cret")
}

func TestWebhookUnreachableRedactsURL(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close() // nothing listens there any more
	w, err := alert.NewWebhook(addr + "/p?key=s3cret")
	require.NoError(t, err)
	err = w.Notify(context.Background(), sample())
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")
}

func TestNewWebhookRejectsBadURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"", "ftp://x/y", "/relative", "http://", "::bad"} {
		_, err := alert.NewWebhook(u)
		require.ErrorIs(t, err, alert.ErrConfig, u)
	}
}

func TestTelegramSendMessage(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t)
	tg, err := alert.NewTelegram("123456:ABC-def", "-1001234567890", rcv.srv.URL+"/")
	require.NoError(t, err)
	require.NotContains(t, tg.String(), "ABC-def")

	require.NoError(t, tg.Notify(context.Background(), sample()))
	reqs := rcv.requests()
	require.Len(t, reqs, 1)
	require.Equal(t, http.MethodPost, reqs[0].Method)
	require.Equal(t, "/bot123456:ABC-def/sendMessage", reqs[0].Path)
	require.Equal(t, "application/json", reqs[0].ContentType)
	var got map[string]any
	require.NoError(t, json.Unmarshal(reqs[0].Body, &got))
	require.Equal(t, "-1001234567890", got["chat_id"])
	require.Equal(t, "FIRING FerryOutboxStuck: 150 unprocessed outbox rows\nbroker=rabbitmq", got["text"])
	require.Equal(t, true, got["disable_web_page_preview"])
	require.NotContains(t, got, "parse_mode", "plain text: no markup to escape")

	// Telegram refuses: ok=false with a description, HTTP 400.
	rcv.set(http.StatusBadRequest, `{"ok":false,"error_code":400,"description":"Bad Request: chat not found"}`)
	err = tg.Notify(context.Background(), sample())
	require.ErrorIs(t, err, alert.ErrNotify)
	require.NotContains(t, err.Error(), "ABC-def")
	// 200 but ok=false is a refusal too.
	rcv.set(http.StatusOK, `{"ok":false,"description":"Forbidden: bot was blocked by the user"}`)
	err = tg.Notify(context.Background(), sample())
	require.ErrorIs(t, err, alert.ErrNotify)
	require.Contains(t, err.Error(), "bot was blocked")
	require.NotContains(t, err.Error(), "ABC-def")
}

func TestNewTelegramValidates(t *testing.T) {
	t.Parallel()
	_, err := alert.NewTelegram("", "1", "")
	require.ErrorIs(t, err, alert.ErrConfig)
	_, err = alert.NewTelegram("1:a", "", "")
	require.ErrorIs(t, err, alert.ErrConfig)
	_, err = alert.NewTelegram("1:a/b", "1", "")
	require.ErrorIs(t, err, alert.ErrConfig)
	_, err = alert.NewTelegram("1:a", "1", "ftp://x")
	require.ErrorIs(t, err, alert.ErrConfig)
	tg, err := alert.NewTelegram("1:a", "1", "")
	require.NoError(t, err)
	require.Contains(t, tg.String(), alert.DefaultTelegramBaseURL)
}

// TestAlertThroughWebhookAndTelegram runs the whole path: the state machine
// fires and resolves, and both real HTTP receivers get one message each time.
func TestAlertThroughWebhookAndTelegram(t *testing.T) {
	t.Parallel()
	hook, tgSrv := newReceiver(t), newReceiver(t)
	w, err := alert.NewWebhook(hook.srv.URL + "/alert")
	require.NoError(t, err)
	tg, err := alert.NewTelegram("42:xyz", "777", tgSrv.srv.URL)
	require.NoError(t, err)
	clk := newClock()
	src := &backlog{}
	a, err := alert.New(alert.Config{
		Threshold: 5, For: time.Minute, Source: src.source, Now: clk.now,
		Notifiers: []alert.Notifier{w, tg}, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	ctx := context.Background()

	src.set(6)
	a.Check(ctx)
	for range 10 {
		clk.add(15 * time.Second)
		a.Check(ctx)
	}
	src.set(0)
	for range 10 {
		clk.add(15 * time.Second)
		a.Check(ctx)
	}
	for _, r := range []*receiver{hook, tgSrv} {
		reqs := r.requests()
		require.Len(t, reqs, 2)
		require.Contains(t, string(reqs[0].Body), "FIRING")
		require.Contains(t, string(reqs[1].Body), "RESOLVED")
	}
}
