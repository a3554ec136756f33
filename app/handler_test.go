package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker"
)

// mailpitMessage is the part of Mailpit's message summary the tests read.
type mailpitMessage struct {
	ID        string
	MessageID string
	Subject   string
	To        []struct{ Address string }
}

// mailpitSearch returns the messages Mailpit holds for the recipient to.
func mailpitSearch(t *testing.T, to string) []mailpitMessage {
	t.Helper()
	u := testenv.MailpitURL() + "/api/v1/search?query=" + url.QueryEscape(`to:"`+to+`"`)
	res, err := http.Get(u)
	if err != nil {
		testenv.Require(t, "mailpit")
	}
	require.NoError(t, err, "Mailpit HTTP API at %s", testenv.MailpitURL())
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	var out struct{ Messages []mailpitMessage }
	require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
	// The search matches substrings; keep exact recipients only.
	var exact []mailpitMessage
	for _, m := range out.Messages {
		for _, a := range m.To {
			if strings.EqualFold(a.Address, to) {
				exact = append(exact, m)
				break
			}
		}
	}
	return exact
}

func mailpitGet(t *testing.T, path string, v any) {
	t.Helper()
	res, err := http.Get(testenv.MailpitURL() + path)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, path)
	require.NoError(t, json.NewDecoder(res.Body).Decode(v))
}

// outboxMessage builds the broker message the relay would publish for the
// outbox row of notification id.
func (b *bundle) outboxMessage(t *testing.T, id string) *broker.Message {
	t.Helper()
	var rowID int64
	var typ, key string
	var payload []byte
	err := b.pool.QueryRow(context.Background(), `
		SELECT id, event_type, partition_key, payload FROM outbox
		WHERE convert_from(payload, 'UTF8')::jsonb->>'notification_id' = $1`, id).Scan(&rowID, &typ, &key, &payload)
	require.NoError(t, err)
	return &broker.Message{ID: strconv.FormatInt(rowID, 10), Type: typ, Key: key, Body: payload, Attempt: 1}
}

// inTx runs f in its own committed transaction, as the worker does. It
// may be called from any goroutine.
func (b *bundle) inTx(f func(pgx.Tx) error) error {
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func (b *bundle) create(t *testing.T, req map[string]any) string {
	t.Helper()
	r := b.post(t, req, nil)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
	return r.obj["id"].(string)
}

func TestHandleNotificationSendsOnce(t *testing.T) {
	t.Parallel()
	testenv.RequireTCP(t, "smtp", testenv.SMTPAddr())
	b := setup(t, app.Config{SMTPFrom: "ferry-test@example.org"})
	ctx := context.Background()
	to := testenv.UniqueName("handler") + "@example.com"
	subject := "Счёт за ноябрь 🎉 " + to
	body := "Здравствуйте!\r\n\tYour invoice is attached.\r\n" + strings.Repeat("Строка текста. ", 2000)
	req := valid()
	req["to"], req["subject"], req["body"] = to, subject, body
	id := b.create(t, req)
	msg := b.outboxMessage(t, id)

	require.NoError(t, b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(ctx, tx, msg) }))
	got := mailpitSearch(t, to)
	require.Len(t, got, 1, "one mail arrived")
	require.Equal(t, subject, got[0].Subject)

	var full struct {
		MessageID string
		Subject   string
		Text      string
		From      struct{ Address string }
	}
	mailpitGet(t, "/api/v1/message/"+got[0].ID, &full)
	require.Equal(t, "ferry-test@example.org", full.From.Address)
	want, gotText := strings.ReplaceAll(body, "\r\n", "\n"), strings.ReplaceAll(full.Text, "\r\n", "\n")
	gotText = strings.TrimSuffix(gotText, "\n") // the MIME part ends with a line break
	if want != gotText {
		i := 0
		for i < len(want) && i < len(gotText) && want[i] == gotText[i] {
			i++
		}
		t.Fatalf("mail text differs from the body at byte %d (len %d, want %d): got %q, want %q",
			i, len(gotText), len(want), gotText[i:min(i+40, len(gotText))], want[i:min(i+40, len(want))])
	}
	require.True(t, strings.HasPrefix(full.MessageID, "notification-"+id+"."), full.MessageID)
	require.True(t, strings.HasSuffix(full.MessageID, "@example.org"), full.MessageID)
	var headers map[string][]string
	mailpitGet(t, "/api/v1/message/"+got[0].ID+"/headers", &headers)
	require.Equal(t, []string{id}, headers[app.HeaderNotificationID])

	n, err := b.app.Status(ctx, id)
	require.NoError(t, err)
	require.Equal(t, app.StatusSent, n.Status)
	require.Equal(t, 1, n.Attempts)
	require.NotNil(t, n.SentAt)

	// The same message again (a redelivery the dedup table missed, or a
	// second consumer): skipped, no second mail.
	require.NoError(t, b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(ctx, tx, msg) }))
	require.Len(t, mailpitSearch(t, to), 1, "no second mail")
	n, err = b.app.Status(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 1, n.Attempts)

	r := b.do(t, http.MethodGet, "/notifications/"+id, nil, nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "sent", r.obj["status"])
	require.EqualValues(t, 1, r.obj["attempts"])
	require.NotNil(t, r.obj["sent_at"])
}

