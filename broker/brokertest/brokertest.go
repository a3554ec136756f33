// Package brokertest is the conformance suite every broker adapter runs.
//
// An adapter's test calls RunConformance with a Harness that says how to
// connect to the real server under test and how to stop and start it for
// the outage test:
//
//	func TestConformance(t *testing.T) {
//		brokertest.RunConformance(t, brokertest.Harness{
//			New: func(ctx context.Context, t *testing.T) (broker.Broker, error) {
//				return rabbitmq.New(ctx, rabbitmq.Config{URL: testenv.RabbitMQURL()})
//			},
//			StopServer:  func(t *testing.T) { testenv.Services(t, "stop", "rabbitmq") },
//			StartServer: func(t *testing.T) { testenv.Services(t, "start", "rabbitmq") },
//		})
//	}
//
// The suite checks the contract written in package broker's doc comments:
// idempotent Declare, confirmed Publish with per-message failures
// (ErrUnroutable, ErrMessageTooLarge, and every refusal of a message's
// names, lengths or characters a message fault, broker.IsMessageFault;
// a message the broker refuses with the whole call carrying it fails
// alone, the others of the batch confirmed: PoisonAmongGood, skipped,
// saying so, when the harness has no Poison),
// per-key order of SubscribeOptions.Ordered, context deadlines, prefetch, retry to
// the failing queue only, the DLQ (List, Replay, Purge, Where, also from a broker
// that did not declare the queue, and ErrUnknownQueue without creating
// anything for a queue that exists nowhere), settlement rules,
// redelivery of unsettled messages, Close, recovery from a server outage,
// and recovery from the deletion of the topology under a running publisher
// and consumer without a reconnect (TopologyDeleted; skipped, saying so,
// when the harness has no RemoveTopology). Where a broker's Capabilities
// rule a feature out (no wildcard bindings, no size limit), the suite
// checks that the capability is declared consistently instead of the
// feature; it never skips because a server is missing: an unreachable
// server fails the test.
//
// The subtests run in parallel with each other, each on its own uniquely
// named topology, except the outage test, which runs alone at the end. The
// parallel group takes about 10s on a local server; the outage test adds
// the server's stop and start time (RabbitMQ: 20-40s). It is modelled on
// go-cloud's pubsub/drivertest and watermill's pubsub/tests.
package brokertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/stretchr/testify/require"
)

// Harness tells the suite how to run an adapter against its real server.
type Harness struct {
	// New connects a new broker to the server under test. Required. The
	// suite closes every broker it creates when the subtest ends. New is
	// called concurrently from parallel subtests.
	New func(ctx context.Context, t *testing.T) (broker.Broker, error)

	// StopServer stops the server (the broker process) and returns once it
	// no longer accepts connections; StartServer starts it again and returns
	// once it accepts connections. Both are required: the outage test uses
	// them, and a harness without them fails that test. The suite always
	// calls StartServer after StopServer, also when the test fails.
	StopServer  func(t *testing.T)
	StartServer func(t *testing.T)

	// DeleteTopology, when set, removes a topology the suite declared (its
	// exchange, queues, retry levels and DLQs) when the subtest ends, so the
	// shared server does not fill up with test queues. Errors are the
	// harness's to log; they do not fail the test.
	DeleteTopology func(ctx context.Context, t *testing.T, topo broker.Topology)

	// RemoveTopology, when set, deletes a declared topology from the server
	// at once (RabbitMQ: its queues and exchange; NATS: its streams, which
	// deletes their consumers), the way an operator's mistake or a broker
	// reset without its data would, and returns an error if it could not.
	// The TopologyDeleted subtest calls it under a running publisher and
	// consumer; a harness without it skips that subtest with a message
	// saying so. Unlike DeleteTopology (clean-up, errors only logged), a
	// failure here fails the test.
	RemoveTopology func(ctx context.Context, t *testing.T, topo broker.Topology) error

	// Poison, when set, returns a message with the given ID and Type that
	// passes the adapter's own checks but that the broker refuses together
	// with the whole call carrying it, without saying which message is at
	// fault (SQS on ElasticMQ: a body holding U+FFFF, HTTP 400 for the whole
	// SendMessageBatch; RabbitMQ: a "CC" header that is not an array,
	// PRECONDITION_FAILED closing the channel; Kafka: a record over the
	// topic's max.message.bytes, which the harness lowers, refusing the
	// partition's whole record batch). It is called after tp is declared
	// on b. The PoisonAmongGood subtest publishes it among good messages in
	// one Publish; a harness without it (a broker without whole-call
	// refusals, such as NATS, where each message is its own publish) skips
	// that subtest, saying so.
	Poison func(ctx context.Context, t *testing.T, b broker.Broker, tp broker.Topology, id, typ string) *broker.Message

	// OutageDuration is how long the outage test keeps the server stopped.
	// Defaults to 2s.
	OutageDuration time.Duration
}

// Timing used by the suite. The retry delays are short so the suite stays
// fast; a broker with retry levels rounds a wanted delay up to a level.
const (
	retryLevel1 = 200 * time.Millisecond
	retryLevel2 = 400 * time.Millisecond
	// quiet is how long the suite waits to conclude that nothing (more)
	// arrives on a queue.
	quiet = 800 * time.Millisecond
	// arrive bounds the wait for a message that must arrive.
	arrive = 15 * time.Second
	// ackDeadline is the AckDeadline the suite subscribes with, so brokers
	// with an ack deadline redeliver quickly.
	ackDeadline = 5 * time.Second
)

// RunConformance runs the conformance suite against the broker of h.
func RunConformance(t *testing.T, h Harness) {
	require.NotNil(t, h.New, "brokertest: Harness.New is required")
	if h.OutageDuration <= 0 {
		h.OutageDuration = 2 * time.Second
	}
	s := &suite{h: h}

	t.Run("parallel", func(t *testing.T) {
		tests := []struct {
			name string
			fn   func(t *testing.T)
		}{
			{"Capabilities", s.testCapabilities},
			{"DeclareIdempotent", s.testDeclareIdempotent},
			{"DeclareInvalid", s.testDeclareInvalid},
			{"PublishReceive", s.testPublishReceive},
			{"Wildcards", s.testWildcards},
			{"FanOutToEveryBoundQueue", s.testFanOut},
			{"Ordering", s.testOrdering},
			{"Unroutable", s.testUnroutable},
			{"TooLarge", s.testTooLarge},
			{"InvalidMessageIsMessageFault", s.testInvalidMessage},
			{"PoisonAmongGood", s.testPoisonAmongGood},
			{"OrderedSubscription", s.testOrderedSubscription},
			{"ContextDeadline", s.testContextDeadline},
			{"Prefetch", s.testPrefetch},
			{"RetryOnlyToFailingQueue", s.testRetry},
			{"DeadLetterAndDLQ", s.testDeadLetterDLQ},
			{"DoubleSettle", s.testDoubleSettle},
			{"RedeliveredAfterClose", s.testRedeliveredAfterClose},
			{"SettleAfterSubscriptionClose", s.testSettleAfterSubscriptionClose},
			{"ConcurrentReceivers", s.testConcurrentReceivers},
			{"UnknownQueue", s.testUnknownQueue},
			{"DLQWithoutDeclare", s.testDLQWithoutDeclare},
			{"DLQOfQueueNowhere", s.testDLQOfQueueNowhere},
			{"Close", s.testClose},
			{"TopologyDeleted", s.testTopologyDeleted},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				tc.fn(t)
			})
		}
	})
	// The outage test stops the server: it runs alone, after the parallel
	// group has finished.
	t.Run("ServerOutage", s.testOutage)
}

type suite struct {
	h Harness
}

// ---- helpers ----

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newBroker connects a broker and closes it when the test ends.
func (s *suite) newBroker(t *testing.T) broker.Broker {
	t.Helper()
	ctx := ctxFor(t, 30*time.Second)
	b, err := s.h.New(ctx, t)
	require.NoError(t, err, "brokertest: Harness.New")
	require.NotNil(t, b)
	t.Cleanup(func() {
		done := make(chan error, 1)
		go func() { done <- b.Close() }()
		select {
		case err := <-done:
			if err != nil {
				t.Logf("brokertest: Close: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("brokertest: Close did not return within 10s")
		}
	})
	return b
}

// topo returns a fresh topology with one exchange and the given queues
// (name suffix -> bindings), all with the suite's short retry levels.
func (s *suite) topo(t *testing.T, queues ...queueSpec) broker.Topology {
	t.Helper()
	base := testenv.UniqueName("ct")
	tp := broker.Topology{Exchange: base + "-ex"}
	for _, q := range queues {
		tp.Queues = append(tp.Queues, broker.Queue{
			Name:        base + "-" + q.suffix,
			Bindings:    q.bindings,
			RetryDelays: []time.Duration{retryLevel1, retryLevel2},
		})
	}
	if s.h.DeleteTopology != nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			s.h.DeleteTopology(ctx, t, tp)
		})
	}
	return tp
}

