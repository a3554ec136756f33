package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferrymq/ferry/broker"
)

// pubChan is one confirm-mode channel of the pool. It is used by one batch
// at a time.
type pubChan struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  chan *amqp.Error
}

// pubPool hands out confirm-mode channels on the publishing connection.
type pubPool struct {
	r     *rabbit
	slots chan *pubChan // nil entries are slots without an open channel
}

func newPubPool(r *rabbit, n int) *pubPool {
	p := &pubPool{r: r, slots: make(chan *pubChan, n)}
	for i := 0; i < n; i++ {
		p.slots <- nil
	}
	return p
}

// acquire returns an open confirm-mode channel, opening one when the slot
// is empty or its channel is closed.
func (p *pubPool) acquire(ctx context.Context) (*pubChan, error) {
	var pc *pubChan
	select {
	case pc = <-p.slots:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.r.closing:
		return nil, broker.ErrClosed
	}
	if pc != nil && !pc.ch.IsClosed() && !pc.conn.IsClosed() {
		return pc, nil
	}
	if pc != nil {
		p.discard(pc)
	}
	for {
		conn, err := p.r.pubMgr.current(ctx)
		if err != nil {
			p.slots <- nil
			return nil, err
		}
		pc, err = p.open(ctx, conn)
		if err == nil {
			return pc, nil
		}
		if errors.Is(err, broker.ErrBlocked) || errors.Is(err, broker.ErrClosed) || (ctx.Err() != nil && errors.Is(err, ctx.Err())) {
			p.slots <- nil
			return nil, err
		}
		if conn.IsClosed() {
			continue // lost meanwhile: wait for the next connection
		}
		p.slots <- nil
		return nil, fmt.Errorf("rabbitmq: open publishing channel: %w", err)
	}
}

// open opens a confirm-mode channel on conn within ctx. amqp091's
// Channel and Confirm wait for the server's answer without a deadline,
// and a connection blocked by a resource alarm is not read by the server
// until the alarm clears (it may get connection.blocked only now, on the
// first write after the alarm): open gives up when ctx ends, the
// connection is reported blocked (broker.ErrBlocked) or the adapter
// closes, and a channel that opens later is closed.
func (p *pubPool) open(ctx context.Context, conn *amqp.Connection) (*pubChan, error) {
	type opened struct {
		pc  *pubChan
		err error
	}
	done := make(chan opened, 1)
	go func() {
		pc, err := openPubChan(conn)
		done <- opened{pc, err}
	}()
	_, blocked := p.r.pubMgr.blocked()
	var err error
	select {
	case o := <-done:
		return o.pc, o.err
	case <-ctx.Done():
		err = ctx.Err()
	case <-blocked:
		err = broker.ErrBlocked
	case <-p.r.closing:
		err = broker.ErrClosed
	}
	go func() {
		if o := <-done; o.pc != nil {
			p.discard(o.pc)
		}
	}()
	if reason, _ := p.r.pubMgr.blocked(); reason != "" && !errors.Is(err, broker.ErrClosed) {
		if err == broker.ErrBlocked {
			err = nil
		}
		return nil, broker.Blocked(reason, err)
	}
	return nil, err
}

