package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferry/broker"
)

// Header names the adapter uses on the wire besides the message's own
// headers. They are stripped from Message.Headers on receive.
const (
	// hdrID carries Message.ID.
	hdrID = "Ferry-Id"
	// hdrType carries Message.Type (needed on DLQ and replay subjects,
	// which do not contain the type).
	hdrType = "Ferry-Type"
	// hdrKey carries Message.Key when it is not empty.
	hdrKey = "Ferry-Key"
	// hdrEncoded lists (one value per name) the headers whose value is
	// base64-encoded because it has leading or trailing blanks, which NATS
	// would trim.
	hdrEncoded = "Ferry-B64"
)

// headerReserve is the part of the server's max_payload kept back from
// Capabilities.MaxMessageBytes for the adapter's own headers, the DLQ
// headers (HeaderLastError is up to broker.MaxReasonBytes) and the wire
// framing of the headers ("Key: Value\r\n").
const headerReserve = 4096

var _ broker.Broker = (*natsBroker)(nil)

type natsBroker struct {
	cfg        Config
	log        *slog.Logger
	nc         *natsgo.Conn
	js         jetstream.JetStream
	maxPayload int
	caps       broker.Capabilities
	notes      *retryNotes
	acks       *ackTracker
	closeCh    chan struct{}

	declareMu sync.Mutex // serialises Declare and the re-declare after a reconnect
	healedAt  time.Time  // end of the last healTopology, under declareMu
	// subOpts is, per queue name, the AckWait and MaxAckPending Subscribe
	// set on the consumer, so a consumer created again keeps them.
	subOpts map[string]consumerOpts

	mu        sync.Mutex
	closed    bool
	exchanges map[string]*declared // by exchange name
	current   *declared            // the exchange declared last: Publish's target
	queues    map[string]*queueInfo
	subs      map[*subscription]struct{}
	handedOut map[*delivery]struct{}
}

// declared is the topology this broker declared, with its JetStream names.
type declared struct {
	exchange string
	names    names
	topology broker.Topology
	queues   map[string]*queueInfo

	// routes caches Publish's decision per Type (see route); routesMu
	// serialises its copy-on-write updates.
	routes   atomic.Pointer[map[string]*route]
	routesMu sync.Mutex
}

// queueInfo is one declared queue.
type queueInfo struct {
	d        *declared
	queue    broker.Queue
	consumer string   // durable consumer name on the work stream
	filters  []string // consumer filter subjects (bindings + replay subject)
	dlqSubj  string
	replay   string
}

// setReplicas resolves Config.Replicas once connected: unset, 1 on a
// single server and min(3, servers known) on a cluster (the server names a
// cluster in its INFO); an explicit 1 on a cluster logs a WARN naming the
// setting (see Config.Replicas).
func (b *natsBroker) setReplicas() {
	cluster := b.nc.ConnectedClusterName() != ""
	servers := len(b.nc.Servers())
	switch {
	case b.cfg.Replicas == 0 && cluster:
		b.cfg.Replicas = max(1, min(3, servers))
	case b.cfg.Replicas == 0:
		b.cfg.Replicas = 1
	case b.cfg.Replicas == 1 && cluster:
		b.log.Warn("nats: Replicas 1 on a cluster: each stream lives on one server, and its messages are unavailable, or lost with its disk, while that server is down; use 3",
			"setting", "Replicas", "cluster", b.nc.ConnectedClusterName(), "servers", servers)
	}
}

