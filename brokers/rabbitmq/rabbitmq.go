package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferrymq/ferry/broker"
)

// Defaults of Config.
const (
	// DefaultURL is the URL when Config.URL is empty.
	DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"
	// DefaultPublishTimeout bounds a Publish whose ctx has no deadline.
	DefaultPublishTimeout = 10 * time.Second
	// DefaultReconnectDelay is the pause between reconnection attempts.
	DefaultReconnectDelay = 500 * time.Millisecond
	// DefaultConnectTimeout bounds how long New waits for the first
	// connection when its ctx has no deadline.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultPublishChannels is the size of the publishing channel pool.
	DefaultPublishChannels = 4
	// DefaultMaxMessageBytes is RabbitMQ's default max_message_size,
	// 128 MiB (134217728 bytes) in 3.8 and later
	// (https://www.rabbitmq.com/docs/configure, max_message_size).
	DefaultMaxMessageBytes = 128 << 20
	// DefaultMaxHeaderBytes bounds Message.HeaderBytes. The properties of a
	// message, headers included, travel in one content-header frame that
	// must fit in the negotiated frame_max (131072 bytes by default); the
	// rest is left for the table's encoding and the other properties.
	DefaultMaxHeaderBytes = 64 << 10
	// DefaultHeartbeat is the AMQP heartbeat interval, which also bounds how
	// long a silently dead connection goes unnoticed (twice the interval).
	DefaultHeartbeat = 10 * time.Second
)

// Queue types of Config.QueueType (RabbitMQ's x-queue-type,
// https://www.rabbitmq.com/docs/quorum-queues).
const (
	// QueueTypeClassic declares classic queues: one copy on one node.
	QueueTypeClassic = "classic"
	// QueueTypeQuorum declares quorum queues: replicated with Raft, the
	// data-safe type RabbitMQ recommends for durable queues.
	QueueTypeQuorum = "quorum"
)

// QuorumDeliveryLimit is the x-delivery-limit ferry sets on quorum queues:
// 2^31-1, in effect no limit. A quorum queue counts every return of a
// delivery (a lost channel or connection, a consumer_timeout, a closed
// subscription returning its prefetched messages, a DLQ List) and drops a
// message past its delivery limit, which is 20 by default from RabbitMQ
// 4.0 (none in 3.x). ferry counts attempts itself and moves a message to
// its DLQ with the reason, so no broker-side limit may drop it. -1 means
// "unlimited" only from RabbitMQ 4.0 on (3.10 accepts it as a plain
// number); 2^31-1 means the same on every version.
const QuorumDeliveryLimit = math.MaxInt32

// MaxRetryDelay is the longest retry level: x-message-ttl is an unsigned
// 32-bit count of milliseconds (https://www.rabbitmq.com/docs/ttl).
const MaxRetryDelay = time.Duration(math.MaxUint32) * time.Millisecond

// keyHeader carries Message.Key. It is removed from Message.Headers on
// receive.
const keyHeader = "x-ferry-key"

