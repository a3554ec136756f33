// Package nats is ferry's NATS JetStream adapter: it implements
// broker.Broker on github.com/nats-io/nats.go's jetstream package.
//
// # Mapping
//
// An exchange is a stream named after it ('.' becomes '_', '_' becomes
// "-u", '-' becomes "-h", so the mapping is one to one) with interest
// retention and file storage; an event of Type T is published to subject
// <stream>.T. Interest retention keeps a message until every queue whose
// bindings match it has settled it, so two queues bound to the same type
// each get their copy (work-queue retention forbids overlapping consumers).
// A queue is a durable pull consumer with explicit ack whose filter
// subjects are its bindings ('*' stays '*', a trailing '#' becomes both
// the prefix and prefix.>, because '#' also matches zero words) plus the
// queue's own replay subject <stream>-replay.<queue>. A '#' before the last
// word has no NATS equivalent and Declare rejects it with
// broker.ErrUnsupported. Dead letters live in a second stream
// <stream>-dlq (limits retention) on subject <stream>-dlq.<queue>.
//
// # Limits
//
// ferry declares the exchange's stream with interest retention and no
// MaxAge, MaxMsgs or MaxBytes, and Declare resets those on every start
// (CreateOrUpdateStream), so no limit of the stream deletes a message
// that a queue's consumer has not acknowledged (the stream's DiscardOld
// applies only to the stream's own limits; a full account or server
// refuses new publishes, which the relay retries). The consumer is created with
// MaxDeliver -1, but Declare keeps an existing consumer's MaxDeliver: an
// operator's `nats consumer edit --max-deliver N` makes JetStream stop
// delivering a message after N deliveries (every retry's Nak counts),
// leaving it unacknowledged in the stream and in no DLQ. Limits reports
// it, and a worker whose attempts are not below it refuses to start
// (package worker, "Settings that must agree with the broker"); the
// stream's MaxAge, when an operator set one since the last Declare, is
// reported as the retention the retry delays must stay under.
// ferry_queue_messages and ferry_queue_oldest_message_age_seconds show
// the backlog of each queue's consumer.
//
// # Delivery semantics
//
// Delivery is at least once. Publish sends the batch asynchronously and
// returns nil once every PubAck arrived; the stream stores the message on
// disk before it acks. Nats-Msg-Id is the message ID (with its creation
// time, see Publish), so a relay's re-publish within the stream's duplicate
// window (Config.DuplicateWindow, default 2 minutes) is dropped by the
// server; a re-publish later than the window is stored again and the
// worker's deduplication on Message.ID drops it. Because interest retention
// discards a message no consumer is interested in without an error,
// Publish checks the Type against the declared bindings itself and
// reports broker.ErrUnroutable.
//
// Each message is its own publish with its own PubAck, so the outcome is
// per message: a message whose PubAck came is confirmed and never listed
// in the *broker.PublishError, whatever happened to the others, and no
// call is ever refused as a whole. A message the server refuses with a
// JetStream API error (nats-server server/errors.json) about the message
// (status 400: a header expectation that fails, such as a wrong expected
// stream or last sequence, an invalid TTL or schedule header) wraps
// broker.ErrNacked, one over the stream's maximum message size (10054)
// broker.ErrMessageTooLarge. An API error about the server's or the
// stream's state is an outage, not the message's fault: status 5xx or
// 429, JetStream not enabled (10039, 10076), temporarily unavailable
// (10008, 10006), insufficient or exceeded resources (10023, 10047), the
// store failing, which includes a stream full under an operator's
// DiscardNew limit ("maximum messages exceeded", 503, 10077); a full
// stream (a DiscardNew MaxBytes, MaxMsgs or MaxMsgsPerSubject reached) and
// exhausted resources (10023, 10047) wrap broker.ErrBlocked with
// JetStream's description, so the relay reports that it holds its rows
// for lack of room. So are no
// responders (the stream is declared again, see below), a lost
// connection and ctx.
//
// While the connection is down (reconnecting), Publish, DeadLetter and DLQ
// replay wait for it to come back, until their ctx ends, instead of
// handing messages to nats.go's reconnect buffer: that buffer (8 MB) and
// the async PubAck futures would keep a publish the caller gave up on in
// memory and send it after the reconnect, next to the relay's republish.
// A publish written in the instant the connection drops, or to a server
// that stopped answering but whose connection is still open, may still
// be stored when the server reads it (at most once per Publish; the
// duplicate window drops the copy). Acks are still buffered: one sent
// after the reconnect is still valid.
//
// Concurrent Publish calls share the connection and do not wait for each
// other: each call waits only for the PubAcks of its own messages (routed
// to it by the client's ack and error handlers), never for the
// connection's whole backlog. At most 8192 publishes are in flight on the
// connection; past that a call waits for a free slot until its ctx ends.
// The routing decision and subject of a Type are computed once per
// declared exchange.
//
// A subscription pulls only for Receive calls waiting, at most Prefetch
// unsettled deliveries per subscription; the consumer's AckWait is
// SubscribeOptions.AckDeadline, and Delivery.Extend sends InProgress so
// that a long handler keeps its message and no other subscriber handles it
// in parallel. Ack, Retry, DeadLetter and Extend wait for the server's
// confirmation, so an error means the settlement may not have happened.
//
// Retry is a NakWithDelay: the message comes back to the same consumer
// (that queue only) after the delay; no consumer BackOff is configured
// (it would not apply to a Nak anyway), and a zero delay is raised to
// Config.MinRetryDelay. A Nak cannot change headers, so Message.Attempt is
// the consumer's NumDelivered: it also counts redeliveries after an
// expired AckWait or a lost connection (Capabilities.CountsRedeliveries).
// DeadLetter publishes a copy to the DLQ subject, awaits its PubAck and
// then terminates the delivery (+TERM), so the message is neither lost nor
// redelivered. DLQ replay publishes to the queue's replay subject, so only
// that queue gets the copy, and deletes the dead message afterwards.
//
// On the wire, Message.ID, Type and Key travel in the headers Ferry-Id,
// Ferry-Type and Ferry-Key next to the message's own headers (names
// starting with "Nats-" or "Ferry-" are reserved; values must not contain
// CR or LF). NATS trims blanks around header values, so a value with
// leading or trailing blanks travels base64-encoded (Ferry-B64 lists them)
// and arrives unchanged.
//
// A Nak cannot carry headers: HeaderRetryCount on a redelivery is
// NumDelivered-1, and HeaderLastError and HeaderFirstFailedAt are kept in
// the memory of the broker that called Retry (bounded, per queue and
// stream sequence) and set again when that broker receives the message
// back. A redelivery to another process lacks them; the DLQ copy always
// has the reason, because the worker passes it to DeadLetter.
//
// Prefetch is enforced per subscription by the adapter. The consumer's
// MaxAckPending (Config.MaxAckPending, raised to the largest Prefetch
// asked for) bounds the unacknowledged deliveries of the queue across all
// its subscribers, and its AckWait is shared by them too.
//
// Order: a queue's consumer hands out messages in stream order, so with
// one subscriber and no retries they arrive in publish order
// (broker.OrderingQueue); a retried message comes back behind later ones.
//
// The connection reconnects forever (Config.ReconnectWait); pulls resume
// by themselves and the declared topology is declared again after each
// reconnect.
//
// A stream or consumer deleted while the connection stays up (an
// operator's mistake, a server reset without its data) is declared again
// without a reconnect: a publish no stream answered, or a pull ended by
// "409 Consumer Deleted" or no responders, makes the broker check its
// remembered topology and, when a part is missing, declare it again after
// one second (the server finishes deleting a stream's files after the
// delete call returns; a stream created again at once can fail or come
// back half-deleted) and publish the refused messages once more. A consumer
// declared again keeps the AckWait and MaxAckPending of the last
// Subscribe. Messages stored in a deleted stream are gone with it.
//
// # Clusters
//
// Config.URL may list several servers, separated by commas (nats.go also
// learns the others from the one it reaches). On a server that names a
// cluster, streams and consumers get 3 replicas unless Config.Replicas says
// otherwise, and an explicit 1 is logged as a WARN. When the connection
// drops, the PubAcks still awaited fail at once (the server would answer
// them on the lost connection), so Publish returns instead of waiting out
// PublishTimeout, and the relay publishes them again: the stream's duplicate
// window drops a copy it already stored. Tested under load on a 3-server
// cluster by internal/cluster.
//
// A stream and each of its consumers (ConsumerName) are Raft groups of
// their own, whose leaders JetStream places independently. Losing the
// server that leads a stream stops its publishes, and losing the one that
// leads a queue's consumer stops that queue's deliveries, each for one
// election: 4 to 9 s (nats-server's randomized election timeout, its
// server/raft.go). Losing any other server, including the one the
// connection is on, costs a reconnect (measured at 10 ms by
// internal/cluster).
package nats
