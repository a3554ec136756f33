package nats

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
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
// an invalid ID, Type (not usable as NATS subject words), Key or header
// wraps broker.ErrInvalidMessage and names the field, a message the server
// refuses with a JetStream API error about the message wraps
// broker.ErrNacked; other errors (no stream answered, connection lost, ctx
// done, an API error about the stream's or the server's state such as a
// full stream under DiscardNew, see apiOutage) mean the broker, not the
// message, failed. A publish confirmed as a duplicate counts as
// confirmed. Each message is its own publish with its own PubAck, so no
// call is refused as a whole, and the messages whose PubAck came are
// confirmed and never listed, whatever happened to the others.
func (b *natsBroker) Publish(ctx context.Context, msgs []*broker.Message) error {
	start := time.Now()
	err := b.publishBatch(ctx, msgs)
	var pe *broker.PublishError
	if !errors.As(err, &pe) || ctx.Err() != nil {
		return err
	}
	// Messages no stream answered for, while the connection is up: the
	// stream was deleted under us (an operator, a server reset without its
	// data). Declare the topology again and publish them once more; they
	// were not stored, so this duplicates nothing.
	var again []int
	for _, f := range pe.Failed {
		if errors.Is(f.Err, errNoStream) {
			again = append(again, f.Index)
		}
	}
	b.mu.Lock()
	d := b.current
	b.mu.Unlock()
	if len(again) == 0 || d == nil || !b.nc.IsConnected() {
		return err
	}
	hctx, cancel := withDefaultTimeout(ctx, b.cfg.PublishTimeout)
	herr := b.healTopology(hctx, d.exchange, "publish: no stream answered", start)
	cancel()
	if herr != nil {
		return err
	}
	sub := make([]*broker.Message, len(again))
	for j, i := range again {
		sub[j] = msgs[i]
	}
	err2 := b.publishBatch(ctx, sub)
	failed2 := broker.FailedIndexes(err2, len(sub))
	redone := map[int]error{}
	for j, i := range again {
		redone[i] = failed2[j] // nil when published this time
	}
	var failed []broker.FailedMessage
	for _, f := range pe.Failed {
		if e, ok := redone[f.Index]; ok {
			if e == nil {
				continue
			}
			f.Err = e
		}
		failed = append(failed, f)
	}
	if len(failed) == 0 {
		return nil
	}
	return &broker.PublishError{Failed: failed}
}

// errNoStream marks a publish no stream answered for (wrapped in the
// FailedMessage's error).
var errNoStream = errors.New("no stream answered")