func openPubChan(conn *amqp.Connection) (*pubChan, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, err
	}
	return &pubChan{
		conn: conn,
		ch:   ch,
		// basic.return frames are handed over by amqp091's reader goroutine
		// with a blocking send; the batch waiter drains this channel while
		// it waits, and discard drains it until the channel closes.
		returns: ch.NotifyReturn(make(chan amqp.Return, 256)),
		closed:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

// release puts pc back; a channel in an unknown state is discarded.
func (p *pubPool) release(pc *pubChan, healthy bool) {
	if !healthy {
		p.discard(pc)
		pc = nil
	}
	p.slots <- pc
}

// discard closes pc's channel in the background, draining its returns so
// amqp091's reader never blocks on them.
func (p *pubPool) discard(pc *pubChan) {
	go func() {
		for range pc.returns {
		}
	}()
	go pc.ch.Close()
}

// outgoing is one message to publish with its destination.
type outgoing struct {
	exchange string
	key      string
	pub      amqp.Publishing
}

// publishConfirmed publishes items pipelined on one pooled channel and
// waits for every confirm. It returns one error per item (nil: durably
// confirmed), or a non-nil second result when nothing could be sent. It
// never blocks past ctx, even when the socket write blocks (a RabbitMQ
// resource alarm blocks publishers' connections).
func (r *rabbit) publishConfirmed(ctx context.Context, items []outgoing) ([]error, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// A blocked connection is not read by the server: nothing sent now
	// would be confirmed before the alarm clears.
	reason, blocked := r.pubMgr.blocked()
	if reason != "" {
		return nil, broker.Blocked(reason, nil)
	}
	pc, err := r.pool.acquire(ctx)
	if err != nil {
		return nil, r.closedErr(err)
	}
	type result struct {
		errs    []error
		healthy bool
	}
	done := make(chan result, 1)
	go func() {
		errs, healthy := pc.send(ctx, items)
		r.pool.release(pc, healthy)
		done <- result{errs, healthy}
	}()
	var fail error
	select {
	case res := <-done:
		return res.errs, nil
	case <-ctx.Done():
		fail = r.closedErr(ctx.Err())
	case <-blocked:
		// A resource alarm: the confirms (or the write) wait for it to
		// clear, which may take hours. Give up now, as for a deadline;
		// the caller's cancel of ctx ends the sending goroutine.
		reason, _ := r.pubMgr.blocked()
		fail = broker.Blocked(reason, nil)
	}
	// The sending goroutine is stuck in a write or a confirm wait; it
	// releases (and discards) the channel when ctx ends.
	select {
	case res := <-done:
		return res.errs, nil
	case <-time.After(50 * time.Millisecond):
	}
	if reason, _ := r.pubMgr.blocked(); reason != "" && !errors.Is(fail, broker.ErrClosed) {
		// The deadline passed while the server was not reading: say why.
		fail = broker.Blocked(reason, fail)
	}
	errs := make([]error, len(items))
	for i := range errs {
		errs[i] = fail
	}
	return errs, nil
}

// publishHealing is publishConfirmed, plus the repair of a topology that
// disappeared while the connection stayed up: items that failed because
// the exchange is missing (the channel closed with NOT_FOUND) or that came
// back unroutable although the remembered topology routes them (their
// queue was deleted) are published once more after healTopology declared
// the topology again. They were not stored, so publishing them again
// duplicates nothing. Without this a relay would park such rows as
// unroutable until the next reconnect.
func (r *rabbit) publishHealing(ctx context.Context, items []outgoing) ([]error, error) {
	start := time.Now()
	errs, err := r.publishConfirmed(ctx, items)
	if err != nil {
		return errs, err
	}
	var again []int
	what := ""
	for i, e := range errs {
		switch {
		case e == nil:
		case isAMQPCode(e, amqp.NotFound):
			again = append(again, i)
			what = e.Error()
		case errors.Is(e, broker.ErrUnroutable) && r.knownRoute(items[i].exchange, items[i].key):
			again = append(again, i)
			if what == "" {
				what = e.Error()
			}
		}
	}
	if len(again) == 0 || ctx.Err() != nil {
		return errs, nil
	}
	cluster := len(r.cfg.urls()) > 1
	if herr := r.healTopology(ctx, what, start); herr != nil {
		// Logged by healTopology. On a cluster the declaration fails
		// when the node it went to is shutting down or has not yet
		// recovered (a rolling restart): the route is known, so the
		// message is not at fault; it is published again later.
		if cluster {
			for _, i := range again {
				if errors.Is(errs[i], broker.ErrUnroutable) {
					errs[i] = fmt.Errorf("rabbitmq: publish %q: %w (declaring the topology again failed: %v)", items[i].pub.MessageId, ErrRoutesRecovering, herr)
				}
			}
		}
		return errs, nil
	}
	retry := make([]outgoing, len(again))
	for j, i := range again {
		retry[j] = items[i]
	}
	errs2, err := r.publishConfirmed(ctx, retry)
	for j, i := range again {
		switch {
		case err != nil:
			errs[i] = err
		case cluster && errors.Is(errs2[j], broker.ErrUnroutable):
			// Returned again right after its binding was declared again:
			// on a cluster that is a node that has just (re)started and
			// not yet recovered its durable bindings (seen in a rolling
			// restart: 100 rows parked as unroutable for 30 s). The route
			// exists, so it is an outage of that node, not a fault of the
			// message.
			errs[i] = fmt.Errorf("rabbitmq: publish %q: %w", items[i].pub.MessageId, ErrRoutesRecovering)
		default:
			errs[i] = errs2[j]
		}
	}
	return errs, nil
}

// ErrRoutesRecovering is the error of a message a cluster node returned
// as unroutable (basic.return) although the adapter's topology binds its
// routing key and the binding was just declared again: a node that has
// just started serves connections before it has recovered its durable
// bindings. It does not wrap broker.ErrUnroutable: the relay waits it out
// as an outage instead of parking the row. Only with several URLs; on a
// single node the message stays broker.ErrUnroutable.
var ErrRoutesRecovering = errors.New("rabbitmq: the node returned the message unroutable although its binding exists (a cluster node still recovering its bindings); publish it again later")

// send publishes items on pc and waits for their confirms. healthy is false
// when the channel must not be reused (closed, or confirms still pending).
func (pc *pubChan) send(ctx context.Context, items []outgoing) (errs []error, healthy bool) {
	errs = make([]error, len(items))
	dcs := make([]*amqp.DeferredConfirmation, len(items))
	returned := make([]bool, len(items))
	onReturn := func(ret amqp.Return) {
		// Returns arrive in publish order, each before its message's ack;
		// the first not yet returned item with the same id and routing key
		// is the one.
		for i := range items {
			if dcs[i] != nil && !returned[i] && items[i].pub.MessageId == ret.MessageId && items[i].key == ret.RoutingKey {
				returned[i] = true
				return
			}
		}
	}
	var sendErr error
	for i := range items {
		it := &items[i]
		dc, err := pc.ch.PublishWithDeferredConfirmWithContext(ctx, it.exchange, it.key, true, false, it.pub)
		if err != nil {
			sendErr = err
			for j := i; j < len(items); j++ {
				errs[j] = fmt.Errorf("rabbitmq: publish: %w", err)
			}
			break
		}
		dcs[i] = dc
		// Take returns as they come, so amqp091's reader never waits on a
		// full returns channel while this loop writes.
	drain:
		for {
			select {
			case ret, ok := <-pc.returns:
				if !ok {
					break drain
				}
				onReturn(ret)
			default:
				break drain
			}
		}
	}
	healthy = sendErr == nil
	returns := pc.returns // nil once closed, so the select below never spins
confirms:
	for i, dc := range dcs {
		if dc == nil {
			continue
		}
	wait:
		for {
			select {
			case <-dc.Done():
				break wait
			case ret, ok := <-returns:
				if !ok {
					returns = nil
					continue
				}
				onReturn(ret)
			case <-ctx.Done():
				for j := i; j < len(dcs); j++ {
					if dcs[j] != nil && !dcs[j].Acked() {
						errs[j] = ctx.Err()
					}
				}
				healthy = false
				break confirms
			}
		}
		if !dc.Acked() {
			if pc.ch.IsClosed() {
				var closeErr *amqp.Error
				select {
				case closeErr = <-pc.closed:
				default:
				}
				if closeErr != nil {
					// Wrapped, so callers can tell a missing exchange
					// (NOT_FOUND) from a lost connection.
					errs[i] = fmt.Errorf("rabbitmq: publish: no confirm before the channel closed (%w): %w", closeErr, amqp.ErrClosed)
				} else {
					errs[i] = fmt.Errorf("rabbitmq: publish: no confirm before the channel closed: %w", amqp.ErrClosed)
				}
				healthy = false
			} else {
				errs[i] = fmt.Errorf("rabbitmq: publish: %w", ErrServerNack)
			}
		}
	}
	// Every return came before its ack, so the returns of the acked
	// messages are all queued by now.
	for returns != nil {
		select {
		case ret, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			onReturn(ret)
			continue
		default:
		}
		break
	}
	for i := range items {
		if returned[i] && errs[i] == nil {
			errs[i] = fmt.Errorf("rabbitmq: publish %q with routing key %q: %w", items[i].pub.MessageId, items[i].key, broker.ErrUnroutable)
		}
	}
	return errs, healthy
}

// Publish implements broker.Broker. Messages that fail validation (no ID or
// Type, an ID or Type over 255 bytes, a header name empty, over 128 bytes
// or reserved: broker.ErrInvalidMessage; too large:
// broker.ErrMessageTooLarge) are not sent and are reported in the
// *broker.PublishError with the others that failed; the valid messages of
// the batch are published all the same. A channel closed by a message
// (refusedByMessage) is split up with broker.SendSplitting so that only
// the message at fault fails; every other failure is reported per
// message, the confirmed messages never listed (see the package doc).
func (r *rabbit) Publish(ctx context.Context, msgs []*broker.Message) error {
	if r.closed.Load() {
		return broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	exchange, ok := r.exchange()
	if !ok {
		return errors.New("rabbitmq: publish: no topology declared; call Declare first")
	}
	ctx, cancel := r.opContext(ctx)
	defer cancel()

	var failed []broker.FailedMessage
	items := make([]outgoing, 0, len(msgs))
	index := make([]int, 0, len(msgs))
	now := time.Now()
	for i, m := range msgs {
		if err := r.check(m); err != nil {
			id := ""
			if m != nil {
				id = m.ID
			}
			failed = append(failed, broker.FailedMessage{Index: i, ID: id, Err: err})
			continue
		}
		items = append(items, outgoing{exchange: exchange, key: m.Type, pub: toPublishing(m, now)})
		index = append(index, i)
	}
	if len(items) > 0 {
		all := make([]int, len(items))
		for j := range all {
			all[j] = j
		}
		// A channel closed by a message (refusedByMessage) takes every
		// message not yet confirmed on it along: sending them apart finds
		// the one at fault and publishes the others.
		res := broker.SendSplitting(ctx, all, func(ctx context.Context, sub []int) map[int]error {
			part := make([]outgoing, len(sub))
			for k, j := range sub {
				part[k] = items[j]
			}
			out := map[int]error{}
			errs, err := r.publishHealing(ctx, part)
			if err != nil {
				for _, j := range sub {
					out[j] = err
				}
				return out
			}
			refused := false
			for _, e := range errs {
				refused = refused || refusedByMessage(e)
			}
			for k, e := range errs {
				if e == nil {
					continue
				}
				if refused && errors.Is(e, amqp.ErrClosed) && !r.closed.Load() {
					e = broker.RefusedCall(e)
				}
				out[sub[k]] = e
			}
			return out
		})
		for j, e := range res {
			if r.closed.Load() && errors.Is(e, context.Canceled) {
				e = broker.ErrClosed
			}
			failed = append(failed, broker.FailedMessage{Index: index[j], ID: msgs[index[j]].ID, Err: e})
		}
	}
	if len(failed) == 0 {
		return nil
	}
	sortFailed(failed)
	if len(failed) == len(msgs) && allSame(failed) && (isPlain(failed[0].Err) || !broker.IsMessageFault(failed[0].Err)) {
		// The whole batch failed for one reason (closed, deadline, no
		// channel): say so plainly; errors.Is finds it either way.
		return failed[0].Err
	}
	return &broker.PublishError{Failed: failed}
}

// refusedByMessage reports whether err says that the channel was closed
// by the server because of a message published on it, not because of
// the server, the connection or the credentials: a channel or connection
// exception with reply code 406 PRECONDITION_FAILED (e.g. "invalid
// message: unacceptable_type_in_header" for a "CC" or "BCC" header that
// is not an array, a message over the server's max_message_size),
// 311 CONTENT_TOO_LARGE or 502 SYNTAX_ERROR (AMQP 0-9-1 reference,
// "Constants"). Every other code is an outage: 320 CONNECTION_FORCED,
// 403 ACCESS_REFUSED, 404 NOT_FOUND (the exchange is gone: the topology
// is declared again), 504 CHANNEL_ERROR, 506 RESOURCE_ERROR,
// 530 NOT_ALLOWED, 541 INTERNAL_ERROR, and a lost connection.
func refusedByMessage(err error) bool {
	if err == nil {
		return false
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.Code {
	case amqp.PreconditionFailed, amqp.ContentTooLarge, amqp.SyntaxError:
		return true
	}
	return false
}

func allSame(f []broker.FailedMessage) bool {
	for _, x := range f[1:] {
		if x.Err != f[0].Err {
			return false
		}
	}
	return true
}

func isPlain(err error) bool {
	return err == broker.ErrClosed || err == context.DeadlineExceeded || err == context.Canceled
}

func sortFailed(f []broker.FailedMessage) {
	for i := 1; i < len(f); i++ {
		for j := i; j > 0 && f[j].Index < f[j-1].Index; j-- {
			f[j], f[j-1] = f[j-1], f[j]
		}
	}
}

// check validates one message for Publish. Every refusal is a failure of
// the message itself: it wraps broker.ErrInvalidMessage, or
// broker.ErrMessageTooLarge for sizes, so that a caller such as the outbox
// relay retries that message with its own backoff and does not take it for
// an outage.
func (r *rabbit) check(m *broker.Message) error {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{broker.ErrInvalidMessage}, args...)...)
	}
	switch {
	case m == nil:
		return invalid("rabbitmq: publish: nil message")
	case m.ID == "":
		return invalid("rabbitmq: publish: Message.ID is required")
	case len(m.ID) > 255:
		return invalid("rabbitmq: publish: Message.ID is %d bytes, at most 255 (AMQP message-id)", len(m.ID))
	case m.Type == "":
		return invalid("rabbitmq: publish %s: Message.Type is required", m.ID)
	case len(m.Type) > 255:
		return invalid("rabbitmq: publish %s: Message.Type is %d bytes, at most 255 (AMQP routing key)", m.ID, len(m.Type))
	}
	if size := m.Size(); size > r.cfg.MaxMessageBytes {
		return fmt.Errorf("rabbitmq: publish %s: %d bytes, at most %d: %w", m.ID, size, r.cfg.MaxMessageBytes, broker.ErrMessageTooLarge)
	}
	if hb := m.HeaderBytes(); hb > r.cfg.MaxHeaderBytes {
		return fmt.Errorf("rabbitmq: publish %s: headers take %d bytes, at most %d: %w", m.ID, hb, r.cfg.MaxHeaderBytes, broker.ErrMessageTooLarge)
	}
	// The encoded headers table must fit in one content-header frame
	// (frame_max, 128 KiB by default), or the server closes the connection.
	if enc := encodedHeaderBytes(m); enc > maxEncodedHeaderBytes {
		return fmt.Errorf("rabbitmq: publish %s: headers encode to %d bytes, at most %d (one AMQP frame): %w", m.ID, enc, maxEncodedHeaderBytes, broker.ErrMessageTooLarge)
	}
	for k := range m.Headers {
		if k == "" || len(k) > 128 {
			return invalid("rabbitmq: publish %s: header name %q: want 1..128 bytes (AMQP field name)", m.ID, k)
		}
		if k == keyHeader {
			return invalid("rabbitmq: publish %s: header name %q is reserved by the adapter", m.ID, k)
		}
	}
	return nil
}

