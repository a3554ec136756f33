// Package ferry is the entry point for using ferry as a library in your
// own Go service: typed events enqueued in your own PostgreSQL
// transaction, a handler mux that decodes them for your handlers, scheduled
// events, and one constructor that runs the relay and the workers.
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
//   - a message whose body does not decode into the handler's type, or
//     whose decoded value fails its Validate method (Validator), with a
//     reason wrapping ErrUndecodable that names the type and the decoding
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
//     (tested: 200 events due at times spread over a minute are each
//     handled no earlier than due and within a second after, on every
//     broker). Lower PollInterval for a finer resolution, at the cost of
//     one claim query per interval per relay.
//   - It survives restarts of the relay, the workers and PostgreSQL: it is
//     a committed row, and any relay publishes it once due.
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
package ferry
