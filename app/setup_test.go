package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// bundle is what a test needs: the service on a fresh database, served
// over a real HTTP server.
type bundle struct {
	app  *app.App
	pool *pgxpool.Pool
	srv  *httptest.Server
}

// setup migrates a fresh database (outbox and app tables) and serves a new
// App configured by cfg (Pool and, unless set, SMTPAddr are filled in).
func setup(t *testing.T, cfg app.Config) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	require.NoError(t, app.Migrate(ctx, pool))
	cfg.Pool = pool
	if cfg.SMTPAddr == "" {
		cfg.SMTPAddr = testenv.SMTPAddr()
	}
	a, err := app.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return &bundle{app: a, pool: pool, srv: srv}
}

// response is a decoded answer.
type response struct {
	status int
	header http.Header
	raw    []byte
	obj    map[string]any
}

func (b *bundle) do(t *testing.T, method, path string, body []byte, header map[string]string) response {
	t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+path, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := b.srv.Client().Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	r := response{status: res.StatusCode, header: res.Header, raw: raw}
	require.Contains(t, res.Header.Get("Content-Type"), "application/json", "answer %d %s", res.StatusCode, raw)
	require.NoError(t, json.Unmarshal(raw, &r.obj), "answer is not a JSON object: %s", raw)
	return r
}

func (b *bundle) post(t *testing.T, body any, header map[string]string) response {
	t.Helper()
	var data []byte
	switch v := body.(type) {
	case []byte:
		data = v
	case string:
		data = []byte(v)
	default:
		var err error
		data, err = json.Marshal(v)
		require.NoError(t, err)
	}
	return b.do(t, http.MethodPost, "/notifications", data, header)
}

// counts returns the rows in notifications and in outbox.
func (b *bundle) counts(t *testing.T) (notifications, events int) {
	t.Helper()
	err := b.pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM notifications), (SELECT count(*) FROM outbox)`).Scan(&notifications, &events)
	require.NoError(t, err)
	return notifications, events
}

func valid() map[string]any {
	return map[string]any{
		"user_id": "u-00001",
		"channel": "email",
		"to":      "anna.1@example.com",
		"subject": "Welcome aboard 🎉",
		"body":    "Привет!\r\n\tThis is a test.",
	}
}

func with(k string, v any) map[string]any {
	m := valid()
	m[k] = v
	return m
}

func without(k string) map[string]any {
	m := valid()
	delete(m, k)
	return m
}
