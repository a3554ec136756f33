package sqs_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/sqs"
	"github.com/ferrymq/ferry/internal/latencyproxy"
	"github.com/ferrymq/ferry/internal/testenv"
)

// calls counts the adapter's requests by operation, and the most of one
// operation in flight at once, through Config.APIOptions.
type calls struct {
	mu       sync.Mutex
	n        map[string]int
	inFlight map[string]int
	most     map[string]int
	// partialBeside counts the ReceiveMessage calls for fewer than 10
	// messages made while another ReceiveMessage was in flight.
	partialBeside int
}

func newCalls() *calls {
	return &calls{n: map[string]int{}, inFlight: map[string]int{}, most: map[string]int{}}
}

func (c *calls) options() []func(*middleware.Stack) error {
	return []func(*middleware.Stack) error{func(st *middleware.Stack) error {
		return st.Initialize.Add(middleware.InitializeMiddlewareFunc("TestPartialReceives",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				if r, ok := in.Parameters.(*awssqs.ReceiveMessageInput); ok && r.MaxNumberOfMessages < sqs.MaxBatchEntries {
					c.mu.Lock()
					if c.inFlight["ReceiveMessage"] > 0 {
						c.partialBeside++
					}
					c.mu.Unlock()
				}
				return next.HandleInitialize(ctx, in)
			}), middleware.After)
	}, func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("TestCallCounter",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				op := awsmiddleware.GetOperationName(ctx)
				c.mu.Lock()
				c.n[op]++
				c.inFlight[op]++
				c.most[op] = max(c.most[op], c.inFlight[op])
				c.mu.Unlock()
				defer func() {
					c.mu.Lock()
					c.inFlight[op]--
					c.mu.Unlock()
				}()
				return next.HandleFinalize(ctx, in)
			}), middleware.After)
	}}
}

func (c *calls) get(op string) (n, inFlight, most int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[op], c.inFlight[op], c.most[op]
}

// TestSendConcurrencyBoundsCalls: one Publish keeps at most
// Config.SendConcurrency SendMessageBatch calls in flight, and
// Config.APIOptions sees every call.
func TestSendConcurrencyBoundsCalls(t *testing.T) {
	t.Parallel()
	tp := topology("sendconc", "evt.sc")
	c := newCalls()
	cfg := config()
	cfg.SendConcurrency = 2
	cfg.APIOptions = c.options()
	b := declaredRaw(t, cfg, tp)
	var msgs []*broker.Message
	for i := range 100 {
		msgs = append(msgs, &broker.Message{ID: fmt.Sprint("sc", i), Type: "evt.sc", Body: []byte("{}")})
	}
	require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), msgs))
	n, _, most := c.get("SendMessageBatch")
	require.Equal(t, 10, n, "100 messages in calls of 10")
	require.LessOrEqual(t, most, 2, "at most SendConcurrency calls in flight")
}

// TestReceivePollersInFlight: on an idle queue a subscription keeps one
// long poll in flight, whatever its pollers; under load all
// Config.ReceivePollers receive at once, and never more. Every call goes
// through a proxy that adds 50 ms, so the receives of a busy queue
// overlap as they do on AWS.
func TestReceivePollersInFlight(t *testing.T) {
	t.Parallel()
	p, err := latencyproxy.Start(testenv.SQSEndpoint(), 50*time.Millisecond)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	tp := topology("pollers", "evt.po")
	c := newCalls()
	cfg := config()
	cfg.Endpoint = p.URL()
	cfg.ReceivePollers = 3
	cfg.APIOptions = c.options()
	b := declaredRaw(t, cfg, tp)
	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 100})
	require.Eventually(t, func() bool { _, in, _ := c.get("ReceiveMessage"); return in == 1 }, 20*time.Second, 10*time.Millisecond,
		"a long poll in flight")
	time.Sleep(2 * cfg.WaitTime) // the polls end and start again
	calls, _, most := c.get("ReceiveMessage")
	require.Equal(t, 1, most, "one long poll at a time on an idle queue (%d polls)", calls)

	const n = 300
	var msgs []*broker.Message
	for i := range n {
		msgs = append(msgs, &broker.Message{ID: fmt.Sprint("po", i), Type: "evt.po", Body: []byte("{}")})
	}
	require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), msgs))
	ctx := ctxFor(t, 60*time.Second)
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			for {
				mu.Lock()
				done := len(seen) == n
				mu.Unlock()
				if done {
					return
				}
				rctx, cancel := context.WithTimeout(ctx, time.Second)
				d, err := sub.Receive(rctx)
				cancel()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					continue
				}
				mu.Lock()
				seen[d.Message().ID] = true
				mu.Unlock()
				_ = d.Ack(ctx)
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, n)
	calls, _, most = c.get("ReceiveMessage")
	require.Equal(t, 3, most, "under load every poller receives at once, never more (%d calls)", calls)
}