// publishBatch is one attempt of Publish.
func (b *natsBroker) publishBatch(ctx context.Context, msgs []*broker.Message) error {
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

	n := len(msgs)
	batch := &pubBatch{errs: make([]error, n), done: make(chan struct{})}
	wire := make([]natsgo.Msg, n) // one allocation for the batch
	valid := 0
	for i, m := range msgs {
		if err := b.toWire(d, m, &wire[i]); err != nil {
			if !errors.Is(err, broker.ErrMessageTooLarge) && !errors.Is(err, broker.ErrUnroutable) {
				// An invalid message: refused for itself, so the caller
				// does not take it for a broker outage.
				err = fmt.Errorf("%w: %w", broker.ErrInvalidMessage, err)
			}
			batch.errs[i] = &refused{err}
			continue
		}
		valid++
	}
	// Register the batch before the first publish: a PubAck can arrive
	// before PublishMsgAsync returns.
	b.acks.register(batch, wire, valid)
	var stop error // set when ctx ended or the broker closed while publishing
	for i := range wire {
		nm := &wire[i]
		if batch.errs[i] != nil {
			continue // refused by toWire, not registered
		}
		if stop != nil {
			b.acks.settle(nm, stop)
			continue
		}
		if _, err := b.publishAsync(ctx, nm); err != nil {
			if ctx.Err() != nil || b.isClosed() || errors.Is(err, natsgo.ErrConnectionReconnecting) {
				stop = err
			}
			b.acks.settle(nm, err)
		}
	}
	// One wake-up per batch: the handlers close batch.done when the last
	// message of the batch is settled; every PublishResend the messages
	// still without a PubAck are published again (see Config.PublishResend).
	var resend <-chan time.Time
	if b.cfg.PublishResend > 0 && stop == nil {
		tick := time.NewTicker(b.cfg.PublishResend)
		defer tick.Stop()
		resend = tick.C
	}
	sent := time.Now()
	var ctxErr error
wait:
	for {
		select {
		case <-batch.done:
			break wait
		case <-ctx.Done():
			ctxErr = ctx.Err()
			break wait
		case <-b.closeCh:
			ctxErr = broker.ErrClosed
			break wait
		case <-resend:
			if time.Since(sent)+b.cfg.PublishResend >= b.cfg.DuplicateWindow {
				resend = nil // a copy past the window would be stored twice
				continue
			}
			b.resend(batch, wire)
		}
	}
	if ctxErr != nil {
		b.acks.abandon(batch, wire)
	}
	var failed []broker.FailedMessage
	for i, err := range batch.errs {
		var r *refused
		switch {
		case err == nil:
			continue
		case errors.As(err, &r):
			err = r.err
		case err == errNoAck:
			err = fmt.Errorf("nats: publish %s: no PubAck: %w", msgs[i].ID, ctxErr)
		default:
			err = b.publishErr(msgs[i], err)
		}
		id := ""
		if msgs[i] != nil {
			id = msgs[i].ID
		}
		failed = append(failed, broker.FailedMessage{Index: i, ID: id, Err: err})
	}
	if len(failed) == 0 {
		return nil
	}
	return &broker.PublishError{Failed: failed}
}

// resend publishes again the messages of batch still waiting for their
// PubAck, with the same Nats-Msg-Id, while the connection is up; the first
// PubAck of either copy settles the message, and the stream's duplicate
// window drops the copy of one already stored. A resend the client cannot
// take now (not connected, too many PubAcks pending) is skipped: the
// message stays pending on its first publish.
func (b *natsBroker) resend(batch *pubBatch, wire []natsgo.Msg) {
	pending := b.acks.pendingOf(batch, wire)
	if len(pending) == 0 || b.nc.Status() != natsgo.CONNECTED {
		return
	}
	b.log.Info("nats: no PubAck yet; publishing again with the same Nats-Msg-Id (the stream drops a duplicate)",
		"messages", len(pending), "after", b.cfg.PublishResend)
	for _, nm := range pending {
		if _, err := b.js.PublishMsgAsync(nm); err != nil {
			return
		}
	}
}

// refused marks a message that toWire refused, whose error is final.
type refused struct{ err error }

func (r *refused) Error() string { return r.err.Error() }

// errNoAck marks a message still waiting for its PubAck when Publish gave
// up (ctx done or broker closed).
var errNoAck = errors.New("nats: no PubAck")

// errAckLost marks a message still waiting for its PubAck when the
// connection dropped: the PubAck, if the server sends one, goes to the
// old connection and is never seen, so waiting for it would hold the
// Publish until PublishTimeout (30 s after a stream leader's server was
// killed, in the failover tests). The message may be stored: publishing it
// again is absorbed by the stream's duplicate window (Nats-Msg-Id).
var errAckLost = errors.New("nats: connection lost before the PubAck")

// pubBatch is one Publish call's messages waiting for their PubAcks.
type pubBatch struct {
	// errs holds each message's outcome: nil when confirmed (or not yet
	// settled), a *refused, errNoAck, or the client's publish error.
	// Entries of registered messages are written under ackTracker.mu.
	errs []error
	left int           // registered messages not settled yet, under ackTracker.mu
	done chan struct{} // closed when left reaches 0
}