// New connects to the NATS server at cfg.URL and returns a Broker on its
// JetStream. ctx bounds the connection attempt. It returns an error when
// the server is unreachable or has JetStream disabled; an error wrapping
// broker.ErrInvalidConfig, before connecting, for a Config that Validate
// refuses; and one wrapping broker.ErrRefused, with the server's words,
// when the server refuses the credentials (Authorization Violation). The connection
// reconnects forever after a loss; Declare's topology is declared again
// after every reconnect.
func New(ctx context.Context, cfg Config) (broker.Broker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b := &natsBroker{
		cfg:       cfg,
		log:       cfg.Logger.With("broker", "nats"),
		notes:     newRetryNotes(),
		acks:      newAckTracker(),
		closeCh:   make(chan struct{}),
		subs:      map[*subscription]struct{}{},
		handedOut: map[*delivery]struct{}{},
		exchanges: map[string]*declared{},
		queues:    map[string]*queueInfo{},
		subOpts:   map[string]consumerOpts{},
	}
	dial := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < dial {
		dial = max(time.Until(dl), 10*time.Millisecond)
	}
	dialer := &recordingDialer{d: net.Dialer{Timeout: dial}}
	nc, err := natsgo.Connect(cfg.URL,
		natsgo.Name(cfg.Name),
		natsgo.Timeout(dial),
		natsgo.SetCustomDialer(dialer),
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(cfg.ReconnectWait),
		natsgo.ReconnectJitter(50*time.Millisecond, 100*time.Millisecond),
		natsgo.PingInterval(10*time.Second),
		natsgo.MaxPingsOutstanding(3),
		natsgo.DisconnectErrHandler(func(_ *natsgo.Conn, err error) {
			if err != nil {
				b.log.Warn("nats: disconnected", "err", err)
			}
			b.acks.failAll(errAckLost)
		}),
		natsgo.ReconnectHandler(func(c *natsgo.Conn) {
			b.log.Info("nats: reconnected", "url", c.ConnectedUrlRedacted())
			go b.redeclare()
		}),
		natsgo.ErrorHandler(func(_ *natsgo.Conn, _ *natsgo.Subscription, err error) {
			b.log.Warn("nats: async error", "err", err)
		}),
	)
	if err != nil {
		if authRefusal(err) {
			return nil, fmt.Errorf("nats: connect %s: %w: %w", redact(cfg.URL), broker.ErrRefused, err)
		}
		if last := dialer.last(); last != nil && errors.Is(err, natsgo.ErrNoServers) {
			// nats.go says only "no servers available": add why.
			return nil, fmt.Errorf("nats: connect %s: %w (last dial error: %v)", redact(cfg.URL), err, last)
		}
		return nil, fmt.Errorf("nats: connect %s: %w", redact(cfg.URL), err)
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(8192),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *natsgo.Msg, _ *jetstream.PubAck) {
			b.acks.settle(m, nil)
		}),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *natsgo.Msg, err error) {
			b.acks.settle(m, err)
		}),
		jetstream.WithPublishAsyncTimeout(cfg.PublishTimeout),
		jetstream.WithDefaultTimeout(cfg.PublishTimeout),
	)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats: jetstream: %w", err)
	}
	actx, cancel := withDefaultTimeout(ctx, cfg.PublishTimeout)
	defer cancel()
	if _, err := js.AccountInfo(actx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats: %s: JetStream is not available (start nats-server with -js): %w", redact(cfg.URL), err)
	}
	b.nc, b.js = nc, js
	b.setReplicas()
	b.maxPayload = int(nc.MaxPayload())
	maxMsg := b.maxPayload - headerReserve
	if maxMsg < b.maxPayload/2 {
		maxMsg = b.maxPayload / 2
	}
	b.caps = broker.Capabilities{
		Name:               "nats",
		NativeDelay:        true,
		MaxDelay:           0,
		Ordering:           broker.OrderingQueue,
		MaxMessageBytes:    maxMsg,
		MaxHeaderBytes:     0,
		Replay:             false,
		Wildcards:          true,
		CountsRedeliveries: true,
	}
	return b, nil
}

// recordingDialer dials TCP like nats.go's own dialer and keeps the last
// dial error, which nats.go's Connect reports only as ErrNoServers.
type recordingDialer struct {
	d       net.Dialer
	mu      sync.Mutex
	lastErr error
}

// Dial implements natsgo.CustomDialer.
func (r *recordingDialer) Dial(network, address string) (net.Conn, error) {
	c, err := r.d.Dial(network, address)
	if err != nil {
		r.mu.Lock()
		r.lastErr = err
		r.mu.Unlock()
	}
	return c, err
}

func (r *recordingDialer) last() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