// TestBusyQueueReceivesWholeBatches: while the queue is busy and the
// subscription's buffer still holds messages, a poller waits for room for
// 10 before it receives, instead of asking for each message a settle
// frees: 100 messages consumed one at a time with Prefetch 20 take about
// 10 ReceiveMessage calls, not one per message or two.
func TestBusyQueueReceivesWholeBatches(t *testing.T) {
	t.Parallel()
	tp := topology("whole", "evt.wh")
	c := newCalls()
	cfg := config()
	cfg.APIOptions = c.options()
	b := declaredRaw(t, cfg, tp)
	const n = 100
	var msgs []*broker.Message
	for i := range n {
		msgs = append(msgs, &broker.Message{ID: fmt.Sprint("wh", i), Type: "evt.wh", Body: []byte("{}")})
	}
	require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), msgs))
	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 20})
	ctx := ctxFor(t, 60*time.Second)
	seen := map[string]bool{}
	for len(seen) < n {
		d, err := sub.Receive(ctx)
		require.NoError(t, err)
		seen[d.Message().ID] = true
		time.Sleep(2 * time.Millisecond) // a handler's work: the buffer does not run dry
		require.NoError(t, d.Ack(ctx))
	}
	got, _, _ := c.get("ReceiveMessage")
	t.Logf("%d ReceiveMessage calls for %d messages", got, n)
	require.LessOrEqual(t, got, 2*n/sqs.MaxBatchEntries, "whole batches while the queue is busy")
}

// TestNoSmallReceiveBesideAnother: with nothing buffered, a poller does
// not ask for the few messages the last settles made room for while
// another poller's receive is on its way (here a long poll of the emptied
// queue): it waits for room for 10, or for that receive to come back.
func TestNoSmallReceiveBesideAnother(t *testing.T) {
	t.Parallel()
	tp := topology("beside", "evt.be")
	c := newCalls()
	cfg := config()
	cfg.APIOptions = c.options()
	cfg.ReceivePollers = 2
	b := declaredRaw(t, cfg, tp)
	var msgs []*broker.Message
	for i := range 20 {
		msgs = append(msgs, &broker.Message{ID: fmt.Sprint("be", i), Type: "evt.be", Body: []byte("{}")})
	}
	require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), msgs))
	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 20})
	ctx := ctxFor(t, 60*time.Second)
	var ds []broker.Delivery
	for range 20 { // both pollers came back full: busy
		d, err := sub.Receive(ctx)
		require.NoError(t, err)
		ds = append(ds, d)
	}
	ackAll := func(ds []broker.Delivery) {
		var wg sync.WaitGroup
		for _, d := range ds {
			wg.Go(func() { require.NoError(t, d.Ack(ctx)) })
		}
		wg.Wait()
	}
	// Room for 3: a poller receives them (none left: it long-polls).
	ackAll(ds[:3])
	require.Eventually(t, func() bool { _, in, _ := c.get("ReceiveMessage"); return in == 1 }, 10*time.Second, time.Millisecond,
		"a receive in flight")
	time.Sleep(100 * time.Millisecond) // past a receive that does not wait: the long poll (WaitTime 2 s) that follows
	_, in, _ := c.get("ReceiveMessage")
	require.Equal(t, 1, in, "a long poll in flight")
	// Room for 3 more, nothing buffered, that receive still on its way.
	ackAll(ds[3:6])
	time.Sleep(300 * time.Millisecond)
	c.mu.Lock()
	partial := c.partialBeside
	c.mu.Unlock()
	require.Zero(t, partial, "no receive for fewer than 10 while another is in flight")
	ackAll(ds[6:])
}

func TestCallSettingsValidated(t *testing.T) {
	for _, tc := range []struct {
		cfg   sqs.Config
		field string
	}{
		{sqs.Config{SendConcurrency: -1}, "SendConcurrency"},
		{sqs.Config{SendConcurrency: sqs.MaxSendConcurrency + 1}, "SendConcurrency"},
		{sqs.Config{ReceivePollers: -1}, "ReceivePollers"},
		{sqs.Config{ReceivePollers: sqs.MaxReceivePollers + 1}, "ReceivePollers"},
	} {
		tc.cfg.Endpoint = testenv.SQSEndpoint()
		err := tc.cfg.Validate()
		var ce *broker.ConfigError
		require.ErrorAs(t, err, &ce, "%+v", tc.cfg)
		require.Equal(t, tc.field, ce.Field)
		require.ErrorIs(t, err, broker.ErrInvalidConfig)
	}
	require.NoError(t, sqs.Config{Endpoint: testenv.SQSEndpoint(), SendConcurrency: sqs.MaxSendConcurrency, ReceivePollers: 1}.Validate())
}
