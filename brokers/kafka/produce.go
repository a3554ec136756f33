package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ferrymq/ferry/broker"
)

// Why the adapter sends produce requests itself instead of using
// kafka.Writer: a Writer keeps every batch it was given in a queue of its
// own and retries it (MaxAttempts times, each attempt bounded by
// WriteTimeout, not by the caller's context) after WriteMessages has
// returned the context's error. The batch is then written when the
// broker comes back, while the outbox relay, told that nothing was
// stored, publishes the same rows again: after a 5-minute blackhole each
// row arrived 18 to 28 times, and the queued batches (rows of tens of KiB)
// grew the relay's memory by about 7 MB per outage probe with no plateau
// (kafka-go issue 1427, still open; the Writer's own comment on
// WriteMessages says messages "might also still be written after this
// method has already returned"). kafka.Client.Produce is one round trip
// bound to the caller's ctx: when ctx ends, nothing of the batch is kept
// or sent again by the client.

// produceBackoffMin and produceBackoffMax bound the pause before a
// produce request is sent again (see retriable); the pause doubles from
// the first to the second.
const (
	produceBackoffMin = 20 * time.Millisecond
	produceBackoffMax = 500 * time.Millisecond
	// produceMaxAttempts is the most requests one chunk of records is sent
	// with (the former Writer's MaxAttempts).
	produceMaxAttempts = 10
	// recordBatchOverhead is a record batch's framing (61 bytes in the v2
	// format) rounded up; a chunk's estimated size stays within the
	// broker's message.max.bytes less this.
	recordBatchOverhead = 128
)

// produce writes recs with acks=all and returns nil when the broker
// acknowledged every record. Records are assigned to partitions with
// murmur2 on their key (random for a nil key, as Java clients do); each
// partition's records go in chunks of at most writerBatchSize records and
// message.max.bytes bytes, a partition's chunks one after the other (so
// per-key order holds: a chunk that fails stops the partition, and the
// records after it are not sent, unless the broker refused the chunk's
// records for themselves, see messageError), partitions concurrently. Each chunk is
// one kafka.Client.Produce bound to ctx, so when ctx ends nothing of recs
// stays queued in the client or is sent later.
//
// A chunk is sent again only when its request is known not to have been
// stored: the broker refused it with a retriable error that comes before
// the append (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE,
// NOT_ENOUGH_REPLICAS, ...), or the connection to the broker could not be
// opened; at most produceMaxAttempts times, while ctx lasts. A request
// that timed out or whose connection broke after it was written may have
// been stored and is not sent again: one produce call is at most one copy
// of each record.
//
// The error is the one error of every record when all failed alike (the
// topic is missing, the broker is down, ctx ended), else a
// kafkago.WriteErrors with one entry per record of recs (nil: stored).
func (b *kafkaBroker) produce(ctx context.Context, recs []kafkago.Message) error {
	if len(recs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	parts := map[string][]int{} // a topic's partitions, [0, n)
	byPart := map[topicPartition][]int{}
	var order []topicPartition
	for i := range recs {
		topic := recs[i].Topic
		ps, ok := parts[topic]
		if !ok {
			n, err := b.partitionCount(ctx, topic)
			if err != nil {
				return err
			}
			ps = partitionList(n)
			parts[topic] = ps
		}
		p := b.balancer.Balance(recs[i], ps...)
		k := topicPartition{topic: topic, partition: p}
		if _, ok := byPart[k]; !ok {
			order = append(order, k)
		}
		byPart[k] = append(byPart[k], i)
	}
	errs := make([]error, len(recs))
	partErrs := make([]error, len(order))
	var wg sync.WaitGroup
	for j, k := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			partErrs[j] = b.producePartition(ctx, k, recs, byPart[k], errs)
		}()
	}
	wg.Wait()
	failed := 0
	for _, e := range errs {
		if e != nil {
			failed++
		}
	}
	switch {
	case failed == 0:
		return nil
	case failed == len(recs):
		// Nothing stored: one error, each partition's different one joined
		// (errors.Is sees them all).
		var all []error
		seen := map[string]bool{}
		for _, e := range partErrs {
			if e != nil && !seen[e.Error()] {
				seen[e.Error()] = true
				all = append(all, e)
			}
		}
		if len(all) == 1 {
			return all[0]
		}
		return errors.Join(all...)
	}
	return kafkago.WriteErrors(errs)
}

type topicPartition struct {
	topic     string
	partition int
}

// producePartition sends the records idx of recs, all of partition k, in
// chunks, sets errs of each record not stored and returns the error that
// stopped the partition, or nil.
func (b *kafkaBroker) producePartition(ctx context.Context, k topicPartition, recs []kafkago.Message, idx []int, errs []error) (failed error) {
	limit := b.maxBytes - recordBatchOverhead
	for start := 0; start < len(idx); {
		end, size := start, 0
		for end < len(idx) && end-start < writerBatchSize {
			n := recordSize(&recs[idx[end]])
			if end > start && size+n > limit {
				break
			}
			size += n
			end++
		}
		if err := b.produceChunk(ctx, k, recs, idx[start:end]); err != nil {
			if _, fault := messageError(err); fault {
				// The broker refused these records for themselves (too
				// large, invalid): they are not stored, the partition's
				// next records are sent.
				for _, i := range idx[start:end] {
					errs[i] = err
				}
				failed = err
				start = end
				continue
			}
			// Not stored, nor anything of the partition after it: per-key
			// order holds.
			for _, i := range idx[start:] {
				errs[i] = err
			}
			return err
		}
		start = end
	}
	return failed
}

