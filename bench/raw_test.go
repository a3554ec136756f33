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

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/internal/testenv"
)

// rawBatch is the baseline's batch: publish 100, then await their confirms.
const rawBatch = 100

// rawPublish publishes n messages of the benchmark's size to tp's exchange
// with the broker's own client, no ferry code, and returns messages/s.
func rawPublish(b *testing.B, kind string, tp broker.Topology, n int) float64 {
	b.Helper()
	switch kind {
	case "rabbitmq":
		return rawRabbitMQ(b, tp.Exchange, n)
	case "nats":
		return rawNATS(b, tp.Exchange, n)
	}
	b.Fatalf("bench: unknown broker %q", kind)
	return 0
}

// rawRabbitMQ is the RabbitMQ baseline: amqp091-go on one confirm-mode
// channel, persistent and mandatory, batches of 100 pipelined (all
// published, then all confirms awaited), the same headers as the adapter
// sends for an outbox row.
func rawRabbitMQ(b *testing.B, exchange string, n int) float64 {
	ctx := benchCtx(b)
	conn, err := amqp.Dial(testenv.RabbitMQURL())
	must(b, err)
	defer conn.Close()
	ch, err := conn.Channel()
	must(b, err)
	must(b, ch.Confirm(false))
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	body := eventBody(1)
	dcs := make([]*amqp.DeferredConfirmation, 0, rawBatch)
	start := time.Now()
	for sent := 0; sent < n; {
		dcs = dcs[:0]
		for i := 0; i < rawBatch && sent < n; i++ {
			sent++
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, eventType, true, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, MessageId: strconv.Itoa(sent), Type: eventType, Body: body,
				Headers: amqp.Table{
					"x-ferry-key":            "user-" + strconv.Itoa(sent%100),
					broker.HeaderTraceparent: traceparent,
					broker.HeaderCreatedAt:   broker.FormatTime(time.Now()),
				},
			})
			must(b, err)
			dcs = append(dcs, dc)
		}
		for _, dc := range dcs {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				b.Fatalf("bench: raw rabbitmq publish not confirmed: ack=%v err=%v", ok, err)
			}
		}
		select {
		case r := <-returns:
			b.Fatalf("bench: raw rabbitmq publish returned: %s", r.ReplyText)
		default:
		}
	}
	return float64(n) / time.Since(start).Seconds()
}

// rawNATS is the NATS baseline: nats.go jetstream PublishMsgAsync of every
// message to the exchange's stream (same subject, same headers with a
// Nats-Msg-Id, the same async pending limit as the adapter), then every
// PubAck awaited.
func rawNATS(b *testing.B, exchange string, n int) float64 {
	nc, err := natsgo.Connect(testenv.NATSURL())
	must(b, err)
	defer nc.Close()
	var failed atomic.Int64
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *natsgo.Msg, error) { failed.Add(1) }))
	must(b, err)
	subject := nats.StreamName(exchange) + "." + eventType
	body := eventBody(1)
	created := broker.FormatTime(time.Now())
	start := time.Now()
	for i := 1; i <= n; i++ {
		id := "raw-" + strconv.Itoa(i)
		m := &natsgo.Msg{Subject: subject, Data: body, Header: natsgo.Header{
			jetstream.MsgIDHeader:    []string{id + "@" + created},
			"Ferry-Id":               []string{id},
			"Ferry-Type":             []string{eventType},
			"Ferry-Key":              []string{"user-" + strconv.Itoa(i%100)},
			broker.HeaderTraceparent: []string{traceparent},
			broker.HeaderCreatedAt:   []string{created},
		}}
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
			b.Fatalf("bench: raw nats publish: %v", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		b.Fatalf("bench: raw nats: %d PubAcks still pending after 2 min", js.PublishAsyncPending())
	}
	elapsed := time.Since(start)
	if f := failed.Load(); f > 0 {
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
		FROM generate_series(1, $1) g`, n, eventType, eventBody(1), traceparent)
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
		bodies[i] = eventBody(int64(i + 1))
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
	m := &broker.Message{ID: "12345", Type: eventType, Key: "user-42", Body: eventBody(12345),
		Headers: map[string]string{broker.HeaderTraceparent: traceparent, broker.HeaderCreatedAt: broker.FormatTime(time.Now())}}
	return fmt.Sprintf("%d-byte messages (%d-byte body)", m.Size(), len(m.Body))
}
