// Package kafka is ferry's Apache Kafka adapter: it implements
// broker.Broker (and broker.HistoryReplayer) on
// github.com/segmentio/kafka-go v0.4.51.
//
// Kafka is a log, not a queue: there is no per-message ack, no native
// delay, no dead-letter queue, order is kept inside a partition only, and
// one committed offset per partition covers everything before it. This
// package maps ferry's contract onto that as follows.
//
// # Topology
//
// An exchange is one topic, named like the exchange (TopicName), with
// Config.Partitions partitions (default 3) and Config.ReplicationFactor
// (default: the broker's default.replication.factor). The message ID and
// Type travel in record headers (x-ferry-id, x-ferry-type), the Key is the
// record key, hashed to a partition with murmur2 as Java clients do, so
// all messages of one key are in one partition, in publish order.
//
// A queue is a consumer group (GroupID = the queue's name) on the exchange
// topic. Bindings, '*' and '#' included, are matched on the Type by the
// adapter: a record no binding of the queue matches is passed over and
// counts as settled, so the group's offset moves past it. Because nothing
// on the server knows the bindings, Publish checks each Type against the
// bindings of the queues declared by this process and fails the message
// with broker.ErrUnroutable when none matches; every process declares the
// whole topology at start, so this is the topology's view.
//
// Per queue, Declare also creates one retry topic per delay level,
// "<queue>.retry.<i>" (RetryTopicName), and a compacted DLQ topic
// "<queue>.dlq" (DLQTopicName, one partition). An existing topic whose
// partition count, replication factor or cleanup.policy differ is an error
// wrapping broker.ErrTopologyMismatch. A topic deleted while processes run
// is created again on the next publish, retry or fetch that misses it; a
// subscription reads the new log from its start, both when its position is
// past the new log's end and when the new log already reaches it (after
// the partition went missing, the record last read is looked up at its
// offset; another record there means a new log). Records written to the
// old log and not yet read are lost with it.
//
// # Publish
//
// The adapter sends its produce requests itself with kafka.Client.Produce
// (acks=all: every in-sync replica has the record; with
// min.insync.replicas=2 on a 3-broker cluster that is two copies), not
// with kafka.Writer. A Publish assigns each record to a partition
// (murmur2 on the Key) and sends up to 256 records, and at most
// message.max.bytes, of one partition per request, a partition's requests
// one after the other, in order (a request that fails for another reason
// than its records stops its partition), partitions concurrently; it
// returns nil only when the broker acknowledged every record. (The Writer's former BatchSize of 100000 made
// kafka-go allocate a slice of BatchSize records for every batch however
// few it held, 15 MB per partition per Publish: measured in one session
// with bench's EndToEnd/kafka (relay batches of about 8 rows), the
// process's CPU fell from 1.03-1.22 to 0.30-0.42 CPU-s per 1,000 events at
// 256 and end to end rose from 520-920 to 1,190-1,550 events/s; the relay
// alone (RelayThroughput, batches of 500) rose from 18,800 to 54,200
// rows/s.)
//
// A timed-out or cancelled publish is abandoned, not kept. Each produce
// request is bound to the Publish's ctx, so when ctx ends (the relay's
// PublishTimeout during an outage, a shutdown, Close) Publish returns and
// nothing of the batch stays queued in the client or is sent again after
// Publish returned; the memory of the request in flight is freed at ctx's
// deadline (or Config.PublishTimeout) at the latest. (kafka.Writer
// keeps a batch whose WriteMessages returned ctx's error, retries it with
// a timeout of its own and writes it when the broker is back, kafka-go
// issue 1427: during an outage every relay probe added a batch to its
// queue, +7 MB per probe with large rows and no plateau, and every queued
// batch arrived next to the relay's own republish, 18-28 copies per row
// after a 5-minute blackhole.) What no client can take back: a request
// already written to the broker's socket when ctx ended (a broker that
// stopped answering, not one that refuses connections) may still be
// stored when the broker reads it. A row republished after an outage is
// therefore in the topic at most once per failed publish plus once;
// consumers deduplicate on Message.ID. Within one Publish, a request is
// sent again (up to 10 requests, 20 to 500 ms apart, within ctx) only when
// it is known not to be stored: the broker refused it before the append
// with a retriable error (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE,
// NOT_ENOUGH_REPLICAS...) or no connection could be opened; a request that
// timed out or whose connection broke is not. Retry, DeadLetter, the retry
// forwarder and the DLQ's Replay and Purge write the same way.
//
// Messages the adapter refuses itself (too large, malformed,
// unroutable) are entries of a *broker.PublishError whose errors
// broker.IsMessageFault recognises (ErrMessageTooLarge, ErrInvalidMessage,
// ErrUnroutable), and are not written.
//
// Kafka answers each produce request per partition, refusing or
// accepting a partition's whole record batch (Kafka protocol guide,
// "Error Codes" and ProduceResponse). A refusal for what the batch
// carries is the messages' fault: MESSAGE_TOO_LARGE (10, e.g. a record
// over the topic's max.message.bytes) and RECORD_LIST_TOO_LARGE (18) as
// ErrMessageTooLarge; CORRUPT_MESSAGE (2), INVALID_MESSAGE_SIZE (4),
// INVALID_TOPIC_EXCEPTION (17), INVALID_TIMESTAMP (32),
// UNSUPPORTED_FOR_MESSAGE_FORMAT (43), POLICY_VIOLATION (44) and
// INVALID_RECORD (87) as ErrInvalidMessage. Those records are written
// again in halves (broker.SendSplitting) until the record at fault fails
// alone; the others are written. Any other error (NOT_LEADER_OR_FOLLOWER,
// REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS, throttling, authorisation, a
// network error, ctx's deadline) is an outage for the records it covers.
// NOT_ENOUGH_REPLICAS (19), NOT_ENOUGH_REPLICAS_AFTER_APPEND (20) and
// KAFKA_STORAGE_ERROR (56) are the leader having no room for the write:
// they wrap broker.ErrBlocked with Kafka's description, also when ctx's
// deadline passed while the adapter sent the request again, so the relay
// reports why it holds its rows. Since Kafka 3.7 the leader uses
// min(min.insync.replicas, replica count) as the minimum ISR
// (apache/kafka#14594), so a topic with one replica never refuses this way.
// The records of the partitions Kafka accepted are not listed and never
// written again; when one error failed the whole write (the broker is
// down) Publish returns it as a plain error. A Publish never outlives
// its ctx (Config.PublishTimeout, 30 s, when ctx has no deadline).
// Capabilities.MaxMessageBytes is the broker's message.max.bytes less
// 4 KiB kept for the adapter's own headers, so a message that was accepted
// still fits when it is retried or dead-lettered with a reason.
//
// # Consume and commit
//
// Subscribe joins the group with kafka-go's ConsumerGroup (heartbeats every
// second from a goroutine of its own, Config.SessionTimeout 10 s). Each
// assigned partition is read by its own kafka.Reader. Messages of a
// partition are handed out concurrently up to SubscribeOptions.Prefetch;
// the adapter tracks every fetched offset, and the committed offset of a
// partition moves past a message only when it and every earlier message of
// the partition are settled (acked, or written to a retry or DLQ topic).
// A failed message in the middle of a partition is therefore never
// skipped by a later commit: after a crash it is read again, with the
// settled messages after it (consumers deduplicate on Message.ID). Commits
// are asynchronous (coalesced, at most one in flight), so Ack returns at
// once; an ack not yet committed when the process dies is a redelivery. A
// new group starts at the earliest offset of every partition, also of a
// partition that never had a commit.
//
// With SubscribeOptions.Ordered, Receive hands out a message with a Key
// only when no earlier message of that Key is in flight: per-key order
// with concurrent handlers. Without it, the prefetched messages of one key
// may be handled at the same time and finish out of order.
//
// A Retry or DeadLetter whose write fails (the broker is down, ctx ended)
// returns the error and hands the message out again, as a broker
// redelivers after a failed settlement; its offset stays unsettled.
//
// A rebalance (a worker joining or leaving) moves partitions. A kept
// partition continues where it was; a lost one is read again by its new
// owner from the last commit, and settling a delivery of it returns an
// error saying so. Subscription.Close stops handing out and leaves the
// group once the deliveries handed out are settled; Broker.Close leaves at
// once, and the unsettled messages are redelivered.
//
// Delivery.Extend maps to nothing on the wire: kafka-go heartbeats
// independently of handlers and has no max.poll.interval.ms, so a long
// handler never makes its member look dead. Extend reports an error when
// a rebalance took the partition away (the handler's result will be a
// duplicate that the consumer's dedup absorbs).
//
// # Retry without blocking a partition
//
// Retry writes the message to the retry topic of the level (the shortest
// declared delay at least as long as the wanted one, else the longest)
// with x-retry-count+1, x-last-error, x-first-failed-at and its due time,
// then settles it. The subscription's group also reads the queue's retry
// topics: each retry partition has a forwarder goroutine that waits until
// its head is due (a level has one delay, so a partition is due in order)
// and writes it back to the work topic with a header naming the queue, so
// only that queue's group takes it (other groups pass over it). The
// records behind the head that are due too go with it, up to 256 in one
// write (acks=all), so a burst of retries comes back together. A wait
// blocks neither the work partitions nor other retry partitions or levels.
// Retried messages come back after later messages of their key. A retry
// topic is created with retention.ms = max(7 days, 4 × its delay), so a
// retried message outlives its delay and a worker outage.
//
// # DLQ
//
// DeadLetter writes the message to "<queue>.dlq", a compacted topic with
// one partition, keyed by message ID, with the headers, x-last-error,
// x-dead-at and the work topic it came from. A log cannot delete one
// record, so List reads the topic and folds it to the latest record per
// ID; Replay writes the messages back to their work topic for this queue
// only (retry count and last error removed) and, once that is stored,
// writes a tombstone (null value) per ID; Purge writes tombstones. Log
// compaction drops superseded records and, after delete.retention.ms
// (24 h), the tombstones. The DLQ of a queue this process did not declare
// is found by its topic name; its records name the work topic for Replay.
//
// # Replay of history
//
// ReplaySince (`ferry replay --since TIME --queue Q`) resets the group's
// committed offsets on the work topic to the first offset at or after
// TIME (ListOffsets by timestamp, then OffsetCommit). Kafka accepts such a
// commit only for an empty group: stop the queue's workers first.
//
// # Retention
//
// Kafka deletes records by the topic's retention.ms (the broker's
// log.retention.hours, 7 days by default, for the work topics ferry
// creates), read or not: a group that falls that far behind loses the
// records it did not read, and no DLQ sees them. ferry cannot route them
// anywhere, so it warns before: the adapter reports each queue's consumer
// lag (records after the group's committed offsets, on the work topic and
// the queue's retry topics, whose records a stopped worker does not read
// either), the age of the oldest unread record and its topic's
// retention.ms (broker.Backlog), as
// ferry_queue_messages, ferry_queue_oldest_message_age_seconds and
// ferry_queue_retention_seconds; the Prometheus rule FerryQueueNearRetention
// fires when the oldest unread record is past half the retention. No
// setting of the worker must agree with Kafka's (see package worker):
// heartbeats run independently of handlers and kafka-go has no
// max.poll.interval.ms. The adapter's own Config.SessionTimeout (also the
// rebalance timeout) must lie within the broker's
// group.min.session.timeout.ms and group.max.session.timeout.ms, else
// every join would be refused: Subscribe checks it and refuses to start.
//
// # Capabilities
//
// NativeDelay false (retry levels), Ordering OrderingKey, Wildcards true,
// Replay true, CountsRedeliveries false (Attempt counts retries only),
// MaxMessageBytes from the broker.
//
// # Clusters
//
// Config.Brokers lists bootstrap brokers; the client follows partition
// leaders through the cluster's metadata. At New the adapter reads
// default.replication.factor, min.insync.replicas and
// unclean.leader.election.enable from a broker: on 2 or more brokers an
// unclean leader election is refused, and a replication factor below 3 (on
// 3 or more) or min.insync.replicas below 2 is logged as a WARN naming the
// setting. Produce requests are acks=all; one refused with a retriable error
// before the append (NOT_LEADER_OR_FOLLOWER while the leader moves) is sent
// again with fresh records. Tested under load on a 3-broker KRaft cluster by
// internal/cluster.
package kafka
