package app_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/worker"
)

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The review's double send: a server answering the end of the data after
// longer than SMTPTimeout (but within SMTPDataTimeout, as RFC 5321 allows)
// must get its mail once, and the notification be sent. Before the split
// the command timeout expired while the server decided, the handler
// reported a failure and every retry sent the mail again.
func TestHandleNotificationSlowDataReplyWithinDataTimeout(t *testing.T) {
	t.Parallel()
	srv := newSlowDataSMTP(t, 1500*time.Millisecond)
	b := setup(t, app.Config{SMTPAddr: srv.addr, SMTPTimeout: 300 * time.Millisecond, SMTPDataTimeout: 20 * time.Second})
	id := b.create(t, valid())
	msg := b.outboxMessage(t, id)
	ctx := context.Background()
	require.NoError(t, b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(ctx, tx, msg) }))
	n, err := b.app.Status(ctx, id)
	require.NoError(t, err)
	require.Equal(t, app.StatusSent, n.Status)
	require.Equal(t, 1, n.Attempts)
	// A redelivery sends nothing more.
	require.NoError(t, b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(ctx, tx, msg) }))
	require.EqualValues(t, 1, srv.mails.Load(), "the mail was sent once")
}

// A reply slower than SMTPDataTimeout leaves the outcome unknown: the
// error wraps ErrDeliveryUnknown, stays retryable (at least once), says
// the server may have the mail and never that it was not accepted, and
// the WARN log says the same.
func TestHandleNotificationDataReplyTimeoutIsAmbiguous(t *testing.T) {
	t.Parallel()
	srv := newSlowDataSMTP(t, 10*time.Second)
	var logs syncBuffer
	b := setup(t, app.Config{SMTPAddr: srv.addr, SMTPTimeout: 5 * time.Second, SMTPDataTimeout: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	id := b.create(t, valid())
	msg := b.outboxMessage(t, id)
	ctx := context.Background()
	start := time.Now()
	err := b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(ctx, tx, msg) })
	require.Error(t, err)
	require.Less(t, time.Since(start), 5*time.Second, "SMTPDataTimeout, not SMTPTimeout, bounds the wait: %v", err)
	require.ErrorIs(t, err, app.ErrDeliveryUnknown)
	require.False(t, worker.IsPermanent(err), "retryable: %v", err)
	require.Contains(t, err.Error(), "may have accepted the mail")
	require.NotContains(t, err.Error(), "not accepted")
	require.EqualValues(t, 1, srv.mails.Load())
	out := logs.String()
	require.Contains(t, out, "level=WARN")
	require.Contains(t, out, "may have accepted the mail")
	require.NotContains(t, out, "not accepted")
	n, err := b.app.Status(ctx, id)
	require.NoError(t, err)
	require.Equal(t, app.StatusPending, n.Status, "the mark is rolled back with the failed attempt")
}

// Review item B: a worker shutting down while the server decides waits
// for the reply up to SMTPDataTimeout; when it does not come the error
// says the server may have the mail (and that ctx is done), never "not
// accepted".
func TestHandleNotificationShutdownDuringDataReplyIsAmbiguous(t *testing.T) {
	t.Parallel()
	srv := newSlowDataSMTP(t, 10*time.Second)
	var logs syncBuffer
	b := setup(t, app.Config{SMTPAddr: srv.addr, SMTPTimeout: 5 * time.Second, SMTPDataTimeout: 700 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	id := b.create(t, valid())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := b.handle(ctx, id, t)
	awaitServer(t, srv.data, done, "the mail never reached the server")
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the handler did not return after SMTPDataTimeout")
	}
	require.Error(t, err)
	require.ErrorIs(t, err, app.ErrDeliveryUnknown)
	require.True(t, errors.Is(err, context.Canceled), "the error says ctx is done: %v", err)
	require.NotContains(t, err.Error(), "not accepted")
	require.NotContains(t, logs.String(), "not accepted")
	require.Contains(t, logs.String(), "may have accepted the mail")
}
