package nats_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/broker/brokertest"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker/workertest"
)

func connect(ctx context.Context, tb testing.TB) (broker.Broker, error) {
	tb.Helper()
	testenv.RequireTCP(tb, "nats", testenv.HostPort(testenv.NATSURL()))
	return nats.New(ctx, nats.Config{URL: testenv.NATSURL()})
}

// newBroker connects a broker, closed when the test ends, whose declared
// streams are deleted when the test ends.
func newBroker(tb testing.TB) broker.Broker {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := connect(ctx, tb)
	require.NoError(tb, err)
	cb := &cleaningBroker{Broker: b}
	tb.Cleanup(func() { cb.deleteAll(tb) })
	tb.Cleanup(func() { _ = b.Close() })
	return cb
}

// cleaningBroker remembers the exchanges declared through it.
type cleaningBroker struct {
	broker.Broker
	mu   sync.Mutex
	tops []broker.Topology
}

func (c *cleaningBroker) Declare(ctx context.Context, t broker.Topology) error {
	c.mu.Lock()
	c.tops = append(c.tops, t)
	c.mu.Unlock()
	return c.Broker.Declare(ctx, t)
}

func (c *cleaningBroker) deleteAll(tb testing.TB) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, t := range c.tops {
		deleteTopology(ctx, tb, t)
	}
}

// deleteTopology deletes the streams (and so the consumers) of t's
// exchange.
func deleteTopology(ctx context.Context, tb testing.TB, t broker.Topology) {
	nc, err := natsgo.Connect(testenv.NATSURL())
	if err != nil {
		tb.Logf("delete topology %s: %v", t.Exchange, err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Logf("delete topology %s: %v", t.Exchange, err)
		return
	}
	stream := nats.StreamName(t.Exchange)
	for _, s := range []string{stream, stream + "-dlq"} {
		if err := js.DeleteStream(ctx, s); err != nil && !errorsIsNotFound(err) {
			tb.Logf("delete stream %s: %v", s, err)
		}
	}
}

func errorsIsNotFound(err error) bool {
	return err != nil && (err == jetstream.ErrStreamNotFound || err.Error() == jetstream.ErrStreamNotFound.Error())
}

func TestConformance(t *testing.T) {
	brokertest.RunConformance(t, brokertest.Harness{
		New: func(ctx context.Context, t *testing.T) (broker.Broker, error) {
			return connect(ctx, t)
		},
		StopServer:  func(t *testing.T) { testenv.Services(t, "stop", "nats") },
		StartServer: func(t *testing.T) { testenv.Services(t, "start", "nats") },
		DeleteTopology: func(ctx context.Context, t *testing.T, topo broker.Topology) {
			deleteTopology(ctx, t, topo)
		},
		RemoveTopology: removeTopology,
	})
}

func TestWorkerSuite(t *testing.T) {
	workertest.RunWorkerSuite(t, newBroker)
}

// TestBatchKill kills a worker process (SIGKILL) right after a batch's
// commit and in the middle of a batch; see workertest.RunBatchKillSuite.
func TestBatchKill(t *testing.T) {
	workertest.RunBatchKillSuite(t, newBroker)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func topology(prefix string, bindings ...string) broker.Topology {
	base := testenv.UniqueName(prefix)
	return broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{Name: base + ".work", Bindings: bindings}}}
}

func declared(t *testing.T, tp broker.Topology) broker.Broker {
	b := newBroker(t)
	require.NoError(t, b.Declare(ctxFor(t, 30*time.Second), tp))
	return b
}

func receive(t *testing.T, sub broker.Subscription, d time.Duration) broker.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	dl, err := sub.Receive(ctx)
	require.NoError(t, err)
	return dl
}

func receiveNone(t *testing.T, sub broker.Subscription, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	dl, err := sub.Receive(ctx)
	if err == nil {
		t.Fatalf("expected nothing within %v, got %s attempt %d", d, dl.Message().ID, dl.Message().Attempt)
	}
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestRetrySpacing: a retry with delay d never comes back sooner than d,
// and a zero delay is not an immediate Nak (attempts are not burned in
// milliseconds).
func TestRetrySpacing(t *testing.T) {
	t.Parallel()
	tp := topology("nats-spacing", "evt.spacing")
	b := declared(t, tp)
	sub, err := b.Subscribe(ctxFor(t, 10*time.Second), tp.Queues[0].Name, broker.SubscribeOptions{AckDeadline: 5 * time.Second})
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, b.Publish(ctxFor(t, 10*time.Second), []*broker.Message{{ID: "s1", Type: "evt.spacing", Body: []byte("x")}}))

	d := receive(t, sub, 10*time.Second)
	for i, delay := range []time.Duration{300 * time.Millisecond, 600 * time.Millisecond, 0, 0} {
		at := time.Now()
		require.NoError(t, d.Retry(ctxFor(t, 5*time.Second), delay, fmt.Sprintf("fail %d", i)))
		d = receive(t, sub, 10*time.Second)
		took := time.Since(at)
		min := max(delay, 100*time.Millisecond) // Config.MinRetryDelay default
		require.GreaterOrEqual(t, took, min-10*time.Millisecond, "retry %d with delay %v came back after %v", i, delay, took)
		require.Equal(t, i+2, d.Message().Attempt)
		require.Equal(t, fmt.Sprintf("fail %d", i), d.Message().Headers[broker.HeaderLastError])
	}
	require.NoError(t, d.Ack(ctxFor(t, 5*time.Second)))
	receiveNone(t, sub, 500*time.Millisecond)
}

