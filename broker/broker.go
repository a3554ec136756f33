package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Header names that ferry itself sets and reads. They are the same on every
// broker; an adapter maps them to its native header mechanism (AMQP headers
// table, NATS message headers, Kafka record headers, SQS message attributes).
const (
	// HeaderRetryCount carries how many times the message has been retried,
	// as a decimal string. It is absent on a first delivery and after a DLQ
	// replay, and absent means 0: the relay publishes outbox rows without
	// it, so that every adapter delivers a first attempt as the row was
	// written (no header the producer did not set) and no byte is added to
	// the common case; readers use Message.Attempt (1 + this value) or treat
	// a missing header as 0. The conformance suite checks both. ferry never reads
	// RabbitMQ's x-death header, whose counting changed between RabbitMQ
	// versions (RabbitMQ 3.13 / 4.0 release notes, "x-death" changes).
	HeaderRetryCount = "x-retry-count"
	// HeaderLastError carries the reason of the last failed attempt, as text
	// of at most MaxReasonBytes bytes. It is set on retried and dead-lettered
	// messages.
	HeaderLastError = "x-last-error"
	// HeaderFirstFailedAt carries the time of the first failed attempt, RFC 3339
	// with nanoseconds, UTC. It is set on the first retry and kept afterwards.
	HeaderFirstFailedAt = "x-first-failed-at"
	// HeaderDeadAt carries the time the message was moved to the DLQ,
	// RFC 3339 with nanoseconds, UTC.
	HeaderDeadAt = "x-dead-at"
	// HeaderCreatedAt carries the commit time of the outbox row (for a
	// scheduled event, its due time when later), RFC 3339 with
	// nanoseconds, UTC; the worker measures create-to-handled latency from it.
	HeaderCreatedAt = "x-created-at"
	// HeaderTraceparent carries the W3C Trace Context traceparent
	// (https://www.w3.org/TR/trace-context/).
	HeaderTraceparent = "traceparent"
	// HeaderAppID carries the application's own id of the event's subject
	// (the sample app: the notification id), set through outbox.Event.AppID,
	// at most 255 bytes of UTF-8. Message.ID is the outbox row id; this is
	// the id an operator knows from the application's API, shown by
	// "ferry dlq list" and in the worker's logs. Absent when not set.
	HeaderAppID = "x-app-id"
)

// MaxReasonBytes bounds the reason text stored in HeaderLastError (bytes).
// Longer reasons are truncated at a UTF-8 boundary by TruncateReason.
const MaxReasonBytes = 1024

// The errors that are part of the API. Adapters return them, wrapped with
// %w where they add context; callers test with errors.Is.
var (
	// ErrClosed is returned by every method called after Close, and by a
	// blocked call that Close interrupted.
	ErrClosed = errors.New("broker: closed")
	// ErrMessageTooLarge is returned by Publish for a message whose body plus
	// headers exceed Capabilities.MaxMessageBytes; such a message is never
	// sent, and the caller must not retry it unchanged.
	ErrMessageTooLarge = errors.New("broker: message too large")
	// ErrUnroutable is returned by Publish for a message that no queue is
	// bound to (RabbitMQ: returned by the server because of the mandatory
	// flag). The message was not stored by the broker.
	ErrUnroutable = errors.New("broker: message unroutable")
	// ErrNacked is returned by Publish for a message the broker refused to
	// take responsibility for (RabbitMQ: basic.nack in confirm mode).
	ErrNacked = errors.New("broker: message nacked by broker")
	// ErrInvalidMessage is returned by Publish, in a *PublishError entry, for
	// a message the adapter or the broker refuses because of the message
	// itself: an ID, Type, Key or header name or value the broker cannot
	// carry (length, characters, encoding, reserved names), too many
	// headers. Such a message is never sent, and publishing it again
	// unchanged fails the same way: it is a failure of that message, never
	// of the broker as a whole. The error names the message and the field.
	ErrInvalidMessage = errors.New("broker: invalid message")
	// ErrUnknownQueue is returned by Subscribe for a queue that Declare did
	// not declare on this broker, and by DLQ and the DeadLetterQueue methods
	// for a queue that is neither declared on this broker nor found on the
	// server (see Broker.DLQ).
	ErrUnknownQueue = errors.New("broker: unknown queue")
	// ErrTopologyMismatch is returned (wrapped) by Declare when the broker
	// already holds an object of the topology with other settings that
	// cannot be changed in place (RabbitMQ: PRECONDITION_FAILED, e.g. a
	// retry queue declared with another x-message-ttl because a process
	// used other RetryDelays). It is permanent: declaring again does not
	// help. The error names the object and the setting that differs.
	ErrTopologyMismatch = errors.New("broker: topology differs from what the broker holds")
	// ErrAlreadyAcked is returned by Delivery methods called after the
	// delivery was already settled by Ack, Retry or DeadLetter. The second
	// call has no effect on the broker.
	ErrAlreadyAcked = errors.New("broker: delivery already settled")
	// ErrUnsupported is returned when a configuration asks for something the
	// broker's Capabilities rule out (see Capabilities.Check).
	ErrUnsupported = errors.New("broker: unsupported by this broker")
)

