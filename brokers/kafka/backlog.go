package kafka

import (
	"context"
	"fmt"
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ferrymq/ferry/broker"
)

var _ broker.BacklogReporter = (*kafkaBroker)(nil)

// Backlog implements broker.BacklogReporter for a declared queue, over
// its work topic and its retry topics (a retry topic's records are read
// only by a running subscription's forwarder, so they wait unread during
// a worker outage too): Messages is the consumer group's lag summed over
// them (records after the committed offset of each partition, from the
// log start for a partition never committed, as a new group starts at the
// earliest offset); OldestAge and Retention are those of the topic whose
// oldest unread record (the timestamp of the first unread record of each
// lagging partition, one fetch per such partition) is nearest its
// retention.ms (0 for -1, no time limit). Kafka deletes records older
// than the retention whether the group read them or not, so an oldest
// record nearing the retention is about to be lost (the Prometheus rule
// FerryQueueNearRetention). A healthy retry topic stays below a quarter
// of it: its records wait their delay, and it keeps at least 4 × that.
func (b *kafkaBroker) Backlog(ctx context.Context, queue string) (broker.Backlog, error) {
	var bl broker.Backlog
	if b.closed.Load() {
		return bl, broker.ErrClosed
	}
	qi, ok := b.queueInfo(queue)
	if !ok {
		return bl, fmt.Errorf("%w: kafka: backlog of %s: not declared on this broker", broker.ErrUnknownQueue, queue)
	}
	ctx, cancel := b.opContext(ctx)
	defer cancel()
	topics := append([]string{qi.topic}, qi.retryTopics...)
	committed, err := b.client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: GroupID(queue)})
	if err != nil {
		return bl, fmt.Errorf("kafka: backlog of %s: fetch committed offsets: %w", queue, err)
	}
	if committed.Error != nil {
		return bl, fmt.Errorf("kafka: backlog of %s: fetch committed offsets: %w", queue, committed.Error)
	}
	retention, err := b.retentions(ctx, topics)
	if err != nil {
		return bl, fmt.Errorf("kafka: backlog of %s: %w", queue, err)
	}
	worst := -1.0
	for _, topic := range topics {
		lag, oldest, err := b.topicLag(ctx, topic, committed.Topics[topic])
		if err != nil {
			return bl, fmt.Errorf("kafka: backlog of %s: %w", queue, err)
		}
		bl.Messages += lag
		ratio := 0.0
		if r := retention[topic]; r > 0 {
			ratio = oldest.Seconds() / r.Seconds()
		}
		if ratio > worst || (ratio == worst && oldest > bl.OldestAge) {
			worst, bl.OldestAge, bl.Retention = ratio, oldest, retention[topic]
		}
	}
	return bl, nil
}

// topicLag returns the records of topic after the committed offsets done
// and the age of the oldest of them.
func (b *kafkaBroker) topicLag(ctx context.Context, topic string, done []kafkago.OffsetFetchPartition) (lag int64, oldest time.Duration, err error) {
	ts, err := b.topics(ctx, []string{topic})
	if err != nil {
		return 0, 0, err
	}
	t, ok := ts[topic]
	if !ok {
		return 0, 0, fmt.Errorf("topic %s does not exist", topic)
	}
	committed := map[int]int64{}
	for _, p := range done {
		committed[p.Partition] = p.CommittedOffset
	}
	var reqs []kafkago.OffsetRequest
	for _, p := range t.Partitions {
		reqs = append(reqs, kafkago.FirstOffsetOf(p.ID), kafkago.LastOffsetOf(p.ID))
	}
	lo, err := b.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		return 0, 0, fmt.Errorf("list offsets of %s: %w", topic, err)
	}
	now := time.Now()
	for _, po := range lo.Topics[topic] {
		if po.Error != nil {
			return 0, 0, fmt.Errorf("topic %s partition %d: %w", topic, po.Partition, po.Error)
		}
		from := po.FirstOffset
		if c, ok := committed[po.Partition]; ok && c > from {
			from = c
		}
		if po.LastOffset <= from {
			continue
		}
		lag += po.LastOffset - from
		f, err := b.client.Fetch(ctx, &kafkago.FetchRequest{Topic: topic, Partition: po.Partition, Offset: from,
			MinBytes: 1, MaxBytes: int64(b.maxBytes) + 1<<20, MaxWait: 100 * time.Millisecond})
		if err != nil || f.Error != nil || f.Records == nil {
			continue // deleted meanwhile, or moved: the next scrape reads it again
		}
		// The answer starts at the batch holding from, which may begin
		// earlier.
		for range 10000 {
			r, err := f.Records.ReadRecord()
			if err != nil {
				break
			}
			if r.Offset >= from {
				if !r.Time.IsZero() {
					oldest = max(oldest, now.Sub(r.Time))
				}
				break
			}
		}
	}
	return lag, oldest, nil
}

// retentions reads the retention.ms of topics (0: none, for -1).
func (b *kafkaBroker) retentions(ctx context.Context, topics []string) (map[string]time.Duration, error) {
	var res []kafkago.DescribeConfigRequestResource
	for _, t := range topics {
		res = append(res, kafkago.DescribeConfigRequestResource{ResourceType: kafkago.ResourceTypeTopic, ResourceName: t, ConfigNames: []string{"retention.ms"}})
	}
	dc, err := b.client.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{Resources: res})
	if err != nil {
		return nil, fmt.Errorf("describe topics: %w", err)
	}
	out := map[string]time.Duration{}
	for _, r := range dc.Resources {
		if r.Error != nil {
			return nil, fmt.Errorf("describe topic %s: %w", r.ResourceName, r.Error)
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName == "retention.ms" {
				if ms, err := strconv.ParseInt(e.ConfigValue, 10, 64); err == nil && ms > 0 {
					out[r.ResourceName] = time.Duration(ms) * time.Millisecond
				}
			}
		}
	}
	return out, nil
}
