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
// 256 records, see produce). Messages whose
// Type no declared queue of the exchange is bound to fail with
// broker.ErrUnroutable, too large ones with broker.ErrMessageTooLarge,
// malformed ones with broker.ErrInvalidMessage; all three are entries of a
// *broker.PublishError and are not written. A record the broker refuses
// for itself (MESSAGE_TOO_LARGE, INVALID_RECORD) is an entry too. Any other
// failure (broker down, topic missing after a re-declare, ctx ended) is a
// plain error: none of the batch is known to be stored. A deleted work
// topic is declared again once and the write retried, within ctx. When
// ctx ends (or the broker is closed) the write is abandoned: nothing of
// the batch stays queued in the client or is sent after Publish returned;
// a produce request already on the wire may still be stored by the
// broker (one copy per Publish at most).
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
		err := b.write(ctx, exchange, recs)
		if err != nil {
			per, ok := perMessage(err, len(recs))
			if !ok {
				if b.closed.Load() {
					return broker.ErrClosed
				}
				return fmt.Errorf("kafka: publish %d message(s) to %s: %w", len(recs), exchange, err)
			}
			for j, e := range per {
				if e != nil {
					failed = append(failed, broker.FailedMessage{Index: index[j], ID: msgs[index[j]].ID, Err: e})
				}
			}
		}
	}
	if len(failed) == 0 {
		return nil
	}
	sort.Slice(failed, func(i, j int) bool { return failed[i].Index < failed[j].Index })
	return &broker.PublishError{Failed: failed}
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

// messageError reports whether err is a refusal of one record (not of the
// connection or the partition) and wraps it in the matching sentinel.
func messageError(err error) (error, bool) {
	var mtl kafkago.MessageTooLargeError
	switch {
	case errors.Is(err, kafkago.MessageSizeTooLarge), errors.As(err, &mtl):
		return fmt.Errorf("%w: kafka: %v", broker.ErrMessageTooLarge, err), true
	case errors.Is(err, kafkago.InvalidMessage), errors.Is(err, kafkago.InvalidRecord):
		return fmt.Errorf("%w: kafka: %v", broker.ErrInvalidMessage, err), true
	case errors.Is(err, kafkago.InvalidTimestamp):
		return fmt.Errorf("%w: kafka: %v", broker.ErrNacked, err), true
	}
	return nil, false
}

// perMessage splits a produce error into per-record errors when
// every failure is the refusal of one record; ok is false when any
// failure is not (a broker outage, a missing topic, ctx): that is a plain
// error for the whole batch.
func perMessage(err error, n int) ([]error, bool) {
	var we kafkago.WriteErrors
	if !errors.As(err, &we) || len(we) != n {
		return nil, false
	}
	out := make([]error, n)
	for i, e := range we {
		if e == nil {
			continue
		}
		me, ok := messageError(e)
		if !ok {
			return nil, false
		}
		out[i] = me
	}
	return out, true
}
