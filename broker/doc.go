// Package broker is the contract between ferry and a message broker, and
// the types every adapter shares.
//
// An adapter (brokers/rabbitmq, brokers/nats, ...) implements Broker by
// mapping it to its broker's native mechanism and nothing more; the
// framework (package outbox's relay and package worker) owns what must
// behave the same on every broker: retry policy and attempt counting,
// deduplication, validation, metrics and tracing.
//
// # Delivery semantics
//
// Delivery is at least once. Publish returns nil only after the broker
// durably confirmed every message; a message is then delivered to every
// queue whose bindings match its Type until one of its deliveries there is
// settled. A message can arrive more than once: after a consumer crashed or
// lost its connection before Ack, after an ack deadline expired, or because
// the relay published it again when a confirm was lost. A duplicate carries
// the same Message.ID, so an idempotent consumer (package worker) drops it.
//
// Order is kept only as far as Capabilities.Ordering says, and never across
// retries: a retried message comes back after its delay, behind messages
// published later. SubscribeOptions.Ordered asks a subscription to hand
// out one key's messages one at a time, in the broker's order; adapters
// whose broker delivers in queue or stream order implement it with
// OrderedSubscription.
//
// A Publish fails per message (a *PublishError) or as a whole. A failure
// of the message itself (ErrInvalidMessage, ErrMessageTooLarge,
// ErrUnroutable, ErrNacked; IsMessageFault) fails the same way when the
// message is published again unchanged; anything else is a failure of the
// broker (unreachable, closed, a deadline passed, a server error,
// throttling, credentials) and says nothing about the message. The outbox
// relay parks the first kind with a per-message backoff and waits out the
// second as one outage. A broker that is up but has no room (a
// RabbitMQ memory or disk alarm, a Kafka partition short of in-sync
// replicas, a full JetStream stream) is the second kind too, told apart
// by ErrBlocked with the broker's reason (BlockedReason), so that the
// relay can say why it holds its rows. A call to the broker that carried several
// messages and was refused as a whole because of them is neither: the
// adapter finds the message(s) at fault by sending the others apart
// (SendSplitting, RefusedCallError), so one bad message never holds back
// the good ones. A Publish that made several calls reports per message
// which were accepted (PublishResult), and those are never sent again.
//
// A retried message comes back only to the queue it failed in. After the
// last attempt the worker moves it to the queue's DLQ (DLQName) with the
// reason in HeaderLastError; DeadLetterQueue lists, replays and purges it
// the same way on every broker, and its Where names the broker's own
// object that holds it (an SQS queue's real name differs from DLQName).
//
// A settlement (Ack, Retry, DeadLetter, Extend) that fails returns an
// error that SettleReason classifies into a short, bounded reason
// (ReasonConnection, ReasonExpired, ReasonNotFound, ...; an adapter wraps
// what only it can classify with SettleFault). A refusal the adapter
// works around by itself, so that the method returns nil, is reported to
// the SettleObserver of the method's ctx (ReportSettleFailure); package
// worker logs and counts both kinds.
//
// An adapter's New fails in one of two ways. What waiting cannot cure is
// permanent (IsPermanent): a Config it refuses before any network access
// (ErrInvalidConfig, a *ConfigError naming the field: a malformed URL, an
// unknown scheme, an address without a port) or a server that refused the
// login (ErrRefused, with the server's words). Anything else (connection
// refused, a timeout, a DNS failure) can pass, and a caller that waits for
// its broker retries it.
//
// # What the broker does on its own
//
// A broker may give up on a message by itself: after a number of
// deliveries (SQS redrive, JetStream MaxDeliver, a RabbitMQ
// delivery-limit), past a length or age limit (RabbitMQ policies, Kafka
// retention, SQS retention). Adapters whose broker has such limits that a
// worker's settings must agree with implement LimitReporter, and package
// worker refuses to start against them; a message RabbitMQ drops still
// reaches the queue's DLQ (its dead-letter exchange), listed with the
// broker's reason; where no DLQ can catch it (Kafka, JetStream, SQS
// retention), the adapter implements BacklogReporter, so an alert fires
// while the oldest unread message is still well within the retention.
//
// Package brokertest is the conformance suite every adapter runs
// (RunConformance), with RunConnectErrors for New's errors.
package broker
