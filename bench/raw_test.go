package bench

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferrymq/ferry/bench/suite"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/internal/testenv"
)

// The raw baselines publish n messages of the benchmark's size to tp's
// exchange with the broker's own client, no ferry code, and return
// messages/s. Each broker has two: a single publisher (RabbitMQ: one
// confirm channel pipelining batches of the relay's BatchSize; NATS: one
// stream of every message published asynchronously, every PubAck awaited at
// the end) and the relay's shape (as many publishers at once as the relay
// publishes with, each publishing a batch of BatchSize and awaiting all its
// confirms before the next batch).

// rawSingle is the single-publisher baseline of kind; batch is the
// RabbitMQ channel's batch (the NATS stream has none).
func rawSingle(b *testing.B, kind string, tp broker.Topology, n, batch int) float64 {
	b.Helper()
	switch kind {
	case "rabbitmq":
		return rawRabbitMQ(b, tp.Exchange, n, 1, batch)
	case "nats":
		return rawNATSStream(b, tp.Exchange, n)
	case "kafka":
		return rawKafka(b, tp.Exchange, n, 1, batch)
	case "sqs":
		return rawSQS(b, tp, n, 1, batch)
	}
	b.Fatalf("bench: unknown broker %q", kind)
	return 0
}

// rawParallel is the baseline in the relay's shape: publishers publishing
// at the same time (RabbitMQ: confirm channels of one connection; NATS:
// goroutines on one connection and JetStream context, as the relay's claim
// loops share the adapter's), each batches of batch messages with all
// their confirms awaited before the next.
func rawParallel(b *testing.B, kind string, tp broker.Topology, n, publishers, batch int) float64 {
	b.Helper()
	switch kind {
	case "rabbitmq":
		return rawRabbitMQ(b, tp.Exchange, n, publishers, batch)
	case "nats":
		return rawNATSBatches(b, tp.Exchange, n, publishers, batch)
	case "kafka":
		return rawKafka(b, tp.Exchange, n, publishers, batch)
	case "sqs":
		return rawSQS(b, tp, n, publishers, batch)
	}
	b.Fatalf("bench: unknown broker %q", kind)
	return 0
}

// rawRabbitMQ is the RabbitMQ baseline: amqp091-go on one connection with
// the given number of confirm-mode channels publishing at the same time,
// persistent and mandatory, batches pipelined per channel (all published,
// then all confirms awaited), the same headers as the adapter sends for an
// outbox row. The publishing is suite.RabbitMQPublish, shared with ferry
// bench's raw scenario.
func rawRabbitMQ(b *testing.B, exchange string, n, channels, batch int) float64 {
	conn, err := amqp.Dial(testenv.RabbitMQURL())
	must(b, err)
	defer conn.Close()
	elapsed, err := suite.RabbitMQPublish(benchCtx(b), conn, exchange, n, channels, batch, suite.EventBody(1, bodyBytes))
	must(b, err)
	return float64(n) / elapsed.Seconds()
}

// natsRaw is a raw NATS publisher: nats.go jetstream on its own
// connection with the adapter's async pending limit, messages with the
// adapter's subject and headers (Nats-Msg-Id included).
type natsRaw struct {
	nc      *natsgo.Conn
	js      jetstream.JetStream
	failed  atomic.Int64 // publishes the error handler reported
	subject string
	body    []byte
	created string
}

func newNATSRaw(b *testing.B, exchange string) *natsRaw {
	b.Helper()
	r := &natsRaw{subject: nats.StreamName(exchange) + "." + eventType, body: suite.EventBody(1, bodyBytes)}
	nc, err := natsgo.Connect(testenv.NATSURL())
	must(b, err)
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *natsgo.Msg, error) { r.failed.Add(1) }))
	must(b, err)
	r.nc, r.js = nc, js
	// Message IDs are unique per run: the stream's duplicate window must
	// not drop a later run's messages.
	r.created = broker.FormatTime(time.Now())
	return r
}

// publish starts the asynchronous publish of message i.
func (r *natsRaw) publish(i int) (jetstream.PubAckFuture, error) {
	id := "raw-" + strconv.Itoa(i)
	m := &natsgo.Msg{Subject: r.subject, Data: r.body, Header: natsgo.Header{
		jetstream.MsgIDHeader:    []string{id + "@" + r.created},
		"Ferry-Id":               []string{id},
		"Ferry-Type":             []string{eventType},
		"Ferry-Key":              []string{"user-" + strconv.Itoa(i%100)},
		broker.HeaderTraceparent: []string{traceparent},
		broker.HeaderCreatedAt:   []string{r.created},
	}}
	return r.js.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second))
}

