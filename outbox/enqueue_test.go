package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/outbox"
)

func enqueue(t testing.TB, pool *pgxpool.Pool, events ...outbox.Event) []int64 {
	t.Helper()
	ctx := testCtx(t)
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		ids, err = outbox.Enqueue(ctx, tx, events...)
		return err
	}))
	return ids
}

func events(n int, typ string) []outbox.Event {
	out := make([]outbox.Event, n)
	for i := range out {
		out[i] = outbox.Event{Type: typ, Key: "k" + strconv.Itoa(i%7), Body: []byte(fmt.Sprintf(`{"i":%d}`, i))}
	}
	return out
}

func TestEnqueueStoresRowsInOrder(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)

	var events []outbox.Event
	for i := range 50 {
		events = append(events, outbox.Event{
			Type:    "notification.requested",
			Key:     "user-" + strconv.Itoa(i%3),
			Body:    []byte(`{"n":` + strconv.Itoa(i) + `}`),
			Headers: map[string]string{"traceparent": "00-" + strconv.Itoa(i)},
		})
	}
	events[7].Headers = nil
	events[8].Body = []byte{}
	ids := enqueue(t, pool, events...)
	require.Len(t, ids, len(events))
	for i, id := range ids {
		var typ, key string
		var body []byte
		var headers map[string]string
		var attempts int
		var processed *any
		require.NoError(t, pool.QueryRow(ctx, `SELECT event_type, partition_key, payload, headers, attempts, processed_at FROM outbox WHERE id = $1`, id).
			Scan(&typ, &key, &body, &headers, &attempts, &processed))
		require.Equal(t, events[i].Type, typ)
		require.Equal(t, events[i].Key, key)
		require.Equal(t, string(events[i].Body), string(body), "row %d", i)
		if events[i].Headers == nil {
			require.Empty(t, headers)
		} else {
			require.Equal(t, events[i].Headers, headers)
		}
		require.Zero(t, attempts)
		require.Nil(t, processed)
	}

	// Enqueue in a rolled-back transaction leaves nothing behind.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.Enqueue(ctx, tx, outbox.Event{Type: "a.b", Body: []byte("x")})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n))
	require.Equal(t, len(events), n)

	// No events: nothing happens.
	require.Empty(t, enqueue(t, pool))
}

func TestEnqueueNotifiesOnCommit(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "LISTEN "+outbox.NotifyChannel)
	require.NoError(t, err)

	enqueue(t, pool, outbox.Event{Type: "a.b", Body: []byte("x")}, outbox.Event{Type: "a.c", Body: []byte("y")})
	n, err := conn.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.NotifyChannel, n.Channel)
}

func TestEnqueueValidation(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	ok := outbox.Event{Type: "notification.requested", Body: []byte("{}")}
	for _, tc := range []struct {
		name  string
		event outbox.Event
		want  string
	}{
		{"empty type", outbox.Event{Body: []byte("x")}, "events[1].Type"},
		{"star", outbox.Event{Type: "a.*", Body: []byte("x")}, "events[1].Type"},
		{"hash", outbox.Event{Type: "a.#", Body: []byte("x")}, "events[1].Type"},
		{"hash in word", outbox.Event{Type: "a.b#c", Body: []byte("x")}, "events[1].Type"},
		{"empty word", outbox.Event{Type: "a..b", Body: []byte("x")}, "events[1].Type"},
		{"leading dot", outbox.Event{Type: ".a", Body: []byte("x")}, "events[1].Type"},
		{"space", outbox.Event{Type: "a b", Body: []byte("x")}, "events[1].Type"},
		{"too long", outbox.Event{Type: strings.Repeat("a", 256), Body: []byte("x")}, "events[1].Type"},
		{"nil body", outbox.Event{Type: "a.b"}, "events[1].Body"},
		{"reserved header", outbox.Event{Type: "a.b", Body: []byte("x"), Headers: map[string]string{"x-retry-count": "1"}}, `events[1].Headers["x-retry-count"]`},
		{"empty header key", outbox.Event{Type: "a.b", Body: []byte("x"), Headers: map[string]string{"": "1"}}, "events[1].Headers"},
		{"bad key", outbox.Event{Type: "a.b", Key: "\xff", Body: []byte("x")}, "events[1].Key"},
		{"key with newline", outbox.Event{Type: "a.b", Key: "a\nb", Body: []byte("x")}, "events[1].Key"},
		{"nats wildcard", outbox.Event{Type: "a.>", Body: []byte("x")}, "events[1].Type"},
		// Each header below is one an adapter refused at publish time; the
		// relay used to take that refusal for an outage (issue 7, item 1).
		{"header name too long", outbox.Event{Type: "a.b", Body: []byte("x"), Headers: map[string]string{strings.Repeat("h", 129): "1"}}, "at most 128"},
		{"header name with colon", outbox.Event{Type: "a.b", Body: []byte("x"), Headers: map[string]string{"a:b": "1"}}, "printable ASCII"},
		{"header name with space", outbox.Event{Type: "a.b", Body: []byte("x"), Headers: map[string]string{"a b": "1"}}, "printable ASCII"},
		{"header name not ASCII", outbox.Event{Type: "a.b", Body: []byte("x"), Headers: map[string]string{"é": "1"}}, "printable ASCII"},
		{"header name reserved by nats", outbox.Event{Type: "a.b", Body: []byte("x"), Headers: map[string]string{"Nats-Msg-Id": "1"}}, "reserved"},
		{"header name reserved by ferry", outbox.Event{Type: "a.b", Body: []byte("x"), Headers: map[string]string{"Ferry-Key": "1"}}, "reserved"},
		{"header value with CRLF", outbox.Event{Type: "a.b", Body: []byte("x"), Headers: map[string]string{"h": "a\r\nb"}}, "CR or LF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			ids, err := outbox.Enqueue(ctx, tx, ok, tc.event)
			require.Error(t, err)
			require.True(t, errors.Is(err, outbox.ErrInvalidEvent), "%v", err)
			require.Contains(t, err.Error(), tc.want)
			require.True(t, strings.HasPrefix(err.Error(), "outbox: "), err.Error())
			require.Nil(t, ids)
			// Nothing inserted, and the transaction is still usable.
			var n int
			require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n))
			require.Zero(t, n)
		})
	}
	require.ErrorIs(t, ok.Validate(), nil)
	_, err := outbox.Enqueue(ctx, nil, ok)
	require.Error(t, err)
}
