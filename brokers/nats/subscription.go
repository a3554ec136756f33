package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferry/broker"
)

// subscription is a demand-driven pull loop over a queue's durable
// consumer. Receive registers as a waiter; when waiters outnumber the
// buffered messages and the prefetch leaves room, one pull request runs in
// the background. It is greedy for what is there and patient only for
// what is asked: first a short pull (pullLinger) for all the room the
// prefetch leaves (Prefetch minus the messages in flight), which takes
// the backlog and what arrives within it; when that one came back empty,
// a pull for as many messages as there are waiters that waits up to
// Config.PullWait. A long pull for the whole room would hold the queue's
// next messages for a process that may not receive them (another
// subscriber would wait for their AckWait); one sized by the waiters alone
// made a worker whose goroutines take turns to gather batches (one waiter
// at a time) pull one message per request, a round trip each: at 1,000
// events/s its latency grew to a p99 of 0.1-0.5 s (bench/README.md, "The
// gathering turn and NATS"). A message that arrives after its
// waiter gave up stays in the buffer for the next Receive, unless it has
// waited longer than 3/4 of the AckWait: then it is dropped unsettled (the
// server redelivers it when its AckWait ends), so that a message is never
// handed out when it may already be redelivered elsewhere.
type subscription struct {
	b       *natsBroker
	d       *declared
	qi      *queueInfo
	cons    jetstream.Consumer
	limit   int           // Prefetch
	ackWait time.Duration // consumer AckWait
	done    chan struct{}

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on every state change
	closed   bool
	buffer   []buffered
	waiters  int
	inflight int // handed out unsettled + buffered + requested from the server
	fetching bool
	idle     bool                 // the last short pull came back empty: wait for the waiters' messages
	fetchSub *natsgo.Subscription // inbox of the pull request running
	failing  bool                 // the last fetch failed (logged once per failure streak)
}

type buffered struct {
	msg *natsgo.Msg
	at  time.Time
}

func newSubscription(b *natsBroker, d *declared, qi *queueInfo, cons jetstream.Consumer, opts broker.SubscribeOptions) *subscription {
	return &subscription{
		b: b, d: d, qi: qi, cons: cons,
		limit:   opts.Prefetch,
		ackWait: opts.AckDeadline,
		done:    make(chan struct{}),
		changed: make(chan struct{}),
	}
}

func (s *subscription) broadcastLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Receive implements broker.Subscription.
func (s *subscription) Receive(ctx context.Context) (broker.Delivery, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.waiters++
	defer func() {
		s.waiters--
		s.mu.Unlock()
	}()
	for {
		if s.closed || s.b.isClosed() {
			return nil, broker.ErrClosed
		}
		for len(s.buffer) > 0 {
			e := s.buffer[0]
			s.buffer[0] = buffered{}
			s.buffer = s.buffer[1:]
			if time.Since(e.at) > s.ackWait*3/4 {
				// Its AckWait is nearly over: the server will redeliver it.
				s.inflight--
				continue
			}
			d, err := s.newDelivery(e.msg)
			if err != nil {
				s.inflight--
				s.b.log.Warn("nats: dropping a message without JetStream metadata", "queue", s.qi.queue.Name, "err", err)
				continue
			}
			s.b.track(d)
			return d, nil
		}
		s.maybeFetchLocked()
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-s.done:
		case <-s.b.closeCh:
		case <-ctx.Done():
			s.mu.Lock()
			return nil, ctx.Err()
		}
		s.mu.Lock()
	}
}

func (s *subscription) maybeFetchLocked() {
	if s.fetching || s.closed {
		return
	}
	room := s.limit - s.inflight
	if s.waiters <= len(s.buffer) || room <= 0 {
		return
	}
	n, wait := room, pullLinger
	if s.idle {
		n, wait = min(s.waiters-len(s.buffer), room), s.b.cfg.PullWait
	}
	s.fetching = true
	s.inflight += n
	go s.fetch(n, wait)
}

// pullLinger is how long a pull for all the prefetch's room waits on the
// server: the backlog comes at once, and what arrives within it joins.
const pullLinger = 5 * time.Millisecond

