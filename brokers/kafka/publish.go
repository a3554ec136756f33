package kafka

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ferrymq/ferry/broker"
)

// maxIDBytes bounds Message.ID (broker.Message's contract).
const maxIDBytes = 255

// toRecord turns m into a record for topic. The ID and Type go into the
// adapter's own headers, the Key is the record key (hashed to a partition
// with murmur2, as Java clients do), user headers follow in key order.
// extra are adapter headers added after them.
func toRecord(topic string, m *broker.Message, headers map[string]string, extra ...kafkago.Header) kafkago.Message {
	hs := make([]kafkago.Header, 0, len(headers)+2+len(extra))
	hs = append(hs, kafkago.Header{Key: hdrID, Value: []byte(m.ID)}, kafkago.Header{Key: hdrType, Value: []byte(m.Type)})
	for _, k := range sortedKeys(headers) {
		hs = append(hs, kafkago.Header{Key: k, Value: []byte(headers[k])})
	}
	hs = append(hs, extra...)
	var key []byte
	if m.Key != "" {
		key = []byte(m.Key)
	}
	body := m.Body
	if body == nil {
		body = []byte{}
	}
	return kafkago.Message{Topic: topic, Key: key, Value: body, Headers: hs}
}

// fromRecord splits a record into the broker.Message and the adapter's
// own headers.
func fromRecord(r kafkago.Message) (*broker.Message, map[string]string) {
	m := &broker.Message{Key: string(r.Key), Body: r.Value}
	if m.Body == nil {
		m.Body = []byte{}
	}
	internal := map[string]string{}
	for _, h := range r.Headers {
		if strings.HasPrefix(h.Key, "x-ferry-") {
			internal[h.Key] = string(h.Value)
			continue
		}
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		m.Headers[h.Key] = string(h.Value)
	}
	m.ID = internal[hdrID]
	m.Type = internal[hdrType]
	m.Attempt = 1
	if n, err := strconv.Atoi(m.Headers[broker.HeaderRetryCount]); err == nil && n > 0 {
		m.Attempt = n + 1
	}
	return m, internal
}

// check returns why m cannot be published, or nil. A malformed message
// wraps broker.ErrInvalidMessage and an oversized one
// broker.ErrMessageTooLarge, so that a caller (the outbox relay) parks
// that message (broker.IsMessageFault) and does not take the broker for
// unreachable. Kafka carries any bytes in keys and header names and
// values, so only what ferry's contract and the adapter need is checked.
func (b *kafkaBroker) check(m *broker.Message) error {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{broker.ErrInvalidMessage}, args...)...)
	}
	switch {
	case m == nil:
		return invalid("kafka: publish: nil message")
	case m.ID == "":
		return invalid("kafka: publish: message without ID")
	case len(m.ID) > maxIDBytes:
		return invalid("kafka: publish: message ID of %d bytes, at most %d", len(m.ID), maxIDBytes)
	case m.Type == "":
		return invalid("kafka: publish: message %s without Type", m.ID)
	}
	for k := range m.Headers {
		if k == "" || strings.HasPrefix(k, "x-ferry-") {
			return invalid("kafka: publish: message %s: header name %q is empty or reserved for the adapter (x-ferry-)", m.ID, k)
		}
	}
	if size := m.Size(); size > b.caps.MaxMessageBytes {
		return fmt.Errorf("%w: kafka: message %s is %d bytes, the broker takes %d (message.max.bytes %d less %d for ferry's headers)",
			broker.ErrMessageTooLarge, m.ID, size, b.caps.MaxMessageBytes, b.maxBytes, recordOverheadBytes)
	}
	return nil
}