// maxEncodedHeaderBytes bounds the encoded AMQP properties of a message,
// leaving room below the default frame_max of 131072 bytes.
const maxEncodedHeaderBytes = 120 << 10

// encodedHeaderBytes estimates the encoded size of m's AMQP properties:
// each table entry is a short-string name (1+len) and a long string
// (1 type byte + 4 length bytes + len), plus the fixed properties.
func encodedHeaderBytes(m *broker.Message) int {
	n := 512 + len(m.ID) + len(m.Type) + len(keyHeader) + 6 + len(m.Key)
	for k, v := range m.Headers {
		n += 6 + len(k) + len(v)
	}
	return n
}

// toPublishing maps a message to an AMQP publishing: persistent, message-id
// and type set, Key in keyHeader.
func toPublishing(m *broker.Message, now time.Time) amqp.Publishing {
	h := make(amqp.Table, len(m.Headers)+1)
	for k, v := range m.Headers {
		h[k] = v
	}
	if m.Key != "" {
		h[keyHeader] = m.Key
	}
	return amqp.Publishing{
		Headers:      h,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Type:         m.Type,
		Timestamp:    now,
		Body:         m.Body,
	}
}

// fromAMQP maps received properties back to a message. x-death and other
// non-string headers set by RabbitMQ are dropped: ferry never reads them.
func fromAMQP(id, typ, routingKey string, headers amqp.Table, body []byte) *broker.Message {
	m := &broker.Message{ID: id, Type: typ, Body: body}
	if m.Type == "" {
		m.Type = routingKey
	}
	if m.Body == nil {
		m.Body = []byte{}
	}
	for k, v := range headers {
		s, ok := v.(string)
		if !ok {
			continue
		}
		if k == keyHeader {
			m.Key = s
			continue
		}
		if isDeathHeader(k) {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(headers))
		}
		m.Headers[k] = s
	}
	m.Attempt = 1 + retryCount(m.Headers)
	return m
}