// fetch sends one pull request for up to n messages that waits up to
// wait on the server, on an inbox of its own, and moves what arrives into
// the buffer until n messages arrived, the server ends the request (408
// when wait expired) or the subscription closes. shutdown unsubscribes
// the inbox, so the server stops delivering to a request nobody listens
// to any more.
func (s *subscription) fetch(n int, wait time.Duration) {
	start := time.Now()
	got, err := s.pull(n, wait)
	if err != nil && !s.b.isClosed() && s.b.nc.IsConnected() {
		// The consumer or its stream may have been deleted under us
		// (409 Consumer Deleted, or no responders): declare them again
		// if they are missing, instead of pulling forever in vain.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.b.healTopology(ctx, s.d.exchange, "pull: "+err.Error(), start)
		cancel()
	}
	if err != nil {
		s.mu.Lock()
		first := !s.failing
		s.failing = true
		s.mu.Unlock()
		if first && !s.b.isClosed() {
			s.b.log.Warn("nats: pull failed, retrying", "queue", s.qi.queue.Name, "err", err)
		}
		// Throttle while the server is unreachable or not ready.
		select {
		case <-s.done:
		case <-s.b.closeCh:
		case <-time.After(250 * time.Millisecond):
		}
	}
	s.mu.Lock()
	if err == nil && s.failing {
		s.failing = false
		s.b.log.Info("nats: pull recovered", "queue", s.qi.queue.Name)
	}
	s.inflight -= n - got
	s.idle = err == nil && got == 0 && wait == pullLinger
	s.fetching = false
	s.broadcastLocked()
	s.mu.Unlock()
}

// pull runs one pull request; it returns how many messages it took.
func (s *subscription) pull(n int, wait time.Duration) (int, error) {
	nc := s.b.nc
	ch := make(chan *natsgo.Msg, n+8)
	inbox := nc.NewInbox()
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = sub.Unsubscribe()
		return 0, nil
	}
	s.fetchSub = sub
	s.mu.Unlock()
	got := 0
	defer func() {
		s.mu.Lock()
		s.fetchSub = nil
		s.mu.Unlock()
		_ = sub.Unsubscribe()
		for { // delivered before the unsubscribe: hand back at once
			select {
			case m := <-ch:
				if m.Reply != "" { // a message, not a status
					s.mu.Lock()
					s.inflight--
					s.mu.Unlock()
					got++
					_ = m.Respond([]byte("-NAK"))
				}
				continue
			default:
			}
			return
		}
	}()
	req := fmt.Appendf(nil, `{"batch":%d,"expires":%d}`, n, wait.Nanoseconds())
	subject := "$JS.API.CONSUMER.MSG.NEXT." + s.d.names.stream + "." + s.qi.consumer
	if err := nc.PublishRequest(subject, inbox, req); err != nil {
		return got, err
	}
	timer := time.NewTimer(wait + time.Second)
	defer timer.Stop()
	for got < n {
		select {
		case m := <-ch:
			if m.Reply == "" { // a status message of the pull request
				status := m.Header.Get("Status")
				switch status {
				case "408", "404", "100": // request expired, no messages, heartbeat
					if status == "100" {
						continue
					}
					return got, nil
				case "503":
					return got, fmt.Errorf("no responders: JetStream not ready or stream %s missing", s.d.names.stream)
				default:
					return got, fmt.Errorf("pull request ended: %s %s", status, m.Header.Get("Description"))
				}
			}
			got++
			s.mu.Lock()
			if s.closed {
				s.inflight--
				s.mu.Unlock()
				_ = m.Respond([]byte("-NAK")) // returned at once to the server
				continue
			}
			s.buffer = append(s.buffer, buffered{msg: m, at: time.Now()})
			s.broadcastLocked()
			s.mu.Unlock()
		case <-timer.C:
			return got, nil // no answer (e.g. disconnected): pull again
		case <-s.done:
			return got, nil
		case <-s.b.closeCh:
			return got, nil
		}
	}
	return got, nil
}

// release frees a prefetch slot after a delivery was settled.
func (s *subscription) release() {
	s.mu.Lock()
	s.inflight--
	s.broadcastLocked()
	s.mu.Unlock()
}

// Close implements broker.Subscription. Buffered messages not yet handed
// out are Nak'ed for immediate redelivery; handed-out deliveries can still
// be settled.
func (s *subscription) Close() error {
	s.shutdown()
	s.b.removeSub(s)
	return nil
}

func (s *subscription) shutdown() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	buf := s.buffer
	s.buffer = nil
	s.inflight -= len(buf)
	if s.fetchSub != nil {
		// Unsubscribed before the Naks below are sent (one connection keeps
		// the order), so the server does not hand them to this request.
		_ = s.fetchSub.Unsubscribe()
	}
	close(s.done)
	s.broadcastLocked()
	s.mu.Unlock()
	for _, e := range buf {
		_ = e.msg.Respond([]byte("-NAK"))
	}
}

// delivery is one handed-out message.
type delivery struct {
	s     *subscription
	msg   *natsgo.Msg
	m     *broker.Message
	key   noteKey
	mu    sync.Mutex
	done  bool // settled
	freed bool
}

