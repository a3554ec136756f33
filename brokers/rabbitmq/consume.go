package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferrymq/ferry/broker"
)

// Subscribe implements broker.Broker. The subscription consumes on its own
// channel of the consuming connection with basic.qos prefetch
// opts.Prefetch (per consumer); AckDeadline is ignored: RabbitMQ waits for a
// settlement until the channel closes (its consumer_timeout, 30 minutes by
// default, closes channels that hold a delivery longer). Subscribe waits
// until the consumer is registered, at most 5s (or ctx); when the server is
// unreachable or refuses the consumer it returns the subscription anyway,
// which keeps trying every Config.ReconnectDelay. With opts.Ordered the
// subscription is wrapped by broker.OrderedSubscription: a queue hands out
// in queue order, and a key's next delivery waits for the previous one's
// settlement.
func (r *rabbit) Subscribe(ctx context.Context, queue string, opts broker.SubscribeOptions) (broker.Subscription, error) {
	if r.closed.Load() {
		return nil, broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q, ok := r.queue(queue)
	if !ok {
		return nil, fmt.Errorf("rabbitmq: subscribe %q: %w", queue, broker.ErrUnknownQueue)
	}
	prefetch := opts.Prefetch
	if prefetch == 0 {
		prefetch = broker.DefaultPrefetch
	}
	if prefetch < 0 || prefetch > 65535 {
		return nil, fmt.Errorf("rabbitmq: subscribe %q: SubscribeOptions.Prefetch %d: want 1..65535", queue, opts.Prefetch)
	}
	s := &subscription{
		r:        r,
		q:        q,
		prefetch: prefetch,
		out:      make(chan *delivery),
		closed:   make(chan struct{}),
		done:     make(chan struct{}),
		started:  make(chan error, 1),
	}
	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		return nil, broker.ErrClosed
	}
	r.subs[s] = struct{}{}
	r.mu.Unlock()
	go s.run()
	// Wait for the first consume to be registered, so messages published
	// after Subscribe returns are already flowing to it; a failure is
	// retried in the background and does not fail Subscribe.
	select {
	case <-s.started:
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
	}
	if opts.Ordered {
		// A queue delivers in queue order; hold back each key's next
		// delivery until the one before it is settled.
		return broker.OrderedSubscription(s), nil
	}
	return s, nil
}

// subscription implements broker.Subscription.
type subscription struct {
	r        *rabbit
	q        broker.Queue
	prefetch int
	out      chan *delivery

	closed    chan struct{} // closed by Close or the adapter's Close
	closeOnce sync.Once
	done      chan struct{} // closed when run returns
	started   chan error
	startOnce sync.Once
}

var _ broker.Subscription = (*subscription)(nil)

// consumerChan is one consuming channel; it stays open after the
// subscription stops until every delivery handed out from it is settled.
type consumerChan struct {
	ch          *amqp.Channel
	mu          sync.Mutex
	outstanding int
	retiring    bool // the subscription stopped consuming on it
	closedOnce  sync.Once
}

func (c *consumerChan) handedOut() {
	c.mu.Lock()
	c.outstanding++
	c.mu.Unlock()
}

// settled records a final settlement and closes a retiring channel once
// nothing is outstanding.
func (c *consumerChan) settled() {
	c.mu.Lock()
	c.outstanding--
	closeNow := c.retiring && c.outstanding <= 0
	c.mu.Unlock()
	if closeNow {
		c.close()
	}
}

// idle reports whether no delivery handed out from c is unsettled.
func (c *consumerChan) idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.outstanding <= 0
}

func (c *consumerChan) retire() {
	c.mu.Lock()
	c.retiring = true
	closeNow := c.outstanding <= 0
	c.mu.Unlock()
	if closeNow {
		c.close()
	}
}

func (c *consumerChan) close() {
	c.closedOnce.Do(func() { go c.ch.Close() })
}

func (s *subscription) signalStarted(err error) {
	s.startOnce.Do(func() { s.started <- err })
}

