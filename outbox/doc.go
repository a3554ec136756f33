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
//	       next_attempt_at TIMESTAMPTZ, destination TEXT DEFAULT 'default')
//	outbox_unprocessed_dest_idx ON outbox(destination, id) WHERE processed_at IS NULL
//	outbox_ready_dest_idx ON outbox(destination, id)
//	       WHERE processed_at IS NULL AND next_attempt_at IS NULL
//	outbox_waiting_dest_idx ON outbox(destination, next_attempt_at)
//	       WHERE processed_at IS NULL AND next_attempt_at IS NOT NULL
//	outbox_unprocessed_dest_key_idx ON outbox(destination, partition_key, id)
//	       WHERE processed_at IS NULL
//	outbox_unique(unique_key TEXT PRIMARY KEY, event_id BIGINT,
//	       expires_at TIMESTAMPTZ)
//	processed_messages(consumer TEXT, message_id TEXT, processed_at TIMESTAMPTZ,
//	       PRIMARY KEY (consumer, message_id))
//	worker_attempts(consumer TEXT, message_id TEXT, attempts INT,
//	       last_error TEXT, dead BOOLEAN, first_failed_at TIMESTAMPTZ,
//	       updated_at TIMESTAMPTZ, snoozes INT,
//	       PRIMARY KEY (consumer, message_id))
//	ferry_periodic(name TEXT PRIMARY KEY, last_tick TIMESTAMPTZ,
//	       updated_at TIMESTAMPTZ)
//	outbox_cancelled(id BIGINT PRIMARY KEY, the outbox row's columns
//	       but processed_at, cancelled_at TIMESTAMPTZ)
//	worker_dead(consumer TEXT, message_id TEXT, attempts INT,
//	       last_error TEXT, dead_at TIMESTAMPTZ,
//	       PRIMARY KEY (consumer, message_id))
//	outbox_held(id BIGINT PRIMARY KEY, the outbox row's columns but
//	       processed_at, attempts, last_error)
//	outbox_workflows(id BIGSERIAL PRIMARY KEY, name TEXT, created_at TIMESTAMPTZ)
//	outbox_workflow_jobs(id BIGINT PRIMARY KEY, workflow_id BIGINT, name TEXT,
//	       consumer TEXT, on_dep_failure TEXT, waiting INT, outcome TEXT,
//	       settled_by TEXT, settled_at TIMESTAMPTZ, released_at TIMESTAMPTZ)
//	outbox_workflow_edges(dep BIGINT, job BIGINT, PRIMARY KEY (dep, job))
//	worker_flow_slots(limit_name TEXT, key TEXT, slot INT, holder TEXT,
//	       acquired_at TIMESTAMPTZ, expires_at TIMESTAMPTZ,
//	       PRIMARY KEY (limit_name, key, slot))
//	worker_flow_rates(limit_name TEXT, key TEXT, tat TIMESTAMPTZ,
//	       PRIMARY KEY (limit_name, key))
//
// processed_messages is the deduplication table of package worker, and
// worker_attempts its record of failed attempts (worker.AttemptsTable).
// ferry_periodic holds the latest tick each periodic job enqueued
// (package ferry, "Periodic jobs"). outbox_cancelled holds the jobs
// JobCancel took out of the outbox, and worker_dead the messages a worker
// dead-lettered (worker.DeadTable); see "Jobs". worker_attempts.snoozes,
// worker_flow_slots and worker_flow_rates are the workers' flow control
// (worker.Snooze, worker.SlotsTable, worker.RatesTable).
// Event.AppID travels as the header broker.HeaderAppID.
//
// # Jobs
//
// JobGet (by message ID, the row id), JobGetByAppID and JobList read what
// ferry records about a job, with no lock: the outbox row (or the
// cancelled one) and, per consumer, worker_attempts (failed attempts, the
// last error; deleted once the message is handled or dead-lettered),
// processed_messages (handled) and worker_dead (dead-lettered). The state
// (JobState) is held (a workflow job, see "Workflows"), scheduled, pending, published, retrying, handled, dead or
// cancelled; Job.History lists the records in order. The per-consumer
// tables are read by a skip scan over their consumers on the primary key;
// the lookup by app id and the lists of worker-decided states read the
// outbox table.
//
// JobCancel moves a row not yet published from the outbox to
// outbox_cancelled in one statement whose SELECT ... FOR UPDATE SKIP
// LOCKED takes the row lock the relay's claim takes: a row a relay holds
// in a batch is skipped and the cancel refused with ErrTooLate (get it
// again; if its publication failed it is pending again), a published row
// is refused with ErrTooLate saying when it was published, and a relay
// that claims after the cancel cannot see the row. So a cancelled job is
// never published, and the claim, its indexes and its cost are those of
// before migration 8. The event's unique key (Event.UniqueKey) is freed.
// Retention (Prune) deletes the cancelled rows and the worker_dead
// records after RelayConfig.Retention.
// BenchmarkJobGetAndCancel, on 100,000 published rows handled by three
// consumers and 10,000 pending rows (PostgreSQL on a loaded 2-core
// machine, 2000 iterations): about 1.0 ms per JobGet (four statements)
// and 1.5 ms per JobCancel.
//
// # Workflows
//
// EnqueueWorkflow stores a Workflow, jobs with dependencies
// (WorkflowJob.After), in the caller's transaction, after refusing a
// cycle (ErrWorkflowCycle) or an edge out of the workflow
// (ErrInvalidWorkflow) with nothing written. The jobs without
// dependencies go into the outbox; the others into outbox_held, which no
// relay reads: the polling relay's claim and the WAL relay's stream see a
// held job only once it is moved into the outbox, so their statements,
// indexes and cost are unchanged. Each job has a row in
// outbox_workflow_jobs counting its unsettled dependencies.
//
// A job settles, for its dependents, in the transaction that records it,
// through triggers of migration 13: completed when a worker's dedup row
// (processed_messages) commits (a deferred trigger, run at the commit of
// the handler's transaction; a dedup row the batch worker deleted again
// does not count), failed when a worker dead-letters it (worker_dead),
// cancelled when it enters outbox_cancelled (JobCancel, or a cascade).
// WorkflowJob.Consumer names the consumer whose record counts; empty, the
// first consumer's. Settling decrements each dependent (one primary-key
// UPDATE each, in id order, so concurrent settlements do not deadlock);
// the transaction that brings a dependent to zero moves it from
// outbox_held into the outbox and sends NOTIFY ferry_outbox. A failed or
// cancelled dependency cancels a dependent (moved to outbox_cancelled,
// Job.CancelReason says which dependency, and so on down the graph)
// unless it has ReleaseOnFailure, which counts it as settled. So a job is
// published after, and only after, every dependency's record committed,
// and a kill -9 anywhere leaves the record and the release both or
// neither; the relay publishes it once as any row (at-least-once, the
// dedup row makes the handling once).
//
// A released job keeps its id, lower than those enqueued after it: the
// order of its Key ("Order") holds among the rows in the outbox from its
// release on, and a row of the key published while it was held went
// first.
//
// The workers must record in this database (their Pool is the outbox's):
// a worker on another database settles nothing, and the dependents stay
// held. A record that arrives after the job settled (a second consumer, a
// DLQ replay handled after the dead-letter) changes nothing.
//
// JobGet says JobHeld for a held job and names its workflow
// (Job.WorkflowID); WorkflowGet reads the whole workflow, WorkflowList the
// newest. Retention (Prune) deletes a workflow's rows once it is older
// than RelayConfig.Retention and none of its jobs is held.
//
// Cost: EnqueueWorkflow is two round trips, six statements whatever the
// number of jobs (rows: one per job in the outbox or outbox_held, one in
// outbox_workflow_jobs, one per edge). Every dedup row pays the deferred
// trigger, workflow or not: in one bulk transaction of 50,000 rows it
// cost about 6 µs a row (313 ms at COMMIT against 4 ms with it
// disabled); pgbench, one dedup INSERT per transaction with
// synchronous_commit off, 0.155 to 0.193 ms against 0.117 to 0.157 ms
// (with synchronous commit on, the difference was below the noise).
// Settling a workflow job adds one UPDATE per dependent and, for a
// released one, a DELETE and an INSERT (about 55 to 70 µs per completion
// into a job with 5,000 dependencies, measured in psql). BenchmarkWorkflow
// (100 jobs, 196 edges, synchronous_commit off, loaded 2-core machine):
// enqueue 30 µs per job against 15 to 36 for outbox.Enqueue of the same
// events; enqueue and completion of every job 740 to 940 µs per job
// against 330 to 460.
//
// # Destinations
//
// Every row names its destination (Event.Destination, "default" when the
// event names none, DefaultDestination): the outbox it belongs to, e.g.
// the service that enqueued it or the exchange its relay publishes to. A
// relay claims only the rows of its RelayConfig.Destination, so several
// services, or one service with several topologies, share a database
// without one relay publishing another's events to its own exchange
// (where nothing may be bound for them, so that it parks them as
// unroutable): a relay never reads, locks, publishes or parks another
// destination's row. The rule is one destination per topology: the
// relays of one destination must all publish to the same broker and
// exchange, as the relays of a database did before destinations. Rows
// enqueued before migration 5 (which added the column), and by code that
// names no destination, are "default" rows, published by the relays
// without a Destination.
//
// The claim's indexes lead with destination, so a claim reads only its
// destination's rows and costs what it cost on a database holding only
// those (TestClaimReadsOnlyItsDestination checks the plan). BenchmarkClaim
// alternates claims of 100 rows of 10,000 due on a database holding only
// them and on one with 50,000 rows of another destination interleaved:
// the shared one took 1.01 to 1.05 times as long (five runs, on a loaded
// 2-core machine). The statement itself ran in 0.52 ms (median of 20,
// EXPLAIN ANALYZE) on the 10,000 rows, against 0.57 ms for the claim
// before destinations on the same rows. Order (below) holds per
// destination; the relays of every destination wake on the one NOTIFY
// channel, so a relay may claim (and find nothing) after another
// destination's commit. ReadStats splits the backlog by destination
// (Stats.Destinations) and names the destination of each parked row.
//
// # Unique events
//
// An Event with a UniqueKey and a UniqueFor window is stored only when no
// event of that key is inside its window: Enqueue upserts the key's row of
// outbox_unique (INSERT ... ON CONFLICT (unique_key) DO UPDATE) with the
// new event's id and the window's end (the transaction's now() plus
// UniqueFor), in the caller's transaction, and inserts the outbox row
// only when the key was new or its window had ended. Otherwise nothing is
// inserted and Enqueue returns the id of the key's event. Concurrent
// transactions are safe without any read-then-write: the second INSERT of
// a key waits on the primary key for the first transaction to end, then
// finds its committed row (and returns its id), or, when the first rolled
// back, no row (and stores its own event). Under REPEATABLE READ or
// SERIALIZABLE the waiting transaction fails instead with a serialization
// error (SQLSTATE 40001), to be retried as any such transaction. The window
// is measured by the database clock from the start of the first event's
// transaction; the key is database-wide (across event types and
// destinations); an event dropped or published does not end its window.
// The relay's retention deletes the keys whose window has ended.
// BenchmarkEnqueue alternates transactions of one Enqueue without a key,
// with a new key and with a duplicate: a new key took 1.02 times as long
// as no key (median of five runs, 0.99 to 1.23) and a duplicate 0.96
// (0.88 to 1.18), the commit dominating both. A duplicate updates the
// key's row, so the duplicates of one key serialize on it until their
// transactions end.
//
// # Delivery semantics
//
// An event is published if and only if the transaction that enqueued it
// commits, at least once. The relay claims a batch of unprocessed rows in
// id order with SELECT ... FOR UPDATE SKIP LOCKED, publishes it, waits for
// the broker's confirms (broker.Broker.Publish) and, in the same
// transaction, sets processed_at on the confirmed rows only, to the time
// Publish returned (the batch's last confirm; the transaction's start plus
// the time the relay measured from its claim). So:
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
//   - A row that fails to publish for a reason of its own
//     (broker.IsMessageFault: refused by the adapter or the broker for its
//     names, lengths, characters or encoding, unroutable, too large,
//     nacked) gets attempts+1 and last_error and is retried after an
//     exponential backoff (next_attempt_at: RelayConfig.RetryBackoff
//     doubling up to MaxRetryBackoff), forever; the other rows of its
//     batch are published and the relay does not slow down. Such "parked"
//     rows (attempts > 0) are listed by ReadStats, counted by the gauge
//     ferry_outbox_parked_rows, and can be made due at once (RetryParked,
//     `ferry outbox retry`) or deleted (DropParked, `ferry outbox drop`).
//     Enqueue refuses first, with ErrInvalidEvent, what no ferry broker can
//     carry (see Event). A row whose message made the broker refuse a
//     whole call (an SQS HTTP 400 for a SendMessageBatch, a Kafka record
//     batch refused as MESSAGE_TOO_LARGE, a RabbitMQ channel closed with
//     PRECONDITION_FAILED) is parked the same way: the adapter sends the
//     call's messages apart to find it (broker.SendSplitting), and the
//     other rows of the batch are published in that same batch.
//   - The rows the broker confirmed are marked published even when others
//     of their batch failed (a *broker.PublishError lists only the
//     unconfirmed ones: an SQS batch of 25 rows is three calls, of which
//     one may fail), also when the broker was closed meanwhile, so they
//     are never published again.
//   - When the broker as a whole fails (unreachable, connection lost, a
//     server error or throttling, a publish that times out after
//     RelayConfig.PublishTimeout) the rows get
//     no attempt and no backoff of their own: they keep attempts and their
//     place, and last_error says "broker unavailable (<broker name>): ..."
//     (a parked row keeps the reason of its own failure), and ReadStats
//     does not list them as parked. The relay logs the outage
//     once and pauses as a whole, all claim loops together: 100 ms doubling
//     up to RelayConfig.MaxBackoff, and after each pause one claim loop
//     tries one batch (the probe); the first batch that reaches the broker
//     ends the outage ("publishing again"). An outage of any length thus
//     adds 0 attempts, and costs one failed batch per pause (about 6 in the
//     first 3 s, then one per MaxBackoff, plus the batches in flight when
//     it began). A database outage is waited out the same way. A failed
//     probe's publish is abandoned by the adapter, not kept: no adapter
//     queues it to send again later (the Kafka adapter does not use
//     kafka-go's Writer, which did; the NATS adapter does not publish into
//     nats.go's reconnect buffer), so memory does not grow with the
//     outage, and once the broker is back a row is in it at most once per
//     failed probe plus once (a broker that stopped answering may still
//     store a request it had already received; on SQS the SDK's own
//     retries of a call that failed after reaching the server may add one
//     per retry; consumers deduplicate).
//   - Marking a row processed clears its last_error (NULL), whether an
//     outage or a failure of its own wrote it: last_error is the reason a
//     row is not sent yet, never history, so a sent row never reads as
//     failing. attempts keeps the number of failed publications of its
//     own.
//   - Rows are claimed by id, not by a high-water mark, so a row whose id
//     is lower than an already published one (its transaction committed
//     later) is still found.
//   - Order: see below.
//
// # Order
//
// The rows of one partition key (Event.Key, broker.Message.Key) are
// published in id order, across the concurrent claim loops of a relay and
// across several relays: a claim takes, with each keyed row, a
// transaction-level advisory lock on the key's slot (one of 1024, by hash
// of the key), so one claimer at a time publishes a key's rows, in id
// order within its batch, and commits before the next claimer can take
// them; a batch that got a key's later rows but not an earlier due one
// (the slot was freed during its claim) leaves them to the next batch.
// Different keys (and rows without a key, which are not ordered) are
// spread over the loops and relays. Rows of one key enqueued by
// concurrent transactions go out in the order the relay sees them commit,
// which can differ from id order: enqueue one key's events from one
// transaction at a time for id order.
//
// A parked row (a failure of its own, next_attempt_at in the future) and a
// row not yet due are not claimable, and they do not hold back the rows
// behind them of the same key: those are published, and the parked row
// follows when it is due (or retried by an operator), after them. So order
// holds up to retries, like broker.SubscribeOptions.Ordered on the
// consumer side. Rows that failed because the broker failed are not
// parked and keep their place. On the consumer side, RabbitMQ and NATS
// keep publish order within a queue; a worker handles one key's messages
// one after the other, in that order, with worker.Config.Ordered.
//
// # Messages
//
// The relay publishes each row as a broker.Message with ID = the row id in
// decimal, Type = event_type (the routing key), Key = partition_key, Body =
// payload, and Headers = the row's headers (e.g. broker.HeaderTraceparent)
// plus broker.HeaderCreatedAt = occurred_at. occurred_at defaults to now()
// of the enqueuing transaction, i.e. its start, which precedes its commit
// by the transaction's duration; for a scheduled event it is its due time
// when that is later.
//
// # Scheduled events
//
// An Event with a DueAt is stored with next_attempt_at = DueAt, the column
// that also holds back a row whose publication failed, so the relay's
// claim skips it until the database clock reaches DueAt; the relay's next
// poll (RelayConfig.PollInterval, 500 ms by default) then publishes it.
// It is a committed row like any other: it survives restarts, any relay
// of its destination publishes it, and while it waits it holds nothing on
// the broker. The
// partial indexes outbox_ready_dest_idx (rows without next_attempt_at)
// and outbox_waiting_dest_idx (rows with one) let the claim find the
// lowest due row without reading the waiting ones (measured on
// PostgreSQL 15 with 100,000 waiting rows and 10 due, before migration 5:
// 12 ms per claim without such indexes, a sequential scan, and 0.1 ms
// with them). The claim then walks its destination's rows in id order from
// that row, so it reads none of the waiting rows below it (with 100,000
// waiting rows below 10 due ones: 0.25 ms per claim, against 12 ms for
// the claim before migration 5, which walked them), and passes over the
// waiting rows among the due ones. Stats counts rows not
// yet due as Scheduled, outside the backlog. A per-key order (Key) holds
// among the rows that are due: a row waiting for its DueAt does not hold
// back the later rows of its key.
//
// # Latency
//
// Enqueue sends NOTIFY ferry_outbox in the caller's transaction (unless
// all its events are scheduled for later, see "Scheduled events"); PostgreSQL
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
// # WAL relay
//
// With RelayConfig.Mode RelayModeWAL ("wal"; `ferry relay --relay-mode=wal`)
// the relay reads the outbox rows' inserts from PostgreSQL's WAL by
// logical replication instead of claiming them: github.com/jackc/pglogrepl
// with the built-in pgoutput plugin (no server extension), a publication
// of the outbox table with a row filter (its destination, next_attempt_at
// and processed_at NULL; PostgreSQL 15 or later) and a replication slot
// (RelayConfig.Slot, "ferry_<destination>"), both created at the first
// start and recorded in outbox_wal_slots (migration 9). Enqueue is
// unchanged: the event is an outbox row as in poll mode, so the API, the
// message IDs (the row id), the headers and the transaction semantics are
// the same.
//
// What it does per batch: the stream delivers committed transactions in
// commit order (a large one in chunks of BatchSize events, published while
// the rest is read: pgoutput sends a transaction only once it committed);
// the relay cuts them into batches of up to Concurrency×BatchSize events
// and splits each batch into one part per publishing lane by partition
// key (a hash of the key; events without a key go to the least loaded
// lane). Each lane publishes its parts in batch order, in Publish calls of
// up to BatchSize, through the same code as the polling relay (publish,
// classify the broker's answer, park a message fault, record an outage,
// OnBatch, logs), and the lanes publish at once; up to 4 batches are in
// flight. A settler takes the batches in order: once every lane has
// published its part of a batch, it gathers the batch's confirmed rows,
// for at most SettleInterval (50 ms) or 8,192 rows, then deletes them all
// in one statement and commits, and only then moves the slot's confirmed
// position past the transactions wholly settled, reported to the server
// every StatusInterval (1 s). A batch with a refused event or an outage
// is settled at once, with everything gathered before it; a relay that
// stops settles what it gathered before it returns. At low rates, where a
// batch holds a few events, this is one commit per interval instead of
// one per batch (the DELETE was 0.34 commits per event at 1,000 events/s,
// bench/README.md). No row version is written, no claim, no slot lock. Measured (BenchmarkWALShapes,
// 117-byte body, one event per transaction): 665 bytes of WAL for the
// insert plus 83 for the bulk delete, against 428 bytes for the same event
// written with pg_logical_emit_message in the caller's transaction (no
// row); the producer's transaction took the same time either way (558 and
// 590 µs, the commit's flush dominating). ferry keeps the row: Enqueue
// need not know the relay's mode, a parked or scheduled event is a row
// already, the backlog stays visible to ReadStats and the stuck-outbox
// alert, and after a lost slot the rows left are exactly the unconfirmed
// events (below), which the message shape could not tell.
//
// Which relay owns which event: the stream owns every event due at once
// (next_attempt_at NULL). The claim loops of the same relay (the polling
// relay, restricted to rows with next_attempt_at set) own the scheduled
// events (Event.DueAt), the parked rows (a message fault parks the event:
// the failSQL update sets next_attempt_at, as in poll mode), and the rows
// committed before the slot existed (handed over when the slot is created
// or reset, by setting next_attempt_at). They find them by polling
// (PollInterval); no LISTEN in WAL mode.
//
// Semantics:
//   - Order: the events of one key go out in commit order with no slot
//     lock: one streamer, and one lane per key, which publishes a call
//     only once the broker confirmed the call before it (or refused its
//     messages for a fault of their own). Events of different keys, and
//     events without a key, are published by several lanes at once, so
//     they are not ordered among themselves (with Concurrency 1, one
//     lane, every event goes out in commit order). A parked event is
//     published later, after the events behind it, as in poll mode.
//   - At least once: the slot's confirmed position passes an event only
//     after the broker confirmed it and everything before it, and its row
//     was deleted: batches are settled in order, and a batch one of whose
//     lanes failed (an outage, a crash) holds the position even when later
//     batches were confirmed by the broker. A relay killed at any point
//     resumes from that position: the events after it (those published
//     in the last SettleInterval among them) are published again with the
//     same message ID, which the workers' dedup absorbs. When a
//     lane fails, it publishes nothing more of its keys; the stream stops
//     and restarts from the confirmed position, so a key's events still
//     first reach the broker in commit order.
//   - Visible before published: PostgreSQL flushes a commit record, which
//     a WAL sender may stream at once, a moment before the committing
//     transaction becomes visible to other sessions; the relay waits
//     (one query per batch: none of its transactions in the running list
//     of a new snapshot) so that a handler always sees the producer's
//     rows, as with the polling relay.
//   - One streamer per slot: PostgreSQL lets one connection stream a slot
//     at a time. Relays started with the same Slot stand by (they try
//     again every second) and one takes over within about a second after
//     the streaming one dies (its connection closes; a network partition
//     waits for the server's wal_sender_timeout, 60 s by default).
//   - A message fault parks the event with its reason and the stream goes
//     on. An outage of the broker or the database stops the stream (the
//     slot retains the WAL meanwhile) and is waited out with the relay's
//     one backoff, shared with its claim loops; the stream restarts from
//     the confirmed position.
//   - Backlog: rows are deleted once confirmed, so ReadStats' Unprocessed
//     and OldestUnprocessedAge are the WAL relay's unconfirmed events, and
//     the stuck-outbox alert fires on them as in poll mode. ReadWALStats
//     adds the WAL the slot retains (ferry_outbox_wal_retained_bytes) and
//     the age of the oldest unconfirmed event
//     (ferry_outbox_wal_oldest_unconfirmed_age_seconds). ProcessedLastMinute
//     and ProcessedLastHour count only the claim loops' rows.
//   - A slot dropped or invalidated (max_slot_wal_keep_size) after the
//     relay began streaming from it is ErrSlotLost, never a silent gap:
//     ResetWALSlot (`ferry outbox wal-reset`) hands the rows left (the
//     unconfirmed events) to the claim loops, and the next start creates a
//     new slot.
//   - A promote: logical replication slots live on the server that
//     created them and are not copied to a physical standby before
//     PostgreSQL 17's failover slots (PostgreSQL documentation,
//     "Replication Slot Synchronization" in "Logical Decoding Concepts",
//     17), while outbox_wal_slots is an ordinary table and is. A promoted
//     standby thus has the registration and no slot. The registration
//     records the server's system identifier and the WAL timeline the slot
//     was created on (migration 11), and a promote (or a point-in-time
//     restore) starts a new timeline; a registered slot missing on another
//     timeline or system was lost with its server, so the relay recovers by
//     itself: in one statement it drops the registration and hands the
//     rows left (the unconfirmed events: rows are deleted only once the
//     broker confirmed them) to the claim loops, as ResetWALSlot does, logs
//     it once at WARN (slot, old and new timeline, rows handed over), and
//     creates a new slot as on a first start. Of several relays standing
//     by, one recovers. Give the relay a multi-host URL with
//     target_session_attrs=read-write (the replication connection keeps
//     it): until the standby is promoted the database is unavailable, an
//     outage waited out, and a standby reached anyway (no
//     target_session_attrs) is one too, never ErrSlotLost. The events of a
//     key keep their order among themselves, not across the recovery (the
//     handed rows go out by the claim loops while the new slot streams);
//     an event whose delete the old primary had not replicated yet is
//     published again, a duplicate the workers' dedup absorbs. A slot
//     missing on its own timeline is still ErrSlotLost (someone dropped
//     it); so is one registered before migration 11 (no timeline: a drop
//     cannot be told from a failover), whose registration gets the
//     timeline at the next start that finds the slot. Streaming resumes
//     when the relay's outage backoff (shared with its claim loops,
//     doubling from 100 ms up to MaxBackoff, jittered) next tries after
//     the promote, and creating the slot waits for the transactions
//     running at that moment to end (TestFailoverPostgresWAL measured
//     0.3 to 13 s from the promote to streaming again). On PostgreSQL 17
//     and later a user who wants the slot itself to survive a failover can
//     create it beforehand with pg_create_logical_replication_slot(...,
//     failover => true) and set sync_replication_slots = on (with
//     primary_slot_name, hot_standby_feedback and a dbname in
//     primary_conninfo) on the standby; ferry creates its slots without
//     that option and does not check it.
//
// What it needs from the database (checked at the first start by
// WALCheck, whose error names the setting): wal_level = logical (a restart;
// on Amazon RDS rds.logical_replication = 1, on Cloud SQL
// cloudsql.logical_decoding, on Azure azure.replication_support), a free
// slot in max_replication_slots and a free WAL sender in max_wal_senders,
// and a role with the REPLICATION attribute (on RDS, rds_replication) that
// may create a publication on the outbox (its owner). A slot that no relay
// streams keeps WAL on the server until it is dropped: drop it (and its
// row in outbox_wal_slots, ResetWALSlot does both) when a destination is
// retired, or set max_slot_wal_keep_size.
//
// # Retention shapes for the WAL relay (both measured; the DELETE kept)
//
// The WAL relay deletes the settled rows (above): one statement and one
// commit per SettleInterval, and dead tuples for autovacuum. The
// alternative is a table partitioned by id range whose partitions are
// dropped once the slot has passed every row of them.
// BenchmarkRetentionShapes measures both on scratch copies of the
// outbox's columns (one run, 50,000 rows in transactions of 500,
// 2026-12-07, the machine loaded by a soak): delete 5.94 µs and 75 WAL
// bytes per row, plus 0.33 µs and 11 bytes for its VACUUM; partition drop
// 0.81 µs and 1.7 WAL bytes per row (partitions of 10,000); the
// producer's insert the same (12.6 µs per row plain, 10.6 partitioned).
// Per row, dropping partitions is the cheaper by a factor of about 8 in
// time and 50 in WAL.
//
// ferry keeps the DELETE, because of what the rows mean, not what they
// cost:
//   - The delete is the WAL relay's record of what the broker confirmed:
//     the rows left are exactly the events not yet confirmed. ResetWALSlot
//     and a slot lost by a failover hand those rows, and only those, to
//     the polling relay; ReadStats, the stuck-outbox alert, `ferry outbox
//     stats` and the console read the backlog from them, whatever the
//     relay's mode. With no write per event, a published row looks like an
//     unpublished one until its partition is dropped. The record would
//     move to a watermark per partition (the WAL position at which the
//     partition was sealed, once no transaction could still write it,
//     passed by the slot's confirmed position). A reset would then
//     publish again every row of the partitions not yet passed, and every
//     backlog figure would have to be read from slot positions, not rows.
//   - A parked row or a row due later (DueAt) keeps its partition alive,
//     so partitions would be dropped late or their pinned rows moved.
//   - Creating partitions ahead and dropping old ones takes an ACCESS
//     EXCLUSIVE lock on the outbox. Every producer then queues behind the
//     DDL, which itself waits for the longest open producer transaction
//     (bounded by a lock_timeout and retried, as pg_partman does).
//
// The cost kept is small beside the event's own. Since SettleInterval,
// the DELETE is one commit per 50 ms, not one per batch: in one loaded
// run of BenchmarkEndToEnd (nats-wal, batched worker commits, 2,000
// events), DELETE calls per event went from 0.53 (every batch at once)
// to 0.14, with 7.4 rows per call. What remains is about 5 µs of
// PostgreSQL time and 84 WAL bytes per event, against the producer's
// 12.6 µs and 665 bytes for its insert. The partition shape stays
// measured (BenchmarkRetentionShapes), for the day the backlog can be read
// from the slots alone.
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