func (s *subscription) newDelivery(jm *natsgo.Msg) (*delivery, error) {
	md, err := jm.Metadata()
	if err != nil {
		return nil, err
	}
	m := fromWire(jm.Subject, s.d.names.stream+".", jm.Header, jm.Data)
	m.Attempt = int(md.NumDelivered)
	if m.Attempt < 1 {
		m.Attempt = 1
	}
	key := noteKey{consumer: s.qi.consumer, seq: md.Sequence.Stream}
	if m.Attempt > 1 {
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		m.Headers[broker.HeaderRetryCount] = strconv.Itoa(m.Attempt - 1)
		if n, ok := s.b.notes.get(key); ok {
			m.Headers[broker.HeaderLastError] = n.lastError
			m.Headers[broker.HeaderFirstFailedAt] = broker.FormatTime(n.firstFailedAt)
		}
	}
	return &delivery{s: s, msg: jm, m: m, key: key}, nil
}

// Message implements broker.Delivery. Attempt is the consumer's
// NumDelivered, so it also counts redeliveries after an expired AckWait or
// a lost connection (Capabilities.CountsRedeliveries). HeaderRetryCount is
// Attempt-1 when Attempt > 1. HeaderLastError and HeaderFirstFailedAt of a
// retried message are known only to the broker that called Retry (a Nak
// cannot change headers): a redelivery to another process lacks them, and
// the worker passes the reason again at DeadLetter.
func (d *delivery) Message() *broker.Message { return d.m }