func TestOnFailureRetryThenDead(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	ctx := context.Background()
	id := b.create(t, valid())
	msg := b.outboxMessage(t, id)

	for range 2 { // the worker may call it twice for one attempt: counted once
		require.NoError(t, b.inTx(func(tx pgx.Tx) error {
			return b.app.OnFailure(ctx, tx, msg, errors.New("smtp: 451 try again later"), false)
		}))
	}
	r := b.do(t, http.MethodGet, "/notifications/"+id, nil, nil)
	require.Equal(t, "pending", r.obj["status"])
	require.EqualValues(t, 1, r.obj["attempts"])
	require.Equal(t, "smtp: 451 try again later", r.obj["last_error"])

	last := msg.Clone()
	last.Attempt = 2
	require.NoError(t, b.inTx(func(tx pgx.Tx) error {
		return b.app.OnFailure(ctx, tx, last, errors.New("smtp: 554 transaction failed\n\x00more"), true)
	}))
	r = b.do(t, http.MethodGet, "/notifications/"+id, nil, nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "dead", r.obj["status"])
	require.EqualValues(t, 2, r.obj["attempts"])
	require.Equal(t, "smtp: 554 transaction failed more", r.obj["last_error"])
	require.Nil(t, r.obj["sent_at"])

	c, err := b.app.CountByStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), c[app.StatusDead])

	// A sent notification never turns dead.
	_, err = b.pool.Exec(ctx, `UPDATE notifications SET status = 'sent' WHERE id = $1::bigint`, id)
	require.NoError(t, err)
	require.NoError(t, b.inTx(func(tx pgx.Tx) error { return b.app.OnFailure(ctx, tx, msg, errors.New("late"), true) }))
	n, err := b.app.Status(ctx, id)
	require.NoError(t, err)
	require.Equal(t, app.StatusSent, n.Status)

	// A message that names no notification changes nothing and is no error.
	bad := &broker.Message{ID: "9", Type: app.EventNotificationRequested, Body: []byte("{")}
	require.NoError(t, b.inTx(func(tx pgx.Tx) error { return b.app.OnFailure(ctx, tx, bad, errors.New("x"), true) }))
	// Nor does a message of another type whose body happens to name it
	// (the mux dead-letters it for want of a handler).
	_, err = b.pool.Exec(ctx, `UPDATE notifications SET status = 'pending' WHERE id = $1::bigint`, id)
	require.NoError(t, err)
	other := &broker.Message{ID: "10", Type: "notification.other", Body: []byte(`{"notification_id":"` + id + `"}`)}
	herr := b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(ctx, tx, other) })
	require.ErrorIs(t, herr, ferry.ErrNoHandler)
	require.True(t, worker.IsPermanent(herr))
	require.NoError(t, b.inTx(func(tx pgx.Tx) error { return b.app.OnFailure(ctx, tx, other, herr, true) }))
	n, err = b.app.Status(ctx, id)
	require.NoError(t, err)
	require.Equal(t, app.StatusPending, n.Status)
}