// ackTracker routes the PubAcks and publish errors that the JetStream
// client reports to its ack and error handlers (set in New) to the
// Publish call that sent the message. Waiting on each message's
// PubAckFuture instead costs two channels and two acquisitions of the
// client's publisher lock per message (the lock its reply handler holds
// while decoding each PubAck) and, with acks still in flight, a goroutine
// park and wake-up per message; the handlers wake Publish once per batch.
// PublishAsyncComplete is no substitute: it waits for every pending
// publish of the connection, other callers' included.
type ackTracker struct {
	mu      sync.Mutex
	pending map[*natsgo.Msg]ackSlot
}

type ackSlot struct {
	batch *pubBatch
	i     int
}

func newAckTracker() *ackTracker {
	return &ackTracker{pending: map[*natsgo.Msg]ackSlot{}}
}

// register adds the valid messages of batch (those without an error yet)
// as pending; valid is their number.
func (t *ackTracker) register(batch *pubBatch, wire []natsgo.Msg, valid int) {
	if valid == 0 {
		close(batch.done)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	batch.left = valid
	for i := range wire {
		if batch.errs[i] == nil {
			t.pending[&wire[i]] = ackSlot{batch: batch, i: i}
		}
	}
}

// settle records the outcome of m (nil: PubAck received); a message that
// is not pending (not ours, or abandoned) is ignored.
func (t *ackTracker) settle(m *natsgo.Msg, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.pending[m]
	if !ok {
		return
	}
	delete(t.pending, m)
	s.batch.errs[s.i] = err
	s.batch.left--
	if s.batch.left == 0 {
		close(s.batch.done)
	}
}

// failAll settles every pending message with err (the connection that
// would have carried their PubAcks is gone).
func (t *ackTracker) failAll(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for m, s := range t.pending {
		delete(t.pending, m)
		s.batch.errs[s.i] = err
		s.batch.left--
		if s.batch.left == 0 {
			close(s.batch.done)
		}
	}
}

// pendingOf returns the messages of batch that still wait for a PubAck.
func (t *ackTracker) pendingOf(batch *pubBatch, wire []natsgo.Msg) []*natsgo.Msg {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*natsgo.Msg
	for i := range wire {
		if s, ok := t.pending[&wire[i]]; ok && s.batch == batch {
			out = append(out, &wire[i])
		}
	}
	return out
}

// abandon marks the batch's messages still pending with errNoAck and
// forgets them, so a late PubAck does not touch the batch.
func (t *ackTracker) abandon(batch *pubBatch, wire []natsgo.Msg) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range wire {
		if s, ok := t.pending[&wire[i]]; ok && s.batch == batch {
			delete(t.pending, &wire[i])
			batch.errs[i] = errNoAck
		}
	}
}

// publishAsync starts the asynchronous publish of nm. When
// PublishAsyncMaxPending PubAcks are outstanding on the connection it
// waits for a free slot until ctx is done or the broker closes, in the
// client's default stall waits, rather than passing a per-message
// WithStallWait option (which costs an option allocation per message).
func (b *natsBroker) publishAsync(ctx context.Context, nm *natsgo.Msg) (jetstream.PubAckFuture, error) {
	if err := b.connected(ctx); err != nil {
		return nil, err
	}
	for {
		f, err := b.js.PublishMsgAsync(nm)
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			return f, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (%w)", err, ctx.Err())
		case <-b.closeCh:
			return nil, fmt.Errorf("%w (%w)", err, broker.ErrClosed)
		default:
		}
	}
}

