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
//     type (Decode). One worker serves every type its queue is bound to.
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
package ferry
