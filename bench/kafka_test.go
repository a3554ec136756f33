package bench

import (
	"context"
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
	w := suite.KafkaWriter(testenv.KafkaBrokers()...)
	defer w.Close()
	elapsed, err := suite.KafkaPublish(benchCtx(b), w, kafka.TopicName(exchange), n, publishers, batch, suite.EventBody(1, bodyBytes))
	must(b, err)
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
