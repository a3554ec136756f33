// Package ferry is the entry point for using ferry as a library in your
// own Go service: typed events enqueued in your own PostgreSQL
// transaction, a handler mux that decodes them for your handlers, scheduled
// events, periodic jobs, handlers on pgx or database/sql, and one
// constructor that runs the relay and the workers.
//
// A service does three things:
//
//   - Enqueue (or EnqueueSQL for database/sql on the pgx driver) stores an
//     event, its args encoded as JSON, in the outbox inside the caller's
//     transaction: it is published if and only if the transaction commits
//     (package outbox).
//   - A Mux routes each received message to the handler registered for
//     its type with Handle, which decodes the body into the handler's Go
//     type (Decode), with the type's own options and the Mux's middleware
//     (Use). One worker serves every type its queue is bound to.
//   - New builds a Pipeline from a pool, a broker.Broker and the
//     topology; Pipeline.Run declares the topology and runs the relay
//     (package outbox), the workers (package worker), or both, with the
//     defaults the ferry command uses.
//
// # Delivery semantics
//
// Those of packages outbox and worker: at least once from the outbox to
// the broker, and each message ID handled at most once per consumer by a
// committed handler transaction (the worker's deduplication row commits
// with the handler's writes). A side effect outside the database (an
// e-mail, an HTTP call) may happen again when the commit fails after it;
// make it idempotent (see the worker package, "External side effects").
//
// # Handler outcomes
//
// A handler returns nil (ack), an ordinary error (retried under the
// worker's RetryPolicy, then dead-lettered), worker.Permanent(err)
// (dead-lettered at once) or worker.RetryAfter(err, d). The Mux itself
// dead-letters at once, never retries and never drops:
//
//   - a message whose Type no registered pattern matches, with a reason
//     wrapping ErrNoHandler that names the type and the patterns;
//   - a message whose body does not decode into the handler's type, with
//     a reason wrapping ErrUndecodable that names the type and the
//     decoding error;
//   - a message whose decoded value fails its Validate method
//     (Validator), with a reason wrapping ErrInvalidEvent and Validate's
//     error.
//
// The reason is the DLQ message's broker.HeaderLastError; "ferry dlq list"
// shows it and "ferry dlq replay" sends the message back once a handler
// exists or the producer is fixed.
//
// # Per-type options
//
// Handle and Mux.Handle take options for the event types of their
// pattern, in place of the worker's settings: WithMaxAttempts (attempts
// before the DLQ), WithRetryDelays (the backoff list) and WithTimeout
// (the bound of each attempt). A type without them keeps the worker's
// (worker.Config.Policy and HandlerTimeout). The worker applies them when
// the Mux is its worker.Config.Router (the Mux implements worker.Router);
// worker.New and Worker.Run check them against the broker's capabilities,
// as they do the worker's own, and refuse with broker.ErrUnsupported a
// delay above the broker's MaxDelay or, on a broker without native delays
// (RabbitMQ, Kafka), one that is not a declared retry level of the queue.
// A type with options whose handler is called by a worker that does not
// apply them (the Mux set as worker.Config.Handler) fails its attempt
// with an error wrapping ErrInvalidConfig instead of running without
// them.
//
// An attempt that overruns its timeout has its ctx cancelled and fails
// with an error wrapping worker.ErrHandlerTimeout, retried under the
// type's policy. A handler that ignores its ctx is abandoned
// worker.HandlerTimeoutGrace (1 s) later: the worker closes its database
// connection, so PostgreSQL rolls its transaction back, and settles the
// delivery as a failed attempt (package worker, Config.HandlerTimeout).
//
// # Middleware
//
// Mux.Use wraps every message the Mux handles (those without a handler
// included) in Middleware, func(worker.Handler) worker.Handler. The first
// middleware given to the first Use is the outermost: after
// mux.Use(a, b) a message runs a, then b, then the handler (and the
// decoding of Handle), and the result returns through b and a, as in
// net/http handler chains and Watermill's router middleware. Shipped:
//
//   - Recover: a panic becomes a failed attempt (an error wrapping
//     worker.ErrPanic, retried or dead-lettered under the policy) and its
//     stack goes to the log; the worker never crashes.
//   - Timeout: the handler's ctx is cancelled after a duration; an error
//     after it wraps worker.ErrHandlerTimeout.
//   - Logging: every attempt is logged with log/slog, with the message's
//     id, type, key, app id, attempt and duration.
//
// # Scheduled events
//
// An event enqueued with DueAt(t) or DueIn(d) is stored with its outbox
// row's next-attempt time (next_attempt_at) set to t, the column the
// relay already uses to hold back rows it failed to publish, so:
//
//   - The relay publishes it no earlier than t, compared with the database
//     server's clock (the claim's now()), and a worker handles it after
//     that.
//   - Resolution: a row that becomes due is found by the relay's next
//     poll, so it is published within outbox.RelayConfig.PollInterval
//     (default 500 ms) after t, plus the broker's confirm and delivery
//     (tested: 200 events due at times spread over 20 s are each
//     handled no earlier than due and within a second after, on every
//     broker). Lower PollInterval for a finer resolution, at the cost of
//     one claim query per interval per relay.
//   - It survives restarts of the relay, the workers and PostgreSQL: it is
//     a committed row, and any relay of its destination publishes it once
//     due.
//   - While it waits it costs a row and its index entries: no broker
//     message, no timer, no goroutine, no connection, and no NOTIFY for a
//     transaction whose events are all due later. Two partial indexes let
//     the relay's claim find the due rows without reading the waiting ones
//     (package outbox, "Scheduled events": 12 ms per claim with 100,000
//     waiting rows without them, 0.1 ms with them; BenchmarkWaitingRows
//     prints the relay's publish latency with 0 and 100,000 waiting rows).
//   - It is not backlog: outbox.Stats counts it as Scheduled until due,
//     so the stuck-outbox alert ignores a planned wait, and its
//     occurred_at (the message's broker.HeaderCreatedAt, from which the
//     worker's end-to-end latency is measured) is its due time.
//   - A scheduled event with a Key keeps only the order the relay and the
//     broker give (package outbox, "Order"): the relay publishes the other
//     events of the same Key without waiting for it; it takes its place
//     in the key's order when it becomes due.
//
// Retries after a failed handler are the worker's business (the queue's
// retry levels), not the schedule's.
//
// # Destinations
//
// Every event names the outbox it goes to: WithDestination(name) at
// Enqueue, outbox.DefaultDestination ("default") without it. A Pipeline's
// relay publishes only the events of Config.Destination (or of
// Config.Relay.Destination), so two services, or two pipelines with
// different exchanges, share one database and each publishes exactly its
// own events to its own exchange; no relay claims, publishes or parks
// another's (package outbox, "Destinations"; tested with two pipelines of
// different exchanges on one database on every broker). Give each
// topology its own destination, e.g. its exchange's name, and enqueue
// with it; the ferry command's api and relay take it as --destination.
// The claim reads only its destination's rows, through indexes that lead
// with the destination, so it costs what it costs on a database holding
// only those rows (BenchmarkClaim in package outbox: 1.01 to 1.05 times as
// long with 50,000 rows of another destination interleaved).
//
// # Unique events
//
// Unique(key, window) makes an Enqueue idempotent for a while, like
// River's unique jobs and asynq's Unique option: a second Enqueue with the
// same key less than window after the first stores nothing and returns
// the first event's id. It holds under concurrent transactions (a primary
// key on the key, not a read-then-write: the second waits for the first
// to commit, or stores its own event when the first rolled back), and
// after the window the next Enqueue stores a new event (package outbox,
// "Unique events"; tested with 20 concurrent enqueues of one key). The
// key is database-wide: include the event type in it. It costs an upsert
// of one small row in the same round trip (BenchmarkEnqueue in package
// outbox: a transaction with a new key took 1.02 times as long as one
// without).
//
// # Periodic jobs
//
// Periodic builds a job from a name, a schedule (ParseSchedule: "@every
// 1m", or a cron expression read by github.com/robfig/cron/v3, in UTC
// unless it starts with CRON_TZ=) and an event (type and typed args,
// encoded by NewEvent as Enqueue does). A Scheduler (NewScheduler), or
// Config.Periodic of a Pipeline, enqueues the event at each tick; the
// event then goes through the outbox, the relay and the broker like any
// other, and Handle's handler receives it. Give every replica the same
// jobs:
//
//   - Exactly once per tick. Each job has one row in PeriodicTable
//     (ferry_periodic) with the latest tick enqueued. At a tick every
//     replica opens a transaction, locks the row (SELECT ... FOR UPDATE)
//     and, when last_tick is before the tick, moves it to the tick and
//     inserts the outbox event, then commits: a replica that waited for
//     the lock finds the tick taken and writes nothing. A replica killed
//     inside that transaction leaves nothing behind (PostgreSQL rolls it
//     back when the connection drops), and another replica, or the same
//     one restarted, takes the tick. Tested: three replicas killed with
//     SIGKILL at random moments, about twice a second, over 10 s of a job
//     every second: each tick enqueued once, none missing.
//   - Ticks are times, the same on every replica: "@every D" ticks at the
//     multiples of D since the zero time.Time (for D dividing a day, at
//     the multiples of D since midnight UTC); a cron expression at its
//     matching times. A replica fires a tick by its own clock, so a clock
//     running ahead fires it early, never twice.
//   - The first replica that ever runs a job registers it: its ticks start
//     after that moment (no back-fill).
//   - Ticks missed while no scheduler ran (every replica down, or the
//     database unreachable): when a scheduler runs again it enqueues at
//     once the latest missed tick only, and logs at WARN how many earlier
//     ticks it skipped ("ticks missed while no scheduler ran were
//     skipped", with "skipped" and "last_enqueued_tick"). So a restart
//     neither repeats a tick nor drops one silently, and a job that runs
//     every minute does not run 600 times after a 10-hour outage.
//   - The event's AppID is "<name>@<tick>" (RFC 3339, UTC) unless the job
//     sets WithAppID: the handler, "ferry dlq list" and the outbox show
//     which tick a message is. A job's DueAt/DueIn options are refused.
//   - Cost: one transaction per tick per replica (the losers' is a lock
//     wait and a read), and one row per job. The winner's transaction is
//     BEGIN and the lock in one round trip, the update, the outbox insert
//     and the commit: BenchmarkPeriodicTick measured 1.7 to 2.1 ms per
//     tick against 0.9 to 2.4 ms for a transaction with one Enqueue of the
//     same event (three runs on a loaded 2-core machine, where the
//     commit's WAL flush dominates both): at most about twice a plain
//     Enqueue.
//
// # database/sql handlers
//
// For services written on database/sql, HandleSQL registers a typed
// handler that takes a *sql.Tx (SQLJobHandler), and Mux.HandleMessageSQL
// serves it: set worker.Config.SQLHandler (not Handler) to it. The worker
// then opens its deduplication transaction through database/sql (pgx's
// driver, github.com/jackc/pgx/v5/stdlib, over the worker's pool), so the
// handler's writes and the dedup row commit together or not at all, as
// with a pgx.Tx: a handler error rolls its writes back, and a redelivery
// after the commit is acked as a duplicate without running the handler.
// A Mux serves one kind: a message whose handler needs the other kind of
// transaction is dead-lettered at once with ErrWrongTransaction. Batches
// (worker.Config.BatchSize > 1) need a pgx.Tx. Cost: database/sql cannot
// pipeline, so BEGIN, the dedup insert and the attempt read are three
// round trips where the pgx path sends one; BenchmarkSQLHandler (NATS,
// one insert per handler) measured about 1.1 times the pgx handler's
// time per message (720 against 650 µs at the default concurrency of 10,
// on 2 cores). EnqueueSQL is the enqueueing side.
package ferry
