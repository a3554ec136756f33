package sqs_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/sqs"
	"github.com/ferrymq/ferry/internal/testenv"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func topology(prefix string, bindings ...string) broker.Topology {
	base := testenv.UniqueName(prefix)
	return broker.Topology{Exchange: base + "-ex", Queues: []broker.Queue{{Name: base + "-work", Bindings: bindings,
		RetryDelays: []time.Duration{time.Second}}}}
}

// declaredRaw connects a broker with cfg, declares tp and deletes its
// queues when the test ends.
func declaredRaw(t *testing.T, cfg sqs.Config, tp broker.Topology) *sqs.Broker {
	t.Helper()
	cb := newBrokerCfg(t, cfg).(*cleaningBroker)
	require.NoError(t, cb.Declare(ctxFor(t, 30*time.Second), tp))
	return cb.Broker.(*sqs.Broker)
}

func subscribe(t *testing.T, b broker.Broker, queue string, opts broker.SubscribeOptions) broker.Subscription {
	t.Helper()
	sub, err := b.Subscribe(ctxFor(t, 10*time.Second), queue, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// drain receives and acks until nothing arrives for quiet, returning the
// messages by ID with how often each came.
func drain(t *testing.T, sub broker.Subscription, quiet time.Duration) map[string]int {
	t.Helper()
	got := map[string]int{}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), quiet)
		d, err := sub.Receive(ctx)
		cancel()
		if err != nil {
			require.ErrorIs(t, err, context.DeadlineExceeded)
			return got
		}
		got[d.Message().ID]++
		require.NoError(t, d.Ack(ctxFor(t, 10*time.Second)))
	}
}

// TestBatchSplitBySize: 10 messages, each under the queue's size limit,
// whose sum is over it, are all sent, in more than one SendMessageBatch.
func TestBatchSplitBySize(t *testing.T) {
	tp := topology("split", "evt.split")
	b := declaredRaw(t, config(), tp)
	max := b.Capabilities().MaxMessageBytes
	require.Positive(t, max, "MaxMessageBytes known after Declare")
	var msgs []*broker.Message
	for i := 0; i < 10; i++ {
		msgs = append(msgs, &broker.Message{ID: fmt.Sprint("s", i), Type: "evt.split", Body: []byte(strings.Repeat("a", max/3))})
	}
	before := sqs.SendCalls(b)
	require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), msgs))
	calls := sqs.SendCalls(b) - before
	require.GreaterOrEqual(t, calls, int64(4), "10 messages of a third of the limit need at least 4 calls (3 per call)")
	got := drain(t, subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{}), 3*time.Second)
	require.Len(t, got, 10)
	for id, n := range got {
		require.Equal(t, 1, n, "message %s", id)
	}
}

// TestTooLargeBeforeAnyCall: a message over the limit fails with
// ErrMessageTooLarge and no call is made for it; the others are sent.
func TestTooLargeBeforeAnyCall(t *testing.T) {
	tp := topology("big", "evt.big")
	b := declaredRaw(t, config(), tp)
	max := b.Capabilities().MaxMessageBytes
	big := &broker.Message{ID: "big", Type: "evt.big", Body: []byte(strings.Repeat("b", max+1))}
	before := sqs.SendCalls(b)
	err := b.Publish(ctxFor(t, 30*time.Second), []*broker.Message{big})
	require.ErrorIs(t, err, broker.ErrMessageTooLarge)
	var pe *broker.PublishError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 0, pe.Failed[0].Index)
	require.Contains(t, err.Error(), "big")
	require.Equal(t, before, sqs.SendCalls(b), "no call for a message known to be too large")

	// A binary body under MaxMessageBytes whose base64 is over the queue's
	// limit is refused the same way, before any call.
	bin := &broker.Message{ID: "bin", Type: "evt.big", Body: append([]byte{0xff}, make([]byte, max-10)...)}
	err = b.Publish(ctxFor(t, 30*time.Second), []*broker.Message{bin, {ID: "ok", Type: "evt.big", Body: []byte("{}")}})
	require.ErrorIs(t, err, broker.ErrMessageTooLarge)
	require.Len(t, broker.FailedIndexes(err, 2), 1)
	got := drain(t, subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{}), 3*time.Second)
	require.Equal(t, map[string]int{"ok": 1}, got)
}