type queueSpec struct {
	suffix   string
	bindings []string
}

func q(suffix string, bindings ...string) queueSpec { return queueSpec{suffix, bindings} }

// declared returns a broker with tp declared.
func (s *suite) declared(t *testing.T, tp broker.Topology) broker.Broker {
	t.Helper()
	b := s.newBroker(t)
	require.NoError(t, b.Declare(ctxFor(t, 30*time.Second), tp))
	return b
}

func msg(id, typ string) *broker.Message {
	return &broker.Message{ID: id, Type: typ, Key: "k-" + id, Body: []byte(`{"id":"` + id + `"}`),
		Headers: map[string]string{"app-header": "v-" + id}}
}

func subscribe(t *testing.T, b broker.Broker, queue string, prefetch int) broker.Subscription {
	t.Helper()
	sub, err := b.Subscribe(ctxFor(t, 30*time.Second), queue, broker.SubscribeOptions{Prefetch: prefetch, AckDeadline: ackDeadline})
	require.NoError(t, err, "Subscribe %s", queue)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// receive waits up to d for one delivery and fails the test if none comes.
func receive(t *testing.T, sub broker.Subscription, d time.Duration) broker.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	dl, err := sub.Receive(ctx)
	require.NoError(t, err, "Receive: expected a delivery within %v", d)
	require.NotNil(t, dl)
	require.NotNil(t, dl.Message())
	return dl
}

// receiveNone asserts that nothing arrives within d.
func receiveNone(t *testing.T, sub broker.Subscription, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	dl, err := sub.Receive(ctx)
	if err == nil {
		dl.Ack(context.Background())
		t.Fatalf("Receive: expected nothing within %v, got message %q (type %q, attempt %d)",
			d, dl.Message().ID, dl.Message().Type, dl.Message().Attempt)
	}
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// receiveIDs receives n deliveries, acks them and returns their IDs in
// arrival order.
func receiveIDs(t *testing.T, sub broker.Subscription, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		d := receive(t, sub, arrive)
		ids = append(ids, d.Message().ID)
		require.NoError(t, d.Ack(ctxFor(t, 10*time.Second)))
	}
	return ids
}

func publish(t *testing.T, b broker.Broker, msgs ...*broker.Message) {
	t.Helper()
	require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), msgs))
}

func sorted(s []string) []string {
	c := slices.Clone(s)
	sort.Strings(c)
	return c
}

// ---- tests ----

func (s *suite) testCapabilities(t *testing.T) {
	b := s.newBroker(t)
	c := b.Capabilities()
	require.NotEmpty(t, c.Name, "Capabilities.Name")
	require.GreaterOrEqual(t, c.MaxMessageBytes, 0)
	require.GreaterOrEqual(t, c.MaxHeaderBytes, 0)
	require.GreaterOrEqual(t, c.MaxDelay, time.Duration(0))
	// Check must agree with the declared capabilities.
	wild := broker.Topology{Exchange: "x", Queues: []broker.Queue{{Name: "q", Bindings: []string{"a.*"}}}}
	err := c.Check(broker.Requirements{Topology: wild})
	if c.Wildcards {
		require.NoError(t, err)
	} else {
		require.ErrorIs(t, err, broker.ErrUnsupported)
	}
	if c.MaxMessageBytes > 0 {
		require.ErrorIs(t, c.Check(broker.Requirements{MaxMessageBytes: c.MaxMessageBytes + 1}), broker.ErrUnsupported)
		require.NoError(t, c.Check(broker.Requirements{MaxMessageBytes: c.MaxMessageBytes}))
	}
	// The suite's retry delays must be holdable.
	require.NoError(t, c.Check(broker.Requirements{RetryDelays: []time.Duration{retryLevel1, retryLevel2}}))
}

func (s *suite) testDeclareIdempotent(t *testing.T) {
	tp := s.topo(t, q("a", "evt.created"), q("b", "evt.created", "evt.updated"))
	b1 := s.newBroker(t)
	b2 := s.newBroker(t)
	ctx := ctxFor(t, 30*time.Second)
	require.NoError(t, b1.Declare(ctx, tp))
	require.NoError(t, b1.Declare(ctx, tp), "second Declare of the same topology")
	// Two processes declaring at once, in any order.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			bb := b1
			if i%2 == 1 {
				bb = b2
			}
			errs[i] = bb.Declare(ctx, tp)
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "concurrent Declare %d", i)
	}
	// A third process that declares and consumes first, before anything is published.
	b3 := s.declared(t, tp)
	subA := subscribe(t, b3, tp.Queues[0].Name, 0)
	subB := subscribe(t, b2, tp.Queues[1].Name, 0)
	publish(t, b1, msg("d1", "evt.created"), msg("d2", "evt.updated"))
	require.Equal(t, []string{"d1"}, receiveIDs(t, subA, 1))
	require.Equal(t, []string{"d1", "d2"}, sorted(receiveIDs(t, subB, 2)))
	receiveNone(t, subA, quiet)
}

func (s *suite) testDeclareInvalid(t *testing.T) {
	b := s.newBroker(t)
	ctx := ctxFor(t, 10*time.Second)
	bad := []broker.Topology{
		{},
		{Exchange: "ok", Queues: nil},
		{Exchange: "bad name!", Queues: []broker.Queue{{Name: "q", Bindings: []string{"a"}}}},
		{Exchange: "ok", Queues: []broker.Queue{{Name: "q", Bindings: nil}}},
		{Exchange: "ok", Queues: []broker.Queue{{Name: "q", Bindings: []string{"a..b"}}}},
		{Exchange: "ok", Queues: []broker.Queue{{Name: "q", Bindings: []string{"a"}, RetryDelays: []time.Duration{-time.Second}}}},
	}
	for i, tp := range bad {
		require.Error(t, b.Declare(ctx, tp), "invalid topology %d must be refused", i)
	}
}

func (s *suite) testPublishReceive(t *testing.T) {
	tp := s.topo(t, q("a", "user.signed-up"))
	b := s.declared(t, tp)
	sub := subscribe(t, b, tp.Queues[0].Name, 0)

	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	msgs := []*broker.Message{
		{ID: "1", Type: "user.signed-up", Key: "user-42", Body: binary,
			Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "content-type": "application/octet-stream"}},
		{ID: "2", Type: "user.signed-up", Key: "ключ-🔑", Body: []byte("Привет, мир! 你好 🌍"),
			Headers: map[string]string{"lang": "ru", "note": "üñíçødé ✓", broker.HeaderCreatedAt: broker.FormatTime(time.Now())}},
		{ID: "3", Type: "user.signed-up", Body: []byte{}, Headers: nil},
		{ID: "9223372036854775807", Type: "user.signed-up", Key: "", Body: bytes.Repeat([]byte("x"), 64<<10)},
	}
	require.NoError(t, b.Publish(ctxFor(t, 10*time.Second), nil), "an empty batch is a no-op")
	publish(t, b, msgs...)
	got := map[string]*broker.Message{}
	for range msgs {
		d := receive(t, sub, arrive)
		m := d.Message()
		got[m.ID] = m.Clone()
		require.NoError(t, d.Ack(ctxFor(t, 10*time.Second)))
	}
	for _, want := range msgs {
		m, ok := got[want.ID]
		require.True(t, ok, "message %s not received", want.ID)
		require.Equal(t, want.Type, m.Type, "Type of %s", want.ID)
		require.Equal(t, want.Key, m.Key, "Key of %s", want.ID)
		require.True(t, bytes.Equal(want.Body, m.Body), "Body of %s differs", want.ID)
		require.Equal(t, 1, m.Attempt, "Attempt of the first delivery of %s", want.ID)
		wantH := want.Headers
		if len(wantH) == 0 {
			require.Empty(t, m.Headers, "Headers of %s", want.ID)
		} else {
			require.Equal(t, wantH, m.Headers, "Headers of %s", want.ID)
		}
	}
	receiveNone(t, sub, quiet)
}

