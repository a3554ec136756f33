package rabbitmq

import (
	"context"
	"fmt"
	"sort"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferrymq/ferry/broker"
)

// DLQ implements broker.Broker. It does no I/O. For a queue this adapter
// did not declare (ferry dlq declares nothing), every operation first
// checks passively that <queue> and <queue>.dlq exist; replays go through
// the default exchange to <queue>, which needs no other topology.
func (r *rabbit) DLQ(queue string) (broker.DeadLetterQueue, error) {
	if r.closed.Load() {
		return nil, broker.ErrClosed
	}
	q, ok := r.queue(queue)
	if !ok {
		if err := validQueueName(queue); err != nil {
			return nil, fmt.Errorf("rabbitmq: dlq %q: %w: %v", queue, broker.ErrUnknownQueue, err)
		}
		q = broker.Queue{Name: queue}
	}
	return &dlq{r: r, q: q, name: broker.DLQName(q.Name)}, nil
}

// validQueueName reports whether Declare would accept name as a queue
// name (broker.Topology.Validate's rule).
func validQueueName(name string) error {
	return broker.Topology{Exchange: "x", Queues: []broker.Queue{{Name: name, Bindings: []string{"x"}}}}.Validate()
}

// dlq implements broker.DeadLetterQueue on <queue>.dlq. Each operation
// reads the queue with basic.get on a channel of its own, without ack, and
// then settles what it read: List returns everything (closing the channel
// requeues the unacked messages at their original positions,
// https://www.rabbitmq.com/docs/confirms#consumer-nacks-requeue), Purge
// acks the chosen messages, Replay first publishes them to the work queue
// with confirms and then acks them. An operation reads at most the
// messages present when it starts. Concurrent operations on the same DLQ
// do not see the messages another one holds at that moment.
type dlq struct {
	r    *rabbit
	q    broker.Queue
	name string
}

var _ broker.DeadLetterQueue = (*dlq)(nil)

type got struct {
	d  amqp.Delivery
	dm broker.DeadMessage
}

