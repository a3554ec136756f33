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
//	worker_attempts(consumer TEXT, message_id TEXT, attempts INT,
//	       last_error TEXT, dead BOOLEAN, first_failed_at TIMESTAMPTZ,
//	       updated_at TIMESTAMPTZ, PRIMARY KEY (consumer, message_id))
//
// processed_messages is the deduplication table of package worker, and
// worker_attempts its record of failed attempts (worker.AttemptsTable).
// Event.AppID travels as the header broker.HeaderAppID.
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
// connection, claims the new rows at once (an idle relay publishes a new
// row within about a millisecond plus the broker's confirm).
//
// A transaction that sent a NOTIFY commits under a database-wide lock held
// from pre-commit through its WAL flush, so NOTIFY in every transaction
// serializes the commits of concurrent producers (BenchmarkCreate in
// package bench measured 1,618 events/s with 4 producers against 3,579
// without). Enqueue therefore notifies at most once per notify window
// (SetNotifyWindow, default 2 ms) per process and database, like River's
// notify limiter; the other transactions of that window commit without
// NOTIFY and rely on the relay's claiming pattern:
//
//   - After a wake-up the relay keeps claiming until a claim comes back
//     empty (BatchDelay, 1 ms, between partial batches, so that a load
//     goes out in real batches), then claims once more RecheckDelay
//     (2 ms) later, and only then goes idle.
//   - A wake-up that arrives while a claim loop is active is remembered,
//     and that loop claims once more after it before going idle.
//   - Every PollInterval (500 ms) the relay claims anyway.
//
// A row whose own NOTIFY was suppressed is thus published at once when
// its transaction commits before the relay's last (recheck) claim after
// the notifying transaction's wake-up. That claim starts at least
// RecheckDelay after the notifying transaction committed, and the
// suppressed transaction ran its Enqueue less than the notify window after
// the notifying one did, so a transaction that commits promptly after
// Enqueue (Enqueue as its last statement, say) is found. The row waits for
// the next notification of any producer on the database, or at worst for
// the poll (PollInterval, 500 ms by default), when all of these hold: its
// transaction ran Enqueue within the notify window after another
// transaction of the same process on the same database chose to notify;
// it committed only after the relay's recheck claim (it took longer from
// Enqueue to commit than the notifying transaction did plus
// RecheckDelay, e.g. slow work after Enqueue, a stalled WAL flush, or the
// notifying transaction rolled back instead of committing); and no
// transaction notified on that database after it committed. Under a
// steady load a later transaction notifies within a window; the poll is
// what a lone straggler at the end of a burst can see. SetNotifyWindow(0)
// restores a NOTIFY in every transaction (each committed row then wakes
// the relay itself, at the cost of serialized commits).
//
// # Retention
//
// The relay deletes, in small batches, outbox rows processed longer ago
// than RelayConfig.Retention, and processed_messages and worker_attempts
// rows older than the same age; Prune does one pass on demand. The processed_messages rows are
// the workers' deduplication: a message whose row was deleted runs its
// handler again if a copy is delivered later, so NewRelay refuses a
// positive Retention shorter than MinRetention or than
// RelayConfig.RedeliveryWindow (see MinRetention for the redeliveries it
// covers). Prune itself takes any age.
package outbox
