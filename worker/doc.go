// Package worker runs a handler for every message of a broker queue, at
// most once per message ID and consumer as far as the database is
// concerned.
//
// # Semantics
//
// Delivery is at least once (package broker): a message can arrive again
// after a crash, a lost connection, an expired ack deadline, or because the
// relay published it twice. The worker turns that into effectively-once
// side effects in the database. For each delivery it opens one transaction
// and, in it:
//
//  1. inserts (Consumer, Message.ID) into processed_messages with
//     ON CONFLICT DO NOTHING. Zero rows inserted means this consumer
//     already processed the message: the transaction is rolled back, the
//     delivery acked, and the outcome is OutcomeDuplicate. A concurrent
//     duplicate waits on the row lock of the first one and then sees it.
//  2. runs the Handler with the transaction, so the handler's own writes
//     commit together with the dedup row, or not at all.
//  3. commits, and only then acks the delivery.
//
// With Config.SQLHandler instead of Handler the same transaction is a
// database/sql one (pgx's stdlib driver over Config.Pool), handed to the
// handler as a *sql.Tx; steps 1 to 3 are the same, and so are batches
// (see Batches: the savepoints are statements on the *sql.Tx).
//
// Two consumers of one event (different Consumer names, each with its own
// queue bound to the event type) each handle it once. Step 1 also reads
// the message's attempt record (see "Attempts and lost settlements").
//
// If the process dies after the commit and before the ack, the broker
// redelivers the message and step 1 drops it. If the handler fails, the
// transaction is rolled back — no dedup row is left — and the message is
// retried.
//
// # Outcomes and retries
//
// A handler returns:
//
//   - nil: commit, then ack (OutcomeAck).
//   - an ordinary error: roll back and ask the RetryPolicy (default
//     BackoffPolicy: 5 attempts, 30 s between them). The message comes back
//     after the delay (broker.Delivery.Retry, HeaderRetryCount + 1,
//     HeaderLastError = the error text, taken from the attempt record when
//     the broker retries in place or the Retry was lost) with
//     Message.Attempt one higher
//     (OutcomeRetry; OutcomeUnsettled when the broker did not take the
//     Retry, see "Attempts and lost settlements"). After the last attempt it goes to the queue's DLQ
//     with its headers plus HeaderLastError (OutcomeDead).
//   - Permanent(err): roll back and dead-letter at once, whatever the
//     attempt (OutcomeDead).
//   - RetryAfter(err, d): like an ordinary error, but the next attempt comes
//     after d instead of the policy's delay.
//   - Snooze(d) (ferry.RetryAfter): roll back and send the message back
//     for d without counting an attempt (OutcomeSnoozed; see "Snoozes and
//     flow limits").
//
// When the transaction cannot even begin, or the dedup insert fails for a
// reason that is not the message's (connection lost, table missing), the
// worker holds the delivery and tries again with a backoff up to 5 s,
// spending no attempt: a database outage pauses the worker instead of
// filling the DLQ. A message ID the database refuses (data exception, e.g.
// invalid UTF-8) is dead-lettered. A failed commit counts as an ordinary
// error (the commit may have happened; if so, the retry is dropped as a
// duplicate). A panic in the handler is
// recovered and counts as an ordinary error wrapping ErrPanic: the worker
// never crashes because of a handler. After each failed attempt,
// Config.OnFailure runs in its own transaction, with dead=true when the
// message goes to the DLQ, so the application can record the failure.
//
// The worker, not the broker adapter, owns the retry policy and the attempt
// counting; the adapter only carries out Retry(delay) and DeadLetter. On a
// broker without native delays (RabbitMQ) the delay is rounded up to the
// queue's declared retry levels (broker.Queue.RetryDelays), so keep the
// policy's Delays equal to the queue's: by default, when Config.Topology is
// set, the policy takes them from there. New checks the policy's delays
// against the broker's Capabilities.
//
// # Attempts and lost settlements
//
// The truth about attempts lives in PostgreSQL, not in the broker: the
// table worker_attempts (AttemptsTable, created by package outbox's
// migrations) holds, per (Consumer, Message.ID), the number of the last
// failed attempt, its error, and whether the DLQ was decided. Once the
// broker confirms a dead-letter, the worker deletes that row and writes
// the message into worker_dead (DeadTable: attempt, reason, time), which
// outbox.JobGet reads to say the job is dead. After each
// failed attempt the worker writes that row in its own transaction —
// before the attempt's transaction rolls back (so a redelivered copy
// waiting on the dedup row sees it), before OnFailure, and before Retry or
// DeadLetter — and every delivery reads it with the dedup insert, as a
// second statement in the same round trip. The
// attempt a handler sees (Message.Attempt) is the larger of the broker's
// count (HeaderRetryCount + 1, or the redelivery count on brokers with
// Capabilities.CountsRedeliveries) and the record's last failed attempt
// + 1, so every broker counts the same way, and a settlement the broker
// never received loses nothing:
//
//   - Retry fails (RabbitMQ closed the channel after its consumer_timeout,
//     the connection was lost, the settle deadline passed): the broker
//     redelivers the original message without ferry's retry header, at
//     once and without the policy's delay; the worker handles it as the
//     next attempt. The outcome of the failed attempt is OutcomeUnsettled,
//     never OutcomeRetry: the "retry" metric counts only retries the
//     broker took.
//   - DeadLetter fails: the record keeps "dead"; the redelivery is
//     dead-lettered at once with the recorded reason, without running the
//     handler again (OutcomeUnsettled, then OutcomeDead).
//   - Ack fails after the commit: the dedup row is committed, so the
//     redelivery is acked as OutcomeDuplicate; the outcome of the attempt
//     is OutcomeUnsettled, not OutcomeAck: outcomes count only
//     settlements the broker took.
//
// A handler that always fails therefore reaches the DLQ after the
// policy's last attempt even when every Retry is lost. The record is
// deleted in the transaction of the attempt that succeeds and once the
// DLQ holds the message, so a replay from the DLQ starts again at attempt
// 1. When writing the record fails (database down) the worker logs it and
// the count falls back on the broker's.
//
// # Settle failures
//
// Every Ack, Retry, DeadLetter or Extend the broker did not take is logged
// once at WARN ("worker: ack failed", "worker: retry failed", ...) with
// the op, the message ID, the broker's error (for RabbitMQ the channel's
// close reason, e.g. the consumer-timeout PRECONDITION_FAILED), a bounded
// reason (broker.SettleReason: closed, connection, timeout, canceled,
// expired, not_found, throttled, refused, already_settled, other) and
// what happens next, and passed to Config.OnSettleFailure (ferry's CLI
// counts it in ferry_worker_settle_failures_total{op,reason}). A refusal
// the adapter worked around by itself, invisible in the method's result
// (SQS: a DeleteMessageBatch entry refused and deleted again with
// DeleteMessage), reaches the same log and hook through the
// broker.SettleObserver the worker puts in every settlement's ctx
// (broker.WithSettleObserver), logged as "worker: ack refused by the
// broker, worked around by the adapter" with SettleFailure.Recovered set;
// its outcome is the one the broker finally took.
//
// # External side effects
//
// The transaction covers only the database. A side effect outside it — an
// e-mail sent over SMTP, an HTTP call — happens before the commit, so when
// the commit fails, or the process dies between the side effect and the
// commit, the message is handled again and the side effect repeats. To make
// that rare and harmless the handler keeps its own state: it locks and
// reads its row (SELECT ... FOR UPDATE), skips the send when the row says
// "already sent", marks it sent in the same transaction, and passes an
// idempotency key (e.g. the Message.ID as the e-mail's Message-ID) where the
// other side supports one. Exactly-once delivery to an external system is
// impossible in general; at-least-once with deduplication on both sides is
// what this gives.
//
// # Batches
//
// With Config.BatchSize above 1 (default 1), a handling goroutine takes the
// deliveries already received — up to BatchSize, waiting at most
// Config.BatchLinger (200 µs) for each further one, never for a full
// batch — and handles them in one transaction. The goroutines take turns
// to gather, one at a time, so that a delivery arriving during a linger
// joins the batch being gathered instead of starting a batch of one on an
// idle goroutine:
//
//  1. one INSERT ... SELECT unnest($ids) ON CONFLICT DO NOTHING RETURNING
//     message_id inserts every dedup row (in sorted ID order, so batches
//     sharing IDs lock them in the same order); an ID not returned, or
//     seen twice in the batch, is a duplicate, acked after the commit
//     without calling the handler.
//  2. each new message runs in its own SAVEPOINT: on success it is
//     released; on error (or panic) the worker rolls back to the savepoint
//     and deletes that message's dedup row, so its writes vanish and its
//     retry is handled like a first delivery, while the other messages
//     carry on.
//  3. one COMMIT; then the successes are acked and each failure goes
//     through the retry policy and OnFailure exactly as with BatchSize 1.
//
// Each message keeps the guarantees above (workertest's kill tests kill a
// worker process with SIGKILL right after a batch's COMMIT and in the
// middle of a batch, and find each database effect once): its writes commit with its
// dedup row or not at all, one failing or panicking handler fails only its
// own message, and Extend runs for every delivery of the batch until it is
// settled. When the batch as a whole fails — the COMMIT (e.g. a deferred
// constraint one message broke), a savepoint statement, or the dedup
// insert refusing an ID — nothing of it committed (or, when only the
// commit's answer was lost, all of it did), so the worker handles each of
// its messages again alone, as with BatchSize 1: no message spends an
// attempt for a batch-mate's fault, and a lost commit answer turns into
// duplicates. A database outage holds the whole batch as it holds a single
// message. Shutdown is unchanged: a batch running when the
// ShutdownTimeout expires is rolled back and its deliveries left for
// redelivery.
//
// The cost: one transaction, one WAL flush and one dedup statement per
// batch instead of per message, plus a savepoint round trip per message;
// BenchmarkWorker on 2 cores measured about 2,500–2,700 msgs/s with one
// transaction per message and 4,000–5,100 with batches of 8–16
// (Concurrency 4–8, Prefetch 64–128). The price: a handler's side effects
// outside the database (an e-mail) happen before the whole batch commits,
// so a crash, a failed commit or a broken batch repeats them for every
// message of the batch, where BatchSize 1 repeats only one; the
// "already sent" check of the section above still guards, but the window
// is wider. Use BatchSize > 1 for handlers whose effects are all in the
// transaction. Row locks a handler takes are held until the batch
// commits. BatchSize is at most 64, PostgreSQL's per-transaction cache of
// subtransaction IDs. Config.Prefetch defaults to Concurrency × BatchSize
// so every goroutine can fill its batch.
//
// # Settings that must agree with the broker
//
// Some of the worker's settings only work within limits the broker sets
// on its side, and a contradiction used to show only when a message was
// lost to it. Run reads the broker's limits for the queue after Declare
// (broker.LimitReporter, implemented by the SQS, NATS and RabbitMQ
// adapters) and refuses to start with an error wrapping ErrInvalidConfig
// that names both settings and a value that works (CheckLimits):
//
//   - the policy's attempts (BackoffPolicy.MaxAttempts, --max-attempts)
//     must be below the broker's delivery limit, the deliveries after
//     which it gives up on a message by itself: SQS
//     sqs.Config.MaxReceiveCount (the queue's RedrivePolicy, ferry
//     --sqs-max-receive-count), a JetStream consumer's MaxDeliver set by
//     an operator, a RabbitMQ policy's delivery-limit on a quorum queue
//     (read with rabbitmq.Config.ManagementURL, ferry
//     --rabbitmq-management-url);
//   - AckDeadline at most the broker's longest ack deadline (SQS 12 h);
//   - HandlerTimeout (--handler-timeout), when set, below the broker's
//     settle limit (RabbitMQ consumer_timeout, rabbitmq.Config.ConsumerTimeout
//     or ferry --rabbitmq-consumer-timeout;
//     SQS 12 h after a receive); the ack deadline itself is kept from
//     expiring under a running handler by Delivery.Extend every
//     AckDeadline/3, so it needs no such bound;
//   - the policy's delays added up over its attempts (--retry-delay,
//     --max-attempts) below the broker's retention of a message retried in
//     place (SQS MessageRetentionPeriod, 14 days; the delays are also each
//     checked against broker.Capabilities.MaxDelay, 12 h on SQS).
//
// Kafka has none of these: kafka-go heartbeats from a goroutine of its own
// and has no max.poll.interval.ms, so a long handler never costs its
// partitions, and retry topics keep a record at least 4 × its delay
// (its Config.SessionTimeout is checked against the broker's range by
// Subscribe). A RabbitMQ policy's delivery-limit cannot be read over AMQP:
// without rabbitmq.Config.ManagementURL it is not checked, and what it
// drops reaches the DLQ through the work queue's dead-letter exchange
// (package rabbitmq).

