package suite

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ferrymq/ferry/broker"
)

// kafkaRawClient is segmentio/kafka-go on a topic of its own with one
// partition (so replay reads one log from offset 0): a Writer with
// acks=all in the relay's shape, a consumer group Reader that commits the
// offsets of each batch it read (Kafka's ack), and a group-less Reader for
// the replay. Its URL is kafka://host:port[,host:port].
type kafkaRawClient struct {
	addrs []string
	topic string
	group string
	w     *kafkago.Writer
	// join is the time the last read waited for its first record: the
	// consumer group's join, or the reader's connect.
	join time.Duration
}

func newKafkaRawClient(ctx context.Context, url string) (*kafkaRawClient, error) {
	addrs := strings.Split(strings.TrimPrefix(url, "kafka://"), ",")
	r := &kafkaRawClient{addrs: addrs, topic: uniqueName("benchraw"), group: uniqueName("benchraw")}
	c := &kafkago.Client{Addr: kafkago.TCP(addrs...), Timeout: 10 * time.Second}
	res, err := c.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{{Topic: r.topic, NumPartitions: 1, ReplicationFactor: 1}}})
	if err != nil {
		return nil, fmt.Errorf("bench: raw kafka: create topic: %w", err)
	}
	if err := res.Errors[r.topic]; err != nil {
		return nil, fmt.Errorf("bench: raw kafka: create topic %s: %w", r.topic, err)
	}
	r.w = KafkaWriter(addrs...)
	return r, nil
}

// KafkaWriter is a segmentio/kafka-go Writer on the brokers at addrs
// (host:port) with the settings of the Kafka adapter's produce requests
// (the adapter sends them itself, without a Writer): RequiredAcks RequireAll,
// synchronous, murmur2 on the key, BatchSize 256 records (brokers/kafka
// writerBatchSize), BatchBytes 1 MiB, BatchTimeout 1 ms, and a transport
// of its own (kafka-go's shared DefaultTransport caches metadata that may
// predate the topic). Each message names its topic. Close it after use.
func KafkaWriter(addrs ...string) *kafkago.Writer {
	return &kafkago.Writer{
		Addr:         kafkago.TCP(addrs...),
		Balancer:     &kafkago.Murmur2Balancer{},
		BatchSize:    256,
		BatchBytes:   1 << 20,
		BatchTimeout: time.Millisecond,
		RequiredAcks: kafkago.RequireAll,
		Transport:    &kafkago.Transport{},
	}
}

// publish writes n records in the relay's shape (KafkaPublish).
func (r *kafkaRawClient) publish(ctx context.Context, n, size int) (time.Duration, error) {
	return KafkaPublish(ctx, r.w, r.topic, n, relayConcurrency, relayBatch, EventBody(1, size))
}

// KafkaPublish writes n records with body to topic through w (see
// KafkaWriter) with the headers the adapter sends for an outbox row (ID,
// Type, key, traceparent, created-at) and the key "user-<id mod 100>":
// publishers at once, each taking the next batch of batch records, writing
// it with one WriteMessages and awaiting it (acks=all) before the next
// (the relay's shape). It returns the elapsed time; a failed write is an
// error. The Go benchmarks and ferry bench share it.
func KafkaPublish(ctx context.Context, w *kafkago.Writer, topic string, n, publishers, batch int, body []byte) (time.Duration, error) {
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
				created := broker.FormatTime(time.Now())
				for id := first + 1; id <= min(first+batch, n); id++ {
					hs := []kafkago.Header{{Key: "x-ferry-id", Value: []byte(strconv.Itoa(id))}, {Key: "x-ferry-type", Value: []byte(EventType)}}
					for k, v := range rawHeaders(id, created) {
						hs = append(hs, kafkago.Header{Key: k, Value: []byte(v)})
					}
					msgs = append(msgs, kafkago.Message{Topic: topic, Key: []byte("user-" + strconv.Itoa(id%100)), Value: body, Headers: hs})
				}
				if err := w.WriteMessages(ctx, msgs...); err != nil {
					errOnce.Do(func() { failure = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if failure != nil {
		return 0, fmt.Errorf("bench: raw kafka write: %w", failure)
	}
	return time.Since(start), nil
}

// read takes n records from rd; when commit, it commits the offset of
// every relayBatch-th record and of the last (the group's ack).
// The time runs from the first record, so a consumer group's join (a
// one-off of a few seconds, kept in r.join) is not part of the rate.
func (r *kafkaRawClient) read(ctx context.Context, rd *kafkago.Reader, n int, commit bool) (time.Duration, error) {
	called := time.Now()
	var start time.Time
	for got := 1; got <= n; got++ {
		m, err := rd.FetchMessage(ctx)
		if err != nil {
			return 0, fmt.Errorf("bench: raw kafka fetch: %w", err)
		}
		if got == 1 {
			start = time.Now()
			r.join = start.Sub(called)
		}
		if commit && (got%relayBatch == 0 || got == n) {
			if err := rd.CommitMessages(ctx, m); err != nil {
				return 0, fmt.Errorf("bench: raw kafka commit: %w", err)
			}
		}
	}
	return time.Since(start), nil
}

func (r *kafkaRawClient) consume(ctx context.Context, n int) (time.Duration, error) {
	rd := kafkago.NewReader(kafkago.ReaderConfig{Brokers: r.addrs, GroupID: r.group, Topic: r.topic,
		StartOffset: kafkago.FirstOffset, MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 100 * time.Millisecond})
	defer rd.Close()
	return r.read(ctx, rd, n, true)
}

// replay reads the topic again from offset 0: a Kafka log keeps records
// after their offsets are committed.
func (r *kafkaRawClient) replay(ctx context.Context, n int) (time.Duration, error) {
	rd := kafkago.NewReader(kafkago.ReaderConfig{Brokers: r.addrs, Topic: r.topic, Partition: 0,
		MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 100 * time.Millisecond})
	defer rd.Close()
	if err := rd.SetOffset(kafkago.FirstOffset); err != nil {
		return 0, fmt.Errorf("bench: raw kafka replay: %w", err)
	}
	return r.read(ctx, rd, n, false)
}

// startup is the time the last consume or replay waited for its first
// record, left out of its rate.
func (r *kafkaRawClient) startup() time.Duration { return r.join }

// version names the client: Kafka's protocol does not report the server's
// release.
func (r *kafkaRawClient) version() string { return "kafka at " + strings.Join(r.addrs, ",") }

func (r *kafkaRawClient) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = r.w.Close()
	c := &kafkago.Client{Addr: kafkago.TCP(r.addrs...), Timeout: 10 * time.Second}
	// Best effort, as the other raw clients' clean-up: a leftover topic
	// only costs disk.
	_, _ = c.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: []string{r.topic}})
	_, _ = c.DeleteGroups(ctx, &kafkago.DeleteGroupsRequest{GroupIDs: []string{r.group}})
}
