// Package rabbitmq is ferry's reference broker adapter, for RabbitMQ over
// AMQP 0-9-1 (github.com/rabbitmq/amqp091-go).
//
// # Mapping
//
// A broker.Topology becomes one durable topic exchange and, per queue, a
// durable work queue bound to it with the queue's routing-key patterns
// ('*' and '#' as in AMQP topic exchanges), a durable DLQ named
// Queue.Name+".dlq" and one durable retry queue per retry level named
// Queue.Name+".retry.<i>". A retry queue has the level's delay as its
// x-message-ttl and dead-letters expired messages through the default
// exchange with the work queue's name as routing key
// (x-dead-letter-exchange "", x-dead-letter-routing-key <queue>), so a
// retried message comes back only to the queue it failed in, never to the
// other queues bound to its type. A per-queue TTL is used rather than a
// per-message expiration because RabbitMQ expires messages only at the head
// of a queue (https://www.rabbitmq.com/docs/ttl#per-message-ttl-caveats):
// with one queue per level every message in it has the same delay.
//
// Publish uses publisher confirms on a small pool of channels, persistent
// delivery mode and the mandatory flag: a message no queue is bound to is
// returned by the server (basic.return before its basic.ack) and reported as
// broker.ErrUnroutable for its batch index. A batch is pipelined: every
// message is written, then every confirm awaited. Each message gets its
// own outcome: an acked message is confirmed (never sent again), a
// basic.nack is ErrServerNack (an outage of the queue, not a fault of the
// message: a quorum queue electing a new leader nacks what was in flight),
// and a message whose confirm did not come
// fails with the reason the channel or connection closed.
//
// A channel closed by the server because of a message published on it is
// the messages' fault, not an outage: reply code 406 PRECONDITION_FAILED
// (e.g. "invalid message: unacceptable_type_in_header" for a "CC" or "BCC"
// header that is not an array, which RabbitMQ reads as sender-selected
// destinations, https://www.rabbitmq.com/docs/sender-selected; a message
// over the server's max_message_size), 311 CONTENT_TOO_LARGE or
// 502 SYNTAX_ERROR (AMQP 0-9-1 reference, "Constants"). The close takes
// every unconfirmed message of the channel along without saying which one
// was at fault, so those are published again in halves
// (broker.SendSplitting) until the one at fault fails alone, wrapping
// broker.ErrInvalidMessage, and the others are confirmed. The messages
// published before the refused one were stored although their confirms
// were dropped with the channel, so they arrive more than once (seen: 30
// to 60 extra deliveries for one poison message among 40; consumers
// deduplicate). Every other close is an outage: 320 CONNECTION_FORCED,
// 403 ACCESS_REFUSED, 404 NOT_FOUND (the exchange is declared again, see
// below), 504 CHANNEL_ERROR, 506 RESOURCE_ERROR, 530 NOT_ALLOWED,
// 541 INTERNAL_ERROR, a lost connection, ctx.
//
// The message travels as: AMQP message-id = Message.ID, AMQP type =
// Message.Type (also the routing key of the first publish; retries travel
// through the default exchange, so the type is read back from the property),
// the header "x-ferry-key" = Message.Key, and the other headers as AMQP
// string headers. The attempt number is carried in ferry's own header
// x-retry-count; RabbitMQ's x-death header is never read
// (broker.HeaderRetryCount).
//
// # Connections
//
// The adapter keeps two AMQP connections, one for publishing (and Declare
// and the DLQ operations) and one for consuming, as RabbitMQ recommends so
// that flow control on publishers does not stall consumers
// (https://www.rabbitmq.com/docs/connections#flow-control). amqp091-go does
// not reconnect by itself (its experimental Recovery is left off); the
// adapter redials every Config.ReconnectDelay after a connection loss,
// re-declares the remembered topology and resumes every subscription.
// Deliveries unsettled at the loss are redelivered by RabbitMQ; settling
// them afterwards returns an error. Before the first connection, New
// redials too, every Config.ReconnectDelay for up to Config.ConnectTimeout
// (10 s) when its ctx has no deadline, each dial allowed 5 s to connect
// (its failures are logged at INFO as "rabbitmq: dial failed; retrying",
// the first and every 20th: New's error reports the last one, and its
// caller decides whether to warn), except when the server refuses the
// login or the vhost (403 ACCESS_REFUSED, 530 NOT_ALLOWED): New returns
// that at once, wrapping broker.ErrRefused, and logs no retry (RabbitMQ
// answers a wrong password after a pause: about 3 s on compose/local's).
// After a first connection every failure is redialled, a refusal
// included (a password rotated under a running process), and logged at
// WARN.
//
// A queue deleted while a subscription consumes it, or an exchange or
// queue deleted while the connections stay up (an operator's mistake, a
// broker reset without its data), is declared again without waiting for a
// reconnect: a basic.consume refused with NOT_FOUND, a publish whose
// channel is closed with NOT_FOUND (no exchange), and a message returned
// unroutable although a remembered binding routes it (its queue is gone)
// make the adapter declare its remembered topology again and publish the
// refused messages once more, so a relay does not park them as
// unroutable. Messages that were in a deleted queue are gone with it; a
// message a classic retry level dead-letters to a deleted work queue is
// dropped by RabbitMQ; and a message that still reaches another queue
// bound to its type is not returned, so a deleted queue misses messages
// until it is declared again (at once when a subscription consumes it:
// RabbitMQ cancels the consumer, whose next basic.consume re-declares).
// RabbitMQ does not always send that cancel (seen with quorum queues
// deleted and declared again at once by another client; a passive
// declaration then still counts a consumer), so a subscription that
// received nothing for 5s and holds no unsettled delivery registers a
// fresh consumer on a new channel. With quorum queues the re-declaration
// waits one second: RabbitMQ removes a deleted quorum queue's replicas
// after queue.delete returned, and a queue of the same name declared at
// once lost messages it had confirmed (seen on 3.10).
//
// A memory or disk alarm makes RabbitMQ send connection.blocked to the
// publishing connection and stop reading from it until
// connection.unblocked (RabbitMQ docs, "Blocked Connection
// Notifications", https://www.rabbitmq.com/docs/connection-blocked):
// a publish would wait for its confirms until the alarm clears. The
// adapter watches amqp091's Connection.NotifyBlocked: the publishes in
// flight when the notification comes fail at once, and those that follow
// fail without being sent, with broker.ErrBlocked and the server's
// reason (e.g. "low on memory"), until connection.unblocked; a publish
// whose deadline passed while the connection was blocked wraps it too.
// Both changes are logged once (WARN, INFO). The consuming connection
// does not publish and is not blocked.
//
// When the server closes a consuming channel (for example
// PRECONDITION_FAILED because a delivery stayed unacknowledged longer than
// consumer_timeout), the reason is logged at WARN with what follows: the
// unsettled deliveries of that channel are redelivered, settling them
// fails, and the subscription consumes again on a new channel. Every
// "connection lost" line is followed by a "reconnected" line once the
// connection is back.
//
// # Queue types and broker-side limits
//
// Config.QueueType (ferry's --rabbitmq-queue-type) makes every queue
// classic (the default) or quorum, the work queue, its retry levels and
// its DLQ alike; each is declared with an explicit x-queue-type, so a
// server whose default queue type is another one does not change it, and
// a queue that exists with the other type is refused with
// broker.ErrTopologyMismatch saying how to switch. Quorum queues also
// get:
//
//   - x-delivery-limit QuorumDeliveryLimit (2^31-1) on every queue: a
//     quorum queue counts each return of a delivery and drops (or
//     dead-letters) a message past the limit, 20 by default from RabbitMQ
//     4.0; ferry counts attempts itself and dead-letters with the reason,
//     so the broker must never drop first. Not -1, which means
//     "unlimited" only from RabbitMQ 4.0 on (3.10 accepts it as a plain
//     number); 2^31-1 means the same on every version.
//   - x-dead-letter-strategy at-least-once and x-overflow reject-publish
//     (which at-least-once requires) on the retry levels, so a message
//     whose delay expired leaves the retry queue only once its work queue
//     has it.
//
// ferry sets no x-max-length, x-max-length-bytes, x-expires or message
// TTL on work queues and DLQs, so neither type drops or expires a message
// by itself; the overflow behaviour only matters with a length limit,
// which ferry never sets. Operator policies still apply: a policy with
// max-length, delivery-limit or message-ttl on ferry's queues makes
// RabbitMQ drop messages ferry meant to retry (where a policy and an
// argument both set a limit, RabbitMQ applies the lower).
//
// # What RabbitMQ drops goes to the DLQ
//
// Each work queue is declared with x-dead-letter-exchange "" and
// x-dead-letter-routing-key "<queue>.dlq": a message RabbitMQ drops by
// itself (a policy's max-length or max-length-bytes with the default
// drop-head overflow, message-ttl, a quorum queue's delivery-limit) is
// dead-lettered straight to the queue's DLQ instead of vanishing.
// DeadLetterQueue.List (`ferry dlq list`) shows such a message with
// RabbitMQ's reason from its x-death header as LastError, e.g.
// `rabbitmq: dropped by the broker from queue "q", x-death reason
// "maxlen": ...` (reasons maxlen, expired, delivery_limit, rejected), and
// DeadAt the x-death time; Replay sends it back without the x-death
// headers. Classic queues and quorum queues without
// x-dead-letter-strategy dead-letter at most once
// (https://www.rabbitmq.com/docs/dlx#safety). What a DLQ itself drops
// under a policy is gone: keep length limits and TTLs off the .dlq queues.
//
// Upgrades: a queue's arguments cannot change in place, and declaring a
// queue with arguments it lacks fails with PRECONDITION_FAILED. So a work
// queue that an older ferry declared without a dead-letter exchange is
// kept as it is: Declare declares it again without one and logs a
// warning with the policy that adds it (PolicyDLX:
// `rabbitmqctl set_policy --apply-to queues ferry-dlx-<queue> '^<queue>$'
// '{"dead-letter-exchange":"","dead-letter-routing-key":"<queue>.dlq"}'`).
// RabbitMQ applies one policy per queue (the highest priority), so an
// operator's own policy on the queue must carry these two keys too; on
// queues ferry declared with the arguments, the arguments win over any
// policy. To get the arguments instead, drain and delete the work queue;
// the next Declare creates it with them. While processes of both versions
// run, an older one declaring a queue a newer one created with the
// arguments fails with PRECONDITION_FAILED naming x-dead-letter-exchange,
// so upgrade the processes before creating new queues, and do not
// downgrade past this version without deleting the queues.
//
// Config.ConsumerTimeout says what the server's consumer_timeout is (AMQP
// cannot read it; 30 minutes by default); Limits reports it, and a worker
// whose HandlerTimeout is not shorter refuses to start. With
// Config.ManagementURL, Limits also reads the queue's effective
// delivery-limit (a policy's, applied over ferry's x-delivery-limit) from
// the management API, and a worker whose attempts are not below it
// refuses to start.
// Classic queues have no delivery limit. Message TTL and at-least-once
// dead-lettering of quorum queues need RabbitMQ 3.10 or later.
//
// Capabilities: no native delay (retry levels), ordering within a queue,
// wildcard bindings, messages up to Config.MaxMessageBytes (RabbitMQ's
// max_message_size, 128 MiB by default since 3.8), no replay of consumed
// messages, redeliveries not counted as attempts.
//
// # Clusters
//
// Config.URL may list the nodes of one cluster, separated by commas. Each
// of the two connections dials them in turn and, after a loss, starts with
// the node after the one it lost; the topology is declared again on the new
// node. With several URLs the queues default to quorum queues with
// x-quorum-initial-group-size = the URL count (up to 5, Config.QuorumReplicas);
// QuorumReplicas 1 is refused and classic queues or 2 replicas are logged as
// a WARN (see Config.QuorumReplicas). A quorum queue whose leader dies
// nacks what was in flight to it; that nack is ErrServerNack, an outage the
// relay waits out without charging the rows an attempt. Tested under load
// on a 3-node cluster (kill -9 of the queue leader and of another node,
// SIGSTOP of the leader beyond net_ticktime, a rolling restart) by
// internal/cluster.
package rabbitmq