// settle sends an acknowledgement body to the server and waits for its
// confirmation.
func (d *delivery) settle(ctx context.Context, what string, body []byte, final bool) error {
	if d.s.b.isClosed() {
		return broker.ErrClosed
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return broker.ErrAlreadyAcked
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	err := d.request(ctx, body)
	if final {
		d.free()
	}
	if err != nil {
		return settleErr(fmt.Errorf("nats: %s message %s: %w", what, d.m.ID, err))
	}
	if final {
		d.done = true
		d.s.b.untrack(d)
	}
	return nil
}

// settleErr classifies the error of a settlement for
// broker.SettleReason: a connection closed, lost or reconnecting is
// broker.ReasonConnection, a request nobody answered in time
// broker.ReasonTimeout, and no responder for the ack subject (the consumer
// is gone) broker.ReasonNotFound.
func settleErr(err error) error {
	switch {
	case errors.Is(err, natsgo.ErrConnectionClosed), errors.Is(err, natsgo.ErrDisconnected),
		errors.Is(err, natsgo.ErrConnectionDraining), errors.Is(err, natsgo.ErrConnectionReconnecting):
		return broker.SettleFault(broker.ReasonConnection, err)
	case errors.Is(err, natsgo.ErrTimeout):
		return broker.SettleFault(broker.ReasonTimeout, err)
	case errors.Is(err, natsgo.ErrNoResponders):
		return broker.SettleFault(broker.ReasonNotFound, err)
	}
	return err
}

func (d *delivery) request(ctx context.Context, body []byte) error {
	ctx, cancel := withDefaultTimeout(ctx, d.s.b.cfg.SettleTimeout)
	defer cancel()
	_, err := d.s.b.nc.RequestWithContext(ctx, d.msg.Reply, body)
	return err
}

// free releases the prefetch slot once (the first settlement attempt,
// successful or not, ends the handler's use of it).
func (d *delivery) free() {
	if !d.freed {
		d.freed = true
		d.s.release()
	}
}

// Ack implements broker.Delivery with an acknowledged +ACK (AckSync).
func (d *delivery) Ack(ctx context.Context) error {
	err := d.settle(ctx, "ack", []byte("+ACK"), true)
	if err == nil {
		d.s.b.notes.forget(d.key)
	}
	return err
}

// Retry implements broker.Delivery with NakWithDelay(delay), confirmed by
// the server: the message comes back to this queue's consumer only, after
// delay (at least Config.MinRetryDelay; a consumer BackOff would not apply
// to a Nak, and none is configured). The reason and the first failure time
// are remembered in this broker for the redelivery (see Message).
func (d *delivery) Retry(ctx context.Context, delay time.Duration, reason string) error {
	if d.s.b.isClosed() {
		return broker.ErrClosed // not ErrAlreadyAcked: Close returned the delivery to the server
	}
	delay = max(delay, d.s.b.cfg.MinRetryDelay)
	d.mu.Lock()
	done := d.done
	d.mu.Unlock()
	if done {
		return broker.ErrAlreadyAcked
	}
	first := time.Now()
	if t := broker.ParseTime(d.m.Headers[broker.HeaderFirstFailedAt]); !t.IsZero() {
		first = t
	}
	d.s.b.notes.put(d.key, note{
		lastError:     broker.TruncateReason(reason),
		firstFailedAt: first,
		expires:       time.Now().Add(delay + d.s.ackWait + 10*time.Minute),
	})
	body := fmt.Appendf(nil, `-NAK {"delay": %d}`, delay.Nanoseconds())
	return d.settle(ctx, "retry", body, true)
}

// DeadLetter implements broker.Delivery: the message is published to the
// queue's DLQ subject with its headers plus HeaderLastError, HeaderDeadAt,
// HeaderFirstFailedAt (now, when it never failed before) and
// HeaderRetryCount (Attempt-1), the PubAck is awaited, and then the
// delivery is terminated (+TERM), so it is neither lost nor redelivered.
// The DLQ copy's Nats-Msg-Id is derived from the queue and the stream
// sequence, so a dead-lettering repeated after a lost +TERM is dropped by
// the DLQ stream's duplicate window.
func (d *delivery) DeadLetter(ctx context.Context, reason string) error {
	if d.s.b.isClosed() {
		return broker.ErrClosed
	}
	d.mu.Lock()
	done := d.done
	d.mu.Unlock()
	if done {
		return broker.ErrAlreadyAcked
	}
	now := time.Now()
	dm := d.m.Clone()
	if dm.Headers == nil {
		dm.Headers = map[string]string{}
	}
	dm.Headers[broker.HeaderLastError] = broker.TruncateReason(reason)
	dm.Headers[broker.HeaderDeadAt] = broker.FormatTime(now)
	if dm.Headers[broker.HeaderFirstFailedAt] == "" {
		dm.Headers[broker.HeaderFirstFailedAt] = broker.FormatTime(now)
	}
	dm.Headers[broker.HeaderRetryCount] = strconv.Itoa(d.m.Attempt - 1)
	h, err := wireHeaders(dm)
	if err != nil {
		return fmt.Errorf("nats: dead-letter: %w", err)
	}
	h[jetstream.MsgIDHeader] = []string{fmt.Sprintf("dlq:%s:%d:%s", d.s.qi.consumer, d.key.seq, d.m.ID)}
	pctx, cancel := withDefaultTimeout(ctx, d.s.b.cfg.PublishTimeout)
	defer cancel()
	if err := d.s.b.connected(pctx); err != nil {
		return fmt.Errorf("nats: dead-letter message %s to %s: %w", d.m.ID, d.s.qi.dlqSubj, err)
	}
	if _, err := d.s.b.js.PublishMsg(pctx, &natsgo.Msg{Subject: d.s.qi.dlqSubj, Header: h, Data: dm.Body}); err != nil {
		return settleErr(fmt.Errorf("nats: dead-letter message %s to %s: %w", d.m.ID, d.s.qi.dlqSubj, err))
	}
	err = d.settle(ctx, "terminate", []byte("+TERM"), true)
	if err == nil {
		d.s.b.notes.forget(d.key)
	}
	return err
}

// Extend implements broker.Delivery with a confirmed InProgress (+WPI),
// which restarts the AckWait of the delivery.
func (d *delivery) Extend(ctx context.Context) error {
	return d.settle(ctx, "extend", []byte("+WPI"), false)
}

// returnToServer Naks an unsettled delivery at Close, without waiting.
func (d *delivery) returnToServer() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return
	}
	d.done = true
	_ = d.s.b.nc.Publish(d.msg.Reply, []byte("-NAK"))
}

// noteKey identifies one message in one queue.
type noteKey struct {
	consumer string
	seq      uint64
}

// note is what a Retry remembers for the redelivery: the headers a Nak
// cannot carry.
type note struct {
	lastError     string
	firstFailedAt time.Time
	expires       time.Time
}

// retryNotes is a bounded in-memory map of notes.
type retryNotes struct {
	mu sync.Mutex
	m  map[noteKey]note
}

const maxNotes = 100_000

func newRetryNotes() *retryNotes { return &retryNotes{m: map[noteKey]note{}} }

func (r *retryNotes) put(k noteKey, n note) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.m) >= maxNotes {
		now := time.Now()
		for k, v := range r.m {
			if now.After(v.expires) {
				delete(r.m, k)
			}
		}
		for k := range r.m { // still full: drop arbitrary entries
			if len(r.m) < maxNotes*9/10 {
				break
			}
			delete(r.m, k)
		}
	}
	r.m[k] = n
}

func (r *retryNotes) get(k noteKey) (note, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.m[k]
	if ok && time.Now().After(n.expires) {
		delete(r.m, k)
		return note{}, false
	}
	return n, ok
}

func (r *retryNotes) forget(k noteKey) {
	r.mu.Lock()
	delete(r.m, k)
	r.mu.Unlock()
}