// Publish writes the batch to the work topic of the last declared
// exchange (acks=all, synchronous, one produce request per partition and
// 256 records, see produce). Messages whose Type no declared queue of the
// exchange is bound to fail with broker.ErrUnroutable, too large ones with
// broker.ErrMessageTooLarge, malformed ones with broker.ErrInvalidMessage;
// all three are entries of a *broker.PublishError and are not written.
// Kafka answers per partition: a record batch it refuses for what it
// carries (messageError) is written again in halves (broker.SendSplitting)
// until the record at fault fails alone and the others are written; the
// records of partitions that failed for another reason (leader moved,
// timeout, broker down) fail with that error, and those of partitions
// Kafka accepted are not listed and never written again. Only when every
// message failed because the broker is closed does Publish return
// broker.ErrClosed itself. A deleted work topic is declared again once and
// the write retried, within ctx. When ctx ends (or the broker is closed)
// the write is abandoned: nothing of the batch stays queued in the client
// or is sent after Publish returned; a produce request already on the wire
// may still be stored by the broker (one copy per Publish at most).
func (b *kafkaBroker) Publish(ctx context.Context, msgs []*broker.Message) error {
	if b.closed.Load() {
		return broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	b.mu.Lock()
	exchange := b.current
	var queues []broker.Queue
	if d := b.topos[exchange]; d != nil {
		queues = d.topology.Queues
	}
	b.mu.Unlock()
	if exchange == "" {
		return errors.New("kafka: publish: no topology declared; call Declare first")
	}
	ctx, cancel := b.opContext(ctx)
	defer cancel()

	var failed []broker.FailedMessage
	recs := make([]kafkago.Message, 0, len(msgs))
	index := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if err := b.check(m); err != nil {
			id := ""
			if m != nil {
				id = m.ID
			}
			failed = append(failed, broker.FailedMessage{Index: i, ID: id, Err: err})
			continue
		}
		if !routable(queues, m.Type) {
			failed = append(failed, broker.FailedMessage{Index: i, ID: m.ID,
				Err: fmt.Errorf("%w: kafka: no queue of exchange %s is bound to %q", broker.ErrUnroutable, exchange, m.Type)})
			continue
		}
		recs = append(recs, toRecord(TopicName(exchange), m, m.Headers))
		index = append(index, i)
	}
	if len(recs) > 0 {
		all := make([]int, len(recs))
		for j := range all {
			all[j] = j
		}
		// A record batch refused as a whole (messageError) is split up to
		// find the record at fault; the records Kafka accepted are never
		// written again.
		res := broker.SendSplitting(ctx, all, func(ctx context.Context, sub []int) map[int]error {
			part := make([]kafkago.Message, len(sub))
			for k, j := range sub {
				part[k] = recs[j]
			}
			per := perRecord(b.write(ctx, exchange, part), len(part))
			out := map[int]error{}
			for k, e := range per {
				if e != nil {
					out[sub[k]] = e
				}
			}
			return out
		})
		if one := sameErr(res, len(recs)); one != nil && len(failed) == 0 && !broker.IsMessageFault(one) {
			// One error failed the whole write (broker down, closed, ctx):
			// none of the batch is stored.
			if b.closed.Load() {
				return broker.ErrClosed
			}
			return fmt.Errorf("kafka: publish %d message(s) to %s: %w", len(recs), exchange, one)
		}
		for j, e := range res {
			if !broker.IsMessageFault(e) {
				if b.closed.Load() {
					e = broker.ErrClosed
				} else {
					e = fmt.Errorf("kafka: publish %s to %s: %w", msgs[index[j]].ID, exchange, e)
				}
			}
			failed = append(failed, broker.FailedMessage{Index: index[j], ID: msgs[index[j]].ID, Err: e})
		}
	}
	if len(failed) == 0 {
		return nil
	}
	sort.Slice(failed, func(i, j int) bool { return failed[i].Index < failed[j].Index })
	return &broker.PublishError{Failed: failed}
}

// sameErr returns the error every one of the n records failed with when
// it is one and the same, or nil.
func sameErr(res map[int]error, n int) error {
	if len(res) != n || n == 0 {
		return nil
	}
	var one error
	for _, e := range res {
		if one == nil {
			one = e
		} else if e != one {
			return nil
		}
	}
	return one
}