func (s *subscription) run() {
	defer close(s.done)
	r := s.r
	log := r.log.With("queue", s.q.Name)
	tagSeq, failures := 0, 0
	for {
		select {
		case <-s.closed:
			return
		default:
		}
		ctx, cancel := context.WithCancel(context.Background())
		stop := context.AfterFunc(r.closeCtx, cancel)
		go func() {
			select {
			case <-s.closed:
				cancel()
			case <-ctx.Done():
			}
		}()
		conn, err := r.subMgr.current(ctx)
		stop()
		cancel()
		if err != nil {
			return // closed
		}
		consumeAt := time.Now()
		ch, msgs, tag, watch, err := s.consume(conn, &tagSeq)
		if err != nil {
			if isAMQPCode(err, amqp.NotFound) && !conn.IsClosed() && failures < 3 {
				// The queue is gone although the connection is up (deleted
				// by an operator): declare the topology again and consume
				// at once, instead of waiting for a reconnect that never
				// comes.
				failures++
				hctx, hcancel := r.opContext(context.Background())
				herr := r.healTopology(hctx, err.Error(), consumeAt)
				hcancel()
				if herr == nil {
					continue
				}
			}
			s.signalStarted(err)
			if !conn.IsClosed() {
				if failures%20 == 0 {
					log.Warn("rabbitmq: consume failed; retrying", "err", err, "attempt", failures+1)
				}
				failures++
				if !r.subMgr.sleep(r.cfg.ReconnectDelay) {
					return
				}
			}
			continue
		}
		failures = 0
		s.signalStarted(nil)
		cc := &consumerChan{ch: ch}
		again, orphaned := s.pump(conn, cc, msgs, tag)
		if !again {
			return
		}
		if orphaned {
			continue // the channel is retired, not closed: consume at once
		}
		// The channel or connection was lost (or the server cancelled the
		// consumer, e.g. the queue was deleted): close what is left and
		// consume again.
		cc.close()
		if conn.IsClosed() {
			continue // the connection manager logs the loss
		}
		if watch.cancelledByServer() {
			log.Warn("rabbitmq: the broker cancelled the consumer (its queue was deleted?); declaring the topology again if it is missing and consuming again")
			continue // consume at once; NOT_FOUND there re-declares
		}
		if e := watch.closeReason(); e != nil {
			log.Warn("rabbitmq: the broker closed the consuming channel; deliveries not yet settled on it go back to the queue and are redelivered, settling them now fails; consuming again",
				"code", e.Code, "reason", e.Reason, "hint", closeHint(e))
		}
		if !r.subMgr.sleep(r.cfg.ReconnectDelay) {
			return
		}
	}
}

// chanWatch holds what the server said when it closed a consuming channel
// or cancelled its consumer.
type chanWatch struct {
	closed    chan *amqp.Error
	cancelled chan string
}

func (w chanWatch) closeReason() *amqp.Error {
	select {
	case e := <-w.closed:
		return e
	default:
		return nil
	}
}

func (w chanWatch) cancelledByServer() bool {
	select {
	case _, ok := <-w.cancelled:
		return ok
	default:
		return false
	}
}

// closeHint says what a channel-closing error from the server means for
// an operator.
func closeHint(e *amqp.Error) string {
	switch {
	case e.Code == amqp.PreconditionFailed && strings.Contains(e.Reason, "timed out"):
		return "a delivery stayed unacknowledged longer than the server's consumer_timeout (30 min by default): the handler was too slow; RabbitMQ redelivers the message; raise consumer_timeout or make the handler faster"
	case e.Code == amqp.NotFound:
		return "the queue was deleted while consumed; ferry declares it again"
	default:
		return "the channel is reopened and consuming resumes; unsettled messages are redelivered"
	}
}