// scan reads up to limit messages (all when limit <= 0) from the DLQ on a
// fresh channel and calls settle, which settles some of them; the channel
// then returns every unsettled one to the queue and closes.
func (q *dlq) scan(ctx context.Context, op string, limit int, settle func(ctx context.Context, ch *amqp.Channel, msgs []got) error) error {
	if q.r.closed.Load() {
		return broker.ErrClosed
	}
	ctx, cancel := q.r.opContext(ctx)
	defer cancel()
	conn, err := q.r.pubMgr.current(ctx)
	if err != nil {
		return fmt.Errorf("rabbitmq: dlq %s: %s: %w", q.name, op, q.r.closedErr(err))
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: dlq %s: %s: open channel: %w", q.name, op, err)
	}
	defer ch.Close()
	// Passive declarations only look: a missing queue is a 404 that
	// closes this throwaway channel, and nothing is created.
	_, err = ch.QueueDeclarePassive(q.name, true, false, false, false, nil)
	if err != nil {
		if isAMQPCode(err, amqp.NotFound) {
			return fmt.Errorf("rabbitmq: dlq %s: %s: %w: no queue %q on the server (its DLQ %q does not exist)", q.name, op, broker.ErrUnknownQueue, q.q.Name, q.name)
		}
		return fmt.Errorf("rabbitmq: dlq %s: %s: %w", q.name, op, q.r.closedErr(err))
	}
	if op == "replay" {
		// Replay publishes to the work queue through the default exchange:
		// it must exist, or the copies would be returned unroutable.
		if _, err := ch.QueueDeclarePassive(q.q.Name, true, false, false, false, nil); err != nil {
			if isAMQPCode(err, amqp.NotFound) {
				return fmt.Errorf("rabbitmq: dlq %s: %s: %w: the work queue %q does not exist on the server (only its DLQ)", q.name, op, broker.ErrUnknownQueue, q.q.Name)
			}
			return fmt.Errorf("rabbitmq: dlq %s: %s: queue %q: %w", q.name, op, q.q.Name, q.r.closedErr(err))
		}
	}
	// The count of a passive declaration is a snapshot that a quorum
	// queue updates only periodically (it may say 1 for 3 messages just
	// confirmed), so it bounds nothing: take messages until the queue
	// answers empty (basic.get-empty) or limit is reached; the ones taken
	// stay unacknowledged on this channel, so none comes twice.
	var msgs []got
	for limit <= 0 || len(msgs) < limit {
		if err := ctx.Err(); err != nil {
			return q.r.closedErr(err)
		}
		d, ok, err := ch.Get(q.name, false)
		if err != nil {
			return fmt.Errorf("rabbitmq: dlq %s: %s: basic.get: %w", q.name, op, q.r.closedErr(err))
		}
		if !ok {
			break
		}
		m := fromAMQP(d.MessageId, d.Type, d.RoutingKey, d.Headers, d.Body)
		dm := broker.DeadMessage{
			Message:       m,
			LastError:     m.Headers[broker.HeaderLastError],
			FirstFailedAt: broker.ParseTime(m.Headers[broker.HeaderFirstFailedAt]),
			DeadAt:        broker.ParseTime(m.Headers[broker.HeaderDeadAt]),
		}
		if dm.DeadAt.IsZero() {
			// Not dead-lettered by ferry (which sets HeaderDeadAt): dropped
			// by RabbitMQ itself through the work queue's dead-letter
			// exchange, with the reason in x-death.
			if reason, at, ok := brokerDeath(d.Headers, q.q.Name); ok {
				if dm.LastError != "" {
					reason += "; the last failed attempt before: " + dm.LastError
				}
				dm.LastError, dm.DeadAt = broker.TruncateReason(reason), at
			}
		}
		msgs = append(msgs, got{d: d, dm: dm})
	}
	// settle acks some; closing the channel (deferred, after the acks on
	// the wire) returns the rest to their original positions.
	return settle(ctx, ch, msgs)
}