// isDeathHeader reports whether k is one of the headers RabbitMQ adds when
// it dead-letters a message (x-death, x-first-death-*, x-last-death-*).
func isDeathHeader(k string) bool {
	return k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-")
}

func retryCount(h map[string]string) int {
	n := 0
	for _, c := range h[broker.HeaderRetryCount] {
		if c < '0' || c > '9' || n > 1e8 {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// ErrServerNack is the error of a message the server answered with
// basic.nack in confirm mode. RabbitMQ sends a nack only when the queue
// could not take the message for a reason of its own, never for the
// message: "basic.nack will only be delivered if an internal error occurs
// in the Erlang process responsible for a queue"
// (https://www.rabbitmq.com/docs/confirms#server-sent-nacks), e.g. a
// quorum queue whose leader died and whose replicas are electing another,
// or a queue at its length limit with x-overflow reject-publish
// (https://www.rabbitmq.com/docs/maxlength). Publishing the same message
// again later succeeds, so it is an outage in broker.Broker.Publish's
// terms: it does not wrap broker.ErrNacked, and the relay pauses and tries
// again without charging the message an attempt (on a cluster, a queue
// leader's death nacks the messages in flight to it).
var ErrServerNack = errors.New("rabbitmq: basic.nack from the server: the queue could not take the message now (a quorum queue electing a leader, a queue at its length limit); publish it again later")