// authRefusal reports whether err, from natsgo.Connect, is the server
// refusing the credentials (-ERR 'Authorization Violation' and the
// expired or revoked authentication errors): connecting again with the
// same credentials fails the same way.
func authRefusal(err error) bool {
	for _, target := range []error{natsgo.ErrAuthorization, natsgo.ErrAuthExpired, natsgo.ErrAuthRevoked, natsgo.ErrAccountAuthExpired} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// redact drops user information from a URL list for error messages.
func redact(urls string) string {
	var out []string
	for _, u := range strings.Split(urls, ",") {
		if at := strings.LastIndex(u, "@"); at >= 0 {
			if i := strings.Index(u, "://"); i >= 0 && i < at {
				u = u[:i+3] + "***@" + u[at+1:]
			}
		}
		out = append(out, u)
	}
	return strings.Join(out, ",")
}

// withDefaultTimeout applies d when ctx has no deadline.
func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// Capabilities implements broker.Broker. MaxMessageBytes is the server's
// max_payload minus a reserve of 4 KiB for the adapter's and the DLQ's
// headers; Ordering is per queue (a pull consumer hands out in stream
// order); CountsRedeliveries is true because Attempt is the consumer's
// NumDelivered; Replay is false because the work streams use interest
// retention.
func (b *natsBroker) Capabilities() broker.Capabilities { return b.caps }

func (b *natsBroker) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// Declare implements broker.Broker: a work stream per exchange (interest
// retention, file storage, subjects <stream>.> and <stream>-replay.>), a
// DLQ stream <stream>-dlq (limits retention), and per queue a durable pull
// consumer with explicit ack whose filter subjects are the queue's
// bindings plus its replay subject. An existing consumer keeps its AckWait
// and MaxAckPending (set by Subscribe); only its filters are updated.
// Declaring the same exchange again adds the new queues; declaring another
// exchange adds it too, and Publish then publishes to it (the exchange
// declared last). A queue name belongs to one exchange only.
func (b *natsBroker) Declare(ctx context.Context, t broker.Topology) error {
	if b.isClosed() {
		return broker.ErrClosed
	}
	if err := t.Validate(); err != nil {
		return fmt.Errorf("nats: declare: %w", err)
	}
	// A queue with priorities is a queue per level (broker.Queue.Priorities).
	t = t.Expanded()
	// One Declare at a time, so concurrent declarations of one exchange
	// merge their queues.
	b.declareMu.Lock()
	defer b.declareMu.Unlock()
	b.mu.Lock()
	prev := b.exchanges[t.Exchange]
	for _, q := range t.Queues {
		if qi, ok := b.queues[q.Name]; ok && qi.d.exchange != t.Exchange {
			b.mu.Unlock()
			return fmt.Errorf("nats: declare: queue %s is already declared on exchange %s, not %s", q.Name, qi.d.exchange, t.Exchange)
		}
	}
	b.mu.Unlock()
	d := &declared{exchange: t.Exchange, names: namesFor(t.Exchange), queues: map[string]*queueInfo{}}
	d.topology.Exchange = t.Exchange
	if prev != nil {
		for _, q := range prev.topology.Queues {
			if _, ok := t.Queue(q.Name); !ok {
				d.topology.Queues = append(d.topology.Queues, q)
			}
		}
	}
	d.topology.Queues = append(d.topology.Queues, t.Queues...)
	for _, q := range d.topology.Queues {
		filters, err := filtersFor(d.names, q.Name, q.Bindings)
		if err != nil {
			return err
		}
		qi := &queueInfo{
			d:        d,
			queue:    q,
			consumer: ConsumerName(q.Name),
			dlqSubj:  d.names.dlqSubject(q.Name),
			replay:   d.names.replaySubject(q.Name),
		}
		qi.filters = append(filters, qi.replay)
		sort.Strings(qi.filters)
		d.queues[q.Name] = qi
	}
	ctx, cancel := withDefaultTimeout(ctx, b.cfg.PublishTimeout)
	defer cancel()
	if err := b.declareObjects(ctx, d); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return broker.ErrClosed
	}
	b.exchanges[d.exchange] = d
	b.current = d
	for name, qi := range d.queues {
		b.queues[name] = qi
	}
	return nil
}

