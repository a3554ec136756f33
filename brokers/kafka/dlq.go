package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ferrymq/ferry/broker"
)

// dlqRecord is the DLQ copy of m: record key = ID (the compaction key),
// value = body, the message's headers plus HeaderLastError and
// HeaderDeadAt, and the adapter's Type, Key and work-topic headers.
func dlqRecord(dlqTopic, workTopic string, m *broker.Message, reason string, now time.Time) kafkago.Message {
	hs := copyHeaders(m.Headers)
	hs[broker.HeaderLastError] = broker.TruncateReason(reason)
	hs[broker.HeaderDeadAt] = broker.FormatTime(now)
	rec := toRecord(dlqTopic, m, hs,
		kafkago.Header{Key: hdrKey, Value: []byte(m.Key)},
		kafkago.Header{Key: hdrTopic, Value: []byte(workTopic)})
	rec.Key = []byte(m.ID)
	return rec
}

// tombstone removes id from the DLQ topic: a record with the ID as key and
// a null value, which log compaction keeps as the key's last word (and
// drops after the topic's delete.retention.ms, 24 h by default).
func tombstone(dlqTopic, id string) kafkago.Message {
	return kafkago.Message{Topic: dlqTopic, Key: []byte(id), Value: nil,
		Headers: []kafkago.Header{{Key: hdrTombstone, Value: []byte("1")}}}
}

// DLQ returns the DLQ of queue: the compacted topic "<queue>.dlq". It
// does no I/O; the methods look the topic up and return
// broker.ErrUnknownQueue when it does not exist.
func (b *kafkaBroker) DLQ(queue string) (broker.DeadLetterQueue, error) {
	if b.closed.Load() {
		return nil, broker.ErrClosed
	}
	probe := broker.Topology{Exchange: "x", Queues: []broker.Queue{{Name: queue, Bindings: []string{"x"}}}}
	if err := probe.Validate(); err != nil {
		return nil, fmt.Errorf("%w: kafka: queue %q: not a valid queue name", broker.ErrUnknownQueue, queue)
	}
	return &dlq{b: b, queue: queue, topic: DLQTopicName(queue)}, nil
}

type dlq struct {
	b     *kafkaBroker
	queue string
	topic string
}

// entry is the latest DLQ record of one ID.
type entry struct {
	offset int64
	rec    kafkago.Message
	dm     broker.DeadMessage
	work   string // work topic
	key    string
}

// load folds the DLQ topic into the latest record per ID, dropping IDs
// whose latest record is a tombstone, oldest (lowest offset) first.
func (q *dlq) load(ctx context.Context) ([]entry, error) {
	if q.b.closed.Load() {
		return nil, broker.ErrClosed
	}
	ok, err := q.b.topicExists(ctx, q.topic)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: kafka: queue %s: its DLQ topic %s does not exist on %v", broker.ErrUnknownQueue, q.queue, q.topic, q.b.cfg.Brokers)
	}
	resp, err := q.b.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{
		q.topic: {kafkago.FirstOffsetOf(0), kafkago.LastOffsetOf(0)},
	}})
	if err != nil {
		return nil, fmt.Errorf("kafka: DLQ %s: list offsets: %w", q.topic, err)
	}
	var first, end int64
	for _, po := range resp.Topics[q.topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("kafka: DLQ %s: list offsets: %w", q.topic, po.Error)
		}
		first, end = po.FirstOffset, po.LastOffset
	}
	latest := map[string]entry{}
	if end > first {
		r := kafkago.NewReader(kafkago.ReaderConfig{
			Brokers: q.b.cfg.Brokers, Topic: q.topic, Partition: 0, Dialer: q.b.dialer,
			MinBytes: 1, MaxBytes: q.b.maxBytes + 1<<20, MaxWait: 200 * time.Millisecond, MaxAttempts: 3,
		})
		defer r.Close()
		if err := r.SetOffset(first); err != nil {
			return nil, fmt.Errorf("kafka: DLQ %s: %w", q.topic, err)
		}
		for {
			// A compacted log may end in a gap; a quiet fetch ends the read.
			fctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			m, err := r.FetchMessage(fctx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				if q.b.closed.Load() {
					return nil, broker.ErrClosed
				}
				if errors.Is(err, context.DeadlineExceeded) {
					break
				}
				return nil, fmt.Errorf("kafka: DLQ %s: read: %w", q.topic, err)
			}
			id := string(m.Key)
			if isTombstone(m) {
				delete(latest, id)
			} else {
				latest[id] = toEntry(m)
			}
			if m.Offset+1 >= end {
				break
			}
		}
	}
	out := make([]entry, 0, len(latest))
	for _, e := range latest {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].offset < out[j].offset })
	return out, nil
}

func isTombstone(m kafkago.Message) bool {
	for _, h := range m.Headers {
		if h.Key == hdrTombstone {
			return true
		}
	}
	return m.Value == nil && len(m.Headers) == 0
}