func (s *suite) testWildcards(t *testing.T) {
	b := s.newBroker(t)
	if !b.Capabilities().Wildcards {
		// Capability branch: the broker says it has no wildcard bindings, so
		// the framework refuses them up front; exact bindings must work.
		tp := s.topo(t, q("exact", "order.created"))
		require.ErrorIs(t, b.Capabilities().Check(broker.Requirements{Topology: broker.Topology{Exchange: tp.Exchange,
			Queues: []broker.Queue{{Name: "w", Bindings: []string{"order.*"}}}}}), broker.ErrUnsupported)
		require.NoError(t, b.Declare(ctxFor(t, 30*time.Second), tp))
		sub := subscribe(t, b, tp.Queues[0].Name, 0)
		publish(t, b, msg("e1", "order.created"))
		require.Equal(t, []string{"e1"}, receiveIDs(t, sub, 1))
		return
	}
	tp := s.topo(t,
		q("star", "order.*"),
		q("hash", "order.#"),
		q("mid", "*.created.#"),
		q("exact", "order.created"),
	)
	require.NoError(t, b.Declare(ctxFor(t, 30*time.Second), tp))
	subs := map[string]broker.Subscription{}
	for _, qq := range tp.Queues {
		subs[qq.Name] = subscribe(t, b, qq.Name, 0)
	}
	publish(t, b,
		msg("w1", "order.created"),    // star, hash, mid, exact
		msg("w2", "order.created.eu"), // hash, mid
		msg("w3", "order"),            // hash ('#' matches zero words)
		msg("w4", "order.shipped"),    // star, hash
		msg("w5", "invoice.created"),  // mid
	)
	want := map[string][]string{
		tp.Queues[0].Name: {"w1", "w4"},
		tp.Queues[1].Name: {"w1", "w2", "w3", "w4"},
		tp.Queues[2].Name: {"w1", "w2", "w5"},
		tp.Queues[3].Name: {"w1"},
	}
	for name, ids := range want {
		// Cross-check the expectation with the contract's matcher.
		qq, _ := tp.Queue(name)
		for _, id := range []string{"w1", "w2", "w3", "w4", "w5"} {
			typ := map[string]string{"w1": "order.created", "w2": "order.created.eu", "w3": "order", "w4": "order.shipped", "w5": "invoice.created"}[id]
			require.Equal(t, slices.Contains(ids, id), broker.MatchRoutingKey(qq.Bindings[0], typ), "suite self-check %s %s", name, id)
		}
		require.Equal(t, ids, sorted(receiveIDs(t, subs[name], len(ids))), "queue %s", name)
	}
	for name := range want {
		receiveNone(t, subs[name], quiet/2)
	}
}

// testOrdering checks the declared ordering scope: with one consumer and
// no retries, OrderingQueue keeps publish order within the queue and
// OrderingKey within each Key.
func (s *suite) testOrdering(t *testing.T) {
	tp := s.topo(t, q("a", "evt.order"))
	b := s.declared(t, tp)
	c := b.Capabilities()
	var msgs []*broker.Message
	for i := 0; i < 60; i++ {
		m := msg(fmt.Sprintf("%03d", i), "evt.order")
		m.Key = fmt.Sprintf("key-%d", i%3)
		msgs = append(msgs, m)
	}
	// Two batches, one after the other.
	publish(t, b, msgs[:30]...)
	publish(t, b, msgs[30:]...)
	sub := subscribe(t, b, tp.Queues[0].Name, 5)
	var got []string
	perKey := map[string][]string{}
	for range msgs {
		d := receive(t, sub, arrive)
		m := d.Message()
		got = append(got, m.ID)
		perKey[m.Key] = append(perKey[m.Key], m.ID)
		require.NoError(t, d.Ack(ctxFor(t, 10*time.Second)))
	}
	require.ElementsMatch(t, func() []string {
		var ids []string
		for _, m := range msgs {
			ids = append(ids, m.ID)
		}
		return ids
	}(), got)
	switch c.Ordering {
	case broker.OrderingQueue:
		require.True(t, sort.StringsAreSorted(got), "OrderingQueue: publish order within the queue, got %v", got)
	case broker.OrderingKey:
		for k, ids := range perKey {
			require.True(t, sort.StringsAreSorted(ids), "OrderingKey: publish order within key %s, got %v", k, ids)
		}
	}
}

// testInvalidMessage: every message an adapter refuses for itself (names,
// lengths, characters, encodings it cannot carry) fails alone, with an
// error broker.IsMessageFault recognises, and the valid messages of the
// batch are confirmed: a caller such as the outbox relay must be able to
// park the one message without taking the broker for unreachable. A
// message the broker accepts is fine too; it must then arrive.
func (s *suite) testInvalidMessage(t *testing.T) {
	tp := s.topo(t, q("a", "evt.#"))
	b := s.declared(t, tp)
	sub := subscribe(t, b, tp.Queues[0].Name, 50)
	hdr := func(id, k, v string) *broker.Message {
		m := msg(id, "evt.ok")
		m.Headers = map[string]string{k: v}
		return m
	}
	withKey := func(id, key string) *broker.Message {
		m := msg(id, "evt.ok")
		m.Key = key
		return m
	}
	batch := []*broker.Message{
		msg("ok-first", "evt.ok"),
		{ID: "", Type: "evt.ok", Body: []byte("x")},
		{ID: strings.Repeat("i", 300), Type: "evt.ok", Body: []byte("x")},
		msg("bad-type-long", "evt."+strings.Repeat("t", 300)),
		msg("bad-type-space", "evt.with space"),
		msg("bad-type-gt", "evt.>"),
		hdr("bad-hdr-empty", "", "v"),
		hdr("bad-hdr-long", strings.Repeat("h", 200), "v"),
		hdr("bad-hdr-colon", "a:b", "v"),
		hdr("bad-hdr-space", "a b", "v"),
		hdr("bad-hdr-crlf", "h", "a\r\nb"),
		hdr("bad-hdr-nonascii", "é", "v"),
		withKey("bad-key-crlf", "a\r\nb"),
		msg("ok-last", "evt.ok"),
	}
	err := b.Publish(ctxFor(t, 30*time.Second), batch)
	failed := broker.FailedIndexes(err, len(batch))
	require.NotContains(t, failed, 0, "a valid message is confirmed beside invalid ones: %v", err)
	require.NotContains(t, failed, len(batch)-1, "a valid message is confirmed beside invalid ones: %v", err)
	var pe *broker.PublishError
	if err != nil {
		require.ErrorAs(t, err, &pe, "per-message failures come as a *broker.PublishError")
	}
	accepted := []string{}
	for i, m := range batch {
		if e, bad := failed[i]; bad {
			require.True(t, broker.IsMessageFault(e), "message %d (%.40q) failed with %v: not a message fault, a caller would take it for an outage", i, m.ID, e)
			continue
		}
		accepted = append(accepted, m.ID)
	}
	t.Logf("%s accepted %d of %d messages; refused: %v", b.Capabilities().Name, len(accepted), len(batch), err)
	require.ElementsMatch(t, accepted, receiveIDs(t, sub, len(accepted)))
}

// testPoisonAmongGood (issue 16): one message the broker refuses with the
// whole call that carries it (Harness.Poison), published in one batch with
// 40 good ones: only the poison message fails, with an error
// broker.IsMessageFault recognises (the relay parks it with its reason
// instead of taking the broker for down), and each good message is
// confirmed and delivered (duplicates are counted and printed: a broker
// that drops the pending confirms with the refused call makes Publish
// send those messages again).
func (s *suite) testPoisonAmongGood(t *testing.T) {
	if s.h.Poison == nil {
		t.Skip("brokertest: the harness has no Poison: this broker has no call refused as a whole for one of its messages")
	}
	tp := s.topo(t, q("a", "evt.#"))
	b := s.declared(t, tp)
	ctx := ctxFor(t, 60*time.Second)
	sub := subscribe(t, b, tp.Queues[0].Name, 50)
	const n, bad = 41, 23
	batch := make([]*broker.Message, n)
	for i := range batch {
		batch[i] = msg(fmt.Sprintf("good-%02d", i), "evt.ok")
	}
	batch[bad] = s.h.Poison(ctx, t, b, tp, "poison", "evt.ok")
	start := time.Now()
	err := b.Publish(ctx, batch)
	took := time.Since(start)
	t.Logf("%s: Publish of %d messages with one poison took %v: %v", b.Capabilities().Name, n, took.Round(time.Millisecond), err)
	var pe *broker.PublishError
	require.ErrorAs(t, err, &pe, "the poison message fails in a *broker.PublishError")
	failed := broker.FailedIndexes(err, n)
	require.Len(t, failed, 1, "only the poison message fails: %v", err)
	require.Contains(t, failed, bad)
	require.True(t, broker.IsMessageFault(failed[bad]), "the poison message's refusal is a message fault, not an outage: %v", failed[bad])
	// Every good message arrives. Some may arrive twice: a broker that
	// drops the pending confirms with the refused call (RabbitMQ closes
	// the channel) leaves Publish unsure about the messages before the
	// poison one, and it sends them again; consumers deduplicate.
	got := map[string]int{}
	for i := 0; i < n-1; {
		d := receive(t, sub, arrive)
		id := d.Message().ID
		require.NoError(t, d.Ack(ctxFor(t, 10*time.Second)))
		if got[id] == 0 {
			i++
		}
		got[id]++
	}
	for {
		rctx, cancel := context.WithTimeout(context.Background(), quiet)
		d, err := sub.Receive(rctx)
		cancel()
		if err != nil {
			require.ErrorIs(t, err, context.DeadlineExceeded)
			break
		}
		got[d.Message().ID]++
		require.NoError(t, d.Ack(ctxFor(t, 10*time.Second)))
	}
	dups := 0
	for i, m := range batch {
		if i == bad {
			require.Zero(t, got[m.ID], "the poison message is not delivered")
			continue
		}
		require.GreaterOrEqual(t, got[m.ID], 1, "good message %s delivered", m.ID)
		dups += got[m.ID] - 1
	}
	t.Logf("%s: %d good messages delivered, %d duplicate deliveries", b.Capabilities().Name, n-1, dups)
}