func (b *natsBroker) declareObjects(ctx context.Context, d *declared) error {
	_, err := b.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        d.names.stream,
		Description: "ferry exchange " + d.exchange,
		Subjects:    d.names.streamSubjects(),
		Retention:   jetstream.InterestPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    b.cfg.Replicas,
		Duplicates:  b.cfg.DuplicateWindow,
		Discard:     jetstream.DiscardOld,
	})
	if err != nil {
		return fmt.Errorf("nats: declare stream %s (exchange %s): %w", d.names.stream, d.exchange, err)
	}
	_, err = b.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        d.names.dlqStream,
		Description: "ferry dead letters of exchange " + d.exchange,
		Subjects:    []string{d.names.dlqStream + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    b.cfg.Replicas,
		Duplicates:  b.cfg.DuplicateWindow,
		Discard:     jetstream.DiscardOld,
	})
	if err != nil {
		return fmt.Errorf("nats: declare DLQ stream %s (exchange %s): %w", d.names.dlqStream, d.exchange, err)
	}
	for _, q := range d.topology.Queues {
		qi := d.queues[q.Name]
		if err := b.declareConsumer(ctx, d, qi, false); err != nil {
			return err
		}
	}
	return nil
}

func (b *natsBroker) declareConsumer(ctx context.Context, d *declared, qi *queueInfo, retried bool) error {
	c, err := b.js.Consumer(ctx, d.names.stream, qi.consumer)
	switch {
	case err == nil:
		cfg := c.CachedInfo().Config
		if slices.Equal(consumerFilters(cfg), qi.filters) {
			return nil
		}
		cfg.FilterSubject = ""
		cfg.FilterSubjects = qi.filters
		if _, err := b.js.UpdateConsumer(ctx, d.names.stream, cfg); err != nil {
			return fmt.Errorf("nats: declare queue %s: update consumer %s on stream %s: %w", qi.queue.Name, qi.consumer, d.names.stream, err)
		}
		return nil
	case errors.Is(err, jetstream.ErrConsumerNotFound):
	default:
		return fmt.Errorf("nats: declare queue %s: look up consumer %s on stream %s: %w", qi.queue.Name, qi.consumer, d.names.stream, err)
	}
	b.mu.Lock()
	so, ok := b.subOpts[qi.queue.Name]
	b.mu.Unlock()
	if !ok {
		so = consumerOpts{ackWait: 30 * time.Second, maxAckPending: b.cfg.MaxAckPending}
	}
	_, err = b.js.CreateConsumer(ctx, d.names.stream, jetstream.ConsumerConfig{
		Durable:        qi.consumer,
		Description:    "ferry queue " + qi.queue.Name,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        so.ackWait,
		MaxDeliver:     -1,
		MaxAckPending:  so.maxAckPending,
		FilterSubjects: qi.filters,
		Replicas:       b.cfg.Replicas,
	})
	var apiErr *jetstream.APIError
	if err != nil && !retried && (errors.Is(err, jetstream.ErrConsumerExists) ||
		errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeConsumerAlreadyExists || apiErr.ErrorCode == jetstream.JSErrCodeConsumerNameExists)) {
		return b.declareConsumer(ctx, d, qi, true) // created concurrently by another process
	}
	if err != nil {
		return fmt.Errorf("nats: declare queue %s: create consumer %s on stream %s: %w", qi.queue.Name, qi.consumer, d.names.stream, err)
	}
	return nil
}

// healSettle is how long healTopology waits after it found a stream or
// consumer missing before it declares them again.
const healSettle = time.Second

// consumerOpts are the consumer settings a Subscribe asked for.
type consumerOpts struct {
	ackWait       time.Duration
	maxAckPending int
}