// TestSlowHandlerTwoSubscriptions: two subscribers (two brokers, as two
// worker processes) on one queue, handlers three times slower than the
// AckWait that call Extend: every message is handled exactly once, never
// in parallel.
func TestSlowHandlerTwoSubscriptions(t *testing.T) {
	t.Parallel()
	tp := topology("nats-slow", "evt.slow")
	b1 := declared(t, tp)
	b2 := declared(t, tp)
	const (
		ackWait = time.Second
		handle  = 3 * time.Second
		n       = 4
	)
	var msgs []*broker.Message
	for i := 0; i < n; i++ {
		msgs = append(msgs, &broker.Message{ID: fmt.Sprint("m", i), Type: "evt.slow", Body: []byte("x")})
	}
	var (
		mu      sync.Mutex
		handled = map[string]int{}
		running = map[string]int{}
		overlap []string
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, b := range []broker.Broker{b1, b2} {
		sub, err := b.Subscribe(ctx, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 2, AckDeadline: ackWait})
		require.NoError(t, err)
		defer sub.Close()
		for w := 0; w < 2; w++ { // two handler goroutines per subscriber
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					d, err := sub.Receive(ctx)
					if err != nil {
						return
					}
					id := d.Message().ID
					mu.Lock()
					handled[id]++
					running[id]++
					if running[id] > 1 {
						overlap = append(overlap, id)
					}
					mu.Unlock()
					end := time.Now().Add(handle)
					for time.Now().Before(end) {
						time.Sleep(ackWait / 4)
						if err := d.Extend(ctx); err != nil {
							t.Errorf("Extend %s: %v", id, err)
						}
					}
					mu.Lock()
					running[id]--
					mu.Unlock()
					if err := d.Ack(ctx); err != nil {
						t.Errorf("Ack %s: %v", id, err)
					}
				}
			}()
		}
	}
	require.NoError(t, b1.Publish(ctx, msgs))
	// 4 messages on 4 handlers: all done after one handling time; wait
	// longer (several AckWaits) so a redelivery would show.
	time.Sleep(handle + 3*ackWait)
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, overlap, "messages handled in parallel")
	require.Len(t, handled, n)
	for id, c := range handled {
		require.Equal(t, 1, c, "message %s handled %d times", id, c)
	}
}

// TestExpiredAckWaitRedelivers is the control for the test above: without
// Extend, a handler slower than the AckWait sees its message redelivered
// (to the other subscriber), counted in Attempt.
func TestExpiredAckWaitRedelivers(t *testing.T) {
	t.Parallel()
	tp := topology("nats-expire", "evt.expire")
	b1 := declared(t, tp)
	b2 := declared(t, tp)
	s1, err := b1.Subscribe(ctxFor(t, 10*time.Second), tp.Queues[0].Name, broker.SubscribeOptions{AckDeadline: time.Second})
	require.NoError(t, err)
	defer s1.Close()
	require.NoError(t, b1.Publish(ctxFor(t, 10*time.Second), []*broker.Message{{ID: "e1", Type: "evt.expire", Body: []byte("x")}}))
	d1 := receive(t, s1, 10*time.Second)
	require.Equal(t, 1, d1.Message().Attempt)
	s2, err := b2.Subscribe(ctxFor(t, 10*time.Second), tp.Queues[0].Name, broker.SubscribeOptions{AckDeadline: time.Second})
	require.NoError(t, err)
	defer s2.Close()
	d2 := receive(t, s2, 10*time.Second)
	require.Equal(t, "e1", d2.Message().ID)
	require.Equal(t, 2, d2.Message().Attempt)
	require.NoError(t, d2.Ack(ctxFor(t, 5*time.Second)))
}