func toEntry(r kafkago.Message) entry {
	msg, internal := fromRecord(r)
	msg.Key = internal[hdrKey]
	if msg.ID == "" {
		msg.ID = string(r.Key)
	}
	return entry{
		offset: r.Offset,
		rec:    r,
		work:   internal[hdrTopic],
		key:    internal[hdrKey],
		dm: broker.DeadMessage{
			Message:       msg,
			LastError:     msg.Headers[broker.HeaderLastError],
			FirstFailedAt: broker.ParseTime(msg.Headers[broker.HeaderFirstFailedAt]),
			DeadAt:        broker.ParseTime(msg.Headers[broker.HeaderDeadAt]),
		},
	}
}

// List folds the DLQ topic (one partition) to the latest record per
// message ID and returns those that are not tombstones, oldest first.
func (q *dlq) List(ctx context.Context, limit int) ([]broker.DeadMessage, error) {
	ctx, cancel := q.b.opContext(ctx)
	defer cancel()
	es, err := q.load(ctx)
	if err != nil {
		return nil, q.closedOr(err)
	}
	if limit > 0 && len(es) > limit {
		es = es[:limit]
	}
	out := make([]broker.DeadMessage, len(es))
	for i, e := range es {
		out[i] = e.dm
	}
	return out, nil
}

func (q *dlq) closedOr(err error) error {
	if q.b.closed.Load() {
		return broker.ErrClosed
	}
	return err
}

func pick(es []entry, ids []string) []entry {
	if ids == nil {
		return es
	}
	var out []entry
	for _, e := range es {
		if slices.Contains(ids, e.dm.Message.ID) {
			out = append(out, e)
		}
	}
	return out
}

// Replay writes the chosen dead messages back to the work topic they came
// from, for this queue only, with HeaderRetryCount and HeaderLastError
// removed, and once that write is acknowledged by every in-sync replica,
// writes a tombstone for each to the DLQ topic.
func (q *dlq) Replay(ctx context.Context, ids []string) ([]string, error) {
	ctx, cancel := q.b.opContext(ctx)
	defer cancel()
	es, err := q.load(ctx)
	if err != nil {
		return nil, q.closedOr(err)
	}
	es = pick(es, ids)
	if len(es) == 0 {
		return []string{}, nil
	}
	var recs []kafkago.Message
	checked := map[string]bool{}
	for _, e := range es {
		if e.work == "" {
			return nil, fmt.Errorf("kafka: DLQ %s: message %s does not name its work topic", q.topic, e.dm.Message.ID)
		}
		if !checked[e.work] {
			ok, err := q.b.topicExists(ctx, e.work)
			if err != nil {
				return nil, q.closedOr(err)
			}
			if !ok {
				return nil, fmt.Errorf("%w: kafka: queue %s: its work topic %s does not exist; nothing replayed", broker.ErrUnknownQueue, q.queue, e.work)
			}
			checked[e.work] = true
		}
		m := e.dm.Message
		hs := copyHeaders(m.Headers)
		delete(hs, broker.HeaderRetryCount)
		delete(hs, broker.HeaderLastError)
		delete(hs, broker.HeaderDeadAt)
		recs = append(recs, toRecord(e.work, m, hs, kafkago.Header{Key: hdrQueue, Value: []byte(q.queue)}))
	}
	if err := q.b.produce(ctx, recs); err != nil {
		return nil, q.closedOr(fmt.Errorf("kafka: DLQ %s: replay to the work topic: %w", q.topic, err))
	}
	done := make([]string, len(es))
	for i, e := range es {
		done[i] = e.dm.Message.ID
	}
	if err := q.tombstones(ctx, done); err != nil {
		return done, q.closedOr(fmt.Errorf("kafka: DLQ %s: %d message(s) replayed, but removing them from the DLQ failed (a replay again would duplicate them): %w", q.topic, len(done), err))
	}
	return done, nil
}

// Purge writes a tombstone for each chosen dead message.
func (q *dlq) Purge(ctx context.Context, ids []string) ([]string, error) {
	ctx, cancel := q.b.opContext(ctx)
	defer cancel()
	es, err := q.load(ctx)
	if err != nil {
		return nil, q.closedOr(err)
	}
	es = pick(es, ids)
	done := make([]string, len(es))
	for i, e := range es {
		done[i] = e.dm.Message.ID
	}
	if len(done) == 0 {
		return done, nil
	}
	if err := q.tombstones(ctx, done); err != nil {
		return nil, q.closedOr(fmt.Errorf("kafka: DLQ %s: purge: %w", q.topic, err))
	}
	return done, nil
}

func (q *dlq) tombstones(ctx context.Context, ids []string) error {
	recs := make([]kafkago.Message, len(ids))
	for i, id := range ids {
		recs[i] = tombstone(q.topic, id)
	}
	return q.b.produce(ctx, recs)
}