// healTopology declares exchange's remembered topology again because a
// part of it is missing on the server although the connection is up (a
// stream or consumer deleted by an operator, a server reset without its
// data): seen at what (a publish no stream answered, a pull on a deleted
// consumer). seenAt is when the caller started the operation that failed:
// a re-declaration finished since then already repaired it, so concurrent
// callers cause one re-declaration. It returns an error when the
// declaration fails (e.g. JetStream is not reachable either).
func (b *natsBroker) healTopology(ctx context.Context, exchange, what string, seenAt time.Time) error {
	b.declareMu.Lock()
	defer b.declareMu.Unlock()
	if b.healedAt.After(seenAt) {
		return nil
	}
	b.mu.Lock()
	d, closed := b.exchanges[exchange], b.closed
	b.mu.Unlock()
	if closed {
		return broker.ErrClosed
	}
	if d == nil {
		return nil
	}
	// Only when something is missing: a stream that answers was not
	// deleted, and re-declaring would not help. The look-ups are bounded
	// by redeclareAttempt: a stream whose leader is being elected answers
	// nothing (no responders, then silence), and declareMu is held.
	lctx, lcancel := context.WithTimeout(ctx, redeclareAttempt)
	defer lcancel()
	if _, err := b.js.Stream(lctx, d.names.stream); err == nil {
		missing := false
		for _, q := range d.topology.Queues {
			if _, err := b.js.Consumer(lctx, d.names.stream, d.queues[q.Name].consumer); errors.Is(err, jetstream.ErrConsumerNotFound) {
				missing = true
				break
			}
		}
		if _, err := b.js.Stream(lctx, d.names.dlqStream); errors.Is(err, jetstream.ErrStreamNotFound) {
			missing = true
		}
		if !missing {
			return nil
		}
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	// The server finishes deleting a stream (its file store) after the
	// delete call returned: a stream created again within milliseconds
	// fails ("error creating store for stream") or, worse, comes back
	// half-deleted, storing messages without acknowledging them (seen with
	// nats-server 2.15). Wait until the deletion has settled.
	select {
	case <-time.After(healSettle):
	case <-ctx.Done():
		return ctx.Err()
	case <-b.closeCh:
		return broker.ErrClosed
	}
	if err := b.declareObjects(ctx, d); err != nil {
		b.log.Error("nats: topology missing on the server; declaring it again failed", "seen", what, "err", err)
		return err
	}
	b.healedAt = time.Now()
	b.log.Warn("nats: topology missing on the server (stream or consumer deleted while in use?); declared it again and carrying on",
		"seen", what, "exchange", exchange, "stream", d.names.stream)
	return nil
}

// consumerFilters returns the sorted filter subjects of a consumer config.
func consumerFilters(cfg jetstream.ConsumerConfig) []string {
	var f []string
	if cfg.FilterSubject != "" {
		f = append(f, cfg.FilterSubject)
	}
	f = append(f, cfg.FilterSubjects...)
	sort.Strings(f)
	return f
}

// redeclareAttempt bounds one attempt of redeclare. It holds declareMu,
// which a Publish or pull that found its stream missing (healTopology)
// waits for: after a stream or meta leader's server died, a JetStream API
// request sent before the new leader was elected is never answered, and a
// long attempt held the relay that long (10 s in the failover tests)
// although the next attempt, after the election (4-9 s in nats-server),
// succeeds at once.
const redeclareAttempt = 3 * time.Second

// redeclare declares the remembered topology again after a reconnect (the
// server may have lost its state). It retries until it succeeds, the
// broker closes or two minutes pass.
func (b *natsBroker) redeclare() {
	for start := time.Now(); time.Since(start) < 2*time.Minute; {
		b.mu.Lock()
		closed := b.closed
		var all []*declared
		for _, d := range b.exchanges {
			all = append(all, d)
		}
		b.mu.Unlock()
		if closed {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), redeclareAttempt)
		b.declareMu.Lock()
		var err error
		for _, d := range all {
			if err = b.declareObjects(ctx, d); err != nil {
				break
			}
		}
		b.declareMu.Unlock()
		cancel()
		if err == nil {
			return
		}
		b.log.Warn("nats: re-declare after reconnect failed, retrying", "err", err)
		select {
		case <-b.closeCh:
			return
		case <-time.After(time.Second):
		}
	}
}

func (b *natsBroker) declaredQueue(queue string) (*declared, *queueInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, nil, broker.ErrClosed
	}
	qi, ok := b.queues[queue]
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s (not declared on this broker)", broker.ErrUnknownQueue, queue)
	}
	return qi.d, qi, nil
}