// # Per-type options and handler timeouts
//
// A worker whose Config.Router is set (ferry.Mux) handles each message
// with the options of its type (Router.Route, TypeOptions): its
// MaxAttempts and RetryDelays replace Config.Policy for it (as a
// BackoffPolicy; what a type does not set comes from the worker's
// policy), its Timeout replaces Config.HandlerTimeout. Types without
// options, and types no route matches, use the worker's settings. New and
// Run check every route's options like the worker's own: valid, each
// delay within broker.Capabilities.MaxDelay and, on a broker without
// NativeDelay, one of the queue's declared retry levels (the levels come
// from Config.Topology; without it such delays are refused, since they
// cannot be checked). A route registered after Run started is checked
// when its first message arrives; refused options fail its attempts with
// the reason.
//
// A timeout (Config.HandlerTimeout or a type's Timeout) runs the handler
// in a goroutine of its own with a ctx cancelled at the timeout. An error
// returned after it wraps ErrHandlerTimeout and is an ordinary failed
// attempt. A handler still running HandlerTimeoutGrace (1 s) after the
// timeout ignores its ctx; the worker does not wait for it, since it
// would hold the delivery (and, in the transaction, the dedup row that a
// redelivery waits on). It records the failed attempt, sends PostgreSQL a
// cancel request for the statement the handler may be running and closes
// the transaction's connection, so the server rolls the transaction back
// and releases its locks at once, and settles the delivery: Retry or the
// DLQ under the policy. The handler's goroutine is left to finish: when
// the handler returns, whatever it returns, its work is rolled back (the
// connection is closed) and the connection goes back to the pool, which
// drops it. Until then it holds a pool connection and the goroutine, on
// top of Concurrency. With BatchSize > 1 the abandoned handler's batch is
// rolled back with it, and its other messages are handled again one by
// one, as after any failed batch.
//
// # Snoozes and flow limits
//
// A snooze sends the delivery back through broker.Delivery.Retry like a
// retry, but it is not a failed attempt: no OnFailure, no attempt record,
// and the redelivery is the same attempt. The broker counts it all the
// same (HeaderRetryCount, JetStream's NumDelivered, SQS's
// ApproximateReceiveCount, which Retry cannot rewrite on a broker that
// retries in place), so the worker counts the snoozes of each message in
// AttemptsTable's snoozes column, in a statement of its own before the
// Retry, and subtracts them from the broker's count. The count is read
// with the attempt record (same statement) and deleted with it. A snooze
// whose record could not be written, or whose Retry was lost, makes the
// redelivery one attempt higher or lower at most. After Config.MaxSnoozes
// snoozes (or one delivery short of the broker's delivery limit,
// broker.Limits.DeliveryLimit) the message is dead-lettered with a reason
// saying so.
//
// A type's ConcurrencyLimit and RateLimit (TypeOptions) are applied
// before its message's transaction begins, in statements of their own
// (SlotsTable, RatesTable) that every replica sees at their commit: a
// slot is taken (a lease renewed every third of it while the handler
// runs, freed once the transaction ended), then the rate is checked; a
// delivery over either limit is snoozed. Both need BatchSize 1.
//
// # Priorities
//
// A queue with priority levels (broker.Queue.Priorities in
// Config.Topology) is consumed level by level: Run subscribes to each
// level's queue (broker.Queue.Levels) and merges them with
// broker.Prioritized, strict by default or in the shares of
// Config.PriorityWeights. Every other queue's subscription goes through
// Prioritized too, with one level, which only takes the priority prefix
// off the Type of messages prioritised for other queues
// (broker.PriorityType). A worker without Config.Topology consumes only
// the queue it names (level 0).
//
// # Concurrency and shutdown
//
// Run handles up to Config.Concurrency messages at once, with
// Config.Prefetch deliveries in flight; size the database pool to at least
// Concurrency connections. Each message costs one transaction: BEGIN, the
// dedup INSERT, the handler's statements and COMMIT (with BatchSize 1; see
// Batches). BEGIN, the dedup INSERT and the read of the attempt record go
// to the server in one round trip (pgx.Batch.BeginTx), so a handler that
// runs one statement costs three round trips: that one, the handler's and
// COMMIT. While a handler runs,
// the worker calls Delivery.Extend every AckDeadline/3 so a broker with an
// ack deadline does not redeliver it meanwhile.
//
// When Run's ctx is cancelled (SIGTERM), the worker stops receiving, lets
// the in-flight handlers finish for up to Config.ShutdownTimeout — their
// ctx is not cancelled during that time — settles them, and Run returns
// nil. Handlers still running at the timeout get their ctx cancelled; their
// transactions roll back and their deliveries are left unsettled, so the
// broker redelivers them to the next worker (without spending an attempt,
// except on brokers whose Capabilities.CountsRedeliveries is true). Run
// waits at most ShutdownGrace (2 s) for the cancelled handlers and then
// returns even when some still run (a handler that ignores its ctx, or
// one waiting for an SMTP server's answer to a mail): Run returns at most
// ShutdownTimeout + ShutdownGrace after its ctx was cancelled, which is
// what a process supervisor's grace period must allow for. The handlers
// left running hold their database connection until they return; the
// process that exits then drops it, and PostgreSQL rolls their
// transactions back.
package worker
