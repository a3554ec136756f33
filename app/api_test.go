package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
)

func TestCreateWritesNotificationAndEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	r := b.post(t, valid(), map[string]string{"traceparent": tp})
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
	require.Equal(t, "pending", r.obj["status"])
	id, ok := r.obj["id"].(string)
	require.True(t, ok, "id is a string: %s", r.raw)
	require.Equal(t, "/notifications/"+id, r.header.Get("Location"))

	n, e := b.counts(t)
	require.Equal(t, 1, n)
	require.Equal(t, 1, e)

	var typ, key string
	var payload []byte
	var headers map[string]string
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT event_type, partition_key, payload, headers FROM outbox`).Scan(&typ, &key, &payload, &headers))
	require.Equal(t, app.EventNotificationRequested, typ)
	require.Equal(t, "u-00001", key)
	require.Equal(t, tp, headers["traceparent"])
	require.Equal(t, id, headers[broker.HeaderAppID], "the notification id rides along, for dlq list")
	var ev app.RequestedEvent
	require.NoError(t, json.Unmarshal(payload, &ev))
	require.Equal(t, app.RequestedEvent{NotificationID: id, UserID: "u-00001", Channel: "email"}, ev)

	var body, subject string
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT body, subject FROM notifications WHERE id = $1::bigint`, id).Scan(&body, &subject))
	require.Equal(t, valid()["body"], body, "CRLF, tab and Cyrillic survive")
	require.Equal(t, valid()["subject"], subject)

	g := b.do(t, http.MethodGet, "/notifications/"+id, nil, nil)
	require.Equal(t, http.StatusOK, g.status, "%s", g.raw)
	require.Equal(t, "pending", g.obj["status"])
	require.EqualValues(t, 0, g.obj["attempts"])
	require.Nil(t, g.obj["last_error"])

	// A malformed traceparent is not propagated (W3C: ignore it).
	r = b.post(t, valid(), map[string]string{"traceparent": "garbage"})
	require.Equal(t, http.StatusCreated, r.status)
	headers = nil
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT headers FROM outbox ORDER BY id DESC LIMIT 1`).Scan(&headers))
	require.Equal(t, map[string]string{broker.HeaderAppID: r.obj["id"].(string)}, headers, "no traceparent")
}

// Scenario 2: the debug switch fails the request after the outbox INSERT,
// inside the transaction; neither row remains.
func TestDebugFailAfterOutboxLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{DebugFailAfterOutbox: true})
	r := b.post(t, valid(), nil)
	require.Equal(t, http.StatusInternalServerError, r.status, "%s", r.raw)
	require.Equal(t, app.CodeDebugFailure, r.obj["code"])
	require.NotEmpty(t, r.obj["error"])
	n, e := b.counts(t)
	require.Zero(t, n, "notification rows")
	require.Zero(t, e, "outbox rows")
	// The sequences did advance: the INSERTs really ran before the rollback.
	var outboxSeq, notifSeq int64
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT (SELECT last_value FROM outbox_id_seq), (SELECT last_value FROM notifications_id_seq)`).Scan(&outboxSeq, &notifSeq))
	require.EqualValues(t, 1, outboxSeq)
	require.EqualValues(t, 1, notifSeq)
	var called bool
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT is_called FROM outbox_id_seq`).Scan(&called))
	require.True(t, called, "the outbox INSERT ran before the failure")
}

// Scenario 8: bad inputs get their 4xx naming the field and the problem,
// and nothing is written.
func TestBadInputsWriteNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	big := strings.Repeat("a", app.DefaultMaxBodyBytes+1)
	huge := strings.Repeat("b", 7*app.DefaultMaxBodyBytes)
	raw := func(s string) []byte { return []byte(s) }
	cases := []struct {
		name   string
		body   any
		header map[string]string
		status int
		field  string
		code   string
	}{
		{"truncated JSON", raw(`{"user_id":"u-1",`), nil, 400, "", app.CodeMalformedJSON},
		{"empty request", raw(``), nil, 400, "", app.CodeMalformedJSON},
		{"array", raw(`[1,2]`), nil, 400, "", app.CodeMalformedJSON},
		{"null", raw(`null`), nil, 400, "", app.CodeMalformedJSON},
		{"trailing data", raw(`{"user_id":"u-1","channel":"email","to":"a@example.com","body":"x"} {}`), nil, 400, "", app.CodeMalformedJSON},
		{"unknown field", with("priority", "high"), nil, 422, "priority", app.CodeUnknownField},
		{"user_id missing", without("user_id"), nil, 422, "user_id", app.CodeMissingField},
		{"user_id number", with("user_id", 42), nil, 422, "user_id", app.CodeInvalidType},
		{"user_id blank", with("user_id", "  "), nil, 422, "user_id", app.CodeEmptyField},
		{"user_id NUL", with("user_id", "u\x00"), nil, 422, "user_id", app.CodeInvalidCharacters},
		{"user_id too long", with("user_id", strings.Repeat("u", 256)), nil, 422, "user_id", app.CodeTooLong},
		{"channel missing", without("channel"), nil, 422, "channel", app.CodeMissingField},
		{"channel sms", with("channel", "sms"), nil, 422, "channel", app.CodeUnsupportedChannel},
		{"channel array", with("channel", []string{"email"}), nil, 422, "channel", app.CodeInvalidType},
		{"to missing", without("to"), nil, 422, "to", app.CodeMissingField},
		{"to null", with("to", nil), nil, 422, "to", app.CodeMissingField},
		{"to not an address", with("to", "not-an-address"), nil, 422, "to", app.CodeInvalidAddress},
		{"to with display name", with("to", "Anna <anna@example.com>"), nil, 422, "to", app.CodeInvalidAddress},
		{"to with spaces", with("to", " anna@example.com"), nil, 422, "to", app.CodeInvalidAddress},
		{"to two addresses", with("to", "a@example.com, b@example.com"), nil, 422, "to", app.CodeInvalidAddress},
		{"to no domain", with("to", "anna@"), nil, 422, "to", app.CodeInvalidAddress},
		{"subject object", with("subject", map[string]int{"a": 1}), nil, 422, "subject", app.CodeInvalidType},
		{"subject CRLF (header injection)", with("subject", "hi\r\nBcc: x@example.com"), nil, 422, "subject", app.CodeInvalidCharacters},
		{"body missing", without("body"), nil, 422, "body", app.CodeMissingField},
		{"body empty", with("body", ""), nil, 422, "body", app.CodeEmptyField},
		{"body boolean", with("body", true), nil, 422, "body", app.CodeInvalidType},
		{"body NUL", with("body", "a\u0000b"), nil, 422, "body", app.CodeInvalidCharacters},
		{"body one byte too large", with("body", big), nil, 413, "body", app.CodeBodyTooLarge},
		{"request too large", with("body", huge), nil, 413, "", app.CodeRequestTooLarge},
		{"body invalid UTF-8", raw("{\"user_id\":\"u-1\",\"channel\":\"email\",\"to\":\"a@example.com\",\"body\":\"\xff\xfe\"}"), nil, 400, "body", app.CodeInvalidUTF8},
		{"to invalid UTF-8", raw("{\"user_id\":\"u-1\",\"channel\":\"email\",\"to\":\"a\xc3@example.com\",\"body\":\"x\"}"), nil, 400, "to", app.CodeInvalidUTF8},
		{"idempotency key with space", valid(), map[string]string{"Idempotency-Key": "a b"}, 400, "Idempotency-Key", app.CodeInvalidIdempotencyKey},
		{"idempotency key too long", valid(), map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}, 400, "Idempotency-Key", app.CodeInvalidIdempotencyKey},
	}
	require.GreaterOrEqual(t, len(cases), 12)
	for _, c := range cases {
		r := b.post(t, c.body, c.header)
		require.Equal(t, c.status, r.status, "%s: %s", c.name, r.raw)
		require.Equal(t, c.code, r.obj["code"], "%s: %s", c.name, r.raw)
		if c.field == "" {
			require.NotContains(t, r.obj, "field", "%s: %s", c.name, r.raw)
		} else {
			require.Equal(t, c.field, r.obj["field"], "%s: %s", c.name, r.raw)
		}
		msg, _ := r.obj["error"].(string)
		require.NotEmpty(t, msg, "%s", c.name)
		require.Less(t, len(r.raw), 1024, "%s: the error does not echo the input", c.name)
		n, e := b.counts(t)
		require.Zero(t, n, "%s wrote a notification", c.name)
		require.Zero(t, e, "%s wrote an outbox row", c.name)
	}

	// The same requests, made valid, are accepted: the table tests the
	// validation, not a broken endpoint.
	r := b.post(t, with("body", strings.Repeat("я", app.DefaultMaxBodyBytes/2)), nil) // exactly 64 KiB
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
	r = b.post(t, with("body", strings.Repeat("\u0001\t", app.DefaultMaxBodyBytes/2)), nil) // 64 KiB, all escaped
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
	r = b.post(t, without("subject"), map[string]string{"Idempotency-Key": "7c0d2b4e-1a7f-4a4e-9e8a-2f5b0c9d1e3f"})
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
	n, e := b.counts(t)
	require.Equal(t, 3, n)
	require.Equal(t, 3, e)
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	key := map[string]string{"Idempotency-Key": "order-42-welcome"}
	first := b.post(t, valid(), key)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.raw)
	again := b.post(t, valid(), key)
	require.Equal(t, http.StatusCreated, again.status, "%s", again.raw)
	require.JSONEq(t, string(first.raw), string(again.raw), "a repeat gets the first answer")
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Empty(t, first.header.Get("Idempotent-Replayed"))
	// The same request written differently (member order, spacing, escapes)
	// is the same request.
	v := valid()
	reformatted := `{ "body": "Привет!\r\n\tThis is a test.", "subject": "Welcome aboard \ud83c\udf89",
		"to": "anna.1@example.com", "channel": "email", "user_id": "u-00001" }`
	require.Equal(t, "Welcome aboard 🎉", v["subject"])
	again = b.post(t, reformatted, key)
	require.Equal(t, http.StatusCreated, again.status, "%s", again.raw)
	require.Equal(t, first.obj["id"], again.obj["id"])
	n, e := b.counts(t)
	require.Equal(t, 1, n)
	require.Equal(t, 1, e)

	// Same key, different request: refused, nothing written.
	diff := b.post(t, with("body", "another body"), key)
	require.Equal(t, http.StatusUnprocessableEntity, diff.status, "%s", diff.raw)
	require.Equal(t, app.CodeIdempotencyKeyReused, diff.obj["code"])
	require.Equal(t, "Idempotency-Key", diff.obj["field"])
	n, e = b.counts(t)
	require.Equal(t, 1, n)
	require.Equal(t, 1, e)

	// Without a key, the same request is a new notification.
	other := b.post(t, valid(), nil)
	require.Equal(t, http.StatusCreated, other.status)
	require.NotEqual(t, first.obj["id"], other.obj["id"])

	// Racing repeats write once.
	const racers = 16
	race := map[string]string{"Idempotency-Key": "race-1"}
	ids := make([]string, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data, _ := json.Marshal(with("user_id", "u-race"))
			req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/notifications", strings.NewReader(string(data)))
			req.Header.Set("Idempotency-Key", race["Idempotency-Key"])
			res, err := b.srv.Client().Do(req)
			if err != nil {
				ids[i] = "error: " + err.Error()
				return
			}
			defer res.Body.Close()
			var c app.Created
			if err := json.NewDecoder(res.Body).Decode(&c); err != nil || res.StatusCode != http.StatusCreated {
				ids[i] = fmt.Sprintf("status %d: %v", res.StatusCode, err)
				return
			}
			ids[i] = c.ID
		}()
	}
	wg.Wait()
	for i := range ids {
		require.Equal(t, ids[0], ids[i], "racer %d", i)
	}
	var rows, events int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT count(*), (SELECT count(*) FROM outbox WHERE convert_from(payload, 'UTF8') LIKE '%u-race%') FROM notifications WHERE idempotency_key = 'race-1'`).Scan(&rows, &events))
	require.Equal(t, 1, rows)
	require.Equal(t, 1, events)
}