// connected returns nil once the connection is up: at once when it is,
// else when it is back (checked every 20 ms) or, when ctx ends or the
// connection is closed first, why nothing was published. nats.go keeps
// what is published while the connection is down in its reconnect buffer
// (ReconnectBufSize, 8 MB) and sends it once it reconnects, long after
// the Publish that sent it gave up waiting for its PubAck and the relay
// took the rows for unpublished: a publish ferry gave up on would be held
// in memory and delivered later (issue 16, item 3). So the adapter waits
// for the connection instead of publishing into that buffer; a message
// published in the instant the connection drops may still be buffered (at
// most once per Publish), and the stream's duplicate window drops its
// copy. Acks still go through the buffer: one sent after the reconnect is
// still valid.
func (b *natsBroker) connected(ctx context.Context) error {
	for {
		switch st := b.nc.Status(); st {
		case natsgo.CONNECTED:
			return nil
		case natsgo.CLOSED:
			return natsgo.ErrConnectionClosed
		default:
			select {
			case <-ctx.Done():
				return fmt.Errorf("nats: nothing published while the connection is %s (%w): %w", strings.ToLower(st.String()), natsgo.ErrConnectionReconnecting, ctx.Err())
			case <-b.closeCh:
				return broker.ErrClosed
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
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
		return fmt.Errorf("nats: publish %s: %w (stream missing or JetStream not ready): %w", m.ID, errNoStream, err)
	case errors.As(err, &apiErr) && apiNoRoom(apiErr):
		return fmt.Errorf("nats: publish %s: %w", m.ID, broker.Blocked(apiErr.Description, err))
	case errors.As(err, &apiErr) && apiOutage(apiErr):
		return fmt.Errorf("nats: publish %s: JetStream refused it for its own state, not the message's: %w", m.ID, err)
	case errors.As(err, &apiErr):
		return fmt.Errorf("%w: nats: publish %s: %v", broker.ErrNacked, m.ID, err)
	}
	return fmt.Errorf("nats: publish %s: %w", m.ID, err)
}

// apiOutageCodes are the JetStream API error codes (nats-server
// server/errors.json) of a publish refused for the server's or the
// stream's state rather than for the message: JetStream not enabled
// (10039, 10076), the system or cluster temporarily unavailable (10008,
// 10006), insufficient resources (10023), storage resources exceeded
// (10047), and the store failing, which includes a stream full under
// DiscardNew ("maximum messages exceeded", "maximum bytes exceeded",
// 10077), and a copy of a message whose first publish the stream is still
// storing (409 "duplicate message id is in process", 10158: the first copy
// is proposed to the stream's Raft group and not yet applied, as after a
// leader change; a later publish is confirmed as a duplicate or stored).
var apiOutageCodes = map[jetstream.ErrorCode]bool{
	10039: true, 10076: true, 10008: true, 10006: true, 10023: true, 10047: true, 10077: true, 10158: true,
}

// apiNoRoom reports whether a JetStream API error of a publish says the
// stream or the server has no room (broker.ErrBlocked): insufficient
// resources (10023), storage resources exceeded (10047), or a store
// failure (10077) that is a limit of a stream with DiscardNew: "maximum
// bytes exceeded", "maximum messages exceeded", "maximum messages per
// subject exceeded" (nats-server server/errors.json and
// server/store.go's ErrMaxBytes, ErrMaxMsgs, ErrMaxMsgsPerSubject).
func apiNoRoom(e *jetstream.APIError) bool {
	switch e.ErrorCode {
	case 10023, 10047:
		return true
	case 10077:
		d := strings.ToLower(e.Description)
		return strings.Contains(d, "maximum") && strings.Contains(d, "exceeded") || strings.Contains(d, "resources exceeded")
	}
	return false
}

// apiOutage reports whether a JetStream API error of a publish is an
// outage: its status code is 5xx (e.g. 503 for a full stream) or 429, or
// its error code is in apiOutageCodes. Every other API error (400:
// wrong expected stream or last sequence, an invalid Nats-TTL or
// schedule header, a sealed stream's refusal of the message...) is about
// the message and wraps broker.ErrNacked.
func apiOutage(e *jetstream.APIError) bool {
	return e.Code >= 500 || e.Code == 429 || apiOutageCodes[e.ErrorCode]
}

// msgID is the Nats-Msg-Id of a message: its ID, followed by "@" and its
// HeaderCreatedAt when that header is set. The relay re-publishes an
// outbox row with the same ID and the same creation time, so the stream
// drops the copy; a different database (or a reset sequence) that reuses
// an ID within the duplicate window has a different creation time and is
// not mistaken for a duplicate.
func msgID(m *broker.Message) string {
	return msgIDWith(m.ID, m.Headers[broker.HeaderCreatedAt])
}

func msgIDWith(id, createdAt string) string {
	if createdAt != "" {
		return id + "@" + createdAt
	}
	return id
}

// route is the publish decision for one Type on one declared exchange,
// computed once (see declared.route).
type route struct {
	// subject is <stream>.<Type>.
	subject string
	// invalid is why Type is not usable as NATS subject words, or nil.
	invalid error
	// unroutable is true when no declared queue binds Type.
	unroutable bool
}

// maxCachedRoutes bounds declared.routes; the decision for further Types
// is computed per message.
const maxCachedRoutes = 1024

// route returns the publish decision for typ. The declared topology never
// changes (Declare builds a new declared), so the decision is cached per
// Type in a copy-on-write map that concurrent Publish calls read without
// a lock.
func (d *declared) route(typ string) *route {
	if m := d.routes.Load(); m != nil {
		if r, ok := (*m)[typ]; ok {
			return r
		}
	}
	r := &route{subject: d.names.eventSubject(typ)}
	if err := validSubjectWords(typ); err != nil {
		r.invalid = err
	} else {
		r.unroutable = !bindsType(d.topology, typ)
	}
	d.routesMu.Lock()
	defer d.routesMu.Unlock()
	old := d.routes.Load()
	if old != nil && len(*old) >= maxCachedRoutes {
		return r
	}
	m := make(map[string]*route, 1+lenOf(old))
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	m[typ] = r
	d.routes.Store(&m)
	return r
}

func lenOf(m *map[string]*route) int {
	if m == nil {
		return 0
	}
	return len(*m)
}

// bindsType reports whether some queue of t binds typ.
func bindsType(t broker.Topology, typ string) bool {
	for _, q := range t.Queues {
		for _, p := range q.Bindings {
			if broker.MatchRoutingKey(p, typ) {
				return true
			}
		}
	}
	return false
}

// toWire validates m and fills nm with its NATS message on subject
// <stream>.<Type>. The checks, in order (the first failing one is
// reported): ID, Type, Capabilities.MaxMessageBytes, routing, headers, ID
// and Key characters, the server's max_payload with header framing.
func (b *natsBroker) toWire(d *declared, m *broker.Message, nm *natsgo.Msg) error {
	if m == nil {
		return errors.New("nats: publish: nil message")
	}
	if m.ID == "" || len(m.ID) > 255 {
		return fmt.Errorf("nats: publish: message ID %q: want 1 to 255 bytes", m.ID)
	}
	r := d.route(m.Type)
	if r.invalid != nil {
		return fmt.Errorf("nats: publish %s: Type %q: %v", m.ID, m.Type, r.invalid)
	}
	w := encodeHeaders(m, 1)
	if size := len(m.Body) + len(m.ID) + len(m.Type) + len(m.Key) + w.userBytes; size > b.caps.MaxMessageBytes {
		return fmt.Errorf("%w: nats: publish %s: %d bytes, at most %d", broker.ErrMessageTooLarge, m.ID, size, b.caps.MaxMessageBytes)
	}
	if r.unroutable {
		return fmt.Errorf("%w: nats: publish %s: no queue of exchange %s binds type %q", broker.ErrUnroutable, m.ID, d.exchange, m.Type)
	}
	if w.err != nil {
		return w.err
	}
	id := msgIDWith(m.ID, w.createdAt)
	w.put(jetstream.MsgIDHeader, id)
	*nm = natsgo.Msg{Subject: r.subject, Header: w.h, Data: m.Body}
	if n := len(m.Body) + w.wireLen; n > b.maxPayload {
		return fmt.Errorf("%w: nats: publish %s: %d bytes with header framing, the server's max_payload is %d", broker.ErrMessageTooLarge, m.ID, n, b.maxPayload)
	}
	return nil
}

// wireHeaders validates m's headers and returns them with the adapter's
// ID, Type and Key headers. Header names starting with "Nats-" or
// "Ferry-" are reserved. NATS trims leading and trailing blanks of header
// values, so a value (or ID or Key) that has them is sent base64-encoded
// and its header name listed in hdrEncoded; fromWire decodes it.
func wireHeaders(m *broker.Message) (natsgo.Header, error) {
	w := encodeHeaders(m, 1)
	if w.err != nil {
		return nil, w.err
	}
	return w.h, nil
}

// wireHeader is a message's NATS header block being built by
// encodeHeaders.
type wireHeader struct {
	h natsgo.Header
	// vals backs the one-value slices of h, so the values of a message
	// take one allocation; each slice has capacity 1, so an append to one
	// never overwrites the next.
	vals []string
	// userBytes is m.HeaderBytes(): the message's own header names and
	// values, unencoded.
	userBytes int
	// wireLen is the header block's size on the wire: "NATS/1.0\r\n",
	// "Key: Value\r\n" per value, "\r\n".
	wireLen int
	// createdAt is the message's HeaderCreatedAt.
	createdAt string
	// err is the first invalid header, ID or Key, or nil.
	err error
}

func (w *wireHeader) put(k, v string) {
	if len(w.vals) == 0 {
		w.vals = make([]string, 4)
	}
	w.vals[0] = v
	w.h[k] = w.vals[0:1:1]
	w.vals = w.vals[1:]
	w.wireLen += len(k) + len(v) + 4
}

// set puts k with v, base64-encoded (and k listed in hdrEncoded) when v
// has leading or trailing blanks, which NATS would trim.
func (w *wireHeader) set(k, v string) {
	if n := len(v); n > 0 && (isBlank(v[0]) || isBlank(v[n-1])) {
		w.h[hdrEncoded] = append(w.h[hdrEncoded], k)
		w.wireLen += len(hdrEncoded) + len(k) + 4
		v = base64.StdEncoding.EncodeToString([]byte(v))
	}
	w.put(k, v)
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

// encodeHeaders builds m's wire headers in one pass over m.Headers, with
// room for extra more headers. It always sums userBytes over every header,
// even after an invalid one, so that the size check comes first.
func encodeHeaders(m *broker.Message, extra int) wireHeader {
	n := len(m.Headers) + 3 + extra
	w := wireHeader{
		h:       make(natsgo.Header, n),
		vals:    make([]string, n),
		wireLen: len("NATS/1.0\r\n") + 2,
	}
	for k, v := range m.Headers {
		w.userBytes += len(k) + len(v)
		if w.err != nil {
			continue
		}
		if err := validHeader(k, v); err != nil {
			w.err = fmt.Errorf("nats: publish %s: %w", m.ID, err)
			continue
		}
		if k == broker.HeaderCreatedAt {
			w.createdAt = v
		}
		w.set(k, v)
	}
	if w.err != nil {
		return w
	}
	if strings.ContainsAny(m.ID, "\r\n") {
		w.err = fmt.Errorf("nats: publish: ID %q: must not contain CR or LF", m.ID)
		return w
	}
	w.set(hdrID, m.ID)
	w.put(hdrType, m.Type)
	if m.Key != "" {
		if strings.ContainsAny(m.Key, "\r\n") {
			w.err = fmt.Errorf("nats: publish %s: Key %q: must not contain CR or LF", m.ID, m.Key)
			return w
		}
		w.set(hdrKey, m.Key)
	}
	return w
}

func validHeader(k, v string) error {
	if k == "" {
		return errors.New("header with an empty name")
	}
	if hasPrefixFold(k, "nats-") || hasPrefixFold(k, "ferry-") {
		return fmt.Errorf("header %q: names starting with Nats- or Ferry- are reserved", k)
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c == ':' || c >= 0x7f {
			return fmt.Errorf("header %q: a NATS header name is printable ASCII without spaces or ':'", k)
		}
	}
	if strings.ContainsAny(v, "\r\n") {
		return fmt.Errorf("header %q: value must not contain CR or LF", k)
	}
	return nil
}

// hasPrefixFold reports whether s starts with the lower-case ASCII
// prefix, ignoring ASCII case.
func hasPrefixFold(s, prefix string) bool {
	if len(s) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != prefix[i] {
			return false
		}
	}
	return true
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
