package app_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
)

// TestEventSizeBound: the largest event the service can enqueue (a
// user_id at its limit made of characters JSON escapes six bytes wide, a
// traceparent) stays within MaxEventBytes, the figure the CLI checks
// against the broker's Capabilities.MaxMessageBytes, even with the
// relay's and tracing's headers added.
func TestEventSizeBound(t *testing.T) {
	b := setup(t, app.Config{})
	userID := strings.Repeat("<", app.MaxUserIDBytes)
	r := b.post(t, with("user_id", userID), map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	})
	require.Equal(t, http.StatusCreated, r.status, string(r.raw))

	var (
		id, typ, key string
		payload      []byte
		headers      map[string]string
	)
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT id::text, event_type, partition_key, payload, headers FROM outbox`).Scan(&id, &typ, &key, &payload, &headers))
	require.Equal(t, userID, key)
	msg := broker.Message{ID: id, Type: typ, Key: key, Body: payload, Headers: headers}
	// What the relay and the tracing wrapper add on the way out.
	msg.Headers[broker.HeaderCreatedAt] = "2026-11-30T14:00:00.123456789Z"
	msg.Headers[broker.HeaderTraceparent] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	require.Less(t, msg.Size(), app.MaxEventBytes, "event of %d bytes", msg.Size())
}