func TestGetNotFoundAndProbes(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	for _, id := range []string{"999999", "abc", "0", "-1", "99999999999999999999"} {
		r := b.do(t, http.MethodGet, "/notifications/"+id, nil, nil)
		require.Equal(t, http.StatusNotFound, r.status, "%s: %s", id, r.raw)
		require.Equal(t, app.CodeNotFound, r.obj["code"])
		require.NotEmpty(t, r.obj["error"])
	}
	r := b.do(t, http.MethodGet, "/nope", nil, nil)
	require.Equal(t, http.StatusNotFound, r.status)
	r = b.do(t, http.MethodGet, "/healthz", nil, nil)
	require.Equal(t, http.StatusOK, r.status)
	r = b.do(t, http.MethodGet, "/readyz", nil, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)

	// With the database gone, /readyz says so and /healthz still answers.
	b.pool.Close()
	r = b.do(t, http.MethodGet, "/readyz", nil, nil)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.raw)
	r = b.post(t, valid(), nil)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.raw)
	require.Equal(t, app.CodeUnavailable, r.obj["code"])
	r = b.do(t, http.MethodGet, "/healthz", nil, nil)
	require.Equal(t, http.StatusOK, r.status)
}

func TestCountByStatusAndStatus(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	ctx := context.Background()
	c, err := b.app.CountByStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"pending": 0, "sent": 0, "dead": 0}, c)
	for range 3 {
		require.Equal(t, http.StatusCreated, b.post(t, valid(), nil).status)
	}
	_, err = b.pool.Exec(ctx, `UPDATE notifications SET status = 'sent' WHERE id = 1`)
	require.NoError(t, err)
	c, err = b.app.CountByStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"pending": 2, "sent": 1, "dead": 0}, c)
	n, err := b.app.Status(ctx, "1")
	require.NoError(t, err)
	require.Equal(t, "sent", n.Status)
	require.Equal(t, "anna.1@example.com", n.To)
	_, err = b.app.Status(ctx, "4")
	require.ErrorIs(t, err, app.ErrNotFound)
	_, err = b.app.Status(ctx, "x")
	require.ErrorIs(t, err, app.ErrNotFound)
}

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	ctx := context.Background()
	require.NoError(t, app.Migrate(ctx, b.pool))
	var v int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT max(version_id) FROM `+app.MigrationsTable).Scan(&v))
	require.EqualValues(t, 1, v)
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	_, err := app.New(app.Config{})
	require.ErrorIs(t, err, app.ErrConfig)
	require.ErrorContains(t, err, "Pool")
	pool, err := pgxpool.New(context.Background(), testenv.DatabaseURL()) // connects lazily
	require.NoError(t, err)
	defer pool.Close()
	for field, cfg := range map[string]app.Config{
		"SMTPAddr":     {Pool: pool, SMTPAddr: "no-port"},
		"SMTPFrom":     {Pool: pool, SMTPFrom: "Ferry <ferry@localhost>"},
		"SMTPTimeout":  {Pool: pool, SMTPTimeout: -1},
		"MaxBodyBytes": {Pool: pool, MaxBodyBytes: -1},
		"Exchange":     {Pool: pool, Exchange: "no spaces"},
	} {
		_, err := app.New(cfg)
		require.ErrorIs(t, err, app.ErrConfig, field)
		require.ErrorContains(t, err, field)
	}
	a, err := app.New(app.Config{Pool: pool})
	require.NoError(t, err)
	top := a.Topology([]time.Duration{time.Second})
	require.NoError(t, top.Validate())
	require.Equal(t, "notifications", top.Exchange)
	require.Equal(t, "notifications.send", top.Queues[0].Name)
	require.Equal(t, []string{app.EventNotificationRequested}, top.Queues[0].Bindings)
	require.Equal(t, []time.Duration{time.Second}, top.Queues[0].RetryDelays)
}

// A repeat with the same Idempotency-Key after the mail went out gets the
// same id and the current status (sent), not the first answer's
// "pending".
func TestIdempotencyReplayReportsCurrentStatus(t *testing.T) {
	t.Parallel()
	testenv.RequireTCP(t, "smtp", testenv.SMTPAddr())
	b := setup(t, app.Config{})
	key := map[string]string{"Idempotency-Key": "replay-after-send"}
	req := with("to", testenv.UniqueName("replay")+"@example.com")
	first := b.post(t, req, key)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.raw)
	require.Equal(t, app.StatusPending, first.obj["status"])
	id := first.obj["id"].(string)
	msg := b.outboxMessage(t, id)
	require.NoError(t, b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(context.Background(), tx, msg) }))

	again := b.post(t, req, key)
	require.Equal(t, http.StatusCreated, again.status, "%s", again.raw)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, id, again.obj["id"])
	require.Equal(t, app.StatusSent, again.obj["status"], "the replay reports the current status: %s", again.raw)
	require.Equal(t, "/notifications/"+id, again.header.Get("Location"))
	n, e := b.counts(t)
	require.Equal(t, 1, n)
	require.Equal(t, 1, e)
}

// GET /notifications/{id} with the database gone is 503 unavailable, as
// POST is, with a reason about reading (nothing was to be written) and
// without the driver's error.
func TestGetWhileDatabaseDown(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	id := b.create(t, valid())
	b.pool.Close()
	r := b.do(t, http.MethodGet, "/notifications/"+id, nil, nil)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.raw)
	require.Equal(t, app.CodeUnavailable, r.obj["code"])
	msg, _ := r.obj["error"].(string)
	require.Contains(t, msg, "could not be read")
	require.NotContains(t, msg, "written")
	require.NotContains(t, msg, "closed pool", "the driver's error goes to the log only")
}
