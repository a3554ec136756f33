package nats_test

import (
	"context"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/internal/testenv"
)

// lookupBroker connects a broker that never declares, with
// Config.LookupExchange set to exchange.
func lookupBroker(t *testing.T, exchange string) broker.Broker {
	t.Helper()
	testenv.RequireTCP(t, "nats", testenv.HostPort(testenv.NATSURL()))
	b, err := nats.New(ctxFor(t, 10*time.Second), nats.Config{URL: testenv.NATSURL(), LookupExchange: exchange})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// deadLetterOne publishes one message of type typ on b and dead-letters it
// from queue.
func deadLetterOne(t *testing.T, b broker.Broker, queue, id, typ string) {
	t.Helper()
	sub, err := b.Subscribe(ctxFor(t, 10*time.Second), queue, broker.SubscribeOptions{})
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, b.Publish(ctxFor(t, 10*time.Second), []*broker.Message{{ID: id, Type: typ, Body: []byte("b")}}))
	d := receive(t, sub, 10*time.Second)
	require.NoError(t, d.DeadLetter(ctxFor(t, 10*time.Second), "dead"))
}

// TestDLQLookupExchange: with Config.LookupExchange a broker that never
// declared finds a queue on that exchange only; a wrong exchange, or a
// queue not on it, is ErrUnknownQueue naming the exchange and stream, and
// the lookup creates no stream and no consumer.
func TestDLQLookupExchange(t *testing.T) {
	t.Parallel()
	tp := topology("nats-lookup", "evt.lookup")
	b := declared(t, tp)
	queue := tp.Queues[0].Name
	deadLetterOne(t, b, queue, "L1", "evt.lookup")
	ctx := ctxFor(t, 30*time.Second)

	list, err := mustDLQ(t, lookupBroker(t, tp.Exchange), queue).List(ctx, 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "L1", list[0].Message.ID)
	require.Equal(t, "evt.lookup", list[0].Message.Type)
	// The reading consumer List used is gone with the reading.
	dlqStream, err := jsFor(t).Stream(ctx, nats.StreamName(tp.Exchange)+"-dlq")
	require.NoError(t, err)
	dlqInfo, err := dlqStream.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, dlqInfo.State.Consumers, "consumers left on the DLQ stream after a List")

	// The queue is not on this (existing) exchange.
	other := topology("nats-lookup-other", "evt.other")
	declared(t, other)
	_, err = mustDLQ(t, lookupBroker(t, other.Exchange), queue).List(ctx, 0)
	require.ErrorIs(t, err, broker.ErrUnknownQueue)
	require.ErrorContains(t, err, queue)
	require.ErrorContains(t, err, other.Exchange)
	require.ErrorContains(t, err, nats.StreamName(other.Exchange))

	// An exchange that does not exist: nothing is created.
	missing := testenv.UniqueName("nats-lookup-missing")
	lb := lookupBroker(t, missing)
	for _, op := range []func(broker.DeadLetterQueue) error{
		func(d broker.DeadLetterQueue) error { _, err := d.List(ctx, 0); return err },
		func(d broker.DeadLetterQueue) error { _, err := d.Replay(ctx, nil); return err },
		func(d broker.DeadLetterQueue) error { _, err := d.Purge(ctx, nil); return err },
	} {
		err := op(mustDLQ(t, lb, queue))
		require.ErrorIs(t, err, broker.ErrUnknownQueue)
		require.ErrorContains(t, err, missing)
	}
	js := jsFor(t)
	for _, s := range []string{nats.StreamName(missing), nats.StreamName(missing) + "-dlq"} {
		_, err := js.Stream(ctx, s)
		require.ErrorIs(t, err, jetstream.ErrStreamNotFound, "the lookup must not create stream %s", s)
	}
	_, err = js.Consumer(ctx, nats.StreamName(tp.Exchange), nats.ConsumerName(queue))
	require.NoError(t, err, "the declared queue's consumer is named ConsumerName(queue)")
	_, err = js.Consumer(ctx, nats.StreamName(other.Exchange), nats.ConsumerName(queue))
	require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, "the lookup must not create a consumer")

	// Declared queues are found on their exchange whatever LookupExchange
	// says.
	cfgd, err := nats.New(ctx, nats.Config{URL: testenv.NATSURL(), LookupExchange: other.Exchange})
	require.NoError(t, err)
	defer cfgd.Close()
	require.NoError(t, cfgd.Declare(ctx, tp))
	list, err = mustDLQ(t, cfgd, queue).List(ctx, 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
}

// TestDLQSearchesExchanges: without LookupExchange a broker that never
// declared finds the queue's exchange by itself, replays to that queue,
// and names the exchanges it searched when the queue is nowhere.
func TestDLQSearchesExchanges(t *testing.T) {
	t.Parallel()
	tp := topology("nats-search", "evt.search")
	b := declared(t, tp)
	queue := tp.Queues[0].Name
	deadLetterOne(t, b, queue, "S1", "evt.search")
	ctx := ctxFor(t, 30*time.Second)

	tool := lookupBroker(t, "")
	dlq := mustDLQ(t, tool, queue)
	replayed, err := dlq.Replay(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"S1"}, replayed)
	sub, err := b.Subscribe(ctx, queue, broker.SubscribeOptions{})
	require.NoError(t, err)
	defer sub.Close()
	d := receive(t, sub, 10*time.Second)
	require.Equal(t, "S1", d.Message().ID)
	require.Equal(t, 1, d.Message().Attempt)
	require.NoError(t, d.Ack(ctx))

	_, err = mustDLQ(t, tool, queue+"-nowhere").List(ctx, 0)
	require.ErrorIs(t, err, broker.ErrUnknownQueue)
	require.ErrorContains(t, err, "no queue")
	require.ErrorContains(t, err, queue+"-nowhere")
}

func TestLookupExchangeValidated(t *testing.T) {
	_, err := nats.New(context.Background(), nats.Config{URL: testenv.NATSURL(), LookupExchange: "bad exchange"})
	require.ErrorContains(t, err, "LookupExchange")
}

func mustDLQ(t *testing.T, b broker.Broker, queue string) broker.DeadLetterQueue {
	t.Helper()
	d, err := b.DLQ(queue)
	require.NoError(t, err)
	return d
}

func jsFor(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := natsgo.Connect(testenv.NATSURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}
