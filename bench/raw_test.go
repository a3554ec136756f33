package bench

import (
	"fmt"
	"strconv"
	"sync"
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

// rawPublish publishes n messages of the benchmark's size to tp's exchange
// with the broker's own client, no ferry code, and returns messages/s.
// channels is the RabbitMQ baseline's parallelism (confirm channels
// publishing at the same time) and batch the number of messages each
// publishes before awaiting their confirms; the NATS baseline ignores both.
func rawPublish(b *testing.B, kind string, tp broker.Topology, n, channels, batch int) float64 {
	b.Helper()
	switch kind {
	case "rabbitmq":
		return rawRabbitMQ(b, tp.Exchange, n, channels, batch)
	case "nats":
		return rawNATS(b, tp.Exchange, n)
	}
	b.Fatalf("bench: unknown broker %q", kind)
	return 0
}

// rawRabbitMQ is the RabbitMQ baseline: amqp091-go on one connection with
// the given number of confirm-mode channels publishing at the same time
// (each from its own goroutine, as the relay's claim loops publish
// concurrently through the adapter's channel pool), persistent and
// mandatory, batches pipelined per channel (all published, then all
// confirms awaited), the same headers as the adapter sends for an outbox
// row.
func rawRabbitMQ(b *testing.B, exchange string, n, channels, batch int) float64 {
	ctx := benchCtx(b)
	conn, err := amqp.Dial(testenv.RabbitMQURL())
	must(b, err)
	defer conn.Close()
	type pub struct {
		ch      *amqp.Channel
		returns chan amqp.Return
	}
	pubs := make([]pub, channels)
	for i := range pubs {
		ch, err := conn.Channel()
		must(b, err)
		must(b, ch.Confirm(false))
		pubs[i] = pub{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1))}
	}
	body := eventBody(1)
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		failed  atomic.Bool
		failure string
	)
	fail := func(format string, args ...any) {
		errOnce.Do(func() { failure = fmt.Sprintf(format, args...) })
		failed.Store(true)
	}
	start := time.Now()
	for _, p := range pubs {
		wg.Go(func() {
			dcs := make([]*amqp.DeferredConfirmation, 0, batch)
			for {
				first := int(next.Add(int64(batch))) - batch
				if first >= n || failed.Load() {
					return
				}
				dcs = dcs[:0]
				for id := first + 1; id <= min(first+batch, n); id++ {
					dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, eventType, true, false, amqp.Publishing{
						DeliveryMode: amqp.Persistent, MessageId: strconv.Itoa(id), Type: eventType, Body: body,
						Headers: amqp.Table{
							"x-ferry-key":            "user-" + strconv.Itoa(id%100),
							broker.HeaderTraceparent: traceparent,
							broker.HeaderCreatedAt:   broker.FormatTime(time.Now()),
						},
					})
					if err != nil {
						fail("bench: raw rabbitmq publish: %v", err)
						return
					}
					dcs = append(dcs, dc)
				}
				for _, dc := range dcs {
					if ok, err := dc.WaitContext(ctx); err != nil || !ok {
						fail("bench: raw rabbitmq publish not confirmed: ack=%v err=%v", ok, err)
						return
					}
				}
				select {
				case r := <-p.returns:
					fail("bench: raw rabbitmq publish returned: %s", r.ReplyText)
					return
				default:
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if failed.Load() {
		b.Fatal(failure)
	}
	return float64(n) / elapsed.Seconds()
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
