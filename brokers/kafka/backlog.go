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

// Backlog implements broker.BacklogReporter for a declared queue: the lag
// of its consumer group on the work topic (records after the committed
// offset of each partition, from the log start for a partition never
// committed, as a new group starts at the earliest offset), the age of
// the oldest of them (the timestamp of the first unread record of each
// lagging partition, one fetch per such partition) and the topic's
// retention.ms (0 for -1, no time limit). Kafka deletes records older
// than the retention whether the group read them or not, so a lag whose
// oldest record nears the retention is about to lose records (the
// Prometheus rule FerryQueueNearRetention). The retry topics are not
// counted: their records wait on purpose, and each keeps at least four
// times its delay.
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
	topic := qi.topic
	ts, err := b.topics(ctx, []string{topic})
	if err != nil {
		return bl, fmt.Errorf("kafka: backlog of %s: %w", queue, err)
	}
	t, ok := ts[topic]
	if !ok {
		return bl, fmt.Errorf("kafka: backlog of %s: topic %s does not exist", queue, topic)
	}
	committed, err := b.client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: GroupID(queue)})
	if err != nil {
		return bl, fmt.Errorf("kafka: backlog of %s: fetch committed offsets: %w", queue, err)
	}
	if committed.Error != nil {
		return bl, fmt.Errorf("kafka: backlog of %s: fetch committed offsets: %w", queue, committed.Error)
	}
	done := map[int]int64{}
	for _, p := range committed.Topics[topic] {
		done[p.Partition] = p.CommittedOffset
	}
	var reqs []kafkago.OffsetRequest
	for _, p := range t.Partitions {
		reqs = append(reqs, kafkago.FirstOffsetOf(p.ID), kafkago.LastOffsetOf(p.ID))
	}
	lo, err := b.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		return bl, fmt.Errorf("kafka: backlog of %s: list offsets: %w", queue, err)
	}
	now := time.Now()
	for _, po := range lo.Topics[topic] {
		if po.Error != nil {
			return bl, fmt.Errorf("kafka: backlog of %s: partition %d: %w", queue, po.Partition, po.Error)
		}
		from := po.FirstOffset
		if c, ok := done[po.Partition]; ok && c > from {
			from = c
		}
		if po.LastOffset <= from {
			continue
		}
		bl.Messages += po.LastOffset - from
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
					bl.OldestAge = max(bl.OldestAge, now.Sub(r.Time))
				}
				break
			}
		}
	}
	dc, err := b.client.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{Resources: []kafkago.DescribeConfigRequestResource{{
		ResourceType: kafkago.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"retention.ms"}}}})
	if err != nil {
		return bl, fmt.Errorf("kafka: backlog of %s: describe topic %s: %w", queue, topic, err)
	}
	for _, r := range dc.Resources {
		for _, e := range r.ConfigEntries {
			if e.ConfigName == "retention.ms" {
				if ms, err := strconv.ParseInt(e.ConfigValue, 10, 64); err == nil && ms > 0 {
					bl.Retention = time.Duration(ms) * time.Millisecond
				}
			}
		}
	}
	return bl, nil
}