// Subscribe implements broker.Broker with a demand-driven pull loop: a
// pull request is sent only for Receive calls waiting and only for as many
// messages as the subscription's Prefetch leaves free, so at most Prefetch
// deliveries are handed out and unsettled per subscription, and messages
// do not sit in a client buffer while their AckWait runs. AckDeadline
// becomes the consumer's AckWait (the consumer is shared by every
// subscriber of the queue, so the last Subscribe's AckDeadline wins).
// With opts.Ordered the subscription is wrapped by
// broker.OrderedSubscription: the consumer hands out in stream order, and a
// key's next delivery waits for the previous one's settlement (per
// subscription: the subscriptions of one queue share its messages).
func (b *natsBroker) Subscribe(ctx context.Context, queue string, opts broker.SubscribeOptions) (broker.Subscription, error) {
	d, qi, err := b.declaredQueue(queue)
	if err != nil {
		return nil, err
	}
	if opts.Prefetch < 0 {
		return nil, fmt.Errorf("nats: subscribe %s: Prefetch %d: must not be negative", queue, opts.Prefetch)
	}
	if opts.AckDeadline < 0 {
		return nil, fmt.Errorf("nats: subscribe %s: AckDeadline %v: must not be negative", queue, opts.AckDeadline)
	}
	if opts.Prefetch == 0 {
		opts.Prefetch = broker.DefaultPrefetch
	}
	if opts.AckDeadline == 0 {
		opts.AckDeadline = 30 * time.Second
	}
	ctx, cancel := withDefaultTimeout(ctx, b.cfg.PublishTimeout)
	defer cancel()
	cons, err := b.js.Consumer(ctx, d.names.stream, qi.consumer)
	if err != nil {
		return nil, fmt.Errorf("nats: subscribe %s: consumer %s on stream %s: %w", queue, qi.consumer, d.names.stream, err)
	}
	cfg := cons.CachedInfo().Config
	if cfg.AckWait != opts.AckDeadline || cfg.MaxAckPending < opts.Prefetch {
		cfg.AckWait = opts.AckDeadline
		cfg.MaxAckPending = max(cfg.MaxAckPending, opts.Prefetch)
		if cons, err = b.js.UpdateConsumer(ctx, d.names.stream, cfg); err != nil {
			return nil, fmt.Errorf("nats: subscribe %s: update consumer %s (AckWait %v, MaxAckPending %d): %w",
				queue, qi.consumer, cfg.AckWait, cfg.MaxAckPending, err)
		}
	}
	s := newSubscription(b, d, qi, cons, opts)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, broker.ErrClosed
	}
	b.subOpts[queue] = consumerOpts{ackWait: cfg.AckWait, maxAckPending: cfg.MaxAckPending}
	b.subs[s] = struct{}{}
	if opts.Ordered {
		// The consumer delivers in stream order; hold back each key's
		// next delivery until the one before it is settled.
		return broker.OrderedSubscription(s), nil
	}
	return s, nil
}

// Close implements broker.Broker. Buffered and handed-out unsettled
// deliveries are Nak'ed so the server redelivers them at once (each such
// redelivery counts in the next Attempt), then the connection is flushed
// for at most 2 s and closed.
func (b *natsBroker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	close(b.closeCh)
	subs := make([]*subscription, 0, len(b.subs))
	for s := range b.subs {
		subs = append(subs, s)
	}
	handed := make([]*delivery, 0, len(b.handedOut))
	for d := range b.handedOut {
		handed = append(handed, d)
	}
	b.handedOut = map[*delivery]struct{}{}
	b.mu.Unlock()
	for _, s := range subs {
		s.shutdown()
	}
	for _, d := range handed {
		d.returnToServer()
	}
	if b.nc.IsConnected() {
		_ = b.nc.FlushTimeout(2 * time.Second)
	}
	b.nc.Close()
	return nil
}

func (b *natsBroker) track(d *delivery) {
	b.mu.Lock()
	b.handedOut[d] = struct{}{}
	b.mu.Unlock()
}

