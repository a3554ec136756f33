package bench

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ferrymq/ferry/bench/suite"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/internal/testenv"
)

// rawKafka is the Kafka baseline: kafka-go's Writer with the adapter's
// settings (RequiredAcks RequireAll, synchronous, murmur2 on the key,
// BatchTimeout 1 ms) and the same record shape (ID and Type headers, the
// key, traceparent and created-at), the given number of publishers at
// once, each writing batches of batch messages with one WriteMessages and
// awaiting it before the next: the relay's shape.
func rawKafka(b *testing.B, exchange string, n, publishers, batch int) float64 {
	ctx := benchCtx(b)
	w := &kafkago.Writer{
		Addr:         kafkago.TCP(testenv.KafkaBrokers()...),
		Balancer:     &kafkago.Murmur2Balancer{},
		BatchSize:    256, // the adapter's (brokers/kafka writerBatchSize)
		BatchBytes:   1 << 20,
		BatchTimeout: time.Millisecond,
		RequiredAcks: kafkago.RequireAll,
		// A transport of its own: kafka-go's shared DefaultTransport
		// caches metadata that may predate the topic.
		Transport: &kafkago.Transport{},
	}
	defer w.Close()
	topic := kafka.TopicName(exchange)
	body := suite.EventBody(1, bodyBytes)
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		failure error
	)
	start := time.Now()
	for range publishers {
		wg.Go(func() {
			msgs := make([]kafkago.Message, 0, batch)
			for {
				first := int(next.Add(int64(batch))) - batch
				if first >= n {
					return
				}
				msgs = msgs[:0]
				created := []byte(broker.FormatTime(time.Now()))
				for id := first + 1; id <= min(first+batch, n); id++ {
					msgs = append(msgs, kafkago.Message{Topic: topic, Key: []byte("user-" + strconv.Itoa(id%100)), Value: body,
						Headers: []kafkago.Header{
							{Key: "x-ferry-id", Value: []byte(strconv.Itoa(id))},
							{Key: "x-ferry-type", Value: []byte(eventType)},
							{Key: broker.HeaderCreatedAt, Value: created},
							{Key: broker.HeaderTraceparent, Value: []byte(traceparent)},
						}})
				}
				if err := w.WriteMessages(ctx, msgs...); err != nil {
					errOnce.Do(func() { failure = err })
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if failure != nil {
		b.Fatalf("bench: raw kafka write: %v", failure)
	}
	return float64(n) / elapsed.Seconds()
}

// deleteKafkaTopology deletes the topics of tp and its consumer groups.
func deleteKafkaTopology(ctx context.Context, b *testing.B, tp broker.Topology) {
	c := &kafkago.Client{Addr: kafkago.TCP(testenv.KafkaBrokers()...), Timeout: 10 * time.Second}
	if _, err := c.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: kafka.TopicNames(tp)}); err != nil {
		b.Logf("bench: delete kafka topics of %s: %v", tp.Exchange, err)
	}
	var groups []string
	for _, q := range tp.Queues {
		groups = append(groups, kafka.GroupID(q.Name))
	}
	if _, err := c.DeleteGroups(ctx, &kafkago.DeleteGroupsRequest{GroupIDs: groups}); err != nil {
		b.Logf("bench: delete kafka groups of %s: %v", tp.Exchange, err)
	}
}