// TestManyHeaders: 15 application headers (SQS allows 10 message
// attributes) are sent and come back intact.
func TestManyHeaders(t *testing.T) {
	tp := topology("hdr", "evt.hdr")
	b := declaredRaw(t, config(), tp)
	h := map[string]string{}
	for i := 0; i < 15; i++ {
		h[fmt.Sprint("h", i)] = fmt.Sprint("value ", i, " ✓")
	}
	h[broker.HeaderTraceparent] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), []*broker.Message{{ID: "h1", Type: "evt.hdr", Key: "k", Body: []byte("x"), Headers: h}}))
	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{})
	rctx := ctxFor(t, 15*time.Second)
	d, err := sub.Receive(rctx)
	require.NoError(t, err)
	require.Equal(t, h, d.Message().Headers)
	require.NoError(t, d.Ack(rctx))
}

// TestEntryRefused: one entry of a batch of 10 has a character SQS
// refuses; only it fails, with SQS's reason, and the other nine are
// stored once (not sent again).
func TestEntryRefused(t *testing.T) {
	tp := topology("refuse", "evt.refuse")
	b := declaredRaw(t, config(), tp)
	var msgs []*broker.Message
	for i := 0; i < 10; i++ {
		msgs = append(msgs, &broker.Message{ID: fmt.Sprint("r", i), Type: "evt.refuse", Body: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	msgs[4].Body = []byte("bad \x01 char") // valid UTF-8, outside SQS's allowed characters
	before := sqs.SendCalls(b)
	err := b.Publish(ctxFor(t, 30*time.Second), msgs)
	var pe *broker.PublishError
	require.ErrorAs(t, err, &pe, "a per-message refusal is a *PublishError: %v", err)
	require.Len(t, pe.Failed, 1)
	require.Equal(t, 4, pe.Failed[0].Index)
	require.Equal(t, "r4", pe.Failed[0].ID)
	require.ErrorIs(t, pe.Failed[0].Err, broker.ErrInvalidMessage, "SQS says it is the sender's fault: the message's own")
	require.Contains(t, pe.Failed[0].Err.Error(), "r4", "the error names the message")
	t.Logf("SQS's reason: %v", pe.Failed[0].Err)
	require.Equal(t, int64(1), sqs.SendCalls(b)-before, "one call, nothing resent")
	got := drain(t, subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{}), 3*time.Second)
	require.Len(t, got, 9)
	for id, n := range got {
		require.NotEqual(t, "r4", id)
		require.Equal(t, 1, n, "message %s stored once", id)
	}
}

// logCapture counts the log records at Warn and above.
type logCapture struct {
	mu   sync.Mutex
	recs []string
}

func (l *logCapture) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Message)
	return nil
}
func (l *logCapture) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCapture) WithGroup(string) slog.Handler      { return l }