func routable(queues []broker.Queue, typ string) bool {
	for _, q := range queues {
		for _, p := range q.Bindings {
			if broker.MatchRoutingKey(p, typ) {
				return true
			}
		}
	}
	return false
}

// write writes recs (see produce). When a topic is missing (an operator
// deleted it), it declares the exchange's topology again and writes once
// more.
func (b *kafkaBroker) write(ctx context.Context, exchange string, recs []kafkago.Message) error {
	err := b.produce(ctx, recs)
	if err != nil && missingTopic(err) && ctx.Err() == nil && exchange != "" {
		if derr := b.redeclare(ctx, exchange); derr != nil {
			return errors.Join(err, derr)
		}
		err = b.produce(ctx, recs)
	}
	return err
}

func missingTopic(err error) bool {
	return errors.Is(err, kafkago.UnknownTopicOrPartition) || errors.Is(err, kafkago.UnknownTopicID)
}

// messageError reports whether err is a refusal of the records a
// produce request carried (not of the connection, the partition's leader
// or the credentials) and wraps it in the matching sentinel. Kafka
// answers a produce request per partition, so a refusal covers the
// partition's whole record batch (Kafka protocol guide, ProduceResponse
// error codes): MESSAGE_TOO_LARGE (10) and RECORD_LIST_TOO_LARGE (18)
// wrap broker.ErrMessageTooLarge (as does kafka-go's client-side
// MessageTooLargeError); CORRUPT_MESSAGE (2, kafka-go InvalidMessage),
// INVALID_MESSAGE_SIZE (4), INVALID_TOPIC_EXCEPTION (17),
// INVALID_TIMESTAMP (32), UNSUPPORTED_FOR_MESSAGE_FORMAT (43),
// POLICY_VIOLATION (44) and INVALID_RECORD (87) wrap
// broker.ErrInvalidMessage. Every other error is an outage:
// NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, REQUEST_TIMED_OUT,
// NOT_ENOUGH_REPLICAS(_AFTER_APPEND), KAFKA_STORAGE_ERROR,
// THROTTLING_QUOTA_EXCEEDED, TOPIC_AUTHORIZATION_FAILED,
// SASL_AUTHENTICATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION (after the
// re-declare), a network error, ctx.
func messageError(err error) (error, bool) {
	var mtl kafkago.MessageTooLargeError
	switch {
	case errors.Is(err, kafkago.MessageSizeTooLarge), errors.Is(err, kafkago.RecordListTooLarge), errors.As(err, &mtl):
		return fmt.Errorf("%w: kafka: %v", broker.ErrMessageTooLarge, err), true
	case errors.Is(err, kafkago.InvalidMessage), errors.Is(err, kafkago.InvalidMessageSize), errors.Is(err, kafkago.InvalidRecord),
		errors.Is(err, kafkago.InvalidTopic), errors.Is(err, kafkago.InvalidTimestamp),
		errors.Is(err, kafkago.UnsupportedForMessageFormat), errors.Is(err, kafkago.PolicyViolation):
		return fmt.Errorf("%w: kafka: %v", broker.ErrInvalidMessage, err), true
	}
	return nil, false
}

// perRecord splits the error of one write (produce) of n records into
// per-record errors (nil: the record was written). A record refused for
// what the request carried (messageError) gets a
// *broker.RefusedCallError: Kafka refuses its partition's whole record
// batch and does not say which record is at fault. A WriteErrors entry of
// another kind, or an error for the whole write that is not a
// WriteErrors, is an outage for the records it covers.
func perRecord(err error, n int) []error {
	out := make([]error, n)
	if err == nil {
		return out
	}
	var we kafkago.WriteErrors
	if !errors.As(err, &we) || len(we) != n {
		if me, ok := messageError(err); ok {
			err = broker.RefusedCall(me)
		}
		for i := range out {
			out[i] = err
		}
		return out
	}
	for i, e := range we {
		if e == nil {
			continue
		}
		if me, ok := messageError(e); ok {
			e = broker.RefusedCall(me)
		}
		out[i] = e
	}
	return out
}