// TestDuplicateWindow: a re-publish of the same message (same ID and
// creation time) within the duplicate window is dropped by the stream; the
// same ID with another creation time (another database) is not.
func TestDuplicateWindow(t *testing.T) {
	t.Parallel()
	tp := topology("nats-dup", "evt.dup")
	b := declared(t, tp)
	sub, err := b.Subscribe(ctxFor(t, 10*time.Second), tp.Queues[0].Name, broker.SubscribeOptions{})
	require.NoError(t, err)
	defer sub.Close()
	created := broker.FormatTime(time.Now())
	m := &broker.Message{ID: "42", Type: "evt.dup", Body: []byte("a"), Headers: map[string]string{broker.HeaderCreatedAt: created}}
	require.NoError(t, b.Publish(ctxFor(t, 10*time.Second), []*broker.Message{m}))
	require.NoError(t, b.Publish(ctxFor(t, 10*time.Second), []*broker.Message{m.Clone()}), "a duplicate is confirmed")
	d := receive(t, sub, 10*time.Second)
	require.Equal(t, "42", d.Message().ID)
	require.NoError(t, d.Ack(ctxFor(t, 5*time.Second)))
	receiveNone(t, sub, 800*time.Millisecond)

	other := m.Clone()
	other.Headers[broker.HeaderCreatedAt] = broker.FormatTime(time.Now().Add(time.Hour))
	require.NoError(t, b.Publish(ctxFor(t, 10*time.Second), []*broker.Message{other}))
	d = receive(t, sub, 10*time.Second)
	require.Equal(t, "42", d.Message().ID)
	require.Equal(t, other.Headers, d.Message().Headers)
	require.NoError(t, d.Ack(ctxFor(t, 5*time.Second)))
}

// TestUnsupportedBindings: '#' before the last word has no NATS subject
// equivalent; Declare says so instead of routing differently.
func TestUnsupportedBindings(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	for _, binding := range []string{"a.#.b", "#.created"} {
		tp := topology("nats-unsup", binding)
		err := b.Declare(ctxFor(t, 10*time.Second), tp)
		require.ErrorIs(t, err, broker.ErrUnsupported, binding)
		require.Contains(t, err.Error(), binding)
	}
}

// TestCapabilities: the server's max_payload bounds MaxMessageBytes.
func TestCapabilities(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	c := b.Capabilities()
	require.Equal(t, "nats", c.Name)
	require.True(t, c.NativeDelay)
	require.True(t, c.CountsRedeliveries)
	require.True(t, c.Wildcards)
	require.Equal(t, broker.OrderingQueue, c.Ordering)
	nc, err := natsgo.Connect(testenv.NATSURL())
	require.NoError(t, err)
	defer nc.Close()
	require.Equal(t, int(nc.MaxPayload())-4096, c.MaxMessageBytes)
}

// TestMessageOfMaxSizeDeadLetters: a message of exactly MaxMessageBytes,
// with a reason of the maximal length, still fits in the DLQ.
func TestMessageOfMaxSizeDeadLetters(t *testing.T) {
	t.Parallel()
	tp := topology("nats-maxdlq", "evt.max")
	b := declared(t, tp)
	m := &broker.Message{ID: "max", Type: "evt.max", Key: "k", Headers: map[string]string{"a": "b", broker.HeaderCreatedAt: broker.FormatTime(time.Now())}}
	m.Body = make([]byte, b.Capabilities().MaxMessageBytes-m.Size())
	require.NoError(t, b.Publish(ctxFor(t, 10*time.Second), []*broker.Message{m}))
	sub, err := b.Subscribe(ctxFor(t, 10*time.Second), tp.Queues[0].Name, broker.SubscribeOptions{})
	require.NoError(t, err)
	defer sub.Close()
	d := receive(t, sub, 10*time.Second)
	require.NoError(t, d.Retry(ctxFor(t, 5*time.Second), 0, "x"))
	d = receive(t, sub, 10*time.Second)
	reason := strings.Repeat("r", broker.MaxReasonBytes)
	require.NoError(t, d.DeadLetter(ctxFor(t, 10*time.Second), reason))
	dlq, err := b.DLQ(tp.Queues[0].Name)
	require.NoError(t, err)
	list, err := dlq.List(ctxFor(t, 10*time.Second), 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, len(m.Body), len(list[0].Message.Body))
	require.Equal(t, 2, list[0].Message.Attempt)
}