// Message is one event as it travels through a broker.
type Message struct {
	// ID identifies the event: the outbox row id as a decimal string. It is
	// the AMQP message-id (and Nats-Msg-Id, Kafka record header, SQS
	// attribute) and stays the same across redeliveries, retries and DLQ
	// replays, so consumers deduplicate on it. Required, at most 255 bytes.
	ID string
	// Type is the event type and routing key, e.g. "notification.requested":
	// dot-separated words. Required.
	Type string
	// Key is the ordering (partition) key, e.g. a user id. Messages with the
	// same Key are delivered in order only where Capabilities.Ordering says
	// so. Optional.
	Key string
	// Body is the payload, opaque bytes (ferry's own events are JSON).
	Body []byte
	// Headers are string headers carried with the message. Keys starting
	// with "x-" are reserved for ferry (see the Header constants). May be nil.
	Headers map[string]string
	// Attempt is the 1-based number of this handling attempt:
	// 1 + the value of HeaderRetryCount. Set by the adapter on received
	// messages; ignored by Publish. Redeliveries after a crash or a lost
	// connection do not count as attempts on brokers that can tell them
	// apart; Capabilities.CountsRedeliveries says which.
	Attempt int
}

// Size returns the bytes the message occupies for size limits: the body,
// the ID, the Type, the Key and every header key and value.
func (m *Message) Size() int {
	n := len(m.Body) + len(m.ID) + len(m.Type) + len(m.Key)
	for k, v := range m.Headers {
		n += len(k) + len(v)
	}
	return n
}

// HeaderBytes returns the bytes taken by the headers' keys and values.
func (m *Message) HeaderBytes() int {
	n := 0
	for k, v := range m.Headers {
		n += len(k) + len(v)
	}
	return n
}

// Clone returns a deep copy of m (Body and Headers are copied).
func (m *Message) Clone() *Message {
	c := *m
	c.Body = append([]byte(nil), m.Body...)
	if m.Headers != nil {
		c.Headers = make(map[string]string, len(m.Headers))
		for k, v := range m.Headers {
			c.Headers[k] = v
		}
	}
	return &c
}

// Topology is what Declare creates: one exchange (topic) and the queues
// bound to it. Declare is idempotent, so every process (relay, worker, API)
// declares the whole topology at start, in any order.
type Topology struct {
	// Exchange is the name of the topic exchange (RabbitMQ exchange, NATS
	// stream, Kafka topic prefix, SNS-less SQS: a name prefix), e.g.
	// "notifications". Required: letters, digits, '-', '_' and '.'.
	Exchange string
	// Queues are the work queues bound to Exchange. At least one.
	Queues []Queue
}

