// Package outbox is ferry's transactional outbox: the application stores
// events in the outbox table inside its own PostgreSQL transaction
// (Enqueue), and a relay (Relay) publishes the committed rows to a broker
// and marks them processed.
//
// # Schema
//
// Migrate creates, through goose migrations embedded in the binary
// (version table ferry_outbox_migrations):
//
//	outbox(id BIGSERIAL PRIMARY KEY, event_type TEXT, partition_key TEXT,
//	       payload BYTEA, headers JSONB, occurred_at TIMESTAMPTZ,
//	       processed_at TIMESTAMPTZ, attempts INT, last_error TEXT,
//	       next_attempt_at TIMESTAMPTZ)
//	outbox_unprocessed_idx ON outbox(id) WHERE processed_at IS NULL
//	processed_messages(consumer TEXT, message_id TEXT, processed_at TIMESTAMPTZ,
//	       PRIMARY KEY (consumer, message_id))
//
// processed_messages is the deduplication table of package worker.
//
// # Delivery semantics
//
// An event is published if and only if the transaction that enqueued it
// commits, at least once. The relay claims a batch of unprocessed rows in
// id order with SELECT ... FOR UPDATE SKIP LOCKED, publishes it, waits for
// the broker's confirms (broker.Broker.Publish) and, in the same
// transaction, sets processed_at on the confirmed rows only. So:
//
//   - A message is marked processed only after the broker durably
//     confirmed it.
//   - A relay that crashes, or loses its database connection, between
//     publishing and committing the mark leaves the rows unprocessed; they
//     are published again, under the same broker.Message.ID (the row id),
//     by the next relay. A lost confirm has the same effect. Consumers
//     therefore deduplicate on Message.ID (package worker does, with
//     processed_messages).
//   - Several relays (replicas, or the concurrent claim loops of one relay)
//     claim disjoint batches thanks to SKIP LOCKED, so in normal operation
//     no row is published twice.
//   - A row that fails to publish for a reason of its own (unroutable,
//     too large, nacked) gets attempts+1 and last_error and is retried
//     after an exponential backoff (next_attempt_at), forever; it never
//     blocks the rows behind it. Such "parked" rows are listed by ReadStats.
//     When the broker as a whole is unreachable (or a publish times out)
//     the rows also get attempts+1 and last_error, but no per-row backoff:
//     the relay pauses (100 ms doubling up to RelayConfig.MaxBackoff),
//     logs once per outage, and retries the batch.
//   - Rows are claimed by id, not by a high-water mark, so a row whose id
//     is lower than an already published one (its transaction committed
//     later) is still found.
//   - Order: rows are published in id order within a batch, but concurrent
//     claim loops, several relays and retried rows mean the broker may
//     receive them out of order; ordering guarantees are only those of
//     broker.Capabilities.Ordering on top of that.
//
// # Messages
//
// The relay publishes each row as a broker.Message with ID = the row id in
// decimal, Type = event_type (the routing key), Key = partition_key, Body =
// payload, and Headers = the row's headers (e.g. broker.HeaderTraceparent)
// plus broker.HeaderCreatedAt = occurred_at. occurred_at defaults to now()
// of the enqueuing transaction, i.e. its start, which precedes its commit
// by the transaction's duration.
//
// # Latency
//
// Enqueue sends NOTIFY ferry_outbox in the caller's transaction; PostgreSQL
// delivers it on commit, and the relay, which LISTENs on a dedicated
// connection, claims the new rows at once. It also polls
// (RelayConfig.PollInterval) in case a notification is lost, and keeps
// claiming without waiting while batches come back full.
//
// # Retention
//
// The relay deletes, in small batches, outbox rows processed longer ago
// than RelayConfig.Retention and processed_messages rows older than the
// same age; Prune does one pass on demand.
package outbox