func (s *subscription) consume(conn *amqp.Connection, seq *int) (*amqp.Channel, <-chan amqp.Delivery, string, chanWatch, error) {
	var watch chanWatch
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, "", watch, fmt.Errorf("rabbitmq: subscribe %s: open channel: %w", s.q.Name, err)
	}
	watch.closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	watch.cancelled = ch.NotifyCancel(make(chan string, 1))
	if err := ch.Qos(s.prefetch, 0, false); err != nil {
		ch.Close()
		return nil, nil, "", watch, fmt.Errorf("rabbitmq: subscribe %s: basic.qos: %w", s.q.Name, err)
	}
	*seq++
	tag := fmt.Sprintf("ferry-%s-%p-%d", s.q.Name, s, *seq)
	if len(tag) > 255 {
		tag = tag[len(tag)-255:]
	}
	msgs, err := ch.Consume(s.q.Name, tag, false, false, false, false, nil)
	if err != nil {
		ch.Close()
		return nil, nil, "", watch, fmt.Errorf("rabbitmq: subscribe %s: basic.consume: %w", s.q.Name, err)
	}
	return ch, msgs, tag, watch, nil
}

// pump hands deliveries from msgs to Receive until msgs closes (returns
// true: consume again) or the subscription stops (returns false).
//
// When no delivery arrived for consumerCheckEvery and none handed out is
// unsettled, it returns again and orphaned true after closing the channel,
// so that the run loop registers a fresh consumer: RabbitMQ does not
// always send basic.cancel when a consumed queue is deleted and declared
// again at once (seen with quorum queues), and a passive declaration then
// still finds the queue and counts a consumer, so the subscription would
// wait forever on a consumer the server forgot. The refresh costs a few
// AMQP frames per idle period and never raises the number of unsettled
// deliveries above Prefetch, because it waits until none is unsettled.
func (s *subscription) pump(conn *amqp.Connection, cc *consumerChan, msgs <-chan amqp.Delivery, tag string) (again, orphaned bool) {
	check := time.NewTicker(consumerCheckEvery)
	defer check.Stop()
	last := time.Now()
	for {
		select {
		case d, ok := <-msgs:
			if !ok {
				return true, false
			}
			last = time.Now()
			dl := s.newDelivery(cc, d)
			select {
			case s.out <- dl:
			case <-s.closed:
				_ = cc.ch.Nack(d.DeliveryTag, false, true)
				s.stopConsuming(cc, msgs, tag)
				return false, false
			}
		case <-check.C:
			if time.Since(last) < consumerCheckEvery || !cc.idle() {
				continue
			}
			if why := s.consumerGone(conn); why != "" {
				s.r.log.Warn("rabbitmq: the consumer is gone without a cancel from the broker; consuming again", "queue", s.q.Name, "why", why)
			}
			cc.retire() // nothing unsettled: closes the channel now
			return true, true
		case <-s.closed:
			s.stopConsuming(cc, msgs, tag)
			return false, false
		}
	}
}

// consumerCheckEvery is how long a subscription may go without a delivery
// before it checks that its consumer still exists (see pump).
const consumerCheckEvery = 5 * time.Second

// consumerGone reports why the subscription's consumer no longer exists
// on the server ("" when it may): its queue is missing, or the queue counts
// no consumer. It uses a passive declaration on a channel of its own.
func (s *subscription) consumerGone(conn *amqp.Connection) string {
	ch, err := conn.Channel()
	if err != nil {
		return ""
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(s.q.Name, true, false, false, false, nil)
	switch {
	case isAMQPCode(err, amqp.NotFound):
		return "its queue no longer exists"
	case err != nil:
		return ""
	case q.Consumers == 0:
		return "its queue counts no consumer"
	}
	return ""
}

// stopConsuming cancels the consumer, returns the prefetched deliveries
// not handed out, and retires the channel: it closes once every handed-out
// delivery is settled, or at the adapter's Close.
func (s *subscription) stopConsuming(cc *consumerChan, msgs <-chan amqp.Delivery, tag string) {
	cc.handedOut() // hold the channel open while cancelling
	defer cc.settled()
	if s.r.closed.Load() {
		cc.retire()
		cc.close()
		return
	}
	cancelled := make(chan struct{})
	go func() {
		_ = cc.ch.Cancel(tag, false)
		close(cancelled)
	}()
	timeout := time.NewTimer(3 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case d, ok := <-msgs:
			if !ok {
				cc.retire()
				return
			}
			_ = cc.ch.Nack(d.DeliveryTag, false, true)
		case <-timeout.C:
			// No cancel-ok (server unreachable): closing the channel returns
			// everything unsettled.
			cc.retire()
			cc.close()
			return
		case <-s.r.closing:
			cc.retire()
			cc.close()
			return
		}
	}
}

