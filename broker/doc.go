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
// broker (unreachable, closed, a deadline passed) and says nothing about
// the message. The outbox relay parks the first kind with a per-message
// backoff and waits out the second as one outage.
//
// A retried message comes back only to the queue it failed in. After the
// last attempt the worker moves it to the queue's DLQ (DLQName) with the
// reason in HeaderLastError; DeadLetterQueue lists, replays and purges it
// the same way on every broker, and its Where names the broker's own
// object that holds it (an SQS queue's real name differs from DLQName).
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
// Package brokertest is the conformance suite every adapter runs.
package broker
