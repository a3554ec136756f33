package ferry_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/worker"
)

// trace is middleware that records its name on the way in and out.
func trace(name string, log *[]string) ferry.Middleware {
	return func(next worker.Handler) worker.Handler {
		return func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
			*log = append(*log, name+">")
			err := next(ctx, tx, msg)
			*log = append(*log, "<"+name)
			return err
		}
	}
}

func TestMuxUseFirstIsOutermost(t *testing.T) {
	t.Parallel()
	var log []string
	mux := ferry.NewMux()
	mux.Use(trace("a", &log), trace("b", &log))
	require.NoError(t, mux.Handle("x", func(context.Context, pgx.Tx, *broker.Message) error {
		log = append(log, "handler")
		return nil
	}))
	mux.Use(trace("c", &log), nil) // after Handle: wraps it all the same
	require.NoError(t, mux.HandleMessage(context.Background(), nil, &broker.Message{ID: "1", Type: "x"}))
	require.Equal(t, []string{"a>", "b>", "c>", "handler", "<c", "<b", "<a"}, log)

	// The middleware sees a type no pattern matches too.
	log = nil
	err := mux.HandleMessage(context.Background(), nil, &broker.Message{ID: "2", Type: "y"})
	require.ErrorIs(t, err, ferry.ErrNoHandler)
	require.Equal(t, []string{"a>", "b>", "c>", "<c", "<b", "<a"}, log)
}

func TestRecoverTurnsPanicIntoFailedAttempt(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	mux := ferry.NewMux()
	mux.Use(ferry.Recover(logger))
	require.NoError(t, mux.Handle("x", func(context.Context, pgx.Tx, *broker.Message) error {
		var m map[string]int
		m["boom"] = 1 // nil map write
		return nil
	}))
	err := mux.HandleMessage(context.Background(), nil, &broker.Message{ID: "9", Type: "x", Attempt: 2})
	require.ErrorIs(t, err, worker.ErrPanic)
	require.False(t, worker.IsPermanent(err), "retried under the policy like any error")
	require.Contains(t, err.Error(), "assignment to entry in nil map")
	require.NotContains(t, err.Error(), "goroutine", "the stack goes to the log, not into the DLQ reason")
	out := buf.String()
	require.Contains(t, out, `"msg":"ferry: handler panicked"`)
	require.Contains(t, out, `"message_id":"9"`)
	require.Contains(t, out, `"attempt":2`)
	require.Contains(t, out, "middleware_test.go", "the stack names the panicking line")
}

func TestTimeoutMiddlewareBoundsTheAttempt(t *testing.T) {
	t.Parallel()
	mux := ferry.NewMux()
	mux.Use(ferry.Timeout(50 * time.Millisecond))
	require.NoError(t, mux.Handle("slow", func(ctx context.Context, _ pgx.Tx, _ *broker.Message) error {
		<-ctx.Done()
		return ctx.Err()
	}))
	require.NoError(t, mux.Handle("fast", func(ctx context.Context, _ pgx.Tx, _ *broker.Message) error {
		_, ok := ctx.Deadline()
		require.True(t, ok, "the handler's ctx has the deadline")
		return nil
	}))
	begin := time.Now()
	err := mux.HandleMessage(context.Background(), nil, &broker.Message{ID: "1", Type: "slow"})
	t.Logf("the slow handler returned %v after the call", time.Since(begin))
	require.ErrorIs(t, err, worker.ErrHandlerTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "after 50ms")
	require.NoError(t, mux.HandleMessage(context.Background(), nil, &broker.Message{ID: "2", Type: "fast"}))

	// d <= 0: no bound.
	none := ferry.Timeout(0)(func(ctx context.Context, _ pgx.Tx, _ *broker.Message) error {
		_, ok := ctx.Deadline()
		require.False(t, ok)
		return nil
	})
	require.NoError(t, none(context.Background(), nil, &broker.Message{ID: "3"}))
}

