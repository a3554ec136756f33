package kafka_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/bench/suite"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/internal/testenv"
)

var benchBody = []byte(`{"to":"user@example.com","subject":"Welcome","template":"welcome","user_id":42}`)

// runBatches publishes b.N messages in batches of batch from callers
// goroutines with publish(first, n) and reports msgs/s.
func runBatches(b *testing.B, batch, callers int, publish func(first, n int) error) {
	var (
		mu   sync.Mutex
		next int
		wg   sync.WaitGroup
	)
	errs := make(chan error, callers)
	take := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		first := next
		n := min(batch, b.N-first)
		next += n
		return first, n
	}
	b.ResetTimer()
	start := time.Now()
	for range callers {
		wg.Go(func() {
			for {
				first, n := take()
				if n <= 0 {
					return
				}
				if err := publish(first, n); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkPublish compares the adapter's Publish (its own produce
// requests, see produce) with kafka-go's Writer writing the same records
// with the same settings (RequireAll,
// synchronous, murmur2, BatchTimeout 1 ms, BatchSize 256), in the relay's batch shapes:
// what the adapter costs on top of kafka-go, without the relay's database
// work. Run with -benchtime 20000x.
func BenchmarkPublish(b *testing.B) {
	for _, shape := range []struct{ batch, callers int }{{100, 1}, {500, 1}, {500, 2}} {
		b.Run(fmt.Sprintf("adapter/batch=%d/callers=%d", shape.batch, shape.callers), func(b *testing.B) {
			bk := newBroker(b)
			tp := topology("kafka-bench")
			require.NoError(b, bk.Declare(context.Background(), tp))
			b.Cleanup(func() { deleteTopology(context.Background(), b, tp) })
			runBatches(b, shape.batch, shape.callers, func(first, n int) error {
				msgs := make([]*broker.Message, n)
				created := broker.FormatTime(time.Now())
				for i := range msgs {
					id := first + i
					msgs[i] = &broker.Message{ID: strconv.Itoa(id), Type: "evt.bench", Key: "user-" + strconv.Itoa(id%100), Body: benchBody,
						Headers: map[string]string{broker.HeaderCreatedAt: created, broker.HeaderTraceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				return bk.Publish(ctx, msgs)
			})
		})
		b.Run(fmt.Sprintf("raw/batch=%d/callers=%d", shape.batch, shape.callers), func(b *testing.B) {
			bk := newBroker(b)
			tp := topology("kafka-bench")
			require.NoError(b, bk.Declare(context.Background(), tp))
			b.Cleanup(func() { deleteTopology(context.Background(), b, tp) })
			w := suite.KafkaWriter(testenv.KafkaBrokers()...) // the adapter's writer settings, shared with ferry bench
			defer w.Close()
			topic := kafka.TopicName(tp.Exchange)
			runBatches(b, shape.batch, shape.callers, func(first, n int) error {
				msgs := make([]kafkago.Message, n)
				created := []byte(broker.FormatTime(time.Now()))
				for i := range msgs {
					id := first + i
					msgs[i] = kafkago.Message{Topic: topic, Key: []byte("user-" + strconv.Itoa(id%100)), Value: benchBody,
						Headers: []kafkago.Header{
							{Key: "x-ferry-id", Value: []byte(strconv.Itoa(id))}, {Key: "x-ferry-type", Value: []byte("evt.bench")},
							{Key: broker.HeaderCreatedAt, Value: created},
							{Key: broker.HeaderTraceparent, Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
						}}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				return w.WriteMessages(ctx, msgs...)
			})
		})
	}
}
