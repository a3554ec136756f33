package nats

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferry/broker"
)

// Publish implements broker.Broker with asynchronous JetStream publishes
// to the exchange declared last
// whose PubAcks are all awaited. Each message goes to subject
// <stream>.<Type> with Nats-Msg-Id set from Message.ID (plus
// HeaderCreatedAt when present, see msgID), so the stream's duplicate
// window drops a relay's re-publish. Per-message failures are reported in
// a *broker.PublishError: a Type that no declared queue binds wraps
// broker.ErrUnroutable (JetStream with interest retention would otherwise
// drop it silently), an oversized message wraps broker.ErrMessageTooLarge,
// an invalid ID, Type (not usable as NATS subject words) or header, and a
// message the server refuses, wrap broker.ErrNacked and name the field;
// other errors (no stream answered, connection lost, ctx done) mean the
// broker, not the message, failed. A publish confirmed as a duplicate
// counts as confirmed.
func (b *natsBroker) Publish(ctx context.Context, msgs []*broker.Message) error {
	b.mu.Lock()
	closed, d := b.closed, b.current
	b.mu.Unlock()
	if closed {
		return broker.ErrClosed
	}
	if d == nil {
		return errors.New("nats: publish: Declare was not called on this broker")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	ctx, cancel := withDefaultTimeout(ctx, b.cfg.PublishTimeout)
	defer cancel()

	var failed []broker.FailedMessage
	fail := func(i int, err error) {
		id := ""
		if msgs[i] != nil {
			id = msgs[i].ID
		}
		failed = append(failed, broker.FailedMessage{Index: i, ID: id, Err: err})
	}
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		nm, err := b.toWire(d, m)
		if err != nil {
			if !errors.Is(err, broker.ErrMessageTooLarge) && !errors.Is(err, broker.ErrUnroutable) {
				// An invalid message: refused for itself, like a nack, so
				// the caller does not take it for a broker outage.
				err = fmt.Errorf("%w: %w", broker.ErrNacked, err)
			}
			fail(i, err)
			continue
		}
		stall := 200 * time.Millisecond
		if dl, ok := ctx.Deadline(); ok {
			stall = max(time.Until(dl), time.Millisecond)
		}
		f, err := b.js.PublishMsgAsync(nm, jetstream.WithStallWait(stall))
		if err != nil {
			fail(i, b.publishErr(m, err))
			continue
		}
		futures[i] = f
	}
	var ctxErr error
	for i, f := range futures {
		if f == nil {
			continue
		}
		if ctxErr == nil {
			select {
			case <-f.Ok():
				continue
			case err := <-f.Err():
				fail(i, b.publishErr(msgs[i], err))
				continue
			case <-ctx.Done():
				ctxErr = ctx.Err()
			case <-b.closeCh:
				ctxErr = broker.ErrClosed
			}
		}
		select { // already settled?
		case <-f.Ok():
		case err := <-f.Err():
			fail(i, b.publishErr(msgs[i], err))
		default:
			fail(i, fmt.Errorf("nats: publish %s: no PubAck: %w", msgs[i].ID, ctxErr))
		}
	}
	if len(failed) == 0 {
		return nil
	}
	sort.Slice(failed, func(i, j int) bool { return failed[i].Index < failed[j].Index })
	return &broker.PublishError{Failed: failed}
}

// publishErr maps a JetStream publish error onto the broker errors.
func (b *natsBroker) publishErr(m *broker.Message, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum || strings.Contains(strings.ToLower(apiErr.Description), "too large") || strings.Contains(strings.ToLower(apiErr.Description), "maximum message size")):
		return fmt.Errorf("%w: nats: publish %s: %v", broker.ErrMessageTooLarge, m.ID, err)
	case errors.Is(err, natsgo.ErrMaxPayload):
		return fmt.Errorf("%w: nats: publish %s: %v", broker.ErrMessageTooLarge, m.ID, err)
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, natsgo.ErrNoResponders):
		return fmt.Errorf("nats: publish %s: no stream answered (stream missing or JetStream not ready): %w", m.ID, err)
	case errors.As(err, &apiErr):
		return fmt.Errorf("%w: nats: publish %s: %v", broker.ErrNacked, m.ID, err)
	}
	return fmt.Errorf("nats: publish %s: %w", m.ID, err)
}

// msgID is the Nats-Msg-Id of a message: its ID, followed by "@" and its
// HeaderCreatedAt when that header is set. The relay re-publishes an
// outbox row with the same ID and the same creation time, so the stream
// drops the copy; a different database (or a reset sequence) that reuses
// an ID within the duplicate window has a different creation time and is
// not mistaken for a duplicate.
func msgID(m *broker.Message) string {
	if c := m.Headers[broker.HeaderCreatedAt]; c != "" {
		return m.ID + "@" + c
	}
	return m.ID
}