// testOrderedSubscription: with SubscribeOptions.Ordered and several
// concurrent receivers that settle slowly, the deliveries of one key are
// handed out one at a time, in publish order, while other keys are not
// held back. A broker with OrderingNone refuses Ordered with
// ErrUnsupported.
func (s *suite) testOrderedSubscription(t *testing.T) {
	tp := s.topo(t, q("a", "evt.ord"))
	b := s.declared(t, tp)
	sub, err := b.Subscribe(ctxFor(t, 30*time.Second), tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 20, AckDeadline: ackDeadline, Ordered: true})
	if b.Capabilities().Ordering == broker.OrderingNone {
		require.ErrorIs(t, err, broker.ErrUnsupported)
		return
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	const keys, perKey = 4, 15
	var msgs []*broker.Message
	for i := 0; i < perKey; i++ {
		for k := 0; k < keys; k++ {
			m := msg(fmt.Sprintf("%d-%03d", k, i), "evt.ord")
			m.Key = fmt.Sprintf("key-%d", k)
			msgs = append(msgs, m)
		}
	}
	publish(t, b, msgs...)
	var (
		mu         sync.Mutex
		got        = map[string][]string{}
		inFlight   = map[string]bool{}
		overlap    int
		maxRunning int
		running    int
		wg         sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for range 6 {
		wg.Go(func() {
			for {
				mu.Lock()
				n := 0
				for _, ids := range got {
					n += len(ids)
				}
				mu.Unlock()
				if n >= len(msgs) {
					return
				}
				rctx, rcancel := context.WithTimeout(ctx, arrive)
				d, err := sub.Receive(rctx)
				rcancel()
				if err != nil {
					return
				}
				m := d.Message()
				mu.Lock()
				if inFlight[m.Key] {
					overlap++
				}
				inFlight[m.Key] = true
				got[m.Key] = append(got[m.Key], m.ID)
				running++
				maxRunning = max(maxRunning, running)
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
				mu.Lock()
				inFlight[m.Key] = false
				running--
				mu.Unlock()
				require.NoError(t, d.Ack(ctx))
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, overlap, "two deliveries of one key were handed out at once")
	for k := 0; k < keys; k++ {
		ids := got[fmt.Sprintf("key-%d", k)]
		require.Len(t, ids, perKey, "key-%d", k)
		require.True(t, sort.StringsAreSorted(ids), "key-%d out of order: %v", k, ids)
	}
	require.Greater(t, maxRunning, 1, "other keys are not held back")
}

func (s *suite) testFanOut(t *testing.T) {
	tp := s.topo(t, q("a", "evt.fan"), q("b", "evt.fan"))
	b := s.declared(t, tp)
	sa := subscribe(t, b, tp.Queues[0].Name, 0)
	sb := subscribe(t, b, tp.Queues[1].Name, 0)
	publish(t, b, msg("f1", "evt.fan"))
	require.Equal(t, []string{"f1"}, receiveIDs(t, sa, 1))
	require.Equal(t, []string{"f1"}, receiveIDs(t, sb, 1))
	receiveNone(t, sa, quiet)
	receiveNone(t, sb, quiet/2)
}

func (s *suite) testUnroutable(t *testing.T) {
	tp := s.topo(t, q("a", "evt.routed"))
	b := s.declared(t, tp)
	sub := subscribe(t, b, tp.Queues[0].Name, 0)
	err := b.Publish(ctxFor(t, 30*time.Second), []*broker.Message{
		msg("u1", "evt.routed"), msg("u2", "evt.nobody-listens"), msg("u3", "evt.routed"), msg("u4", "other.thing"),
	})
	require.Error(t, err, "a message no queue is bound to must fail")
	require.ErrorIs(t, err, broker.ErrUnroutable)
	var pe *broker.PublishError
	require.ErrorAs(t, err, &pe)
	failed := broker.FailedIndexes(err, 4)
	require.Len(t, failed, 2, "exactly the unroutable messages fail: %v", err)
	require.ErrorIs(t, failed[1], broker.ErrUnroutable)
	require.ErrorIs(t, failed[3], broker.ErrUnroutable)
	for _, f := range pe.Failed {
		require.Equal(t, map[int]string{1: "u2", 3: "u4"}[f.Index], f.ID)
	}
	// The routable ones were confirmed and arrive.
	require.Equal(t, []string{"u1", "u3"}, sorted(receiveIDs(t, sub, 2)))
	receiveNone(t, sub, quiet)
}

func (s *suite) testTooLarge(t *testing.T) {
	tp := s.topo(t, q("a", "evt.big"))
	b := s.declared(t, tp)
	c := b.Capabilities()
	sub := subscribe(t, b, tp.Queues[0].Name, 0)
	if c.MaxMessageBytes <= 0 && c.MaxHeaderBytes <= 0 {
		// Capability branch: no known limit; a 1 MiB message must pass.
		publish(t, b, &broker.Message{ID: "big", Type: "evt.big", Body: make([]byte, 1<<20)})
		require.Equal(t, []string{"big"}, receiveIDs(t, sub, 1))
		return
	}
	batch := []*broker.Message{msg("ok1", "evt.big")}
	want := map[int]string{}
	if c.MaxMessageBytes > 0 {
		big := &broker.Message{ID: "too-big", Type: "evt.big"}
		big.Body = make([]byte, c.MaxMessageBytes+1-big.Size())
		require.Equal(t, c.MaxMessageBytes+1, big.Size())
		want[len(batch)] = big.ID
		batch = append(batch, big)
	}
	if c.MaxHeaderBytes > 0 {
		hb := &broker.Message{ID: "big-headers", Type: "evt.big", Headers: map[string]string{"h": strings.Repeat("v", c.MaxHeaderBytes)}}
		want[len(batch)] = hb.ID
		batch = append(batch, hb)
	}
	batch = append(batch, msg("ok2", "evt.big"))
	err := b.Publish(ctxFor(t, 60*time.Second), batch)
	require.ErrorIs(t, err, broker.ErrMessageTooLarge)
	failed := broker.FailedIndexes(err, len(batch))
	require.Len(t, failed, len(want), "only the too-large messages fail: %v", err)
	for i := range want {
		require.ErrorIs(t, failed[i], broker.ErrMessageTooLarge, "index %d", i)
	}
	require.Equal(t, []string{"ok1", "ok2"}, sorted(receiveIDs(t, sub, 2)))
	receiveNone(t, sub, quiet)
	// The broker still works after refusing them.
	publish(t, b, msg("ok3", "evt.big"))
	require.Equal(t, []string{"ok3"}, receiveIDs(t, sub, 1))
}

func (s *suite) testContextDeadline(t *testing.T) {
	tp := s.topo(t, q("a", "evt.ctx"))
	b := s.declared(t, tp)

	// Publish with an expired context returns promptly with the context error.
	expired, cancel := context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	start := time.Now()
	err := b.Publish(expired, []*broker.Message{msg("c1", "evt.ctx")})
	require.Error(t, err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 2*time.Second, "Publish with an expired ctx must return promptly")

	canceled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	require.ErrorIs(t, b.Publish(canceled, []*broker.Message{msg("c2", "evt.ctx")}), context.Canceled)

	// Receive returns ctx's error, unwrapped.
	sub := subscribe(t, b, tp.Queues[0].Name, 0)
	rctx, rcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer rcancel()
	start = time.Now()
	_, err = sub.Receive(rctx)
	require.Equal(t, context.DeadlineExceeded, err, "Receive returns ctx.Err() unwrapped")
	require.Less(t, time.Since(start), 3*time.Second)

	// A short deadline on a real publish is honoured too: it either succeeds
	// or fails with an error, within the deadline plus a little slack.
	sctx, scancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer scancel()
	start = time.Now()
	_ = b.Publish(sctx, []*broker.Message{msg("c3", "evt.ctx")})
	require.Less(t, time.Since(start), 2*time.Second, "Publish must not block past its deadline")
}

func (s *suite) testPrefetch(t *testing.T) {
	tp := s.topo(t, q("a", "evt.pf"))
	b := s.declared(t, tp)
	var msgs []*broker.Message
	for i := 0; i < 7; i++ {
		msgs = append(msgs, msg(fmt.Sprintf("p%d", i), "evt.pf"))
	}
	publish(t, b, msgs...)
	const prefetch = 3
	sub := subscribe(t, b, tp.Queues[0].Name, prefetch)
	var held []broker.Delivery
	for i := 0; i < prefetch; i++ {
		d := receive(t, sub, arrive)
		require.Equal(t, 1, d.Message().Attempt)
		held = append(held, d)
	}
	// Nothing settled: the prefetch bound holds the rest back.
	receiveNone(t, sub, quiet)
	// Settling one lets exactly one more in.
	require.NoError(t, held[0].Ack(ctxFor(t, 10*time.Second)))
	held = append(held[1:], receive(t, sub, arrive))
	receiveNone(t, sub, quiet)
	for _, d := range held {
		require.NoError(t, d.Ack(ctxFor(t, 10*time.Second)))
	}
	require.Len(t, receiveIDs(t, sub, 3), 3)
	receiveNone(t, sub, quiet/2)

	// The default prefetch is DefaultPrefetch.
	tp2 := s.topo(t, q("b", "evt.pf2"))
	b = s.declared(t, tp2)
	msgs = nil
	for i := 0; i < broker.DefaultPrefetch+2; i++ {
		msgs = append(msgs, msg(fmt.Sprintf("d%d", i), "evt.pf2"))
	}
	publish(t, b, msgs...)
	sub2 := subscribe(t, b, tp2.Queues[0].Name, 0)
	held = nil
	for i := 0; i < broker.DefaultPrefetch; i++ {
		held = append(held, receive(t, sub2, arrive))
	}
	receiveNone(t, sub2, quiet)
	for _, d := range held {
		require.NoError(t, d.Ack(ctxFor(t, 10*time.Second)))
	}
	require.Len(t, receiveIDs(t, sub2, 2), 2)
}

// testRetry is the test 10: two queues bound to the same type, one
// retries, the other sees the event exactly once.
func (s *suite) testRetry(t *testing.T) {
	tp := s.topo(t, q("failing", "evt.retry"), q("other", "evt.retry"))
	b := s.declared(t, tp)
	failing := subscribe(t, b, tp.Queues[0].Name, 0)
	other := subscribe(t, b, tp.Queues[1].Name, 0)
	orig := msg("r1", "evt.retry")
	orig.Headers["keep-me"] = "yes"
	publish(t, b, orig)

	d := receive(t, failing, arrive)
	require.Equal(t, 1, d.Message().Attempt)
	require.Empty(t, d.Message().Headers[broker.HeaderRetryCount])
	wanted := 150 * time.Millisecond
	retriedAt := time.Now()
	require.NoError(t, d.Retry(ctxFor(t, 10*time.Second), wanted, "boom: first"))
	require.ErrorIs(t, d.Ack(ctxFor(t, 10*time.Second)), broker.ErrAlreadyAcked, "Retry settles the delivery")

	// The other queue got its own copy once and never again.
	od := receive(t, other, arrive)
	require.Equal(t, "r1", od.Message().ID)
	require.Equal(t, 1, od.Message().Attempt)
	require.NoError(t, od.Ack(ctxFor(t, 10*time.Second)))

	d2 := receive(t, failing, arrive)
	elapsed := time.Since(retriedAt)
	require.GreaterOrEqual(t, elapsed, wanted-20*time.Millisecond, "a retry comes back after at least its delay")
	m := d2.Message()
	require.Equal(t, "r1", m.ID)
	require.Equal(t, orig.Type, m.Type)
	require.Equal(t, orig.Key, m.Key)
	require.Equal(t, orig.Body, m.Body)
	require.Equal(t, 2, m.Attempt)
	require.Equal(t, "1", m.Headers[broker.HeaderRetryCount])
	inPlace := b.Capabilities().RetryInPlace
	if !inPlace {
		require.Equal(t, "boom: first", m.Headers[broker.HeaderLastError])
	}
	require.Equal(t, "yes", m.Headers["keep-me"])
	require.Equal(t, "v-r1", m.Headers["app-header"])
	first := broker.ParseTime(m.Headers[broker.HeaderFirstFailedAt])
	require.False(t, first.IsZero(), "HeaderFirstFailedAt set on the first retry: %q", m.Headers[broker.HeaderFirstFailedAt])

	// A second retry, with a longer delay, a long reason with newlines.
	long := strings.Repeat("é", broker.MaxReasonBytes) + "\nsecond line"
	retriedAt = time.Now()
	require.NoError(t, d2.Retry(ctxFor(t, 10*time.Second), 350*time.Millisecond, long))
	d3 := receive(t, failing, arrive)
	require.GreaterOrEqual(t, time.Since(retriedAt), 330*time.Millisecond)
	m = d3.Message()
	require.Equal(t, 3, m.Attempt)
	require.Equal(t, "2", m.Headers[broker.HeaderRetryCount])
	if !inPlace {
		require.Equal(t, broker.TruncateReason(long), m.Headers[broker.HeaderLastError])
	}
	require.Equal(t, first, broker.ParseTime(m.Headers[broker.HeaderFirstFailedAt]), "HeaderFirstFailedAt kept")
	require.NoError(t, d3.Ack(ctxFor(t, 10*time.Second)))

	receiveNone(t, failing, quiet)
	receiveNone(t, other, quiet/2)
}

func (s *suite) testDeadLetterDLQ(t *testing.T) {
	tp := s.topo(t, q("work", "evt.dead"), q("bystander", "evt.dead"))
	b := s.declared(t, tp)
	work := tp.Queues[0].Name
	sub := subscribe(t, b, work, 0)
	by := subscribe(t, b, tp.Queues[1].Name, 0)
	ctx := ctxFor(t, 60*time.Second)

	dlq, err := b.DLQ(work)
	require.NoError(t, err)
	list, err := dlq.List(ctx, 0)
	require.NoError(t, err)
	require.Empty(t, list)

	ids := []string{"x1", "x2", "x3"}
	for i, id := range ids {
		publish(t, b, msg(id, "evt.dead"))
		d := receive(t, sub, arrive)
		require.Equal(t, id, d.Message().ID, "one queue, one consumer: publish order")
		if i == 0 {
			// The first one is retried once before it dies.
			require.NoError(t, d.Retry(ctx, retryLevel1, "transient"))
			d = receive(t, sub, arrive)
			require.Equal(t, id, d.Message().ID)
			require.Equal(t, 2, d.Message().Attempt)
		}
		require.NoError(t, d.DeadLetter(ctx, "bad input "+id))
		require.ErrorIs(t, d.Ack(ctx), broker.ErrAlreadyAcked)
	}
	receiveNone(t, sub, quiet)
	require.Equal(t, ids, sorted(receiveIDs(t, by, 3)), "the bystander queue got each once")

	list, err = dlq.List(ctx, 0)
	require.NoError(t, err)
	require.Len(t, list, 3)
	for i, dm := range list {
		require.Equal(t, ids[i], dm.Message.ID, "List is oldest first")
		require.Equal(t, "evt.dead", dm.Message.Type)
		require.Equal(t, "k-"+ids[i], dm.Message.Key)
		require.Equal(t, []byte(`{"id":"`+ids[i]+`"}`), dm.Message.Body)
		require.Equal(t, "bad input "+ids[i], dm.LastError)
		require.Equal(t, "bad input "+ids[i], dm.Message.Headers[broker.HeaderLastError])
		require.Equal(t, "v-"+ids[i], dm.Message.Headers["app-header"], "DLQ keeps the headers")
		require.False(t, dm.DeadAt.IsZero(), "DeadAt set")
		require.WithinDuration(t, time.Now(), dm.DeadAt, time.Minute)
	}
	require.Equal(t, 2, list[0].Message.Attempt, "x1 was tried twice")
	require.False(t, list[0].FirstFailedAt.IsZero())
	require.Equal(t, 1, list[1].Message.Attempt)

	// Listing does not remove, and a limit returns the oldest.
	again, err := dlq.List(ctx, 2)
	require.NoError(t, err)
	require.Len(t, again, 2)
	require.Equal(t, "x1", again[0].Message.ID)
	require.Equal(t, "x2", again[1].Message.ID)
	again, err = dlq.List(ctx, 0)
	require.NoError(t, err)
	require.Len(t, again, 3)

	// Purge by id.
	purged, err := dlq.Purge(ctx, []string{"x2", "nope"})
	require.NoError(t, err)
	require.Equal(t, []string{"x2"}, purged)
	list, err = dlq.List(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"x1", "x3"}, []string{list[0].Message.ID, list[1].Message.ID})

	// Replay by id: back to this work queue only, attempt counting reset.
	replayed, err := dlq.Replay(ctx, []string{"x1", "missing"})
	require.NoError(t, err)
	require.Equal(t, []string{"x1"}, replayed)
	d := receive(t, sub, arrive)
	m := d.Message()
	require.Equal(t, "x1", m.ID)
	require.Equal(t, 1, m.Attempt, "a replayed message starts again at attempt 1")
	require.Empty(t, m.Headers[broker.HeaderLastError])
	require.Equal(t, "v-x1", m.Headers["app-header"])
	require.Equal(t, "evt.dead", m.Type)
	require.Equal(t, "k-x1", m.Key)
	require.NoError(t, d.Ack(ctx))
	receiveNone(t, by, quiet)

	list, err = dlq.List(ctx, 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "x3", list[0].Message.ID)

	// Replay all, then dead-letter it again, then purge all.
	replayed, err = dlq.Replay(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"x3"}, replayed)
	d = receive(t, sub, arrive)
	require.Equal(t, "x3", d.Message().ID)
	require.NoError(t, d.DeadLetter(ctx, "still bad"))
	purged, err = dlq.Purge(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"x3"}, purged)
	list, err = dlq.List(ctx, 0)
	require.NoError(t, err)
	require.Empty(t, list)
	replayed, err = dlq.Replay(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, replayed)
	receiveNone(t, sub, quiet/2)
}

func (s *suite) testDoubleSettle(t *testing.T) {
	tp := s.topo(t, q("a", "evt.ds"))
	b := s.declared(t, tp)
	sub := subscribe(t, b, tp.Queues[0].Name, 0)
	publish(t, b, msg("s1", "evt.ds"), msg("s2", "evt.ds"), msg("s3", "evt.ds"))
	ctx := ctxFor(t, 30*time.Second)
	settle := []func(d broker.Delivery) error{
		func(d broker.Delivery) error { return d.Ack(ctx) },
		func(d broker.Delivery) error { return d.Retry(ctx, retryLevel1, "again") },
		func(d broker.Delivery) error { return d.DeadLetter(ctx, "dead") },
	}
	for i := 0; i < 3; i++ {
		d := receive(t, sub, arrive)
		require.NoError(t, settle[i](d))
		for j, second := range settle {
			require.ErrorIs(t, second(d), broker.ErrAlreadyAcked, "settle %d then %d", i, j)
		}
	}
	// s2 was retried: it comes back once; the others never.
	d := receive(t, sub, arrive)
	require.Equal(t, 2, d.Message().Attempt)
	require.NoError(t, d.Ack(ctx))
	receiveNone(t, sub, quiet)
}

func (s *suite) testRedeliveredAfterClose(t *testing.T) {
	tp := s.topo(t, q("a", "evt.redeliver"))
	b1 := s.declared(t, tp)
	sub1 := subscribe(t, b1, tp.Queues[0].Name, 0)
	publish(t, b1, msg("rd1", "evt.redeliver"))
	d := receive(t, sub1, arrive)
	require.Equal(t, "rd1", d.Message().ID)
	// Never settled: a crash. The broker closes and the message comes back.
	require.NoError(t, b1.Close())
	require.Error(t, d.Ack(ctxFor(t, 5*time.Second)), "settling after the broker's Close fails")

	b2 := s.declared(t, tp)
	sub2 := subscribe(t, b2, tp.Queues[0].Name, 0)
	d2 := receive(t, sub2, arrive)
	m := d2.Message()
	require.Equal(t, "rd1", m.ID, "the same ID on redelivery")
	require.Equal(t, []byte(`{"id":"rd1"}`), m.Body)
	if b2.Capabilities().CountsRedeliveries {
		require.GreaterOrEqual(t, m.Attempt, 2)
	} else {
		require.Equal(t, 1, m.Attempt, "a redelivery is not a retry")
	}
	require.NoError(t, d2.Ack(ctxFor(t, 10*time.Second)))
	receiveNone(t, sub2, quiet)
}

func (s *suite) testSettleAfterSubscriptionClose(t *testing.T) {
	tp := s.topo(t, q("a", "evt.subclose"))
	b := s.declared(t, tp)
	sub := subscribe(t, b, tp.Queues[0].Name, 0)
	publish(t, b, msg("sc1", "evt.subclose"), msg("sc2", "evt.subclose"))
	d := receive(t, sub, arrive)
	first := d.Message().ID
	require.NoError(t, sub.Close())
	require.NoError(t, sub.Close(), "a second Close returns nil")
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := sub.Receive(rctx)
	require.ErrorIs(t, err, broker.ErrClosed, "Receive after the subscription's Close")
	// A delivery handed out before Close can still be settled.
	require.NoError(t, d.Ack(ctxFor(t, 10*time.Second)))
	// The other message (prefetched or not) is not lost, and the acked one
	// does not come back.
	sub2 := subscribe(t, b, tp.Queues[0].Name, 0)
	d2 := receive(t, sub2, arrive)
	require.NotEqual(t, first, d2.Message().ID)
	require.NoError(t, d2.Ack(ctxFor(t, 10*time.Second)))
	receiveNone(t, sub2, quiet+ackDeadline)
}

func (s *suite) testConcurrentReceivers(t *testing.T) {
	tp := s.topo(t, q("a", "evt.conc"))
	b := s.declared(t, tp)
	const n = 200
	var msgs []*broker.Message
	for i := 0; i < n; i++ {
		msgs = append(msgs, msg(strconv.Itoa(i), "evt.conc"))
	}
	// Concurrent publishers.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for p := 0; p < 4; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs <- b.Publish(ctx, msgs[p*n/4:(p+1)*n/4])
		}(p)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	sub := subscribe(t, b, tp.Queues[0].Name, 20)
	var mu sync.Mutex
	seen := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				done := len(seen) == n
				mu.Unlock()
				if done {
					return
				}
				rctx, rcancel := context.WithTimeout(ctx, 500*time.Millisecond)
				d, err := sub.Receive(rctx)
				rcancel()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					continue
				}
				mu.Lock()
				seen[d.Message().ID]++
				mu.Unlock()
				_ = d.Ack(ctx)
			}
		}()
	}
	wg.Wait()
	require.Len(t, seen, n, "every published message received")
	for id, c := range seen {
		require.Equal(t, 1, c, "message %s received %d times", id, c)
	}
}