// TestLongPollIdle: an empty queue long-polled (20 s waits) for 25 s, a
// whole wait that returns empty and a second one begun, logs no error,
// and a message sent in the middle of that second wait arrives within a
// second.
func TestLongPollIdle(t *testing.T) {
	logs := &logCapture{}
	cfg := config()
	cfg.WaitTime = 20 * time.Second
	cfg.Logger = slog.New(logs)
	tp := topology("idle", "evt.idle")
	b := declaredRaw(t, cfg, tp)
	pub := declaredRaw(t, config(), tp)
	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	_, err := sub.Receive(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// The first 20 s wait returned empty; the next is 5 s into its wait.
	sent := time.Now()
	require.NoError(t, pub.Publish(ctxFor(t, 10*time.Second), []*broker.Message{{ID: "late", Type: "evt.idle", Body: []byte("{}")}}))
	d, err := sub.Receive(ctxFor(t, 5*time.Second))
	require.NoError(t, err)
	took := time.Since(sent)
	require.Equal(t, "late", d.Message().ID)
	require.Less(t, took, time.Second, "a long poll returns as soon as a message arrives")
	require.NoError(t, d.Ack(ctxFor(t, 10*time.Second)))
	logs.mu.Lock()
	defer logs.mu.Unlock()
	require.Empty(t, logs.recs, "no warning or error while idle")
}

// TestFIFOOrderPerKey: 1,000 events over 50 keys on FIFO queues are
// handled in publish order per key by four concurrent receivers of an
// Ordered subscription.
func TestFIFOOrderPerKey(t *testing.T) {
	cfg := config()
	cfg.FIFO = true
	tp := topology("fifo", "evt.fifo")
	b := declaredRaw(t, cfg, tp)
	require.Equal(t, broker.OrderingKey, b.Capabilities().Ordering)
	const n, keys = 1000, 50
	var msgs []*broker.Message
	for i := 0; i < n; i++ {
		msgs = append(msgs, &broker.Message{ID: fmt.Sprintf("%04d", i), Type: "evt.fifo", Key: fmt.Sprint("user-", i%keys), Body: []byte("{}")})
	}
	for i := 0; i < n; i += 100 {
		require.NoError(t, b.Publish(ctxFor(t, 60*time.Second), msgs[i:i+100]))
	}
	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 40, Ordered: true})
	var mu sync.Mutex
	perKey := map[string][]string{}
	seen := map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				done := len(seen) == n
				mu.Unlock()
				if done || ctx.Err() != nil {
					return
				}
				rctx, rcancel := context.WithTimeout(ctx, time.Second)
				d, err := sub.Receive(rctx)
				rcancel()
				if err != nil {
					continue
				}
				m := d.Message()
				mu.Lock()
				if !seen[m.ID] {
					seen[m.ID] = true
					perKey[m.Key] = append(perKey[m.Key], m.ID)
				}
				mu.Unlock()
				time.Sleep(time.Millisecond) // a handler
				if err := d.Ack(ctx); err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("ack %s: %v", m.ID, err)
				}
			}
		}()
	}
	wg.Wait()
	require.Len(t, seen, n, "every event handled")
	require.Len(t, perKey, keys)
	for k, ids := range perKey {
		for i := 1; i < len(ids); i++ {
			require.Less(t, ids[i-1], ids[i], "key %s handled out of order: %v", k, ids)
		}
	}
}

// TestOrderedNeedsFIFO: an Ordered subscription on standard queues is
// refused as unsupported.
func TestOrderedNeedsFIFO(t *testing.T) {
	tp := topology("ord", "evt.ord")
	b := declaredRaw(t, config(), tp)
	_, err := b.Subscribe(ctxFor(t, 10*time.Second), tp.Queues[0].Name, broker.SubscribeOptions{Ordered: true})
	require.ErrorIs(t, err, broker.ErrUnsupported)
}

// TestDeclareMismatch: a queue that exists with another RedrivePolicy
// (another maxReceiveCount) is broker.ErrTopologyMismatch.
func TestDeclareMismatch(t *testing.T) {
	tp := topology("mis", "evt.mis")
	declaredRaw(t, config(), tp)
	cfg := config()
	cfg.MaxReceiveCount = 7
	other, err := sqs.New(ctxFor(t, 10*time.Second), cfg)
	require.NoError(t, err)
	defer other.Close()
	err = other.Declare(ctxFor(t, 30*time.Second), tp)
	require.ErrorIs(t, err, broker.ErrTopologyMismatch)
	t.Logf("mismatch: %v", err)
}

// TestQueueDeletedUnderRunningProcess: the queues are deleted under a
// running publisher and consumer; the next publish and receive declare
// them again and both go on.
func TestQueueDeletedUnderRunningProcess(t *testing.T) {
	tp := topology("gone", "evt.gone")
	b := declaredRaw(t, config(), tp)
	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{})
	require.NoError(t, b.Publish(ctxFor(t, 10*time.Second), []*broker.Message{{ID: "before", Type: "evt.gone", Body: []byte("{}")}}))
	require.Equal(t, map[string]int{"before": 1}, drain(t, sub, 3*time.Second))

	deleteTopology(ctxFor(t, 20*time.Second), t, tp, false)
	require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), []*broker.Message{{ID: "after", Type: "evt.gone", Body: []byte("{}")}}),
		"Publish declares the deleted queue again")
	start := time.Now()
	d, err := sub.Receive(ctxFor(t, 30*time.Second))
	require.NoError(t, err, "the subscription recovers")
	t.Logf("received %v after the publish", time.Since(start))
	require.Equal(t, "after", d.Message().ID)
	require.NoError(t, d.DeadLetter(ctxFor(t, 10*time.Second), "dead after the re-declare"))
	dlq, err := b.DLQ(tp.Queues[0].Name)
	require.NoError(t, err)
	list, err := dlq.List(ctxFor(t, 10*time.Second), 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
}