// Queue is one work queue with its bindings, its retry levels and its DLQ.
type Queue struct {
	// Name of the work queue, e.g. "notifications.send". The DLQ is named
	// Name+".dlq" and retry levels Name+".retry.<i>" where the broker needs
	// them. Required: letters, digits, '-', '_' and '.'.
	Name string
	// Bindings are routing-key patterns: dot-separated words where '*'
	// matches exactly one word and '#' zero or more words (AMQP 0-9-1 topic
	// exchange rules). At least one.
	Bindings []string
	// RetryDelays is the backoff list: the delay before retry i+1 is
	// RetryDelays[min(i, len-1)]. One retry level is declared per entry on
	// brokers without per-message delay (RabbitMQ: a queue with that
	// x-message-ttl). Defaults to [30s].
	RetryDelays []time.Duration
	// Priorities is the number of priority levels, 2..MaxPriority+1; 0
	// or 1: none. Each level is a queue of its own ("<Name>.p<k>", see
	// Topology.Expanded and the package doc, "Priorities") and a worker
	// of the queue consumes them all, the highest first (Prioritized). A
	// queue with priorities may not bind a pattern whose first word is
	// '*' or '#'.
	Priorities int
}

// Delays returns q.RetryDelays, or the default [30s] when it is empty.
func (q Queue) Delays() []time.Duration {
	if len(q.RetryDelays) == 0 {
		return []time.Duration{DefaultRetryDelay}
	}
	return q.RetryDelays
}

// DefaultRetryDelay is the retry delay when Queue.RetryDelays is empty.
const DefaultRetryDelay = 30 * time.Second

// DLQName returns the name of the dead-letter queue of the work queue name.
func DLQName(queue string) string { return queue + ".dlq" }

// Validate reports the first problem with the topology, naming the field,
// or nil.
func (t Topology) Validate() error {
	if !validName(t.Exchange) {
		return fmt.Errorf("broker: topology: Exchange %q: want letters, digits, '-', '_' or '.'", t.Exchange)
	}
	if len(t.Queues) == 0 {
		return errors.New("broker: topology: Queues: at least one queue is required")
	}
	seen := map[string]bool{}
	for i, q := range t.Queues {
		if !validName(q.Name) {
			return fmt.Errorf("broker: topology: Queues[%d].Name %q: want letters, digits, '-', '_' or '.'", i, q.Name)
		}
		if seen[q.Name] {
			return fmt.Errorf("broker: topology: Queues[%d].Name %q: declared twice", i, q.Name)
		}
		seen[q.Name] = true
		if len(q.Bindings) == 0 {
			return fmt.Errorf("broker: topology: Queues[%d].Bindings: at least one routing-key pattern is required", i)
		}
		for j, b := range q.Bindings {
			if err := ValidatePattern(b); err != nil {
				return fmt.Errorf("broker: topology: Queues[%d].Bindings[%d]: %w", i, j, err)
			}
		}
		for j, d := range q.RetryDelays {
			if d <= 0 {
				return fmt.Errorf("broker: topology: Queues[%d].RetryDelays[%d]: %v: must be positive", i, j, d)
			}
		}
	}
	return validatePriorities(t)
}

// Queue returns the queue named name and whether it exists.
func (t Topology) Queue(name string) (Queue, bool) {
	for _, q := range t.Queues {
		if q.Name == name {
			return q, true
		}
	}
	return Queue{}, false
}

func validName(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
		default:
			return false
		}
	}
	return true
}

// ValidatePattern reports whether p is a valid routing-key pattern:
// non-empty dot-separated words, each either '*', '#' or a word without
// '*' and '#'.
func ValidatePattern(p string) error {
	if p == "" {
		return errors.New("empty routing-key pattern")
	}
	for _, w := range strings.Split(p, ".") {
		if w == "" {
			return fmt.Errorf("routing-key pattern %q: empty word", p)
		}
		if w != "*" && w != "#" && strings.ContainsAny(w, "*#") {
			return fmt.Errorf("routing-key pattern %q: '*' and '#' must be whole words", p)
		}
	}
	return nil
}

// MatchRoutingKey reports whether the routing key matches pattern under the
// AMQP 0-9-1 topic exchange rules: '*' matches exactly one word, '#' zero or
// more words (https://www.rabbitmq.com/tutorials/tutorial-five-go).
func MatchRoutingKey(pattern, key string) bool {
	return matchWords(strings.Split(pattern, "."), strings.Split(key, "."))
}

