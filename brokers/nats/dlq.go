package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferry/broker"
)

// deadLetterQueue is the DLQ of one queue: the messages on its subject of
// the exchange's DLQ stream (limits retention, so reading does not remove
// them).
type deadLetterQueue struct {
	b  *natsBroker
	d  *declared
	qi *queueInfo
}

// deadEntry is one stored dead message with its DLQ stream sequence.
type deadEntry struct {
	seq  uint64
	dead broker.DeadMessage
}

// scan reads up to limit dead messages (all when limit <= 0), oldest
// first, by direct gets of the next message on the queue's DLQ subject.
func (q *deadLetterQueue) scan(ctx context.Context, limit int) ([]deadEntry, error) {
	if q.b.isClosed() {
		return nil, broker.ErrClosed
	}
	stream, err := q.b.js.Stream(ctx, q.d.names.dlqStream)
	if err != nil {
		return nil, fmt.Errorf("nats: DLQ of %s: stream %s: %w", q.qi.queue.Name, q.d.names.dlqStream, err)
	}
	var out []deadEntry
	for seq := uint64(1); limit <= 0 || len(out) < limit; {
		raw, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(q.qi.dlqSubj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("nats: DLQ of %s: read %s from sequence %d: %w", q.qi.queue.Name, q.qi.dlqSubj, seq, err)
		}
		out = append(out, deadEntry{seq: raw.Sequence, dead: toDead(raw, q.d.names.stream+".")})
		seq = raw.Sequence + 1
	}
	return out, nil
}

func toDead(raw *jetstream.RawStreamMsg, eventPrefix string) broker.DeadMessage {
	m := fromWire(raw.Subject, eventPrefix, raw.Header, raw.Data)
	retries, _ := strconv.Atoi(m.Headers[broker.HeaderRetryCount])
	m.Attempt = retries + 1
	return broker.DeadMessage{
		Message:       m,
		LastError:     m.Headers[broker.HeaderLastError],
		FirstFailedAt: broker.ParseTime(m.Headers[broker.HeaderFirstFailedAt]),
		DeadAt:        broker.ParseTime(m.Headers[broker.HeaderDeadAt]),
	}
}

// List implements broker.DeadLetterQueue.
func (q *deadLetterQueue) List(ctx context.Context, limit int) ([]broker.DeadMessage, error) {
	ctx, cancel := withDefaultTimeout(ctx, q.b.cfg.PublishTimeout)
	defer cancel()
	entries, err := q.scan(ctx, limit)
	if err != nil {
		return nil, err
	}
	out := make([]broker.DeadMessage, len(entries))
	for i, e := range entries {
		out[i] = e.dead
	}
	return out, nil
}

// selectEntries returns the entries whose ID is in ids (all when ids is
// nil) and the IDs selected, each once, in DLQ order.
func selectEntries(entries []deadEntry, ids []string) ([]deadEntry, []string) {
	var want map[string]bool
	if ids != nil {
		want = make(map[string]bool, len(ids))
		for _, id := range ids {
			want[id] = true
		}
	}
	var sel []deadEntry
	var got []string
	seen := map[string]bool{}
	for _, e := range entries {
		id := e.dead.Message.ID
		if want != nil && !want[id] {
			continue
		}
		sel = append(sel, e)
		if !seen[id] {
			seen[id] = true
			got = append(got, id)
		}
	}
	return sel, got
}

// Replay implements broker.DeadLetterQueue. Each selected message is
// published to the queue's replay subject, which only this queue's
// consumer filters on, without HeaderRetryCount, HeaderLastError and
// HeaderDeadAt; once its PubAck arrived it is deleted from the DLQ stream.
// The copy is a new stream message, so its Attempt starts at 1 again.
func (q *deadLetterQueue) Replay(ctx context.Context, ids []string) ([]string, error) {
	ctx, cancel := withDefaultTimeout(ctx, q.b.cfg.PublishTimeout)
	defer cancel()
	entries, err := q.scan(ctx, 0)
	if err != nil {
		return nil, err
	}
	sel, _ := selectEntries(entries, ids)
	stream, err := q.b.js.Stream(ctx, q.d.names.dlqStream)
	if err != nil {
		return nil, fmt.Errorf("nats: DLQ of %s: stream %s: %w", q.qi.queue.Name, q.d.names.dlqStream, err)
	}
	var replayed []string
	seen := map[string]bool{}
	for _, e := range sel {
		m := e.dead.Message.Clone()
		delete(m.Headers, broker.HeaderRetryCount)
		delete(m.Headers, broker.HeaderLastError)
		delete(m.Headers, broker.HeaderDeadAt)
		h, err := wireHeaders(m)
		if err != nil {
			return replayed, fmt.Errorf("nats: DLQ of %s: replay %s: %w", q.qi.queue.Name, m.ID, err)
		}
		h[jetstream.MsgIDHeader] = []string{fmt.Sprintf("replay:%s:%d:%s", q.qi.consumer, e.seq, m.ID)}
		if _, err := q.b.js.PublishMsg(ctx, &natsgo.Msg{Subject: q.qi.replay, Header: h, Data: m.Body}); err != nil {
			return replayed, fmt.Errorf("nats: DLQ of %s: replay %s to %s: %w", q.qi.queue.Name, m.ID, q.qi.replay, err)
		}
		if err := stream.DeleteMsg(ctx, e.seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return replayed, fmt.Errorf("nats: DLQ of %s: replayed %s but could not remove it from the DLQ (sequence %d): %w", q.qi.queue.Name, m.ID, e.seq, err)
		}
		if !seen[m.ID] {
			seen[m.ID] = true
			replayed = append(replayed, m.ID)
		}
	}
	return replayed, nil
}

// Purge implements broker.DeadLetterQueue: the selected messages are
// deleted by sequence (all of them: a subject purge up to the last
// message listed, so messages dead-lettered meanwhile are kept).
func (q *deadLetterQueue) Purge(ctx context.Context, ids []string) ([]string, error) {
	ctx, cancel := withDefaultTimeout(ctx, q.b.cfg.PublishTimeout)
	defer cancel()
	entries, err := q.scan(ctx, 0)
	if err != nil {
		return nil, err
	}
	sel, got := selectEntries(entries, ids)
	if len(sel) == 0 {
		return nil, nil
	}
	stream, err := q.b.js.Stream(ctx, q.d.names.dlqStream)
	if err != nil {
		return nil, fmt.Errorf("nats: DLQ of %s: stream %s: %w", q.qi.queue.Name, q.d.names.dlqStream, err)
	}
	if ids == nil {
		last := sel[len(sel)-1].seq
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(q.qi.dlqSubj), jetstream.WithPurgeSequence(last+1)); err != nil {
			return nil, fmt.Errorf("nats: DLQ of %s: purge %s: %w", q.qi.queue.Name, q.qi.dlqSubj, err)
		}
		return got, nil
	}
	var purged []string
	seen := map[string]bool{}
	for _, e := range sel {
		err := stream.DeleteMsg(ctx, e.seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return purged, fmt.Errorf("nats: DLQ of %s: delete %s (sequence %d): %w", q.qi.queue.Name, e.dead.Message.ID, e.seq, err)
		}
		if id := e.dead.Message.ID; !seen[id] {
			seen[id] = true
			purged = append(purged, id)
		}
	}
	return purged, nil
}