func (s *suite) testUnknownQueue(t *testing.T) {
	tp := s.topo(t, q("a", "evt.uq"))
	b := s.declared(t, tp)
	_, err := b.Subscribe(ctxFor(t, 10*time.Second), tp.Queues[0].Name+"-undeclared", broker.SubscribeOptions{})
	require.ErrorIs(t, err, broker.ErrUnknownQueue)
	requireUnknownDLQ(t, b, tp.Queues[0].Name+"-undeclared")
	fresh := s.newBroker(t)
	_, err = fresh.Subscribe(ctxFor(t, 10*time.Second), tp.Queues[0].Name, broker.SubscribeOptions{})
	require.ErrorIs(t, err, broker.ErrUnknownQueue, "a queue this broker did not declare")
}

// requireUnknownDLQ checks that the DLQ of queue, which exists nowhere,
// is ErrUnknownQueue, either from DLQ or from every DeadLetterQueue
// method, with the queue named; it asks twice, so a lookup that created
// the queue would be caught by the second round.
func requireUnknownDLQ(t *testing.T, b broker.Broker, queue string) {
	t.Helper()
	ctx := ctxFor(t, 30*time.Second)
	for round := 1; round <= 2; round++ {
		dlq, err := b.DLQ(queue)
		if err != nil {
			require.ErrorIs(t, err, broker.ErrUnknownQueue, "round %d: DLQ(%q)", round, queue)
			require.ErrorContains(t, err, queue, "the error names the queue")
			continue
		}
		_, err = dlq.List(ctx, 0)
		require.ErrorIs(t, err, broker.ErrUnknownQueue, "round %d: List of %q", round, queue)
		require.ErrorContains(t, err, queue, "the error names the queue")
		_, err = dlq.Replay(ctx, nil)
		require.ErrorIs(t, err, broker.ErrUnknownQueue, "round %d: Replay of %q", round, queue)
		_, err = dlq.Purge(ctx, nil)
		require.ErrorIs(t, err, broker.ErrUnknownQueue, "round %d: Purge of %q", round, queue)
		_, err = dlq.Replay(ctx, []string{"x"})
		require.ErrorIs(t, err, broker.ErrUnknownQueue, "round %d: Replay of an ID in %q", round, queue)
	}
}