func matchWords(p, k []string) bool {
	for len(p) > 0 {
		switch p[0] {
		case "#":
			if len(p) == 1 {
				return true
			}
			for i := 0; i <= len(k); i++ {
				if matchWords(p[1:], k[i:]) {
					return true
				}
			}
			return false
		case "*":
			if len(k) == 0 {
				return false
			}
		default:
			if len(k) == 0 || p[0] != k[0] {
				return false
			}
		}
		p, k = p[1:], k[1:]
	}
	return len(k) == 0
}

// PublishError reports which messages of a Publish batch failed. The
// messages not listed were durably confirmed by the broker.
type PublishError struct {
	// Failed lists the failed messages, by their index in the batch.
	Failed []FailedMessage
}

// FailedMessage is one message of a batch that was not confirmed.
type FailedMessage struct {
	// Index of the message in the batch passed to Publish.
	Index int
	// ID is the message's ID.
	ID string
	// Err says why. A failure of the message itself wraps ErrNacked,
	// ErrUnroutable, ErrMessageTooLarge or ErrInvalidMessage (see
	// IsMessageFault); anything else (a context error, a connection error,
	// ErrClosed) is a failure of the broker as a whole.
	Err error
}

// Error implements error.
func (e *PublishError) Error() string {
	if len(e.Failed) == 0 {
		return "broker: publish: no failures"
	}
	return fmt.Sprintf("broker: publish: %d message(s) failed, first %s: %v", len(e.Failed), e.Failed[0].ID, e.Failed[0].Err)
}

// Unwrap returns the errors of the failed messages, so errors.Is finds
// ErrUnroutable and the others.
func (e *PublishError) Unwrap() []error {
	errs := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		errs[i] = f.Err
	}
	return errs
}

// IsMessageFault reports whether err, a FailedMessage.Err or a Publish
// error, is a failure of the message itself (it wraps ErrNacked,
// ErrUnroutable, ErrMessageTooLarge or ErrInvalidMessage; a
// *RefusedCallError wraps ErrInvalidMessage) rather than of the broker as
// a whole (unreachable, closed, a deadline passed, a server error,
// throttling, credentials, no room: ErrBlocked, which is never a message
// fault; see Broker.Publish). A caller retries a message
// fault with a per-message backoff and an outage by pausing all
// publishing.
func IsMessageFault(err error) bool {
	if errors.Is(err, ErrBlocked) {
		return false // no room on the broker: the messages are not at fault
	}
	return errors.Is(err, ErrInvalidMessage) || errors.Is(err, ErrMessageTooLarge) ||
		errors.Is(err, ErrUnroutable) || errors.Is(err, ErrNacked)
}

// FailedIndexes returns the set of failed batch indexes of err: all of
// 0..n-1 when err is not a *PublishError (the whole batch failed), none when
// err is nil.
func FailedIndexes(err error, n int) map[int]error {
	out := map[int]error{}
	if err == nil {
		return out
	}
	var pe *PublishError
	if errors.As(err, &pe) {
		for _, f := range pe.Failed {
			out[f.Index] = f.Err
		}
		return out
	}
	for i := 0; i < n; i++ {
		out[i] = err
	}
	return out
}

// Ordering says how far a broker keeps messages in order.
type Ordering int

const (
	// OrderingNone: no order is promised.
	OrderingNone Ordering = iota
	// OrderingQueue: in publish order within one queue, with one consumer
	// and no retries (RabbitMQ).
	OrderingQueue
	// OrderingKey: in publish order among messages with the same Key
	// (Kafka partition, SQS FIFO message group), again up to retries.
	OrderingKey
)

// String returns "none", "queue" or "key".
func (o Ordering) String() string {
	switch o {
	case OrderingQueue:
		return "queue"
	case OrderingKey:
		return "key"
	default:
		return "none"
	}
}