func TestHandleNotificationErrors(t *testing.T) {
	t.Parallel()
	// An SMTP server that is not there: a port that was free a moment ago.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadAddr := l.Addr().String()
	require.NoError(t, l.Close())
	b := setup(t, app.Config{SMTPAddr: deadAddr, SMTPTimeout: 2 * time.Second})
	ctx := context.Background()

	for name, body := range map[string]string{
		"not JSON":      `{`,
		"no id":         `{"user_id":"u"}`,
		"non-numeric":   `{"notification_id":"abc"}`,
		"numeric value": `{"notification_id":7}`,
		"unknown id":    `{"notification_id":"424242"}`,
	} {
		msg := &broker.Message{ID: "1", Type: app.EventNotificationRequested, Body: []byte(body)}
		err := b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(ctx, tx, msg) })
		require.Error(t, err, name)
		require.True(t, worker.IsPermanent(err), "%s: %v", name, err)
	}

	id := b.create(t, valid())
	msg := b.outboxMessage(t, id)
	err = b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(ctx, tx, msg) })
	require.Error(t, err)
	require.False(t, worker.IsPermanent(err), "an unreachable SMTP server is worth a retry: %v", err)
	require.Contains(t, err.Error(), deadAddr)
	n, err := b.app.Status(ctx, id)
	require.NoError(t, err)
	require.Equal(t, app.StatusPending, n.Status)
	require.Equal(t, 0, n.Attempts, "the failed attempt is counted by OnFailure, in its own transaction")
}

// TestConcurrentDeliveriesSendOnce delivers the same message to several
// handlers at once (as two workers might after a redelivery): the row lock
// lets one send and the others skip.
func TestConcurrentDeliveriesSendOnce(t *testing.T) {
	t.Parallel()
	testenv.RequireTCP(t, "smtp", testenv.SMTPAddr())
	b := setup(t, app.Config{})
	ctx := context.Background()
	to := testenv.UniqueName("concurrent") + "@example.net"
	id := b.create(t, with("to", to))
	msg := b.outboxMessage(t, id)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			errs <- b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(ctx, tx, msg) })
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	require.Len(t, mailpitSearch(t, to), 1, fmt.Sprintf("one mail to %s", to))
	n, err := b.app.Status(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 1, n.Attempts)
}

// TestSentClearsTheLastError: a notification dead after an SMTP error and
// sent once replayed from the DLQ (the attempt count starts again) no
// longer shows the old error; an earlier ErrDeliveryUnknown stays, since
// that attempt may have delivered a copy too.
func TestSentClearsTheLastError(t *testing.T) {
	t.Parallel()
	testenv.RequireTCP(t, "smtp", testenv.SMTPAddr())
	b := setup(t, app.Config{})
	ctx := context.Background()
	for _, tc := range []struct {
		cause error
		kept  bool
	}{
		{errors.New("smtp: 554 5.7.1 relay access denied"), false},
		{fmt.Errorf("%w (notification 1, smtp %s): i/o timeout", app.ErrDeliveryUnknown, testenv.SMTPAddr()), true},
	} {
		req := valid()
		req["to"] = testenv.UniqueName("lasterror") + "@example.com"
		id := b.create(t, req)
		msg := b.outboxMessage(t, id)
		require.NoError(t, b.inTx(func(tx pgx.Tx) error { return b.app.OnFailure(ctx, tx, msg, tc.cause, true) }))
		r := b.do(t, http.MethodGet, "/notifications/"+id, nil, nil)
		require.Equal(t, "dead", r.obj["status"])
		require.Equal(t, tc.cause.Error(), r.obj["last_error"])

		replayed := msg.Clone() // dlq replay: the retry count is reset
		require.NoError(t, b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(ctx, tx, replayed) }))
		r = b.do(t, http.MethodGet, "/notifications/"+id, nil, nil)
		require.Equal(t, "sent", r.obj["status"], "%s", r.raw)
		require.EqualValues(t, 2, r.obj["attempts"])
		if tc.kept {
			require.Equal(t, tc.cause.Error(), r.obj["last_error"], "a possible earlier delivery stays visible")
		} else {
			require.Nil(t, r.obj["last_error"], "the old SMTP error no longer describes a sent notification")
		}
	}
}