// produceChunk sends one produce request of the records idx of recs to
// partition k, again while the broker refuses it retriably.
func (b *kafkaBroker) produceChunk(ctx context.Context, k topicPartition, recs []kafkago.Message, idx []int) error {
	backoff := produceBackoffMin
	for attempt := 1; ; attempt++ {
		res, err := b.client.Produce(ctx, &kafkago.ProduceRequest{
			Topic:        k.topic,
			Partition:    k.partition,
			RequiredAcks: kafkago.RequireAll,
			Records:      chunkRecords(recs, idx),
		})
		if err == nil && res != nil && res.Error != nil {
			err = res.Error
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			// ctx ended during the request: say so, not how the transport
			// noticed.
			return fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		if attempt >= produceMaxAttempts || !retriable(err) {
			return noRoom(err, err)
		}
		b.log.Debug("produce: retrying", "topic", k.topic, "partition", k.partition, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			// The deadline passed while the leader refused the write for
			// lack of room: that is why (broker.ErrBlocked).
			return noRoom(fmt.Errorf("%w (%v)", ctx.Err(), err), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, produceBackoffMax)
	}
}

// chunkRecords returns the records idx of recs as a fresh reader, one per
// request: a kafkago.Bytes key or value is read once by the request's
// encoding, so a request sent again with the readers of the first would
// carry empty keys and values (every record of a retried chunk reached
// the topic with an empty body before this was built per attempt).
func chunkRecords(recs []kafkago.Message, idx []int) kafkago.RecordReader {
	rs := make([]kafkago.Record, len(idx))
	for j, i := range idx {
		m := &recs[i]
		rs[j] = kafkago.Record{Time: m.Time, Headers: m.Headers}
		if m.Key != nil {
			rs[j].Key = kafkago.NewBytes(m.Key)
		}
		if m.Value != nil { // nil: a tombstone
			rs[j].Value = kafkago.NewBytes(m.Value)
		}
	}
	return kafkago.NewRecordReader(rs...)
}

// noRoom returns err wrapped in a *broker.BlockedError when cause, the
// partition leader's answer, says it has no room for the write:
// NOT_ENOUGH_REPLICAS (19) or NOT_ENOUGH_REPLICAS_AFTER_APPEND (20),
// fewer in-sync replicas than the topic's min.insync.replicas for an
// acks=all produce, or KAFKA_STORAGE_ERROR (56), its log directory
// offline (Kafka protocol guide, "Error Codes"). The reason is Kafka's
// own description of the code. Any other err is returned as it is.
func noRoom(err, cause error) error {
	var ke kafkago.Error
	if errors.As(cause, &ke) {
		switch ke {
		case kafkago.NotEnoughReplicas, kafkago.NotEnoughReplicasAfterAppend, kafkago.KafkaStorageError:
			return broker.Blocked(ke.Error(), err)
		}
	}
	return err
}

// retriable reports whether a produce request that failed with err is
// known not to have been stored, so that sending it again makes no copy:
// the broker refused it before the append with an error it calls
// retriable, or no connection could be opened. NOT_ENOUGH_REPLICAS_AFTER_APPEND
// and REQUEST_TIMED_OUT come after the leader appended the records, a
// missing topic is for write to declare again, and a
// connection that broke after the request was written may have delivered
// it: those are not sent again (the caller, the outbox relay, decides).
func retriable(err error) bool {
	var ke kafkago.Error
	if errors.As(err, &ke) {
		switch ke {
		case kafkago.NotEnoughReplicasAfterAppend, kafkago.RequestTimedOut:
			return false
		case kafkago.UnknownTopicOrPartition, kafkago.UnknownTopicID:
			return false // write declares the topic again
		}
		return ke.Temporary()
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// partitionCount returns the number of partitions of topic from the
// transport's metadata cache (refreshed every MetadataTTL); a topic that
// does not exist is kafkago.UnknownTopicOrPartition.
func (b *kafkaBroker) partitionCount(ctx context.Context, topic string) (int, error) {
	md, err := b.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, err
	}
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return 0, t.Error
		}
		if len(t.Partitions) == 0 {
			return 0, kafkago.UnknownTopicOrPartition
		}
		return len(t.Partitions), nil
	}
	return 0, kafkago.UnknownTopicOrPartition
}

// partitionList returns [0, n).
func partitionList(n int) []int {
	ps := make([]int, n)
	for i := range ps {
		ps[i] = i
	}
	return ps
}

// recordSize bounds the size of m as a record of a v2 record batch:
// length, attributes, timestamp and offset deltas, key and value lengths
// (varints of at most 5 or 10 bytes) and each header's name and value
// with their lengths.
func recordSize(m *kafkago.Message) int {
	n := 36 + len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}
