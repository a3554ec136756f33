package rabbitmq_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
)

// The benchmarks compare the adapter's Publish with the raw amqp091-go
// baseline, both publishing persistent 256-byte messages in batches of 100
// with publisher confirms (publish all, then wait for all) to one durable
// queue behind a topic exchange. They print msgs/s; compare the two in the
// same run:
//
//	go test ./brokers/rabbitmq -run '^$' -bench Publish -benchtime 20000x

const benchBatch = 100

// benchTopology declares a one-queue topology with an adapter and purges
// the queue regularly so the benchmark measures publishing, not a growing
// queue.
func benchTopology(b *testing.B) (broker.Topology, broker.Broker) {
	testenv.RequireTCP(b, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ad, err := rabbitmq.New(ctx, config())
	require.NoError(b, err)
	b.Cleanup(func() { ad.Close() })
	base := testenv.UniqueName("bench")
	tp := broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{Name: base + ".q", Bindings: []string{"bench.#"}, RetryDelays: []time.Duration{time.Second}}}}
	require.NoError(b, ad.Declare(ctx, tp))
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		deleteTopology(ctx, b, tp)
	})
	return tp, ad
}

func purge(b *testing.B, ch *amqp.Channel, queue string) {
	_, err := ch.QueuePurge(queue, false)
	require.NoError(b, err)
}

// BenchmarkPublishConfirmed is the baseline: raw amqp091-go on one
// confirm-mode channel, persistent, mandatory, batches of 100, every
// confirm awaited before the next batch.
func BenchmarkPublishConfirmed(b *testing.B) {
	tp, _ := benchTopology(b)
	conn, err := amqp.Dial(testenv.RabbitMQURL())
	require.NoError(b, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(b, err)
	require.NoError(b, ch.Confirm(false))
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	admin, err := conn.Channel()
	require.NoError(b, err)
	body := make([]byte, 256)
	ctx := context.Background()
	dcs := make([]*amqp.DeferredConfirmation, 0, benchBatch)
	b.ResetTimer()
	start := time.Now()
	sent := 0
	for sent < b.N {
		dcs = dcs[:0]
		for i := 0; i < benchBatch && sent < b.N; i++ {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, tp.Exchange, "bench.event", true, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, MessageId: strconv.Itoa(sent), Type: "bench.event", Body: body,
				Headers: amqp.Table{"x-ferry-key": "k"},
			})
			if err != nil {
				b.Fatal(err)
			}
			dcs = append(dcs, dc)
			sent++
		}
		for _, dc := range dcs {
			if !dc.Wait() {
				b.Fatal("nacked")
			}
		}
		select {
		case r := <-returns:
			b.Fatalf("returned: %s", r.ReplyText)
		default:
		}
		if sent%20000 == 0 {
			b.StopTimer()
			purge(b, admin, tp.Queues[0].Name)
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkAdapterPublish is the adapter's Publish of batches of 100, one
// caller at a time, as the relay calls it.
func BenchmarkAdapterPublish(b *testing.B) {
	benchAdapter(b, 1)
}

// BenchmarkAdapterPublishParallel is the adapter's Publish from 4
// concurrent callers (the pool of publishing channels at work).
func BenchmarkAdapterPublishParallel(b *testing.B) {
	benchAdapter(b, 4)
}

func benchAdapter(b *testing.B, callers int) {
	tp, ad := benchTopology(b)
	conn, err := amqp.Dial(testenv.RabbitMQURL())
	require.NoError(b, err)
	defer conn.Close()
	admin, err := conn.Channel()
	require.NoError(b, err)
	body := make([]byte, 256)
	ctx := context.Background()
	batches := make(chan int, callers)
	errs := make(chan error, callers)
	b.ResetTimer()
	start := time.Now()
	for c := 0; c < callers; c++ {
		go func() {
			var first error
			for start := range batches {
				if first != nil {
					continue // keep draining so the feeder never blocks
				}
				msgs := make([]*broker.Message, 0, benchBatch)
				for i := start; i < start+benchBatch && i < b.N; i++ {
					msgs = append(msgs, &broker.Message{ID: strconv.Itoa(i), Type: "bench.event", Key: "k", Body: body})
				}
				if err := ad.Publish(ctx, msgs); err != nil {
					first = fmt.Errorf("publish: %w", err)
				}
			}
			errs <- first
		}()
	}
	for first := 0; first < b.N; first += benchBatch {
		if first > 0 && first%20000 == 0 {
			if _, err := admin.QueuePurge(tp.Queues[0].Name, false); err != nil {
				b.Errorf("purge: %v", err)
				break
			}
		}
		batches <- first
	}
	close(batches)
	for c := 0; c < callers; c++ {
		require.NoError(b, <-errs)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}