// testDLQWithoutDeclare: an operator's tool connects a second broker that
// never calls Declare and lists, replays and purges the DLQ of a queue
// the first broker declared; the replay reaches that queue only.
func (s *suite) testDLQWithoutDeclare(t *testing.T) {
	tp := s.topo(t, q("work", "evt.nodecl"), q("bystander", "evt.nodecl"))
	b := s.declared(t, tp)
	work, bystander := tp.Queues[0].Name, tp.Queues[1].Name
	sub := subscribe(t, b, work, 0)
	by := subscribe(t, b, bystander, 0)
	ctx := ctxFor(t, 60*time.Second)
	ids := []string{"n1", "n2", "n3"}
	for _, id := range ids {
		publish(t, b, msg(id, "evt.nodecl"))
		d := receive(t, sub, arrive)
		require.Equal(t, id, d.Message().ID)
		require.NoError(t, d.DeadLetter(ctx, "dead "+id))
	}
	require.Equal(t, ids, sorted(receiveIDs(t, by, 3)))

	tool := s.newBroker(t) // never declares
	dlq, err := tool.DLQ(work)
	require.NoError(t, err, "DLQ of a queue declared by another broker")
	list, err := dlq.List(ctx, 0)
	require.NoError(t, err)
	require.Len(t, list, 3)
	for i, dm := range list {
		require.Equal(t, ids[i], dm.Message.ID, "List is oldest first")
		require.Equal(t, "evt.nodecl", dm.Message.Type)
		require.Equal(t, "k-"+ids[i], dm.Message.Key)
		require.Equal(t, "dead "+ids[i], dm.LastError)
		require.Equal(t, "v-"+ids[i], dm.Message.Headers["app-header"])
	}
	limited, err := dlq.List(ctx, 1)
	require.NoError(t, err)
	require.Len(t, limited, 1)
	require.Equal(t, "n1", limited[0].Message.ID)

	// The bystander's DLQ is another one, and empty.
	byDLQ, err := tool.DLQ(bystander)
	require.NoError(t, err)
	byList, err := byDLQ.List(ctx, 0)
	require.NoError(t, err)
	require.Empty(t, byList)

	replayed, err := dlq.Replay(ctx, []string{"n2", "absent"})
	require.NoError(t, err)
	require.Equal(t, []string{"n2"}, replayed)
	d := receive(t, sub, arrive)
	require.Equal(t, "n2", d.Message().ID)
	require.Equal(t, 1, d.Message().Attempt, "a replayed message starts again at attempt 1")
	require.Empty(t, d.Message().Headers[broker.HeaderLastError])
	require.Equal(t, "evt.nodecl", d.Message().Type)
	require.Equal(t, "k-n2", d.Message().Key)
	require.NoError(t, d.Ack(ctx))
	receiveNone(t, by, quiet)

	purged, err := dlq.Purge(ctx, []string{"n3"})
	require.NoError(t, err)
	require.Equal(t, []string{"n3"}, purged)
	list, err = dlq.List(ctx, 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "n1", list[0].Message.ID)

	// The declaring broker sees the same DLQ, and both name the same
	// broker-side object.
	own, err := b.DLQ(work)
	require.NoError(t, err)
	where, err := dlq.Where(ctx)
	require.NoError(t, err, "Where of a DLQ found on the server")
	require.NotEmpty(t, where)
	require.NotContains(t, where, "\n", "Where is one line")
	ownWhere, err := own.Where(ctx)
	require.NoError(t, err)
	require.Equal(t, ownWhere, where, "the declaring broker and a tool name the same DLQ")
	list, err = own.List(ctx, 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	purged, err = dlq.Purge(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"n1"}, purged)
	list, err = own.List(ctx, 0)
	require.NoError(t, err)
	require.Empty(t, list)
	receiveNone(t, sub, quiet/2)
}