// Receive implements broker.Subscription.
func (s *subscription) Receive(ctx context.Context) (broker.Delivery, error) {
	select {
	case <-s.closed:
		return nil, broker.ErrClosed
	default:
	}
	select {
	case d := <-s.out:
		return d, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.closed:
		return nil, broker.ErrClosed
	}
}

// stop signals the run loop to stop consuming.
func (s *subscription) stop() {
	s.closeOnce.Do(func() { close(s.closed) })
}

// Close implements broker.Subscription. It cancels the consumer and returns
// the prefetched deliveries not yet handed out to the queue; deliveries
// handed out stay settleable until the adapter's Close. It waits at most
// about 3s for the server.
func (s *subscription) Close() error {
	s.stop()
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
	}
	s.r.mu.Lock()
	delete(s.r.subs, s)
	s.r.mu.Unlock()
	return nil
}

func (s *subscription) newDelivery(cc *consumerChan, d amqp.Delivery) *delivery {
	cc.handedOut()
	return &delivery{s: s, cc: cc, d: d, msg: fromAMQP(d.MessageId, d.Type, d.RoutingKey, d.Headers, d.Body)}
}

// Delivery states.
const (
	stateOpen int32 = iota
	stateSettling
	stateSettled
)

// delivery implements broker.Delivery.
type delivery struct {
	s     *subscription
	cc    *consumerChan
	d     amqp.Delivery
	msg   *broker.Message
	state atomic.Int32
}

var _ broker.Delivery = (*delivery)(nil)

// Message implements broker.Delivery.
func (d *delivery) Message() *broker.Message { return d.msg }

// begin claims the delivery for one settlement.
func (d *delivery) begin() error {
	if d.s.r.closed.Load() {
		return broker.ErrClosed
	}
	if !d.state.CompareAndSwap(stateOpen, stateSettling) {
		return broker.ErrAlreadyAcked
	}
	return nil
}

// finish records the outcome of a settlement: settled, or open again so
// the caller may settle otherwise.
func (d *delivery) finish(settled bool) {
	if settled {
		d.state.Store(stateSettled)
		d.cc.settled()
	} else {
		d.state.Store(stateOpen)
	}
}

func (d *delivery) ack(op string) error {
	if err := d.cc.ch.Ack(d.d.DeliveryTag, false); err != nil {
		return connFault(fmt.Errorf("rabbitmq: %s %s: ack: %w (the channel is gone; RabbitMQ redelivers the message)", op, d.msg.ID, d.s.r.closedErr(err)))
	}
	return nil
}

// connFault classifies the error of a settlement on a channel that is
// gone as broker.ReasonConnection (broker.SettleReason), unless the
// Broker was closed (broker.ReasonClosed).
func connFault(err error) error {
	if errors.Is(err, broker.ErrClosed) {
		return err
	}
	return broker.SettleFault(broker.ReasonConnection, err)
}

// Ack implements broker.Delivery.
func (d *delivery) Ack(ctx context.Context) error {
	if err := d.begin(); err != nil {
		return err
	}
	err := d.ack("ack")
	d.finish(err == nil)
	return err
}

// Extend implements broker.Delivery: a no-op, RabbitMQ has no ack deadline
// short of consumer_timeout.
func (d *delivery) Extend(ctx context.Context) error {
	if d.s.r.closed.Load() {
		return broker.ErrClosed
	}
	return nil
}