// Capabilities is what an adapter does natively, declared at run time. The
// framework calls Check at start-up and refuses a configuration the broker
// cannot honour.
type Capabilities struct {
	// Name of the broker, e.g. "rabbitmq"; used as the metrics label.
	Name string
	// NativeDelay is true when the broker can redeliver a message after an
	// arbitrary delay (NATS NakWithDelay, SQS ChangeMessageVisibility).
	// When false, only the declared retry levels exist and a retry asks for
	// the smallest level at least as long as the wanted delay.
	NativeDelay bool
	// MaxDelay is the longest retry delay the broker can hold; 0 means no
	// limit. SQS: 12 hours of visibility timeout.
	MaxDelay time.Duration
	// Ordering is the ordering scope.
	Ordering Ordering
	// MaxMessageBytes is the largest Message.Size the broker accepts
	// (bytes); 0 means no limit known. NATS: the server's max_payload.
	MaxMessageBytes int
	// MaxHeaderBytes is the largest Message.HeaderBytes the broker accepts
	// (bytes); 0 means no separate limit.
	MaxHeaderBytes int
	// Replay is true when consumed messages can be read again (Kafka log,
	// JetStream stream with limits retention).
	Replay bool
	// Wildcards is true when bindings may use '*' and '#'.
	Wildcards bool
	// CountsRedeliveries is true when Message.Attempt also counts
	// redeliveries after a crash or an expired ack deadline, not only
	// retries asked for by the handler (NATS NumDelivered, SQS
	// ApproximateReceiveCount).
	CountsRedeliveries bool
	// RetryInPlace is true when Delivery.Retry only hides the message for
	// the delay and cannot rewrite it (SQS ChangeMessageVisibility): the
	// next delivery's HeaderRetryCount and HeaderFirstFailedAt are derived
	// from the broker's receive count and first receive time, and the
	// retry's reason is not carried to it in HeaderLastError (package
	// worker adds it from its attempt record). DeadLetter still sets
	// HeaderLastError.
	RetryInPlace bool
}

// Requirements is what a configuration asks of a broker; see Check.
type Requirements struct {
	// MaxMessageBytes is the largest message the application will publish.
	MaxMessageBytes int
	// RetryDelays are the delays the retry policy will ask for.
	RetryDelays []time.Duration
	// Topology is the topology to be declared.
	Topology Topology
}

// Check returns an error wrapping ErrUnsupported that names the first
// requirement c cannot honour, or nil.
func (c Capabilities) Check(r Requirements) error {
	if c.MaxMessageBytes > 0 && r.MaxMessageBytes > c.MaxMessageBytes {
		return fmt.Errorf("%w: %s accepts messages up to %d bytes, the application may publish %d bytes",
			ErrUnsupported, c.Name, c.MaxMessageBytes, r.MaxMessageBytes)
	}
	for _, d := range r.RetryDelays {
		if c.MaxDelay > 0 && d > c.MaxDelay {
			return fmt.Errorf("%w: %s holds retry delays up to %v, the policy asks for %v", ErrUnsupported, c.Name, c.MaxDelay, d)
		}
	}
	if !c.Wildcards {
		for _, q := range r.Topology.Queues {
			for _, b := range q.Bindings {
				if strings.ContainsAny(b, "*#") {
					return fmt.Errorf("%w: %s has no wildcard bindings, queue %s binds %q", ErrUnsupported, c.Name, q.Name, b)
				}
			}
		}
	}
	return nil
}

