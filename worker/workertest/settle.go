package workertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/worker"
)

// SettleFailures records worker.Config.OnSettleFailure calls; its Hook
// fits that field. Adapter tests use it with LogRecorder to check what a
// settlement the broker refused leaves behind.
type SettleFailures struct {
	mu   sync.Mutex
	list []broker.SettleFailure
}

// Hook records f.
func (s *SettleFailures) Hook(f broker.SettleFailure) {
	s.mu.Lock()
	s.list = append(s.list, f)
	s.mu.Unlock()
}

// Snapshot returns the failures recorded so far, in order; with op set,
// only those of op.
func (s *SettleFailures) Snapshot(op broker.SettleOp) []broker.SettleFailure {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []broker.SettleFailure
	for _, f := range s.list {
		if op == "" || f.Op == op {
			out = append(out, f)
		}
	}
	return out
}

// LogRecorder is a slog.Handler that keeps every record as one line of
// text ("message key=value ..."), for assertions on what the worker logs.
type LogRecorder struct {
	mu    *sync.Mutex
	lines *[]string
	attrs []slog.Attr
}

// NewLogRecorder returns an empty LogRecorder.
func NewLogRecorder() LogRecorder { return LogRecorder{mu: &sync.Mutex{}, lines: new([]string)} }

// Enabled implements slog.Handler: every level.
func (h LogRecorder) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (h LogRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	for _, a := range h.attrs {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	h.mu.Lock()
	*h.lines = append(*h.lines, b.String())
	h.mu.Unlock()
	return nil
}

// WithAttrs implements slog.Handler.
func (h LogRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	h.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return h
}

// WithGroup implements slog.Handler (groups are flattened).
func (h LogRecorder) WithGroup(string) slog.Handler { return h }

// Lines returns the recorded lines that contain every one of substrs.
func (h LogRecorder) Lines(substrs ...string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
next:
	for _, l := range *h.lines {
		for _, s := range substrs {
			if !strings.Contains(l, s) {
				continue next
			}
		}
		out = append(out, l)
	}
	return out
}

// testSettleFailuresCounted: settlements the broker does not take, for
// real: the handler closes the worker's broker connection before it
// returns, so the Retry (round 1, the handler failed) and then the Ack
// (round 2, the handler succeeded and committed) reach a closed broker.
// Each is reported once to OnSettleFailure with its op and a bounded
// reason ("closed"), logged once with the broker's error and what happens
// next, and counted as outcome "unsettled", never as "retry" or "ack".
// Round 3, on a new connection, acks the redelivery as a duplicate.
func testSettleFailuresCounted(t *testing.T, s suite) {
	f := setup(t, s, 1)
	out := newOutcomes()
	fails := &SettleFailures{}
	logs := NewLogRecorder()
	var closeIn atomic.Pointer[broker.Broker]
	var calls atomic.Int32
	handler := func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		n := calls.Add(1)
		if err := recordSideEffect(ctx, tx, "settle", msg); err != nil {
			return err
		}
		if b := closeIn.Swap(nil); b != nil {
			require.NoError(t, (*b).Close())
		}
		if n == 1 {
			return errors.New("smtp: 451 try later")
		}
		return nil
	}
	f.publish(t, f.msg("91"))

	for round := 1; round <= 3; round++ {
		b := s.newBroker(t)
		if round < 3 {
			closeIn.Store(&b)
		}
		cfg := f.config("settle", f.queue, handler)
		cfg.Broker = b
		cfg.OnOutcome = out.hook
		cfg.OnSettleFailure = fails.Hook
		cfg.Logger = slog.New(logs)
		cfg.AckDeadline = 2 * time.Second
		w, err := worker.New(cfg)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		before := len(out.snapshot())
		deadline := time.Now().Add(waitTimeout)
		for len(out.snapshot()) == before {
			require.True(t, time.Now().Before(deadline), "workertest: round %d: no outcome in %v; outcomes %+v", round, waitTimeout, out.snapshot())
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
		select {
		case err := <-done:
			if round < 3 {
				require.True(t, err == nil || errors.Is(err, broker.ErrClosed), "Run: %v", err)
			} else {
				require.NoError(t, err)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("workertest: round %d: Run did not return", round)
		}
		require.NoError(t, b.Close())
	}

	var got []worker.Outcome
	for _, r := range out.snapshot() {
		got = append(got, r.outcome)
	}
	require.Equal(t, []worker.Outcome{worker.OutcomeUnsettled, worker.OutcomeUnsettled, worker.OutcomeDuplicate}, got,
		"a Retry or Ack the broker did not take is unsettled, never retry or ack")
	require.Equal(t, int32(2), calls.Load(), "the redelivery after the lost Ack does not run the handler")

	retries, acks := fails.Snapshot(broker.SettleRetry), fails.Snapshot(broker.SettleAck)
	require.Len(t, retries, 1, "the failed Retry is reported once: %+v", fails.Snapshot(""))
	require.Len(t, acks, 1, "the failed Ack is reported once: %+v", fails.Snapshot(""))
	for _, sf := range append(retries, acks...) {
		require.Equal(t, "91", sf.MessageID)
		require.Equal(t, broker.ReasonClosed, sf.Reason, "%v", sf.Err)
		require.ErrorIs(t, sf.Err, broker.ErrClosed)
		require.False(t, sf.Recovered)
		require.NotEmpty(t, sf.Next)
	}
	for _, sf := range fails.Snapshot(broker.SettleExtend) {
		require.Equal(t, broker.ReasonClosed, sf.Reason, "an Extend on the closed broker: %v", sf.Err)
	}
	require.Len(t, logs.Lines("worker: retry failed", "message_id=91", "reason=closed", "next=the broker will redeliver it"), 1)
	ackLines := logs.Lines("worker: ack failed", "message_id=91", "reason=closed", "next=the broker will redeliver it and the worker will ack the redelivery as a duplicate")
	require.Len(t, ackLines, 1, "one log line for the failed Ack")
	t.Logf("logged: %s", ackLines[0])
}
