package suite

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferrymq/ferry/broker"
)

// The raw baselines move messages through a broker with its own client
// and no ferry code, in the relay's shape: publishers publishing at once,
// each a batch of the relay's BatchSize with every confirm awaited before
// the next batch; then one consumer acking each message (Kafka: committing
// its offset every batch, a commit covering the records below it). They are the
// denominator of every ratio ferry bench reports.

// errNoRaw is returned by newRawClient for a broker without a raw
// baseline (yet).
var errNoRaw = errors.New("no raw baseline for this broker")

// errNoReplay is returned by rawClient.replay when the broker cannot
// re-read consumed messages.
var errNoReplay = errors.New("not supported")

// rawClient is one broker's own client on a topic of its own (a RabbitMQ
// exchange and queue, a JetStream stream, a Kafka topic), created by newRawClient and
// removed by close.
type rawClient interface {
	// publish sends n messages of a size-byte body with publisher confirms
	// and returns the time until the last was confirmed.
	publish(ctx context.Context, n, size int) (time.Duration, error)
	// consume receives and acks n messages and returns the time it took.
	consume(ctx context.Context, n int) (time.Duration, error)
	// replay reads the n consumed messages again from the start; it
	// returns an error wrapping errNoReplay, saying why, where the broker
	// cannot.
	replay(ctx context.Context, n int) (time.Duration, error)
	// version is the server's version.
	version() string
	close()
}

// newRawClient connects the raw client of broker kind to url.
func newRawClient(ctx context.Context, kind, url string) (rawClient, error) {
	switch kind {
	case "rabbitmq":
		return newRabbitRawClient(url)
	case "nats":
		return newNATSRawClient(ctx, url)
	case "kafka":
		return newKafkaRawClient(ctx, url)
	case "sqs":
		return newSQSRawClient(ctx, url)
	}
	return nil, errNoRaw
}

// rawHeaders are the headers the adapters send for an outbox row.
func rawHeaders(id int, created string) map[string]string {
	return map[string]string{
		"x-ferry-key":            "user-" + strconv.Itoa(id%100),
		broker.HeaderTraceparent: traceparent,
		broker.HeaderCreatedAt:   created,
	}
}

// RabbitMQPublish publishes n messages with body to exchange with routing
// key EventType through conn: channels confirm-mode channels publishing at
// the same time, persistent and mandatory, each taking the next batch of
// batch messages, publishing them all and then awaiting every confirm
// before the next batch (the relay's shape). It returns the elapsed time;
// an unconfirmed or returned message is an error. The Go benchmarks and
// ferry bench share it.
func RabbitMQPublish(ctx context.Context, conn *amqp.Connection, exchange string, n, channels, batch int, body []byte) (time.Duration, error) {
	type pub struct {
		ch      *amqp.Channel
		returns chan amqp.Return
	}
	pubs := make([]pub, channels)
	for i := range pubs {
		ch, err := conn.Channel()
		if err != nil {
			return 0, fmt.Errorf("bench: raw rabbitmq channel: %w", err)
		}
		defer ch.Close()
		if err := ch.Confirm(false); err != nil {
			return 0, fmt.Errorf("bench: raw rabbitmq confirm mode: %w", err)
		}
		pubs[i] = pub{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1))}
	}
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		failed  atomic.Bool
		failure error
	)
	fail := func(err error) {
		errOnce.Do(func() { failure = err })
		failed.Store(true)
	}
	created := broker.FormatTime(time.Now())
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
					h := amqp.Table{}
					for k, v := range rawHeaders(id, created) {
						h[k] = v
					}
					dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, EventType, true, false, amqp.Publishing{
						DeliveryMode: amqp.Persistent, MessageId: strconv.Itoa(id), Type: EventType, Body: body, Headers: h,
					})
					if err != nil {
						fail(fmt.Errorf("bench: raw rabbitmq publish: %w", err))
						return
					}
					dcs = append(dcs, dc)
				}
				for _, dc := range dcs {
					if ok, err := dc.WaitContext(ctx); err != nil || !ok {
						fail(fmt.Errorf("bench: raw rabbitmq publish not confirmed: ack=%v err=%v", ok, err))
						return
					}
				}
				select {
				case r := <-p.returns:
					fail(fmt.Errorf("bench: raw rabbitmq publish returned: %s", r.ReplyText))
					return
				default:
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), failure
}