// Broker is the contract every adapter meets. All methods may be called
// concurrently. After Close every method returns ErrClosed.
//
// Delivery is at least once: a message confirmed by Publish is delivered
// to every queue whose bindings match its Type, until a Delivery of it is
// settled (Ack, Retry, DeadLetter); it may be delivered more than once
// (after a crash, a lost connection or an expired ack deadline), so
// consumers deduplicate on Message.ID.
type Broker interface {
	// Declare creates the topology idempotently: the exchange, each queue
	// with its bindings, its retry levels and its DLQ, all durable. Calling
	// it again with the same topology is a no-op; every process calls it at
	// start. The adapter remembers the topology and re-declares it after a
	// reconnect. Returns an error naming the object the broker refused; an
	// object that exists with other settings that cannot change in place is
	// an error wrapping ErrTopologyMismatch (not worth retrying).
	Declare(ctx context.Context, t Topology) error

	// Publish sends the batch to the declared exchange. It returns nil only
	// once the broker durably confirmed every message (RabbitMQ: publisher
	// confirms with persistent delivery mode and the mandatory flag, so an
	// unroutable message is an error, not a silent drop). When some messages
	// fail it returns a *PublishError listing exactly those; the others are
	// confirmed, and the caller must not send them again. Any other error
	// means none of the batch is known to be confirmed. Publish honours
	// ctx's deadline and never blocks past it; when ctx has no deadline the
	// adapter applies its own publish timeout. A message may be stored even
	// when Publish returned an error for it (the confirm was lost): the
	// caller publishes it again and consumers deduplicate. Publish
	// reconnects by itself after a connection loss.
	//
	// Each error the broker can give is classified, for one message or for
	// a whole call (a request carrying several messages):
	//   - an outage, which says nothing about the messages and passes on a
	//     later try: no answer (connection refused or lost, timeout, ctx
	//     done), a server error (HTTP 5xx, Kafka NOT_LEADER or
	//     REQUEST_TIMED_OUT, a JetStream cluster without quorum), throttling
	//     or a quota, authentication or authorisation, a missing or closed
	//     topic, stream or queue. Its messages fail with that error, which
	//     IsMessageFault does not recognise.
	//     An outage because the broker has no room (a resource alarm, too
	//     few in-sync replicas, a full stream) wraps ErrBlocked with the
	//     broker's reason (see ErrBlocked for what each adapter maps);
	//     when the broker stops answering for that reason (RabbitMQ's
	//     connection.blocked), Publish returns it as soon as it knows,
	//     without waiting for ctx's deadline.
	//   - a message fault, which publishing the same message again repeats:
	//     the broker refused the message for what it is (its size, body,
	//     headers or routing: ErrMessageTooLarge, ErrInvalidMessage,
	//     ErrUnroutable, ErrNacked). When the broker refused a whole call
	//     that carried several messages for such a reason without saying
	//     which (an SQS HTTP 400 for the whole SendMessageBatch, a Kafka
	//     record batch refused as MESSAGE_TOO_LARGE or INVALID_RECORD, a
	//     RabbitMQ channel closed by PRECONDITION_FAILED), the adapter sends
	//     its messages again apart (SendSplitting) so that only the
	//     message(s) at fault fail, and the others are published.
	//
	// Whenever one Publish makes several calls (SQS batches of 10, Kafka
	// produce requests per partition, NATS per-message publishes, RabbitMQ
	// per-message confirms), the outcome is per message: the messages of
	// the calls the broker accepted are confirmed and absent from the
	// *PublishError, the others are listed with their call's error. Each
	// adapter's package doc lists what it classifies how, citing its
	// broker's documentation.
	Publish(ctx context.Context, msgs []*Message) error

	// Subscribe starts consuming the named declared queue, with at most
	// opts.Prefetch unsettled deliveries in flight. The subscription
	// reconnects by itself after a connection loss; deliveries unsettled at
	// the loss are redelivered by the broker. Returns ErrUnknownQueue for a
	// queue Declare did not declare.
	Subscribe(ctx context.Context, queue string, opts SubscribeOptions) (Subscription, error)

	// DLQ returns access to the dead-letter queue of the named work queue,
	// the same on every broker. It does no I/O and creates nothing on the
	// broker, also not when the queue is unknown.
	//
	// The queue need not be declared by this Broker: an operator's tool
	// reads, replays and purges a DLQ without calling Declare (so without
	// knowing the queue's bindings or retry delays). For a queue this
	// Broker did not declare, every DeadLetterQueue method first looks the
	// queue and its DLQ up on the server, without creating anything
	// (RabbitMQ: a passive declaration of <queue>.dlq, and of <queue>
	// before a replay; NATS: the queue's consumer on its exchange's stream,
	// and the DLQ stream), and returns an error wrapping ErrUnknownQueue,
	// naming the queue and where it was looked for, when they are missing
	// (an adapter may let List and Purge read a DLQ whose work queue is
	// gone, never Replay); Replay routes to the work queue found there.
	// For a declared queue the declared names are used.
	// DLQ itself returns ErrUnknownQueue only for a name no Declare could
	// accept (see Topology.Validate), and ErrClosed after Close.
	DLQ(queue string) (DeadLetterQueue, error)

	// Capabilities describes what the adapter does natively.
	Capabilities() Capabilities

	// Close releases the connections. Unsettled deliveries are returned to
	// the broker for redelivery. It returns within a bounded time (at most
	// a few seconds) even when the broker is unreachable. A second Close
	// returns nil.
	Close() error
}