// TestHeaderRoundTrip: NATS trims blanks around header values; the
// adapter keeps them (ID, Key and headers arrive exactly as published, also
// through the DLQ).
func TestHeaderRoundTrip(t *testing.T) {
	t.Parallel()
	tp := topology("nats-hdr", "evt.hdr")
	b := declared(t, tp)
	sub, err := b.Subscribe(ctxFor(t, 10*time.Second), tp.Queues[0].Name, broker.SubscribeOptions{})
	require.NoError(t, err)
	defer sub.Close()
	h := map[string]string{"sp": "  spaced  ", "empty": "", "tab": "a\tb\t", "Upper-Case": "X", "colon": "a: b", "uni": "é✓"}
	require.NoError(t, b.Publish(ctxFor(t, 10*time.Second), []*broker.Message{{ID: " 1 ", Type: "evt.hdr", Key: " k ", Headers: h}}))
	d := receive(t, sub, 10*time.Second)
	require.Equal(t, h, d.Message().Headers)
	require.Equal(t, " k ", d.Message().Key)
	require.Equal(t, " 1 ", d.Message().ID)
	require.NoError(t, d.DeadLetter(ctxFor(t, 10*time.Second), " reason "))
	dlq, err := b.DLQ(tp.Queues[0].Name)
	require.NoError(t, err)
	list, err := dlq.List(ctxFor(t, 10*time.Second), 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, " 1 ", list[0].Message.ID)
	require.Equal(t, " k ", list[0].Message.Key)
	require.Equal(t, " reason ", list[0].LastError)
	require.Equal(t, "  spaced  ", list[0].Message.Headers["sp"])
}

// TestRestartKeepsRetriesAndDeadLetters: a message waiting for its retry
// delay and a dead letter both survive a server restart (file storage),
// and the subscription made before the restart receives the retry after
// it. Not parallel: it stops the shared server.
func TestRestartKeepsRetriesAndDeadLetters(t *testing.T) {
	tp := topology("nats-restart", "evt.restart")
	b := declared(t, tp)
	sub, err := b.Subscribe(ctxFor(t, 10*time.Second), tp.Queues[0].Name, broker.SubscribeOptions{AckDeadline: 2 * time.Second})
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, b.Publish(ctxFor(t, 10*time.Second), []*broker.Message{
		{ID: "later", Type: "evt.restart", Body: []byte("r")},
		{ID: "dead", Type: "evt.restart", Body: []byte("d")},
	}))
	for i := 0; i < 2; i++ {
		d := receive(t, sub, 10*time.Second)
		if d.Message().ID == "later" {
			require.NoError(t, d.Retry(ctxFor(t, 5*time.Second), 2*time.Second, "wait"))
		} else {
			require.NoError(t, d.DeadLetter(ctxFor(t, 5*time.Second), "gone"))
		}
	}
	testenv.Services(t, "stop", "nats")
	started := false
	defer func() {
		if !started {
			testenv.Services(t, "start", "nats")
		}
	}()
	time.Sleep(500 * time.Millisecond)
	testenv.Services(t, "start", "nats")
	started = true

	d := receive(t, sub, 30*time.Second)
	require.Equal(t, "later", d.Message().ID)
	require.GreaterOrEqual(t, d.Message().Attempt, 2)
	require.NoError(t, d.Ack(ctxFor(t, 10*time.Second)))
	dlq, err := b.DLQ(tp.Queues[0].Name)
	require.NoError(t, err)
	list, err := dlq.List(ctxFor(t, 10*time.Second), 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "dead", list[0].Message.ID)
	require.Equal(t, "gone", list[0].LastError)
	receiveNone(t, sub, 3*time.Second)
}

// TestInvalidMessagesRefused: messages NATS cannot carry fail alone, with
// broker.ErrInvalidMessage (a failure of the message, not of the broker); the
// others of the batch are confirmed.
func TestInvalidMessagesRefused(t *testing.T) {
	t.Parallel()
	tp := topology("nats-invalid", "#")
	b := declared(t, tp)
	batch := []*broker.Message{
		{ID: "ok1", Type: "evt.ok"},
		{ID: "sp", Type: "evt.with space"},
		{ID: "wild", Type: "evt.>"},
		{ID: "empty-word", Type: "evt..x"},
		{ID: "", Type: "evt.ok"},
		{ID: "hdr", Type: "evt.ok", Headers: map[string]string{"Nats-Expected-Stream": "x"}},
		{ID: "crlf", Type: "evt.ok", Headers: map[string]string{"k": "a\r\nb"}},
		{ID: "ok2", Type: "evt.ok"},
	}
	err := b.Publish(ctxFor(t, 10*time.Second), batch)
	failed := broker.FailedIndexes(err, len(batch))
	require.Len(t, failed, len(batch)-2, "%v", err)
	for i, e := range failed {
		require.ErrorIs(t, e, broker.ErrInvalidMessage, "index %d", i)
		require.True(t, broker.IsMessageFault(e), "index %d", i)
	}
	require.NotContains(t, failed, 0)
	require.NotContains(t, failed, len(batch)-1)
}

// removeTopology deletes the streams of t's exchange (and so its
// consumers) at once, as an operator could, and fails when it cannot.
func removeTopology(ctx context.Context, t *testing.T, topo broker.Topology) error {
	nc, err := natsgo.Connect(testenv.NATSURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream := nats.StreamName(topo.Exchange)
	for _, s := range []string{stream, stream + "-dlq"} {
		if err := js.DeleteStream(ctx, s); err != nil {
			return fmt.Errorf("delete stream %s: %w", s, err)
		}
	}
	return nil
}