// retryLevel picks the retry level for delay: the shortest level at least
// as long, or the longest level when none is.
func retryLevel(delays []time.Duration, delay time.Duration) int {
	best, longest := -1, 0
	for i, d := range delays {
		if d >= delay && (best < 0 || d < delays[best]) {
			best = i
		}
		if d > delays[longest] {
			longest = i
		}
	}
	if best < 0 {
		return longest
	}
	return best
}

// Retry implements broker.Delivery: it publishes a copy with the retry
// headers to the retry level <queue>.retry.<i> through the default
// exchange, waits for its confirm, then acks the original. If the publish
// fails the delivery stays unsettled; if the ack fails after the copy was
// stored, the original is redelivered too (a duplicate, deduplicated by ID).
func (d *delivery) Retry(ctx context.Context, delay time.Duration, reason string) error {
	if err := d.begin(); err != nil {
		return err
	}
	delays := d.s.q.Delays()
	level := retryLevel(delays, delay)
	h := d.copyHeaders()
	h[broker.HeaderRetryCount] = strconv.Itoa(retryCount(d.msg.Headers) + 1)
	h[broker.HeaderLastError] = broker.TruncateReason(reason)
	if _, ok := h[broker.HeaderFirstFailedAt]; !ok {
		h[broker.HeaderFirstFailedAt] = broker.FormatTime(time.Now())
	}
	return d.moveTo(ctx, "retry", retryQueueName(d.s.q.Name, level), h)
}

// DeadLetter implements broker.Delivery: it publishes a copy with
// HeaderLastError and HeaderDeadAt to <queue>.dlq through the default
// exchange, waits for its confirm, then acks the original.
func (d *delivery) DeadLetter(ctx context.Context, reason string) error {
	if err := d.begin(); err != nil {
		return err
	}
	h := d.copyHeaders()
	h[broker.HeaderLastError] = broker.TruncateReason(reason)
	h[broker.HeaderDeadAt] = broker.FormatTime(time.Now())
	return d.moveTo(ctx, "dead-letter", broker.DLQName(d.s.q.Name), h)
}

// copyHeaders returns the original AMQP headers without RabbitMQ's
// dead-lettering headers.
func (d *delivery) copyHeaders() amqp.Table {
	h := make(amqp.Table, len(d.d.Headers)+3)
	for k, v := range d.d.Headers {
		if isDeathHeader(k) {
			continue
		}
		h[k] = v
	}
	return h
}

func (d *delivery) moveTo(ctx context.Context, op, queue string, h amqp.Table) error {
	r := d.s.r
	if d.cc.ch.IsClosed() {
		// The delivery's channel is gone and RabbitMQ redelivers the
		// message: a copy now would be a second attempt.
		d.finish(false)
		return connFault(fmt.Errorf("rabbitmq: %s %s: %w (the channel is gone; RabbitMQ redelivers the message)", op, d.msg.ID, r.closedErr(amqp.ErrClosed)))
	}
	ctx, cancel := r.opContext(ctx)
	defer cancel()
	pub := amqp.Publishing{
		Headers:         h,
		ContentType:     d.d.ContentType,
		ContentEncoding: d.d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		MessageId:       d.d.MessageId,
		Timestamp:       d.d.Timestamp,
		Type:            d.msg.Type,
		Body:            d.d.Body,
	}
	errs, err := r.publishHealing(ctx, []outgoing{{exchange: "", key: queue, pub: pub}})
	if err == nil {
		err = errs[0]
	}
	if err != nil {
		d.finish(false)
		if r.closed.Load() {
			return broker.ErrClosed
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return err
		}
		return fmt.Errorf("rabbitmq: %s %s to %s: %w", op, d.msg.ID, queue, err)
	}
	err = d.ack(op)
	// The copy is stored: the delivery is settled either way.
	d.state.Store(stateSettled)
	d.cc.settled()
	return err
}