// SubscribeOptions tune a subscription.
type SubscribeOptions struct {
	// Prefetch bounds the deliveries handed out and not yet settled
	// (RabbitMQ basic.qos prefetch count, JetStream MaxAckPending, Kafka
	// batch, SQS max messages). Defaults to DefaultPrefetch.
	Prefetch int
	// AckDeadline is how long the broker waits for a settlement before it
	// redelivers (JetStream AckWait, SQS visibility timeout); brokers that
	// wait for a settlement until the connection closes ignore it. Defaults
	// to 30s.
	AckDeadline time.Duration
	// Ordered asks for per-key order: Receive hands out a delivery whose
	// Message.Key is not empty only after every earlier delivery of the
	// same Key on this subscription was settled (Ack, Retry or
	// DeadLetter), in the order the broker holds them (Kafka: partition
	// order; SQS FIFO: message group order; RabbitMQ and NATS: queue or
	// stream order). Messages of other keys are not held back. Order holds
	// up to retries: a retried message comes back after later messages of
	// its key. Subscribe returns an error wrapping ErrUnsupported on a
	// broker whose Capabilities.Ordering is OrderingNone.
	Ordered bool
}

// DefaultPrefetch is the prefetch when SubscribeOptions.Prefetch is 0.
const DefaultPrefetch = 10

// Subscription hands out deliveries of one queue.
type Subscription interface {
	// Receive blocks until a delivery arrives, ctx is done (returns ctx's
	// error, unwrapped) or the subscription is closed (ErrClosed). It may be
	// called from several goroutines at once. While the broker is
	// unreachable it keeps waiting and reconnecting.
	Receive(ctx context.Context) (Delivery, error)
	// Close stops receiving. Deliveries handed out and not yet settled can
	// still be settled until the broker's Close; a delivery that never is
	// gets redelivered. A second Close returns nil.
	Close() error
}

// Delivery is one received message and the ways to settle it. Exactly one
// of Ack, Retry or DeadLetter settles it; a second settlement returns
// ErrAlreadyAcked and does nothing. Settling after the connection that
// received the delivery was lost returns an error, and the broker
// redelivers the message: consumers must deduplicate.
//
// A settlement's error is classified by SettleReason into a bounded
// reason (ReasonClosed, ReasonConnection, ReasonExpired, ...); adapters
// wrap the broker errors only they can classify with SettleFault. A
// refusal an adapter works around by itself (it tries again another way
// and the method returns nil) is reported to the SettleObserver of the
// method's ctx with ReportSettleFailure, so it is never silent.
type Delivery interface {
	// Message returns the received message; Attempt is set. The returned
	// value must not be modified.
	Message() *Message
	// Ack removes the message from the queue.
	Ack(ctx context.Context) error
	// Retry schedules the message to come back to this queue only, never to
	// other queues bound to its Type, after delay, with HeaderRetryCount
	// incremented, HeaderLastError set to reason and HeaderFirstFailedAt set
	// on the first retry; the other headers, ID, Type, Key and Body are kept.
	// On brokers without NativeDelay the delay is rounded up to the next
	// declared retry level (the longest when none is long enough).
	Retry(ctx context.Context, delay time.Duration, reason string) error
	// DeadLetter moves the message to this queue's DLQ with its headers plus
	// HeaderLastError (reason) and HeaderDeadAt, and removes it from the
	// queue. It returns nil only once the DLQ copy is durably stored.
	DeadLetter(ctx context.Context, reason string) error
	// Extend tells the broker the handler is still working, so the ack
	// deadline does not expire under it (JetStream InProgress, SQS
	// ChangeMessageVisibility). A no-op on brokers without an ack deadline.
	Extend(ctx context.Context) error
}