// NATSPublish publishes n messages with body to subject through js:
// publishers goroutines sharing js (as the relay's claim loops share the
// adapter's), each taking the next batch of batch messages, publishing
// them with PublishMsgAsync and awaiting every PubAck before the next
// batch (the relay's shape), with the adapter's headers (Nats-Msg-Id
// unique per call). It returns the elapsed time; a failed publish is an
// error. The Go benchmarks and ferry bench share it.
func NATSPublish(ctx context.Context, js jetstream.JetStream, subject string, n, publishers, batch int, body []byte) (time.Duration, error) {
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		failed  atomic.Bool
		failure error
	)
	fail := func(err error) {
		errOnce.Do(func() { failure = err })
		failed.Store(true)
	}
	created := broker.FormatTime(time.Now())
	start := time.Now()
	for range publishers {
		wg.Go(func() {
			futures := make([]jetstream.PubAckFuture, 0, batch)
			for {
				first := int(next.Add(int64(batch))) - batch
				if first >= n || failed.Load() {
					return
				}
				futures = futures[:0]
				for id := first + 1; id <= min(first+batch, n); id++ {
					sid := "raw-" + strconv.Itoa(id)
					h := natsgo.Header{
						jetstream.MsgIDHeader:    []string{sid + "@" + created},
						"Ferry-Id":               []string{sid},
						"Ferry-Type":             []string{EventType},
						"Ferry-Key":              []string{"user-" + strconv.Itoa(id%100)},
						broker.HeaderTraceparent: []string{traceparent},
						broker.HeaderCreatedAt:   []string{created},
					}
					f, err := js.PublishMsgAsync(&natsgo.Msg{Subject: subject, Data: body, Header: h}, jetstream.WithStallWait(30*time.Second))
					if err != nil {
						fail(fmt.Errorf("bench: raw nats publish: %w", err))
						return
					}
					futures = append(futures, f)
				}
				for _, f := range futures {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						fail(fmt.Errorf("bench: raw nats publish not acknowledged: %w", err))
						return
					case <-ctx.Done():
						fail(fmt.Errorf("bench: raw nats: PubAck not received: %w", ctx.Err()))
						return
					}
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), failure
}

// rabbitRawClient is amqp091-go on an exchange and a durable queue of its own.
type rabbitRawClient struct {
	conn     *amqp.Connection
	exchange string
	queue    string
}

func newRabbitRawClient(url string) (*rabbitRawClient, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("bench: raw rabbitmq: %w", err)
	}
	r := &rabbitRawClient{conn: conn, exchange: uniqueName("benchraw"), queue: ""}
	r.queue = r.exchange + ".q"
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("bench: raw rabbitmq: %w", err)
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(r.exchange, "topic", true, false, false, false, nil); err != nil {
		conn.Close()
		return nil, fmt.Errorf("bench: raw rabbitmq: %w", err)
	}
	if _, err := ch.QueueDeclare(r.queue, true, false, false, false, nil); err != nil {
		conn.Close()
		return nil, fmt.Errorf("bench: raw rabbitmq: %w", err)
	}
	if err := ch.QueueBind(r.queue, EventType, r.exchange, false, nil); err != nil {
		conn.Close()
		return nil, fmt.Errorf("bench: raw rabbitmq: %w", err)
	}
	return r, nil
}

func (r *rabbitRawClient) publish(ctx context.Context, n, size int) (time.Duration, error) {
	return RabbitMQPublish(ctx, r.conn, r.exchange, n, relayConcurrency, relayBatch, EventBody(1, size))
}

func (r *rabbitRawClient) consume(ctx context.Context, n int) (time.Duration, error) {
	ch, err := r.conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("bench: raw rabbitmq: %w", err)
	}
	defer ch.Close()
	if err := ch.Qos(2*relayBatch, 0, false); err != nil {
		return 0, fmt.Errorf("bench: raw rabbitmq qos: %w", err)
	}
	start := time.Now()
	ds, err := ch.ConsumeWithContext(ctx, r.queue, "", false, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("bench: raw rabbitmq consume: %w", err)
	}
	for got := 0; got < n; {
		select {
		case d, ok := <-ds:
			if !ok {
				return 0, errors.New("bench: raw rabbitmq: delivery channel closed")
			}
			if err := d.Ack(false); err != nil {
				return 0, fmt.Errorf("bench: raw rabbitmq ack: %w", err)
			}
			got++
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return time.Since(start), nil
}

// replay: a classic queue forgets an acked message.
func (r *rabbitRawClient) replay(context.Context, int) (time.Duration, error) {
	return 0, fmt.Errorf("%w: a classic queue removes a message when its consumer acks it and has no log to re-read", errNoReplay)
}

func (r *rabbitRawClient) version() string {
	if v, ok := r.conn.Properties["version"].(string); ok {
		return "RabbitMQ " + v
	}
	return "RabbitMQ (version unknown)"
}

func (r *rabbitRawClient) close() {
	if ch, err := r.conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(r.queue, false, false, false)
		_ = ch.ExchangeDelete(r.exchange, false, false)
		ch.Close()
	}
	r.conn.Close()
}

// natsRawClient is nats.go jetstream on a file-backed stream of its own with
// limits retention (messages stay after their ack, as ferry's streams).
type natsRawClient struct {
	nc      *natsgo.Conn
	js      jetstream.JetStream
	stream  string
	subject string
}

func newNATSRawClient(ctx context.Context, url string) (*natsRawClient, error) {
	nc, err := natsgo.Connect(url)
	if err != nil {
		return nil, fmt.Errorf("bench: raw nats: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("bench: raw nats: %w", err)
	}
	name := uniqueName("BENCHRAW")
	r := &natsRawClient{nc: nc, js: js, stream: name, subject: name + "." + EventType}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage}); err != nil {
		nc.Close()
		return nil, fmt.Errorf("bench: raw nats: create stream: %w", err)
	}
	return r, nil
}