func TestLoggingLogsEachAttempt(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	mux := ferry.NewMux()
	mux.Use(ferry.Logging(logger))
	require.NoError(t, mux.Handle("x", func(_ context.Context, _ pgx.Tx, msg *broker.Message) error {
		if msg.Attempt == 1 {
			return errors.New("smtp: 451 try later")
		}
		return nil
	}))
	msg := &broker.Message{ID: "5", Type: "x", Key: "k1", Attempt: 1, Headers: map[string]string{broker.HeaderAppID: "order-5"}}
	require.Error(t, mux.HandleMessage(context.Background(), nil, msg))
	msg.Attempt = 2
	require.NoError(t, mux.HandleMessage(context.Background(), nil, msg))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2)
	for _, want := range []string{`"level":"WARN"`, `"msg":"ferry: handler failed"`, `"err":"smtp: 451 try later"`, `"message_id":"5"`, `"type":"x"`, `"attempt":1`, `"key":"k1"`, `"app_id":"order-5"`, `"duration":`} {
		require.Contains(t, lines[0], want)
	}
	for _, want := range []string{`"level":"INFO"`, `"msg":"ferry: handled"`, `"attempt":2`} {
		require.Contains(t, lines[1], want)
	}
}

func TestHandleOptions(t *testing.T) {
	t.Parallel()
	h := func(context.Context, pgx.Tx, *broker.Message) error { return nil }
	mux := ferry.NewMux()
	for _, opt := range []ferry.HandleOption{
		ferry.WithMaxAttempts(0), ferry.WithMaxAttempts(-3), ferry.WithRetryDelays(),
		ferry.WithRetryDelays(time.Second, 0), ferry.WithTimeout(0), ferry.WithTimeout(-time.Second),
	} {
		err := mux.Handle("bad", h, opt)
		require.ErrorIs(t, err, ferry.ErrInvalidConfig)
		require.Contains(t, err.Error(), `pattern "bad"`)
	}
	require.Empty(t, mux.Patterns(), "a refused registration registers nothing")

	require.NoError(t, mux.Handle("mail.*", h, ferry.WithMaxAttempts(8), ferry.WithRetryDelays(time.Second, time.Minute), ferry.WithTimeout(10*time.Second)))
	require.NoError(t, ferry.Handle(mux, "report.#", func(context.Context, pgx.Tx, *ferry.Job[struct{}]) error { return nil }, ferry.WithTimeout(time.Minute)))
	require.NoError(t, mux.Handle("audit", h))
	r, ok := mux.Route("mail.sent")
	require.True(t, ok)
	require.Equal(t, worker.Route{Pattern: "mail.*", Options: worker.TypeOptions{MaxAttempts: 8, RetryDelays: []time.Duration{time.Second, time.Minute}, Timeout: 10 * time.Second}}, r)
	_, ok = mux.Route("invoice.sent")
	require.False(t, ok)
	require.Equal(t, []worker.Route{
		{Pattern: "mail.*", Options: worker.TypeOptions{MaxAttempts: 8, RetryDelays: []time.Duration{time.Second, time.Minute}, Timeout: 10 * time.Second}},
		{Pattern: "report.#", Options: worker.TypeOptions{Timeout: time.Minute}},
		{Pattern: "audit"},
	}, mux.Routes())

	// Options no worker applies are never ignored silently: called as a
	// plain Handler (not as the worker's Router), the handler does not
	// run and the attempt fails saying why.
	err := mux.HandleMessage(context.Background(), nil, &broker.Message{ID: "1", Type: "mail.sent"})
	require.ErrorIs(t, err, ferry.ErrInvalidConfig)
	require.Contains(t, err.Error(), "worker.Config.Router")
	require.Contains(t, err.Error(), "WithMaxAttempts(8)")
	require.NoError(t, mux.HandleMessage(context.Background(), nil, &broker.Message{ID: "2", Type: "audit"}), "a type without options runs as before")
}