// List implements broker.DeadLetterQueue. Oldest first means by
// HeaderDeadAt: a quorum queue serves the messages an earlier List (or a
// closed channel) returned before the others, in no fixed order, so the
// queue's own order is not the dead-lettering order; with quorum queues
// List therefore reads the whole DLQ and sorts it before applying limit.
func (q *dlq) List(ctx context.Context, limit int) ([]broker.DeadMessage, error) {
	var out []broker.DeadMessage
	scanLimit := limit
	if q.r.cfg.QueueType == QueueTypeQuorum {
		scanLimit = 0
	}
	err := q.scan(ctx, "list", scanLimit, func(_ context.Context, _ *amqp.Channel, msgs []got) error {
		for _, g := range msgs {
			out = append(out, g.dm)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].DeadAt, out[j].DeadAt
		return !a.IsZero() && !b.IsZero() && a.Before(b)
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func wanted(ids []string) func(string) bool {
	if ids == nil {
		return func(string) bool { return true }
	}
	set := make(map[string]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	return func(id string) bool { return set[id] }
}

// Purge implements broker.DeadLetterQueue.
func (q *dlq) Purge(ctx context.Context, ids []string) ([]string, error) {
	match := wanted(ids)
	var out []string
	err := q.scan(ctx, "purge", 0, func(ctx context.Context, ch *amqp.Channel, msgs []got) error {
		for _, g := range msgs {
			if !match(g.d.MessageId) {
				continue
			}
			if err := ch.Ack(g.d.DeliveryTag, false); err != nil {
				return fmt.Errorf("rabbitmq: dlq %s: purge %s: %w", q.name, g.d.MessageId, err)
			}
			out = append(out, g.d.MessageId)
		}
		return nil
	})
	return out, err
}

// Replay implements broker.DeadLetterQueue. The messages go back to the
// work queue through the default exchange (so only to this queue) without
// HeaderRetryCount, HeaderLastError and HeaderDeadAt; HeaderFirstFailedAt
// is kept. Each is acked in the DLQ only after its copy was confirmed.
func (q *dlq) Replay(ctx context.Context, ids []string) ([]string, error) {
	match := wanted(ids)
	var out []string
	err := q.scan(ctx, "replay", 0, func(ctx context.Context, ch *amqp.Channel, msgs []got) error {
		var items []outgoing
		var picked []got
		for _, g := range msgs {
			if !match(g.d.MessageId) {
				continue
			}
			h := make(amqp.Table, len(g.d.Headers))
			for k, v := range g.d.Headers {
				switch {
				case k == broker.HeaderRetryCount, k == broker.HeaderLastError, k == broker.HeaderDeadAt, isDeathHeader(k):
					continue
				}
				h[k] = v
			}
			items = append(items, outgoing{exchange: "", key: q.q.Name, pub: amqp.Publishing{
				Headers:         h,
				ContentType:     g.d.ContentType,
				ContentEncoding: g.d.ContentEncoding,
				DeliveryMode:    amqp.Persistent,
				MessageId:       g.d.MessageId,
				Timestamp:       g.d.Timestamp,
				Type:            g.dm.Message.Type,
				Body:            g.d.Body,
			}})
			picked = append(picked, g)
		}
		if len(items) == 0 {
			return nil
		}
		errs, err := q.r.publishConfirmed(ctx, items)
		if err != nil {
			return fmt.Errorf("rabbitmq: dlq %s: replay: %w", q.name, err)
		}
		var first error
		for i, g := range picked {
			if errs[i] != nil {
				if first == nil {
					first = fmt.Errorf("rabbitmq: dlq %s: replay %s: %w", q.name, g.d.MessageId, errs[i])
				}
				continue
			}
			if err := ch.Ack(g.d.DeliveryTag, false); err != nil {
				return fmt.Errorf("rabbitmq: dlq %s: replay %s: ack: %w", q.name, g.d.MessageId, err)
			}
			out = append(out, g.d.MessageId)
		}
		return first
	})
	return out, err
}

// Where implements broker.DeadLetterQueue: the RabbitMQ queue
// <queue>.dlq (in the vhost of Config.URL). It does no I/O.
func (q *dlq) Where(context.Context) (string, error) {
	if q.r.closed.Load() {
		return "", broker.ErrClosed
	}
	return fmt.Sprintf("RabbitMQ queue %q", q.name), nil
}

// brokerDeath reads the x-death header RabbitMQ adds to a message it
// dead-letters (https://www.rabbitmq.com/docs/dlx#effects) and returns,
// for the entry of the work queue queue (the entries of its retry levels,
// whose TTL sends messages back, are passed over), a reason naming what
// RabbitMQ did and why, and when. ok is false when there is no such
// entry.
func brokerDeath(h amqp.Table, queue string) (reason string, at time.Time, ok bool) {
	deaths, _ := h["x-death"].([]interface{})
	for _, e := range deaths {
		t, isTable := e.(amqp.Table)
		if !isTable {
			continue
		}
		if q, _ := t["queue"].(string); q != queue {
			continue
		}
		why, _ := t["reason"].(string)
		at, _ = t["time"].(time.Time)
		what := map[string]string{
			"maxlen":         "the queue was over its max-length or max-length-bytes (a policy or argument) and RabbitMQ dropped its oldest message",
			"expired":        "the message outlived its message-ttl (a policy or argument)",
			"delivery_limit": "the message was delivered more often than the quorum queue's delivery-limit",
			"rejected":       "a consumer rejected the message without requeue",
		}[why]
		if what == "" {
			what = "RabbitMQ dead-lettered the message"
		}
		return fmt.Sprintf("rabbitmq: dropped by the broker from queue %q, x-death reason %q: %s", queue, why, what), at.UTC(), true
	}
	return "", time.Time{}, false
}