// Config configures the adapter. The zero value of every field means its
// documented default.
type Config struct {
	// URL is the AMQP URL, amqp://user:password@host:port/vhost, or, for a
	// cluster, the URLs of its nodes separated by commas
	// ("amqp://u:p@h1:5672/,amqp://u:p@h2:5672/"). Each connection
	// dials the nodes in turn, starting after the one it lost, until one
	// answers (https://www.rabbitmq.com/docs/clustering#clients: clients
	// must be given several nodes to connect to). Several URLs mean a
	// cluster: QueueType then defaults to QueueTypeQuorum and classic
	// queues, which live on one node, are logged as a WARN at New.
	// Defaults to DefaultURL.
	URL string
	// PublishTimeout bounds a Publish (and the confirmed publish inside
	// Retry, DeadLetter and Replay) whose ctx has no deadline. Defaults to
	// DefaultPublishTimeout (10s).
	PublishTimeout time.Duration
	// ReconnectDelay is the pause between attempts to reconnect after a
	// connection loss or a failed dial. Defaults to DefaultReconnectDelay
	// (500ms).
	ReconnectDelay time.Duration
	// ConnectTimeout bounds how long New waits for the first connection when
	// its ctx has no deadline. Defaults to DefaultConnectTimeout (10s).
	ConnectTimeout time.Duration
	// PublishChannels is how many confirm-mode channels Publish uses, so
	// that concurrent Publish calls do not wait for each other. Defaults to
	// DefaultPublishChannels (4).
	PublishChannels int
	// MaxMessageBytes is the largest Message.Size Publish accepts, in bytes;
	// set it to the server's max_message_size when that was changed.
	// Defaults to DefaultMaxMessageBytes (128 MiB).
	MaxMessageBytes int
	// MaxHeaderBytes is the largest Message.HeaderBytes Publish accepts, in
	// bytes. Defaults to DefaultMaxHeaderBytes (64 KiB).
	MaxHeaderBytes int
	// Heartbeat is the AMQP heartbeat interval. Defaults to DefaultHeartbeat
	// (10s).
	Heartbeat time.Duration
	// ConnectionName names the two connections in the management UI
	// (ConnectionName+"-publish", ConnectionName+"-consume"). Defaults to
	// "ferry".
	ConnectionName string
	// QueueType is the type of every queue Declare creates, the work queue,
	// its retry levels and its DLQ alike: QueueTypeClassic or
	// QueueTypeQuorum. Defaults to QueueTypeClassic. A queue that exists
	// with the other type is refused with broker.ErrTopologyMismatch: the
	// type of a queue cannot change, delete it (after draining it) to
	// switch. See the package doc for the arguments each type gets. With
	// several URLs (a cluster) it defaults to QueueTypeQuorum.
	QueueType string
	// QuorumReplicas is the x-quorum-initial-group-size of the quorum
	// queues Declare creates: how many nodes hold each queue. Defaults,
	// with several URLs, to their count up to 5, and with one URL to the
	// server's default (every node up to its quorum_cluster_size). With
	// several URLs, 1 is refused (a queue on one node loses the messages it
	// confirmed when that node's disk is lost, and is unavailable while the
	// node is down) and 2 is logged as a WARN (a majority of 2 is 2: one
	// node down stops the queue); https://www.rabbitmq.com/docs/quorum-queues#replication-factor
	// recommends an odd count, 3 or 5. Ignored for classic queues.
	QuorumReplicas int
	// ConsumerTimeout is the server's consumer_timeout (rabbitmq.conf;
	// https://www.rabbitmq.com/docs/consumers#acknowledgement-timeout):
	// a delivery left unacknowledged that long makes the server close the
	// channel and redeliver it. AMQP cannot read it, so say it here when
	// the server's differs; the adapter reports it as
	// broker.Limits.SettleTimeout, and package worker refuses a
	// HandlerTimeout that is not shorter. Defaults to
	// DefaultConsumerTimeout (30 min, RabbitMQ's default); negative: the
	// server has none.
	ConsumerTimeout time.Duration
	// ManagementURL, when set, is the base URL of the server's management
	// HTTP API, e.g. "http://user:password@127.0.0.1:15672" (without
	// credentials, those of URL are used). Limits then reads each queue's
	// effective delivery-limit there (an operator policy's or the
	// x-delivery-limit argument, the lower), which AMQP cannot tell, so the
	// worker refuses attempts that the limit would cut short; the API
	// must answer then, or the worker does not start. Empty: no such
	// check.
	ManagementURL string
	// Logger receives connection losses and reconnections. Defaults to
	// slog.Default(). The adapter adds the attribute broker=rabbitmq to
	// every line, so do not add a "broker" attribute to Logger yourself.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.URL == "" {
		c.URL = DefaultURL
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.ReconnectDelay == 0 {
		c.ReconnectDelay = DefaultReconnectDelay
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.PublishChannels == 0 {
		c.PublishChannels = DefaultPublishChannels
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.ConnectionName == "" {
		c.ConnectionName = "ferry"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.QueueType == "" {
		c.QueueType = QueueTypeClassic
		if len(c.urls()) > 1 {
			c.QueueType = QueueTypeQuorum
		}
	}
	if n := len(c.urls()); c.QuorumReplicas == 0 && n > 1 {
		c.QuorumReplicas = min(n, 5)
	}
	if c.ConsumerTimeout == 0 {
		c.ConsumerTimeout = DefaultConsumerTimeout
	}
	return c
}

// Validate checks c with the defaults applied, as New does before it
// dials: the URL must parse as an AMQP URI (amqp:// or amqps://), the
// ManagementURL, when set, as an http:// or https:// URL with a host, the
// durations and sizes must be in range. It needs no server. The error is
// a *broker.ConfigError naming the field, wrapping broker.ErrInvalidConfig.
func (c Config) Validate() error { return c.withDefaults().validate() }

// DefaultConsumerTimeout is Config.ConsumerTimeout's default, RabbitMQ's
// default consumer_timeout (30 minutes since 3.8.15).
const DefaultConsumerTimeout = 30 * time.Minute

var _ broker.LimitReporter = (*rabbit)(nil)

// Limits implements broker.LimitReporter: SettleTimeout is
// Config.ConsumerTimeout (none when negative). DeliveryLimit is, with
// Config.ManagementURL, the queue's effective delivery-limit read from the
// management API (an operator policy's delivery-limit, which RabbitMQ
// applies over ferry's higher x-delivery-limit argument); each redelivery
// of a delivery whose settlement was lost counts towards it, and so does
// the worker's attempt for it. Without ManagementURL it is 0 and Limits
// does no I/O: AMQP cannot read a policy, and what such a limit drops
// still reaches the DLQ through the work queue's dead-letter exchange,
// listed with the reason "delivery_limit". ferry's own retries are new
// messages in a retry level and never count. Returns
// broker.ErrUnknownQueue for a queue not declared on this broker,
// broker.ErrClosed after Close.
func (r *rabbit) Limits(ctx context.Context, queue string) (broker.Limits, error) {
	if r.closed.Load() {
		return broker.Limits{}, broker.ErrClosed
	}
	r.mu.Lock()
	_, ok := r.queues[queue]
	r.mu.Unlock()
	if !ok {
		return broker.Limits{}, fmt.Errorf("%w: %s (not declared on this broker)", broker.ErrUnknownQueue, queue)
	}
	var l broker.Limits
	if r.cfg.ConsumerTimeout > 0 {
		l.SettleTimeout = r.cfg.ConsumerTimeout
		l.SettleTimeoutSetting = "rabbitmq.Config.ConsumerTimeout (ferry --rabbitmq-consumer-timeout; the server's consumer_timeout)"
	}
	if r.cfg.ManagementURL != "" {
		n, setting, err := r.deliveryLimit(ctx, queue)
		if err != nil {
			return l, err
		}
		l.DeliveryLimit, l.DeliveryLimitSetting = n, setting
	}
	return l, nil
}

func (c Config) validate() error {
	bad := func(field, value, format string, args ...any) error {
		return &broker.ConfigError{Adapter: "rabbitmq", Field: field, Value: value, Reason: fmt.Sprintf(format, args...)}
	}
	const wantURL = "want amqp://user:password@host:port/vhost or amqps://…, or several separated by commas"
	urls := c.urls()
	if len(urls) == 0 {
		return bad("URL", c.URL, "no URL; %s", wantURL)
	}
	var vhost string
	for i, u := range urls {
		uri, err := amqp.ParseURI(u)
		if err != nil {
			return bad("URL", redact(u), "%v; %s", err, wantURL)
		}
		if strings.Contains(uri.Host, ":") && net.ParseIP(uri.Host) == nil {
			// amqp.ParseURI takes "host:1:2" as host "host:1".
			return bad("URL", redact(u), "host %q is not a host name; %s", uri.Host, wantURL)
		}
		if i > 0 && uri.Vhost != vhost {
			return bad("URL", redact(c.URL), "the URLs name different vhosts (%q, %q): they must be nodes of one cluster, one vhost", vhost, uri.Vhost)
		}
		vhost = uri.Vhost
	}
	switch {
	case c.QuorumReplicas < 0:
		return bad("QuorumReplicas", "", "%d: must not be negative", c.QuorumReplicas)
	case len(urls) > 1 && c.QueueType == QueueTypeQuorum && c.QuorumReplicas == 1:
		return bad("QuorumReplicas", "1", "a quorum queue on one node of a %d-node cluster loses what it confirmed with that node; want 3 or 5 (https://www.rabbitmq.com/docs/quorum-queues#replication-factor)", len(urls))
	case c.PublishTimeout < 0:
		return bad("PublishTimeout", "", "%v: must not be negative", c.PublishTimeout)
	case c.ReconnectDelay < 0:
		return bad("ReconnectDelay", "", "%v: must not be negative", c.ReconnectDelay)
	case c.ConnectTimeout < 0:
		return bad("ConnectTimeout", "", "%v: must not be negative", c.ConnectTimeout)
	case c.PublishChannels < 0 || c.PublishChannels > 256:
		return bad("PublishChannels", "", "%d: want 1..256", c.PublishChannels)
	case c.MaxMessageBytes < 0:
		return bad("MaxMessageBytes", "", "%d: must not be negative", c.MaxMessageBytes)
	case c.MaxHeaderBytes < 0 || c.MaxHeaderBytes > 120<<10:
		return bad("MaxHeaderBytes", "", "%d: want 1..%d (one AMQP frame)", c.MaxHeaderBytes, 120<<10)
	case c.Heartbeat < 0:
		return bad("Heartbeat", "", "%v: must not be negative", c.Heartbeat)
	case c.QueueType != QueueTypeClassic && c.QueueType != QueueTypeQuorum:
		return bad("QueueType", c.QueueType, "want %q or %q", QueueTypeClassic, QueueTypeQuorum)
	}
	if c.ManagementURL != "" {
		if u, err := url.Parse(c.ManagementURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("ManagementURL", redact(c.ManagementURL), "want http(s)://[user:password@]host:port of the management API, e.g. http://guest:guest@127.0.0.1:15672")
		}
	}
	return nil
}

// refusal reports whether err, from a dial, is the server refusing the
// connection for good: AMQP 403 ACCESS_REFUSED (wrong user or password,
// no SASL mechanism in common, no access to the vhost) or 530 NOT_ALLOWED
// (the vhost does not exist), sent during the connection handshake
// (https://www.rabbitmq.com/amqp-0-9-1-reference#constants).
func refusal(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && (ae.Code == amqp.AccessRefused || ae.Code == amqp.NotAllowed)
}

// urls returns the URLs of c.URL: split at commas, blanks trimmed, empty
// items dropped.
func (c Config) urls() []string {
	var out []string
	for _, u := range strings.Split(c.URL, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// redact hides the passwords of an AMQP URL, or of a comma list of them,
// for messages and logs.
func redact(raw string) string {
	if strings.Contains(raw, ",") {
		parts := strings.Split(raw, ",")
		for i, p := range parts {
			parts[i] = redact1(strings.TrimSpace(p))
		}
		return strings.Join(parts, ",")
	}
	return redact1(raw)
}

func redact1(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// rabbit implements broker.Broker.
type rabbit struct {
	cfg    Config
	log    *slog.Logger
	pubMgr *connMgr
	subMgr *connMgr
	pool   *pubPool

	closing   chan struct{} // closed by Close
	closeCtx  context.Context
	cancelAll context.CancelFunc // cancels closeCtx, by Close
	closeOnce sync.Once
	closed    atomic.Bool
	wg        sync.WaitGroup // connection managers

	healMu   sync.Mutex // one re-declaration of missing topology at a time
	healedAt time.Time  // when the last one finished, under healMu

	mu     sync.Mutex
	topo   *broker.Topology // merged topology of every Declare, nil before the first
	queues map[string]broker.Queue
	subs   map[*subscription]struct{}
}

var _ broker.Broker = (*rabbit)(nil)

// New connects to RabbitMQ and returns the adapter. It waits for the first
// connection until ctx is done or, when ctx has no deadline, for
// Config.ConnectTimeout, and returns an error naming the URL (password
// hidden) and the last dial error if the server stays unreachable. It
// returns at once an error wrapping broker.ErrInvalidConfig for a Config
// that Validate refuses, and one wrapping broker.ErrRefused, with the
// server's reason, when the server refuses the login or the vhost (AMQP
// 403 ACCESS_REFUSED, 530 NOT_ALLOWED). Once connected, later connection
// losses are repaired in the background.
func New(ctx context.Context, cfg Config) (broker.Broker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.ConnectTimeout)
		defer cancel()
	}
	r := &rabbit{
		cfg:     cfg,
		log:     cfg.Logger.With("broker", "rabbitmq"),
		closing: make(chan struct{}),
		queues:  map[string]broker.Queue{},
		subs:    map[*subscription]struct{}{},
	}
	r.warnUnsafe()
	r.closeCtx, r.cancelAll = context.WithCancel(context.Background())
	r.pubMgr = newConnMgr(r, "publish")
	r.subMgr = newConnMgr(r, "consume")
	r.pool = newPubPool(r, cfg.PublishChannels)
	r.wg.Add(2)
	go r.pubMgr.run()
	go r.subMgr.run()
	for _, m := range []*connMgr{r.pubMgr, r.subMgr} {
		if _, err := m.current(ctx); err != nil {
			last := m.lastError()
			r.Close()
			if errors.Is(err, broker.ErrRefused) {
				return nil, fmt.Errorf("rabbitmq: connect %s: %w", redact(cfg.URL), err)
			}
			if last != nil {
				return nil, fmt.Errorf("rabbitmq: connect %s: %w (last dial error: %v)", redact(cfg.URL), err, last)
			}
			return nil, fmt.Errorf("rabbitmq: connect %s: %w", redact(cfg.URL), err)
		}
	}
	return r, nil
}

// warnUnsafe logs a WARN for each setting that, on a cluster (several
// URLs), lets a node loss lose or block confirmed messages: classic queues
// (one copy on one node; RabbitMQ's replicated types are quorum queues and
// streams, https://www.rabbitmq.com/docs/quorum-queues#motivation) and
// QuorumReplicas 2 (no node may be down,
// https://www.rabbitmq.com/docs/quorum-queues#quorum-requirements).
// QuorumReplicas 1 is refused by validate.
func (r *rabbit) warnUnsafe() {
	n := len(r.cfg.urls())
	if n < 2 {
		return
	}
	if r.cfg.QueueType == QueueTypeClassic {
		r.log.Warn("rabbitmq: QueueType classic on a cluster: each queue lives on one node, and its messages are unavailable, or lost with its disk, when that node is down; use quorum",
			"setting", "QueueType", "nodes", n)
	} else if r.cfg.QuorumReplicas == 2 {
		r.log.Warn("rabbitmq: QuorumReplicas 2: a quorum of 2 replicas is both, so one node down stops every queue; use 3 or 5",
			"setting", "QuorumReplicas", "nodes", n)
	}
}

// Capabilities implements broker.Broker.
func (r *rabbit) Capabilities() broker.Capabilities {
	return broker.Capabilities{
		Name:               "rabbitmq",
		NativeDelay:        false,
		MaxDelay:           MaxRetryDelay,
		Ordering:           broker.OrderingQueue,
		MaxMessageBytes:    r.cfg.MaxMessageBytes,
		MaxHeaderBytes:     r.cfg.MaxHeaderBytes,
		Replay:             false,
		Wildcards:          true,
		CountsRedeliveries: false,
	}
}

// Declare implements broker.Broker. It declares, in this order, the topic
// exchange, then per queue the DLQ, the retry levels, the work queue and its
// bindings; all durable. A retry level whose delay changed since an earlier
// declaration is refused by RabbitMQ (PRECONDITION_FAILED, arguments differ):
// the error wraps broker.ErrTopologyMismatch and names the queue and the
// argument; delete it (or choose other delays) to change it. A
// declaration refused for the user's permissions (403 ACCESS_REFUSED)
// wraps broker.ErrRefused. Bindings are only added, never removed. All Declare calls on one
// adapter must use the same exchange; their queues are merged and
// re-declared after every reconnect.
func (r *rabbit) Declare(ctx context.Context, t broker.Topology) error {
	if r.closed.Load() {
		return broker.ErrClosed
	}
	if err := t.Validate(); err != nil {
		return fmt.Errorf("rabbitmq: declare: %w", err)
	}
	// A queue with priorities is a queue per level (broker.Queue.Priorities).
	t = t.Expanded()
	for _, q := range t.Queues {
		for i, d := range q.Delays() {
			if d < time.Millisecond || d > MaxRetryDelay {
				return fmt.Errorf("rabbitmq: declare: queue %s: RetryDelays[%d] %v: want 1ms..%v (x-message-ttl)", q.Name, i, d, MaxRetryDelay)
			}
		}
	}
	r.mu.Lock()
	if r.topo != nil && r.topo.Exchange != t.Exchange {
		ex := r.topo.Exchange
		r.mu.Unlock()
		return fmt.Errorf("rabbitmq: declare: exchange %q: this adapter already publishes to exchange %q", t.Exchange, ex)
	}
	r.mu.Unlock()
	ctx, cancel := r.opContext(ctx)
	defer cancel()
	conn, err := r.pubMgr.current(ctx)
	if err != nil {
		return fmt.Errorf("rabbitmq: declare: %w", err)
	}
	if err := declareOn(conn, t, r.cfg.QueueType, r.cfg.QuorumReplicas, r.log); err != nil {
		if isAMQPCode(err, amqp.AccessRefused) {
			return fmt.Errorf("%w: %w (the user may not configure, write or read these names on the vhost: see rabbitmqctl set_permissions)", err, broker.ErrRefused)
		}
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.topo == nil {
		r.topo = &broker.Topology{Exchange: t.Exchange}
	}
	for _, q := range t.Queues {
		merged := q
		if old, ok := r.queues[q.Name]; ok {
			merged.Bindings = appendMissing(old.Bindings, q.Bindings)
			for i := range r.topo.Queues {
				if r.topo.Queues[i].Name == q.Name {
					r.topo.Queues[i] = merged
				}
			}
		} else {
			r.topo.Queues = append(r.topo.Queues, merged)
		}
		r.queues[q.Name] = merged
	}
	return nil
}

func appendMissing(have, add []string) []string {
	out := append([]string(nil), have...)
	for _, a := range add {
		found := false
		for _, h := range out {
			if h == a {
				found = true
				break
			}
		}
		if !found {
			out = append(out, a)
		}
	}
	return out
}

// retryQueueName is the name of retry level i of queue.
func retryQueueName(queue string, i int) string { return fmt.Sprintf("%s.retry.%d", queue, i) }

// QueueNames returns the names of the RabbitMQ queues Declare creates for
// q: the work queue, one retry level <queue>.retry.<i> per entry of
// q.Delays(), and the DLQ (broker.DLQName). Teardown code deletes these.
func QueueNames(q broker.Queue) []string {
	names := []string{q.Name}
	for i := range q.Delays() {
		names = append(names, retryQueueName(q.Name, i))
	}
	return append(names, broker.DLQName(q.Name))
}

// queueArgs are the arguments every queue of type qt gets: its
// x-queue-type and, for quorum queues, QuorumDeliveryLimit and, when
// replicas > 0, x-quorum-initial-group-size (Config.QuorumReplicas).
func queueArgs(qt string, replicas ...int) amqp.Table {
	if qt == QueueTypeQuorum {
		t := amqp.Table{"x-queue-type": QueueTypeQuorum, "x-delivery-limit": int64(QuorumDeliveryLimit)}
		if len(replicas) > 0 && replicas[0] > 0 {
			t["x-quorum-initial-group-size"] = int64(replicas[0])
		}
		return t
	}
	return amqp.Table{"x-queue-type": QueueTypeClassic}
}

// retryQueueArgs are the arguments of a retry level: the level's delay as
// per-queue message TTL, then dead-lettering through the default exchange
// straight to the work queue (https://www.rabbitmq.com/docs/dlx). A quorum
// retry level dead-letters at least once (x-dead-letter-strategy
// at-least-once, which requires x-overflow reject-publish): the expired
// message leaves the retry queue only once the work queue confirmed it,
// where the default at-most-once strategy could lose it
// (https://www.rabbitmq.com/docs/quorum-queues#dead-lettering).
func retryQueueArgs(qt, queue string, delay time.Duration, replicas ...int) amqp.Table {
	args := queueArgs(qt, replicas...)
	args["x-message-ttl"] = ttlMillis(delay)
	args["x-dead-letter-exchange"] = ""
	args["x-dead-letter-routing-key"] = queue
	if qt == QueueTypeQuorum {
		args["x-dead-letter-strategy"] = "at-least-once"
		args["x-overflow"] = "reject-publish"
	}
	return args
}

func ttlMillis(d time.Duration) int64 {
	ms := int64((d + time.Millisecond - 1) / time.Millisecond)
	if ms < 1 {
		ms = 1
	}
	return ms
}

// workQueueArgs are the arguments of a work queue: queueArgs plus
// dead-lettering through the default exchange straight to its DLQ, so a
// message RabbitMQ drops by itself (an operator policy's max-length,
// message-ttl or delivery-limit) lands in the DLQ with the reason in its
// x-death header instead of vanishing (https://www.rabbitmq.com/docs/dlx).
// ferry itself never rejects without requeue, so nothing else takes that
// way.
func workQueueArgs(qt, queue string, replicas ...int) amqp.Table {
	args := queueArgs(qt, replicas...)
	args["x-dead-letter-exchange"] = ""
	args["x-dead-letter-routing-key"] = broker.DLQName(queue)
	return args
}

// PolicyDLX returns the rabbitmqctl command that gives the work queue
// queue, declared before ferry set x-dead-letter-exchange on work queues,
// the same dead-lettering as a policy (a queue's arguments cannot change
// in place; a policy can add what they lack). The pattern matches that
// queue's name only. An operator policy of one's own on the queue must
// carry these two keys as well: RabbitMQ applies one policy per queue.
func PolicyDLX(queue string) string {
	return fmt.Sprintf(`rabbitmqctl set_policy --apply-to queues ferry-dlx-%s '^%s$' '{"dead-letter-exchange":"","dead-letter-routing-key":"%s"}'`,
		queue, regexp.QuoteMeta(queue), broker.DLQName(queue))
}

// declareOn declares t on conn, on a channel of its own (a refused
// declaration closes the channel). A work queue that exists without
// x-dead-letter-exchange (declared by a ferry before it set one) is
// declared again without it, and log gets a warning with the policy that
// adds it (PolicyDLX): a queue's arguments cannot change in place, and
// refusing the queue would stop an upgrade.
func declareOn(conn *amqp.Connection, t broker.Topology, qt string, replicas int, log *slog.Logger) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: declare: open channel: %w", err)
	}
	defer func() { ch.Close() }()
	if err := ch.ExchangeDeclare(t.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		if isAMQPCode(err, amqp.PreconditionFailed) {
			return fmt.Errorf("rabbitmq: declare exchange %q: %w: %w; it exists with another type or other flags (ferry needs a durable topic exchange): delete it or use another exchange name",
				t.Exchange, broker.ErrTopologyMismatch, err)
		}
		return fmt.Errorf("rabbitmq: declare exchange %q: %w", t.Exchange, err)
	}
	for _, q := range t.Queues {
		dlq := broker.DLQName(q.Name)
		if _, err := ch.QueueDeclare(dlq, true, false, false, false, queueArgs(qt, replicas)); err != nil {
			return queueDeclareError(dlq, "", qt, err)
		}
		for i, d := range q.Delays() {
			name := retryQueueName(q.Name, i)
			if _, err := ch.QueueDeclare(name, true, false, false, false, retryQueueArgs(qt, q.Name, d, replicas)); err != nil {
				return queueDeclareError(name, fmt.Sprintf("retry level %d, x-message-ttl %dms", i, ttlMillis(d)), qt, err)
			}
		}
		if _, err := ch.QueueDeclare(q.Name, true, false, false, false, workQueueArgs(qt, q.Name, replicas)); err != nil {
			var ae *amqp.Error
			if !isAMQPCode(err, amqp.PreconditionFailed) || !errors.As(err, &ae) || !strings.Contains(ae.Reason, "x-dead-letter-") {
				return queueDeclareError(q.Name, "", qt, err)
			}
			// Declared before ferry set a dead-letter exchange on work
			// queues: keep it as it is, on a new channel (the refusal
			// closed this one).
			if ch, err = conn.Channel(); err != nil {
				return fmt.Errorf("rabbitmq: declare: open channel: %w", err)
			}
			if _, err := ch.QueueDeclare(q.Name, true, false, false, false, queueArgs(qt, replicas)); err != nil {
				return queueDeclareError(q.Name, "", qt, err)
			}
			log.Warn("rabbitmq: work queue has no dead-letter exchange (declared by an older ferry): a message RabbitMQ drops by itself (a policy's max-length, message-ttl or delivery-limit) is lost instead of reaching the DLQ; add it with a policy",
				"queue", q.Name, "dlq", broker.DLQName(q.Name), "command", PolicyDLX(q.Name))
		}
		for _, b := range q.Bindings {
			if err := ch.QueueBind(q.Name, b, t.Exchange, false, nil); err != nil {
				return fmt.Errorf("rabbitmq: bind queue %q to exchange %q with %q: %w", q.Name, t.Exchange, b, err)
			}
		}
	}
	return nil
}

// queueDeclareError describes a refused queue declaration. A
// PRECONDITION_FAILED (406) refusal means the queue exists with other
// arguments or flags (RabbitMQ's message names the argument and both
// values); it wraps broker.ErrTopologyMismatch and says how to fix it.
func queueDeclareError(name, what, qt string, err error) error {
	desc := fmt.Sprintf("queue %q", name)
	if what != "" {
		desc = fmt.Sprintf("retry queue %q (%s)", name, what)
	}
	if !isAMQPCode(err, amqp.PreconditionFailed) {
		return fmt.Errorf("rabbitmq: declare %s: %w", desc, err)
	}
	fix := "the queue exists with other settings: delete it (the next declaration re-creates it) or use another queue name"
	var ae *amqp.Error
	errors.As(err, &ae)
	switch {
	case ae != nil && strings.Contains(ae.Reason, "x-queue-type"):
		other := QueueTypeQuorum
		if qt == QueueTypeQuorum {
			other = QueueTypeClassic
		}
		fix = fmt.Sprintf("the queue exists as a %s queue (or was declared without a type) and ferry is configured for %s queues (--rabbitmq-queue-type %s); a queue's type cannot change: use --rabbitmq-queue-type %s, or drain and delete the queue and its .retry.<i> and .dlq queues so they are declared again as %s queues",
			other, qt, qt, other, qt)
	case ae != nil && strings.Contains(ae.Reason, "x-delivery-limit"):
		fix = fmt.Sprintf("the quorum queue exists with another x-delivery-limit (a policy or another client set it); ferry sets %d so that RabbitMQ never drops a message ferry means to retry: delete the queue (after draining it) to declare it again", QuorumDeliveryLimit)
	case what != "":
		fix = fmt.Sprintf("every process declaring this queue must use the same retry delays (ferry: the same --retry-delay); to change them, delete %q and its other .retry.<i> queues (messages waiting in them are lost)", name)
	}
	return fmt.Errorf("rabbitmq: declare %s: %w: %w; %s", desc, broker.ErrTopologyMismatch, err, fix)
}

// healTopology declares the remembered topology again because a part of
// it is missing on the server (deleted by an operator, or a broker reset
// without its data) although the connection stayed up: seen at what
// (basic.consume NOT_FOUND, a publish to a missing exchange, a message
// returned unroutable that a remembered binding routes). seenAt is when
// the caller started the operation that failed: a re-declaration finished
// since then already repaired what it saw, so concurrent callers cause one
// re-declaration, not one each.
func (r *rabbit) healTopology(ctx context.Context, what string, seenAt time.Time) error {
	r.healMu.Lock()
	defer r.healMu.Unlock()
	if r.healedAt.After(seenAt) {
		return nil
	}
	t := r.topology()
	if t == nil {
		return nil
	}
	if r.cfg.QueueType == QueueTypeQuorum {
		// RabbitMQ removes a deleted quorum queue's Raft members after
		// queue.delete returned; a queue of the same name declared at once
		// can lose the messages it confirms meanwhile (seen on 3.10).
		// Let the deletion settle first.
		t := time.NewTimer(quorumHealSettle)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	for attempt := 1; ; attempt++ {
		conn, err := r.pubMgr.current(ctx)
		if err != nil {
			return fmt.Errorf("rabbitmq: re-declare the missing topology: %w", err)
		}
		err = declareOn(conn, *t, r.cfg.QueueType, r.cfg.QuorumReplicas, r.log)
		if err == nil {
			break
		}
		// NOT_FOUND while declaring: an object was deleted between two
		// declarations of this run (the operator is still deleting);
		// declare everything again, a few times.
		if !isAMQPCode(err, amqp.NotFound) || attempt == 5 || ctx.Err() != nil {
			r.log.Error("rabbitmq: topology missing on the server; declaring it again failed", "seen", what, "err", err)
			return err
		}
		time.Sleep(time.Duration(attempt) * 20 * time.Millisecond)
	}
	r.healedAt = time.Now()
	r.log.Warn("rabbitmq: topology missing on the server (deleted while in use?); declared it again and carrying on",
		"seen", what, "exchange", t.Exchange, "queues", len(t.Queues))
	return nil
}

// quorumHealSettle is how long healTopology waits before it declares
// missing quorum queues again.
const quorumHealSettle = time.Second

// knownRoute reports whether the remembered topology routes a message
// published to exchange with key: a binding of a declared queue matches
// key on the declared exchange, or, on the default exchange, key names a
// declared work, retry or dead-letter queue. A message returned
// unroutable although knownRoute holds means the topology is missing.
func (r *rabbit) knownRoute(exchange, key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.topo == nil {
		return false
	}
	for _, q := range r.topo.Queues {
		if exchange == "" {
			for _, n := range QueueNames(q) {
				if n == key {
					return true
				}
			}
			continue
		}
		if exchange != r.topo.Exchange {
			continue
		}
		for _, b := range q.Bindings {
			if broker.MatchRoutingKey(b, key) {
				return true
			}
		}
	}
	return false
}

// topology returns a copy of the merged topology, or nil.
func (r *rabbit) topology() *broker.Topology {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.topo == nil {
		return nil
	}
	c := *r.topo
	c.Queues = append([]broker.Queue(nil), r.topo.Queues...)
	return &c
}

func (r *rabbit) queue(name string) (broker.Queue, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	q, ok := r.queues[name]
	return q, ok
}

func (r *rabbit) exchange() (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.topo == nil {
		return "", false
	}
	return r.topo.Exchange, true
}

// opContext applies the publish timeout when ctx has no deadline, and ends
// the context when the adapter is closed.
func (r *rabbit) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	var cancel context.CancelFunc
	if _, ok := ctx.Deadline(); ok {
		ctx, cancel = context.WithCancel(ctx)
	} else {
		ctx, cancel = context.WithTimeout(ctx, r.cfg.PublishTimeout)
	}
	stop := context.AfterFunc(r.closeCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

// closedErr returns ErrClosed when the adapter was closed while err
// happened, else err.
func (r *rabbit) closedErr(err error) error {
	if r.closed.Load() {
		return broker.ErrClosed
	}
	return err
}

// Close implements broker.Broker. It stops every subscription (their
// unsettled deliveries go back to their queues when the channels close),
// closes both connections with a 2s deadline for the close handshake and
// returns within about 5s even when the server is unreachable.
func (r *rabbit) Close() error {
	first := false
	r.closeOnce.Do(func() {
		first = true
		r.closed.Store(true)
		close(r.closing)
		r.cancelAll()
	})
	if !first {
		return nil
	}
	r.mu.Lock()
	subs := make([]*subscription, 0, len(r.subs))
	for s := range r.subs {
		subs = append(subs, s)
	}
	r.mu.Unlock()
	for _, s := range subs {
		s.stop()
	}
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		r.log.Warn("rabbitmq: close: connections did not close within 5s; abandoning them")
	}
	return nil
}

// isAMQPCode reports whether err is an AMQP error with the reply code.
func isAMQPCode(err error, code int) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == code
}
