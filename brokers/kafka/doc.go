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
// One kafka.Writer with RequiredAcks: RequireAll (acks=all: every in-sync
// replica has the record; with min.insync.replicas=2 on a 3-broker cluster
// that is two copies), never Async, BatchTimeout 1 ms, BatchSize 256. A
// Publish writes the whole batch with one WriteMessages and returns nil
// only when the broker acknowledged every record; the writer sends up to
// 256 records of one partition per produce request and a partition's
// requests one after the other, in order. BatchSize was 100000, but
// kafka-go allocates a slice of BatchSize records for every batch however
// few it holds (15 MB per partition per Publish): measured in one session
// with bench's EndToEnd/kafka (relay batches of about 8 rows), the
// process's CPU fell from 1.03-1.22 to 0.30-0.42 CPU-s per 1,000 events
// and end to end rose from 520-920 to 1,190-1,550 events/s; the relay
// alone (RelayThroughput, batches of 500) rose from 18,800 to 54,200
// rows/s. Messages the adapter refuses itself (too
// large, malformed, unroutable) and records the broker refuses one by one
// (MESSAGE_TOO_LARGE, INVALID_RECORD) are entries of a
// *broker.PublishError whose errors broker.IsMessageFault recognises
// (ErrMessageTooLarge, ErrInvalidMessage, ErrUnroutable); any other failure (a broker outage, ctx's
// deadline) is a plain error for the whole batch. A Publish never outlives
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
package kafka