func (b *natsBroker) untrack(d *delivery) {
	b.mu.Lock()
	delete(b.handedOut, d)
	b.mu.Unlock()
}

func (b *natsBroker) removeSub(s *subscription) {
	b.mu.Lock()
	delete(b.subs, s)
	b.mu.Unlock()
}

var _ broker.LimitReporter = (*natsBroker)(nil)

// Limits implements broker.LimitReporter: it reads the queue's consumer
// and its exchange's stream from the server. DeliveryLimit is the
// consumer's MaxDeliver (ferry creates it with -1, no limit, and Declare
// does not change it on an existing consumer, so an operator's
// `nats consumer edit --max-deliver` stays in force: JetStream then stops
// delivering a message after that many deliveries, every Nak of a retry
// included, and it stays in the stream unacknowledged). Retention is the
// stream's MaxAge (none as ferry declares it). Returns
// broker.ErrUnknownQueue for a queue not declared on this broker,
// broker.ErrClosed after Close.
func (b *natsBroker) Limits(ctx context.Context, queue string) (broker.Limits, error) {
	d, qi, err := b.declaredQueue(queue)
	if err != nil {
		return broker.Limits{}, err
	}
	ctx, cancel := withDefaultTimeout(ctx, b.cfg.PublishTimeout)
	defer cancel()
	var l broker.Limits
	cons, err := b.js.Consumer(ctx, d.names.stream, qi.consumer)
	if err != nil {
		return l, fmt.Errorf("nats: limits of %s: consumer %s on stream %s: %w", queue, qi.consumer, d.names.stream, err)
	}
	if md := cons.CachedInfo().Config.MaxDeliver; md > 0 {
		l.DeliveryLimit = md
		l.DeliveryLimitSetting = fmt.Sprintf("the MaxDeliver of JetStream consumer %q on stream %q", qi.consumer, d.names.stream)
	}
	st, err := b.js.Stream(ctx, d.names.stream)
	if err != nil {
		return l, fmt.Errorf("nats: limits of %s: stream %s: %w", queue, d.names.stream, err)
	}
	if age := st.CachedInfo().Config.MaxAge; age > 0 {
		l.Retention = age
		l.RetentionSetting = fmt.Sprintf("the MaxAge of JetStream stream %q", d.names.stream)
	}
	return l, nil
}

var _ broker.BacklogReporter = (*natsBroker)(nil)

// Backlog implements broker.BacklogReporter: the queue's consumer's
// pending and unacknowledged messages (a retry waiting for its delay is
// one), the age of the first unacknowledged message on the consumer's
// filter subjects (one stream message lookup per filter), and the
// stream's MaxAge as the retention (0 as ferry declares it: JetStream
// keeps a message until every queue bound to it acknowledged it).
func (b *natsBroker) Backlog(ctx context.Context, queue string) (broker.Backlog, error) {
	var bl broker.Backlog
	d, qi, err := b.declaredQueue(queue)
	if err != nil {
		return bl, err
	}
	ctx, cancel := withDefaultTimeout(ctx, b.cfg.PublishTimeout)
	defer cancel()
	cons, err := b.js.Consumer(ctx, d.names.stream, qi.consumer)
	if err != nil {
		return bl, fmt.Errorf("nats: backlog of %s: consumer %s on stream %s: %w", queue, qi.consumer, d.names.stream, err)
	}
	info := cons.CachedInfo()
	bl.Messages = int64(info.NumPending) + int64(info.NumAckPending)
	st, err := b.js.Stream(ctx, d.names.stream)
	if err != nil {
		return bl, fmt.Errorf("nats: backlog of %s: stream %s: %w", queue, d.names.stream, err)
	}
	bl.Retention = st.CachedInfo().Config.MaxAge
	if bl.Messages > 0 {
		now := time.Now()
		for _, f := range consumerFilters(info.Config) {
			m, err := st.GetMsg(ctx, info.AckFloor.Stream+1, jetstream.WithGetMsgSubject(f))
			if err == nil && !m.Time.IsZero() {
				bl.OldestAge = max(bl.OldestAge, now.Sub(m.Time))
			}
		}
	}
	return bl, nil
}