// toWire validates m and builds its NATS message on subject
// <stream>.<Type>.
func (b *natsBroker) toWire(d *declared, m *broker.Message) (*natsgo.Msg, error) {
	if m == nil {
		return nil, errors.New("nats: publish: nil message")
	}
	if m.ID == "" || len(m.ID) > 255 {
		return nil, fmt.Errorf("nats: publish: message ID %q: want 1 to 255 bytes", m.ID)
	}
	if err := validSubjectWords(m.Type); err != nil {
		return nil, fmt.Errorf("nats: publish %s: Type %q: %v", m.ID, m.Type, err)
	}
	if size := m.Size(); size > b.caps.MaxMessageBytes {
		return nil, fmt.Errorf("%w: nats: publish %s: %d bytes, at most %d", broker.ErrMessageTooLarge, m.ID, size, b.caps.MaxMessageBytes)
	}
	routed := false
	for _, q := range d.topology.Queues {
		for _, p := range q.Bindings {
			if broker.MatchRoutingKey(p, m.Type) {
				routed = true
				break
			}
		}
		if routed {
			break
		}
	}
	if !routed {
		return nil, fmt.Errorf("%w: nats: publish %s: no queue of exchange %s binds type %q", broker.ErrUnroutable, m.ID, d.exchange, m.Type)
	}
	h, err := wireHeaders(m)
	if err != nil {
		return nil, err
	}
	h[jetstream.MsgIDHeader] = []string{msgID(m)}
	nm := &natsgo.Msg{Subject: d.names.eventSubject(m.Type), Header: h, Data: m.Body}
	if n := wireSize(nm); n > b.maxPayload {
		return nil, fmt.Errorf("%w: nats: publish %s: %d bytes with header framing, the server's max_payload is %d", broker.ErrMessageTooLarge, m.ID, n, b.maxPayload)
	}
	return nm, nil
}

// wireHeaders validates m's headers and returns them with the adapter's
// ID, Type and Key headers. Header names starting with "Nats-" or
// "Ferry-" are reserved. NATS trims leading and trailing blanks of header
// values, so a value (or ID or Key) that has them is sent base64-encoded
// and its header name listed in hdrEncoded; fromWire decodes it.
func wireHeaders(m *broker.Message) (natsgo.Header, error) {
	h := make(natsgo.Header, len(m.Headers)+4)
	set := func(k, v string) {
		if v != strings.Trim(v, " \t") {
			h[hdrEncoded] = append(h[hdrEncoded], k)
			v = base64.StdEncoding.EncodeToString([]byte(v))
		}
		h[k] = []string{v}
	}
	for k, v := range m.Headers {
		if err := validHeader(k, v); err != nil {
			return nil, fmt.Errorf("nats: publish %s: %w", m.ID, err)
		}
		set(k, v)
	}
	if strings.ContainsAny(m.ID, "\r\n") {
		return nil, fmt.Errorf("nats: publish: ID %q: must not contain CR or LF", m.ID)
	}
	set(hdrID, m.ID)
	h[hdrType] = []string{m.Type}
	if m.Key != "" {
		if strings.ContainsAny(m.Key, "\r\n") {
			return nil, fmt.Errorf("nats: publish %s: Key %q: must not contain CR or LF", m.ID, m.Key)
		}
		set(hdrKey, m.Key)
	}
	return h, nil
}

func validHeader(k, v string) error {
	if k == "" {
		return errors.New("header with an empty name")
	}
	lk := strings.ToLower(k)
	if strings.HasPrefix(lk, "nats-") || strings.HasPrefix(lk, "ferry-") {
		return fmt.Errorf("header %q: names starting with Nats- or Ferry- are reserved", k)
	}
	for _, r := range k {
		if r <= ' ' || r == ':' || r >= 0x7f {
			return fmt.Errorf("header %q: a NATS header name is printable ASCII without spaces or ':'", k)
		}
	}
	if strings.ContainsAny(v, "\r\n") {
		return fmt.Errorf("header %q: value must not contain CR or LF", k)
	}
	return nil
}

// wireSize is the payload size NATS counts against max_payload: the
// header block ("NATS/1.0\r\n", "Key: Value\r\n" per value, "\r\n") plus
// the data.
func wireSize(m *natsgo.Msg) int {
	n := len(m.Data)
	if len(m.Header) > 0 {
		n += len("NATS/1.0\r\n") + 2
		for k, vs := range m.Header {
			for _, v := range vs {
				n += len(k) + 2 + len(v) + 2
			}
		}
	}
	return n
}

// fromWire converts a stored NATS message back to a broker.Message:
// the adapter's headers become ID, Type and Key, the Nats- headers are
// dropped, the others are the message's headers (nil when none).
func fromWire(subject, eventPrefix string, h natsgo.Header, data []byte) *broker.Message {
	m := &broker.Message{Body: data}
	encoded := map[string]bool{}
	for _, k := range h[hdrEncoded] {
		encoded[k] = true
	}
	for k, vs := range h {
		if len(vs) == 0 {
			continue
		}
		v := vs[0]
		if encoded[k] {
			if b, err := base64.StdEncoding.DecodeString(v); err == nil {
				v = string(b)
			}
		}
		switch {
		case k == hdrID:
			m.ID = v
		case k == hdrType:
			m.Type = v
		case k == hdrKey:
			m.Key = v
		case strings.HasPrefix(strings.ToLower(k), "nats-"), strings.HasPrefix(strings.ToLower(k), "ferry-"):
		default:
			if m.Headers == nil {
				m.Headers = map[string]string{}
			}
			m.Headers[k] = v
		}
	}
	if m.ID == "" {
		m.ID = h.Get(jetstream.MsgIDHeader)
	}
	if m.Type == "" && strings.HasPrefix(subject, eventPrefix) {
		m.Type = strings.TrimPrefix(subject, eventPrefix)
	}
	return m
}