// ReplaySince resets the committed offsets of queue's consumer group on
// its work topic to the first offset at or after since (the end of a
// partition when nothing is that new). The group must be empty: Kafka
// refuses offset commits from outside an active group, and a running
// member would overwrite them. It returns how many records the group will
// read again (sum over partitions of the old committed offset less the new
// one; a partition never committed counts from its end).
func (b *kafkaBroker) ReplaySince(ctx context.Context, queue string, since time.Time) (int64, error) {
	if b.closed.Load() {
		return 0, broker.ErrClosed
	}
	ctx, cancel := b.opContext(ctx)
	defer cancel()
	group := GroupID(queue)
	topic := ""
	if qi, ok := b.queueInfo(queue); ok {
		topic = qi.topic
	}
	dg, err := b.client.DescribeGroups(ctx, &kafkago.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil {
		return 0, fmt.Errorf("kafka: replay %s: describe group: %w", queue, err)
	}
	for _, g := range dg.Groups {
		if g.Error != nil {
			return 0, fmt.Errorf("kafka: replay %s: describe group: %w", queue, g.Error)
		}
		if len(g.Members) > 0 {
			return 0, fmt.Errorf("kafka: replay %s: consumer group %s has %d active member(s) (state %s); stop the workers of the queue first", queue, group, len(g.Members), g.GroupState)
		}
	}
	committed, err := b.client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group})
	if err != nil {
		return 0, fmt.Errorf("kafka: replay %s: fetch committed offsets: %w", queue, err)
	}
	if committed.Error != nil {
		return 0, fmt.Errorf("kafka: replay %s: fetch committed offsets: %w", queue, committed.Error)
	}
	if topic == "" {
		// Not declared here: the work topic is the one the group has
		// offsets on that is not one of its retry topics.
		for t := range committed.Topics {
			if len(t) > len(queue)+7 && t[:len(queue)+7] == queue+".retry." {
				continue
			}
			topic = t
		}
	}
	if topic == "" {
		return 0, fmt.Errorf("%w: kafka: replay %s: consumer group %s has no committed offsets and the queue is not declared here", broker.ErrUnknownQueue, queue, group)
	}
	ts, err := b.topics(ctx, []string{topic})
	if err != nil {
		return 0, fmt.Errorf("kafka: replay %s: %w", queue, err)
	}
	t, ok := ts[topic]
	if !ok {
		return 0, fmt.Errorf("%w: kafka: replay %s: topic %s does not exist", broker.ErrUnknownQueue, queue, topic)
	}
	old := map[int]int64{}
	for _, p := range committed.Topics[topic] {
		old[p.Partition] = p.CommittedOffset
	}
	var reqs []kafkago.OffsetRequest
	for _, p := range t.Partitions {
		reqs = append(reqs, kafkago.TimeOffsetOf(p.ID, since), kafkago.LastOffsetOf(p.ID))
	}
	lo, err := b.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		return 0, fmt.Errorf("kafka: replay %s: list offsets at %v: %w", queue, since, err)
	}
	var commits []kafkago.OffsetCommit
	var n int64
	for _, po := range lo.Topics[topic] {
		if po.Error != nil {
			return 0, fmt.Errorf("kafka: replay %s: partition %d: %w", queue, po.Partition, po.Error)
		}
		at := po.LastOffset
		for off := range po.Offsets {
			// Offsets holds the answer to the timestamp request.
			if off >= 0 && off < at {
				at = off
			}
		}
		prev, had := old[po.Partition]
		if !had || prev < 0 {
			prev = po.LastOffset
		}
		if prev > at {
			n += prev - at
		}
		commits = append(commits, kafkago.OffsetCommit{Partition: po.Partition, Offset: at, Metadata: "ferry replay --since " + since.UTC().Format(time.RFC3339)})
	}
	res, err := b.client.OffsetCommit(ctx, &kafkago.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: map[string][]kafkago.OffsetCommit{topic: commits}})
	if err != nil {
		return 0, fmt.Errorf("kafka: replay %s: commit offsets: %w", queue, err)
	}
	for _, ps := range res.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return 0, fmt.Errorf("kafka: replay %s: commit offset of partition %d: %w", queue, p.Partition, p.Error)
			}
		}
	}
	b.log.Info("group offsets reset", "queue", queue, "topic", topic, "since", since, "records", strconv.FormatInt(n, 10))
	return n, nil
}

// Where implements broker.DeadLetterQueue: the compacted Kafka topic
// <queue>.dlq (DLQTopicName). It does no I/O.
func (q *dlq) Where(context.Context) (string, error) {
	if q.b.closed.Load() {
		return "", broker.ErrClosed
	}
	return fmt.Sprintf("Kafka topic %q", q.topic), nil
}