// testDLQOfQueueNowhere: the DLQ of a queue that exists on no exchange of
// the server is ErrUnknownQueue, for a broker that declared other queues
// and for one that declared nothing, and looking does not create it.
func (s *suite) testDLQOfQueueNowhere(t *testing.T) {
	tp := s.topo(t, q("a", "evt.nowhere"))
	b := s.declared(t, tp)
	nowhere := testenv.UniqueName("ct") + "-nowhere"
	requireUnknownDLQ(t, b, nowhere)
	requireUnknownDLQ(t, s.newBroker(t), nowhere)
	// A name no Declare accepts is unknown too, not a panic or a server
	// error.
	requireUnknownDLQ(t, s.newBroker(t), "no such queue")
}

func (s *suite) testClose(t *testing.T) {
	tp := s.topo(t, q("a", "evt.close"))
	b := s.declared(t, tp)
	sub := subscribe(t, b, tp.Queues[0].Name, 0)
	dlq, err := b.DLQ(tp.Queues[0].Name)
	require.NoError(t, err)

	// A Receive blocked when Close is called returns ErrClosed.
	blocked := make(chan error, 1)
	go func() {
		_, err := sub.Receive(context.Background())
		blocked <- err
	}()
	time.Sleep(100 * time.Millisecond)

	start := time.Now()
	require.NoError(t, b.Close())
	require.Less(t, time.Since(start), 5*time.Second, "Close is bounded")
	require.NoError(t, b.Close(), "a second Close returns nil")
	select {
	case err := <-blocked:
		require.ErrorIs(t, err, broker.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("a blocked Receive was not interrupted by Close")
	}

	ctx := ctxFor(t, 10*time.Second)
	require.ErrorIs(t, b.Declare(ctx, tp), broker.ErrClosed)
	require.ErrorIs(t, b.Publish(ctx, []*broker.Message{msg("z", "evt.close")}), broker.ErrClosed)
	_, err = b.Subscribe(ctx, tp.Queues[0].Name, broker.SubscribeOptions{})
	require.ErrorIs(t, err, broker.ErrClosed)
	_, err = b.DLQ(tp.Queues[0].Name)
	require.ErrorIs(t, err, broker.ErrClosed)
	_, err = dlq.List(ctx, 0)
	require.ErrorIs(t, err, broker.ErrClosed)
	_, err = dlq.Replay(ctx, nil)
	require.ErrorIs(t, err, broker.ErrClosed)
	_, err = dlq.Purge(ctx, nil)
	require.ErrorIs(t, err, broker.ErrClosed)
	_, err = dlq.Where(ctx)
	require.ErrorIs(t, err, broker.ErrClosed)
	_, err = sub.Receive(ctx)
	require.ErrorIs(t, err, broker.ErrClosed)
	require.NoError(t, sub.Close())
}

// testOutage stops the server in the middle of publishing and consuming.
// Publish during the outage must either fail or block until its deadline;
// every message Publish confirmed (returned nil for) must be received after
// the restart, and the subscription must resume by itself.
func (s *suite) testOutage(t *testing.T) {
	require.NotNil(t, s.h.StopServer, "brokertest: Harness.StopServer is required for the outage test")
	require.NotNil(t, s.h.StartServer, "brokertest: Harness.StartServer is required for the outage test")
	tp := s.topo(t, q("a", "evt.outage"))
	pub := s.declared(t, tp)
	cons := s.declared(t, tp)
	idle := s.declared(t, tp) // closed during the outage
	sub := subscribe(t, cons, tp.Queues[0].Name, 5)

	var (
		stopOnce  sync.Once
		mu        sync.Mutex
		confirmed = map[string]bool{}
		received  = map[string]bool{}
		pubErrs   int
		slowest   time.Duration
	)
	const pubDeadline = 2 * time.Second
	stopPub := make(chan struct{})
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for batch := 0; ; batch++ {
			select {
			case <-stopPub:
				return
			default:
			}
			var msgs []*broker.Message
			for i := 0; i < 5; i++ {
				msgs = append(msgs, msg(fmt.Sprintf("o%d-%d", batch, i), "evt.outage"))
			}
			ctx, cancel := context.WithTimeout(context.Background(), pubDeadline)
			start := time.Now()
			err := pub.Publish(ctx, msgs)
			took := time.Since(start)
			cancel()
			failed := broker.FailedIndexes(err, len(msgs))
			mu.Lock()
			if took > slowest {
				slowest = took
			}
			if err != nil {
				pubErrs++
			}
			for i, m := range msgs {
				if _, bad := failed[i]; !bad {
					confirmed[m.ID] = true
				}
			}
			mu.Unlock()
			if err != nil {
				time.Sleep(50 * time.Millisecond)
			} else {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	consCtx, consCancel := context.WithCancel(context.Background())
	consDone := make(chan struct{})
	go func() {
		defer close(consDone)
		for {
			d, err := sub.Receive(consCtx)
			if err != nil {
				if consCtx.Err() != nil {
					return
				}
				t.Errorf("Receive during the outage test: %v (the subscription must keep reconnecting)", err)
				return
			}
			mu.Lock()
			received[d.Message().ID] = true
			mu.Unlock()
			// Settling may fail while the server is down; the message is
			// then redelivered, which the map absorbs.
			_ = d.Ack(consCtx)
		}
	}()
	stopPublisher := func() {
		stopOnce.Do(func() { close(stopPub) })
		<-pubDone
	}
	defer func() {
		stopPublisher()
		consCancel()
		<-consDone
	}()

	time.Sleep(700 * time.Millisecond)
	mu.Lock()
	before := len(confirmed)
	mu.Unlock()
	require.Positive(t, before, "nothing was confirmed before the outage")

	stopped := true
	s.h.StopServer(t)
	defer func() {
		if stopped {
			s.h.StartServer(t)
		}
	}()
	time.Sleep(s.h.OutageDuration / 2)
	// Close is bounded even when the server is unreachable.
	start := time.Now()
	require.NoError(t, idle.Close())
	require.Less(t, time.Since(start), 5*time.Second, "Close while the server is down is bounded")
	time.Sleep(s.h.OutageDuration / 2)
	s.h.StartServer(t)
	stopped = false

	// Keep publishing after the restart until new confirms come in.
	mu.Lock()
	atRestart := len(confirmed)
	mu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		n := len(confirmed)
		mu.Unlock()
		if n >= atRestart+20 {
			break
		}
		require.True(t, time.Now().Before(deadline), "Publish did not recover within 60s after the restart")
		time.Sleep(100 * time.Millisecond)
	}
	stopPublisher()

	// Everything confirmed arrives.
	deadline = time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		var missing []string
		for id := range confirmed {
			if !received[id] {
				missing = append(missing, id)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			sort.Strings(missing)
			t.Fatalf("%d confirmed message(s) never received after the outage, e.g. %v", len(missing), missing[:min(10, len(missing))])
		}
		time.Sleep(100 * time.Millisecond)
	}
	mu.Lock()
	t.Logf("outage: %d confirmed, %d received, %d publish errors, slowest Publish %v", len(confirmed), len(received), pubErrs, slowest)
	require.Less(t, slowest, pubDeadline+3*time.Second, "Publish blocked past its deadline during the outage")
	mu.Unlock()

	// The subscription resumed by itself: a fresh message arrives on it.
	publish(t, pub, msg("after-outage", "evt.outage"))
	deadline = time.Now().Add(arrive)
	for {
		mu.Lock()
		ok := received["after-outage"]
		mu.Unlock()
		if ok {
			break
		}
		require.True(t, time.Now().Before(deadline), "the subscription did not resume after the outage")
		time.Sleep(50 * time.Millisecond)
	}
}

// testTopologyDeleted deletes the topology (exchange, queues, streams)
// under a running publisher and a running consumer, two brokers as a relay
// and a worker would be, twice. Both must heal by themselves within
// seconds, without a reconnect: every message whose Publish started after
// the deletion and returned nil is received, and no Publish started after
// the deletion reports a message unroutable (a relay would park the row).
// Messages that sat in a queue when it was deleted are lost by the
// deletion itself; the test does not count them.
func (s *suite) testTopologyDeleted(t *testing.T) {
	if s.h.RemoveTopology == nil {
		t.Skip("brokertest: this adapter's harness has no RemoveTopology hook; topology self-healing is not tested for it")
	}
	tp := s.topo(t, q("a", "evt.heal.*"))
	pub := s.declared(t, tp)
	cons := s.declared(t, tp)
	sub := subscribe(t, cons, tp.Queues[0].Name, 10)

	type sent struct {
		start time.Time
		id    string
	}
	var (
		mu         sync.Mutex
		confirmed  []sent
		received   = map[string]time.Time{}
		unroutable []string
		lastErr    error
		lastErrAt  time.Time
	)
	stopPub := make(chan struct{})
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for batch := 0; ; batch++ {
			select {
			case <-stopPub:
				return
			default:
			}
			var msgs []*broker.Message
			for i := 0; i < 3; i++ {
				msgs = append(msgs, msg(fmt.Sprintf("h%d-%d", batch, i), "evt.heal.x"))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			start := time.Now()
			err := pub.Publish(ctx, msgs)
			cancel()
			failed := broker.FailedIndexes(err, len(msgs))
			mu.Lock()
			for i, m := range msgs {
				e, bad := failed[i]
				if !bad {
					confirmed = append(confirmed, sent{start, m.ID})
					continue
				}
				if errors.Is(e, broker.ErrUnroutable) {
					unroutable = append(unroutable, fmt.Sprintf("%s at %s: %v", m.ID, start.Format("15:04:05.000"), e))
				}
			}
			if err != nil {
				lastErr, lastErrAt = err, time.Now()
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	consCtx, consCancel := context.WithCancel(context.Background())
	consDone := make(chan struct{})
	go func() {
		defer close(consDone)
		for {
			d, err := sub.Receive(consCtx)
			if err != nil {
				if consCtx.Err() == nil {
					t.Errorf("Receive after the topology was deleted: %v (the subscription must heal by itself)", err)
				}
				return
			}
			mu.Lock()
			received[d.Message().ID] = time.Now()
			mu.Unlock()
			_ = d.Ack(consCtx)
		}
	}()
	stopPublisher := sync.OnceFunc(func() {
		close(stopPub)
		<-pubDone
	})
	defer func() {
		stopPublisher()
		consCancel()
		<-consDone
	}()

	countSince := func(at time.Time) (confirms, arrived int) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range confirmed {
			if c.start.After(at) {
				confirms++
				if _, ok := received[c.id]; ok {
					arrived++
				}
			}
		}
		return confirms, arrived
	}
	waitFlow := func(since time.Time, what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			c, a := countSince(since)
			if c >= 10 && a >= 10 {
				return
			}
			if time.Now().After(deadline) {
				mu.Lock()
				le, at := lastErr, lastErrAt
				mu.Unlock()
				t.Fatalf("%s: after 30s only %d message(s) confirmed and %d received (last Publish error at %s: %v)",
					what, c, a, at.Format("15:04:05.000"), le)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFlow(time.Now(), "before the deletion")

	var deletedAt []time.Time
	for round := 1; round <= 2; round++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := s.h.RemoveTopology(ctx, t, tp)
		cancel()
		require.NoError(t, err, "Harness.RemoveTopology (round %d)", round)
		at := time.Now()
		deletedAt = append(deletedAt, at)
		waitFlow(at, fmt.Sprintf("round %d: publisher and consumer did not recover from the deleted topology", round))
		t.Logf("round %d: flowing again %v after the deletion", round, time.Since(at).Round(time.Millisecond))
	}
	stopPublisher()

	// Every message published after the first deletion and confirmed
	// arrives.
	first := deletedAt[0]
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		var missing []string
		for _, c := range confirmed {
			if _, ok := received[c.id]; !ok && c.start.After(first) && !nearDeletion(c.start, deletedAt[1:]) {
				missing = append(missing, c.id)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d message(s) confirmed after the topology was deleted were never received, e.g. %v", len(missing), missing[:min(10, len(missing))])
		}
		time.Sleep(100 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, unroutable, "Publish reported messages unroutable after the topology was deleted: the adapter must declare the topology again, not let a relay park the rows")
}

// nearDeletion reports whether a publish that started at start may have
// been in a queue when a later deletion (at one of dels) removed it: it
// started within 5s before that deletion.
func nearDeletion(start time.Time, dels []time.Time) bool {
	for _, d := range dels {
		if start.Before(d) && d.Sub(start) < 5*time.Second {
			return true
		}
	}
	return false
}