// DeadMessage is a message parked in a DLQ.
type DeadMessage struct {
	// Message is the dead message with its headers; Attempt is the number
	// of attempts made.
	Message *Message
	// LastError is HeaderLastError.
	LastError string
	// FirstFailedAt is HeaderFirstFailedAt parsed, zero if missing.
	FirstFailedAt time.Time
	// DeadAt is HeaderDeadAt parsed, zero if missing.
	DeadAt time.Time
}

// DeadLetterQueue is the broker-agnostic view of one queue's DLQ.
type DeadLetterQueue interface {
	// List returns up to limit dead messages, oldest first, without removing
	// them (limit <= 0 means all). Listing does not change what a later
	// List returns, apart from messages added or removed meanwhile.
	List(ctx context.Context, limit int) ([]DeadMessage, error)
	// Replay moves the dead messages with the given IDs (all of them when
	// ids is nil) back to the work queue with HeaderRetryCount removed
	// (which means 0) and HeaderLastError removed, only to this queue. It returns the IDs
	// replayed; an ID not found is not an error (it is missing from the
	// result). A replayed message is stored in the work queue before it is
	// removed from the DLQ.
	Replay(ctx context.Context, ids []string) ([]string, error)
	// Purge deletes the dead messages with the given IDs (all when ids is
	// nil) and returns the IDs deleted.
	Purge(ctx context.Context, ids []string) ([]string, error)
	// Where says where this DLQ is on the broker, in the broker's own
	// terms, so a person finds it with the broker's tools (console,
	// management UI, CLI): the kind of object and its real name, e.g.
	// `RabbitMQ queue "notifications.send.dlq"`, `NATS stream
	// "notifications-dlq", subject "notifications-dlq.notifications_send"`,
	// `Kafka topic "notifications.send.dlq"`, `SQS queue
	// "notifications__notifications-send-dlq"`. One line, no trailing
	// period. Adapters whose names follow from the queue's name alone
	// (RabbitMQ, Kafka) do no I/O; the others look an undeclared queue up
	// as List does and then return List's lookup errors (ErrUnknownQueue
	// wrapped, naming the queue). Returns ErrClosed after the broker's
	// Close.
	Where(ctx context.Context) (string, error)
}

// TruncateReason cuts reason to at most MaxReasonBytes bytes at a UTF-8
// boundary and replaces newlines with spaces, so it fits in a header.
func TruncateReason(reason string) string {
	reason = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(reason, "\uFFFD"))
	if len(reason) <= MaxReasonBytes {
		return reason
	}
	cut := MaxReasonBytes
	for cut > 0 && (reason[cut]&0xC0) == 0x80 {
		cut--
	}
	return reason[:cut]
}

// FormatTime formats t for the time headers: RFC 3339 with nanoseconds, UTC.
func FormatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// ParseTime parses a time header written by FormatTime; zero on error.
func ParseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// HistoryReplayer is implemented by adapters whose Capabilities.Replay is
// true and that can make a queue read its history again (Kafka: reset the
// consumer group's committed offsets to a time). `ferry replay` uses it;
// on a broker without it, the command fails at once naming the Replay
// capability.
type HistoryReplayer interface {
	// ReplaySince makes queue read again every message stored at or after
	// since: its consumers see them once more, with their original IDs (the
	// idempotent consumer absorbs those already handled). It returns how
	// many stored messages the queue will read again. The queue's consumers
	// must be stopped (Kafka: an empty consumer group); otherwise it
	// returns an error saying so and changes nothing. Returns
	// ErrUnknownQueue (wrapped) when the queue exists nowhere.
	ReplaySince(ctx context.Context, queue string, since time.Time) (int64, error)
}