// rawNATSStream is the NATS single-publisher baseline: PublishMsgAsync of
// all n messages, then every PubAck awaited (PublishAsyncComplete).
func rawNATSStream(b *testing.B, exchange string, n int) float64 {
	r := newNATSRaw(b, exchange)
	defer r.nc.Close()
	start := time.Now()
	for i := 1; i <= n; i++ {
		if _, err := r.publish(i); err != nil {
			b.Fatalf("bench: raw nats publish: %v", err)
		}
	}
	select {
	case <-r.js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		b.Fatalf("bench: raw nats: %d PubAcks still pending after 2 min", r.js.PublishAsyncPending())
	}
	elapsed := time.Since(start)
	if f := r.failed.Load(); f > 0 {
		b.Fatalf("bench: raw nats: %d publishes failed", f)
	}
	return float64(n) / elapsed.Seconds()
}

// rawNATSBatches is the NATS baseline in the relay's shape: publishers
// goroutines sharing one connection and JetStream context (as the relay's
// claim loops share the adapter's), each taking the next batch of batch
// messages, publishing them all with PublishMsgAsync and then awaiting
// every one's PubAck before taking the next batch: suite.NATSPublish,
// shared with ferry bench's raw scenario.
func rawNATSBatches(b *testing.B, exchange string, n, publishers, batch int) float64 {
	r := newNATSRaw(b, exchange)
	defer r.nc.Close()
	elapsed, err := suite.NATSPublish(benchCtx(b), r.js, r.subject, n, publishers, batch, r.body)
	must(b, err)
	if f := r.failed.Load(); f > 0 {
		b.Fatalf("bench: raw nats: %d publishes failed", f)
	}
	return float64(n) / elapsed.Seconds()
}

// fillOutbox inserts n unpublished outbox rows (the same type, body size
// and headers as produce's) and vacuums the table, as a backlog for the
// relay to drain.
func fillOutbox(b *testing.B, db database, n int) {
	b.Helper()
	ctx := benchCtx(b)
	_, err := db.pool.Exec(ctx, `
		INSERT INTO outbox (event_type, partition_key, payload, headers)
		SELECT $2, 'user-' || (g % 100), $3::bytea, jsonb_build_object('traceparent', $4::text)
		FROM generate_series(1, $1) g`, n, eventType, suite.EventBody(1, bodyBytes), traceparent)
	must(b, err)
	_, err = db.pool.Exec(ctx, `VACUUM ANALYZE outbox`)
	must(b, err)
}

// fillBusiness inserts n pending business rows (ids 1..n on a fresh
// database) and their unpublished outbox events, as produce would have
// committed them.
func fillBusiness(b *testing.B, db database, n int) {
	b.Helper()
	ctx := benchCtx(b)
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = suite.EventBody(int64(i+1), bodyBytes)
	}
	_, err := db.pool.Exec(ctx, `
		INSERT INTO notifications (id, user_id, channel, to_addr, subject, body)
		SELECT g, 'user-bench', 'email', 'someone@example.com', 'Your weekly summary', 'Hello!'
		FROM generate_series(1, $1) g`, n)
	must(b, err)
	_, err = db.pool.Exec(ctx, `
		INSERT INTO outbox (event_type, partition_key, payload, headers)
		SELECT $1, 'user-' || (ord % 100), body, jsonb_build_object('traceparent', $3::text)
		FROM unnest($2::bytea[]) WITH ORDINALITY AS e(body, ord)
		ORDER BY ord`, eventType, bodies, traceparent)
	must(b, err)
	_, err = db.pool.Exec(ctx, `VACUUM ANALYZE outbox, notifications`)
	must(b, err)
}

func describeMessage() string {
	m := &broker.Message{ID: "12345", Type: eventType, Key: "user-42", Body: suite.EventBody(12345, bodyBytes),
		Headers: map[string]string{broker.HeaderTraceparent: traceparent, broker.HeaderCreatedAt: broker.FormatTime(time.Now())}}
	return fmt.Sprintf("%d-byte messages (%d-byte body)", m.Size(), len(m.Body))
}