func (r *natsRawClient) publish(ctx context.Context, n, size int) (time.Duration, error) {
	return NATSPublish(ctx, r.js, r.subject, n, relayConcurrency, relayBatch, EventBody(1, size))
}

// read takes n messages from consumer cfg, acking each when ack.
func (r *natsRawClient) read(ctx context.Context, cons jetstream.Consumer, n int, ack bool) (time.Duration, error) {
	start := time.Now()
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * relayBatch))
	if err != nil {
		return 0, fmt.Errorf("bench: raw nats: %w", err)
	}
	defer it.Stop()
	for got := 0; got < n; got++ {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		m, err := it.Next()
		if err != nil {
			return 0, fmt.Errorf("bench: raw nats: next: %w", err)
		}
		if ack {
			if err := m.Ack(); err != nil {
				return 0, fmt.Errorf("bench: raw nats ack: %w", err)
			}
		}
	}
	return time.Since(start), nil
}

func (r *natsRawClient) consume(ctx context.Context, n int) (time.Duration, error) {
	cons, err := r.js.CreateOrUpdateConsumer(ctx, r.stream, jetstream.ConsumerConfig{Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 2 * relayBatch})
	if err != nil {
		return 0, fmt.Errorf("bench: raw nats consumer: %w", err)
	}
	return r.read(ctx, cons, n, true)
}

// replay reads the stream again from its first message with an ordered
// consumer: JetStream keeps acked messages under limits retention.
func (r *natsRawClient) replay(ctx context.Context, n int) (time.Duration, error) {
	cons, err := r.js.OrderedConsumer(ctx, r.stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return 0, fmt.Errorf("bench: raw nats ordered consumer: %w", err)
	}
	return r.read(ctx, cons, n, false)
}

func (r *natsRawClient) version() string { return "nats-server " + r.nc.ConnectedServerVersion() }

func (r *natsRawClient) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = r.js.DeleteStream(ctx, r.stream)
	r.nc.Close()
}
