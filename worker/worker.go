package worker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/broker"
)

// Handler handles one message inside the dedup transaction tx: its
// database writes commit together with the dedup row, or not at all. With
// Config.BatchSize > 1, tx is the batch's transaction and the handler runs
// inside a savepoint of it (package doc, "Batches"). It
// returns nil (the message is acked), an ordinary error (retried under the
// RetryPolicy), Permanent(err) (dead-lettered at once), RetryAfter(err, d)
// (a failed attempt retried after d) or Snooze(d) (sent back for d
// without counting an attempt; tx is rolled back). It must not commit or
// roll back tx. ctx is cancelled
// when a shutdown's ShutdownTimeout expires, and at the attempt's timeout
// (Config.HandlerTimeout, TypeOptions.Timeout) when one is set. A handler may run again
// for the same message (after a failed attempt, or a crash before the
// commit); see the package doc for external side effects.
type Handler func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error

// FailureFunc is called in its own transaction tx after a failed attempt,
// before the message is retried (dead=false) or dead-lettered (dead=true);
// err is the handler's error. The application records the failure there
// (e.g. marks a notification "failed"). msg.Attempt is the attempt that
// failed, counted as the package doc's "Attempts and lost settlements"
// says, so a redelivery after a lost settlement is the next attempt; it
// may still be called twice for one attempt when the attempt record could
// not be written (database trouble), so it must be idempotent. When it fails the error is logged and the
// message is retried or dead-lettered all the same.
type FailureFunc func(ctx context.Context, tx pgx.Tx, msg *broker.Message, err error, dead bool) error

// Outcome is how one delivery was settled.
type Outcome int

const (
	// OutcomeAck: the handler succeeded, the transaction committed and the
	// delivery was acked.
	OutcomeAck Outcome = iota
	// OutcomeRetry: the attempt failed and the message was sent back for
	// another attempt (broker.Delivery.Retry).
	OutcomeRetry
	// OutcomeDead: the message was moved to the DLQ (last attempt failed,
	// a Permanent error, or a message without ID).
	OutcomeDead
	// OutcomeDuplicate: the consumer had already processed the message ID;
	// the delivery was acked without calling the handler.
	OutcomeDuplicate
	// OutcomeUnsettled: the broker did not take the settlement the worker
	// asked for (Ack, Retry or DeadLetter returned an error: channel
	// closed, connection lost, receipt expired, deadline passed); the
	// failure is logged and passed to Config.OnSettleFailure. For a failed
	// Ack the transaction had committed: the broker redelivers the message
	// and the worker acks the redelivery as a duplicate. For a failed
	// Retry or DeadLetter the failed attempt is in AttemptsTable; the
	// broker redelivers the message, and the worker handles the redelivery
	// as the next attempt, or dead-letters it at once when the DLQ was
	// decided (package doc, "Attempts and lost settlements"). Neither
	// "ack", "duplicate", "retry" nor "dead" is counted for such a
	// delivery: outcomes count only what the broker took.
	OutcomeUnsettled
	// OutcomeSnoozed: the delivery was sent back for later without
	// counting an attempt (Snooze: the handler asked for it, or a
	// concurrency or rate limit of its type was reached).
	OutcomeSnoozed
)

// String returns "ack", "retry", "dead", "duplicate", "unsettled" or
// "snoozed" (the metrics label).
func (o Outcome) String() string {
	switch o {
	case OutcomeAck:
		return "ack"
	case OutcomeRetry:
		return "retry"
	case OutcomeDead:
		return "dead"
	case OutcomeDuplicate:
		return "duplicate"
	case OutcomeUnsettled:
		return "unsettled"
	case OutcomeSnoozed:
		return "snoozed"
	default:
		return fmt.Sprintf("Outcome(%d)", int(o))
	}
}

// Defaults of Config.
const (
	// DefaultConcurrency is Config.Concurrency when 0: as many handlers as
	// the default prefetch (broker.DefaultPrefetch) hands out. Each message
	// waits for its commit's WAL flush, so throughput grows with the number
	// of transactions in flight (group commit) well past the number of
	// cores: on 2 cores 20 handles about 1.5 times as many messages per
	// second as 10 (BenchmarkWorker); raise Concurrency and Prefetch
	// together for throughput.
	DefaultConcurrency = 10
	// DefaultAckDeadline is Config.AckDeadline when 0.
	DefaultAckDeadline = 30 * time.Second
	// DefaultShutdownTimeout is Config.ShutdownTimeout when 0.
	DefaultShutdownTimeout = 30 * time.Second
	// ShutdownGrace is how long Run waits, once Config.ShutdownTimeout
	// expired and the handlers' ctx was cancelled, for the handlers to
	// return and for the settlements of those that finished. Then Run
	// returns even if some still run (a handler that ignores its ctx, an
	// SMTP server answering the end of a mail's data): their deliveries
	// are unsettled and come back when the broker connection closes. So
	// Run returns at most ShutdownTimeout + ShutdownGrace after its ctx
	// was cancelled.
	ShutdownGrace = 2 * time.Second
	// DefaultBatchSize is Config.BatchSize when 0: one delivery per
	// transaction.
	DefaultBatchSize = 1
	// DefaultBatchLinger is Config.BatchLinger when 0.
	DefaultBatchLinger = 200 * time.Microsecond
	// MaxBatchLinger is the longest Config.BatchLinger.
	MaxBatchLinger = time.Second
	// MaxBatchSize is the largest Config.BatchSize. Each message of a batch
	// runs in its own subtransaction (SAVEPOINT); PostgreSQL caches at most
	// 64 subtransaction IDs per transaction (PGPROC_MAX_CACHED_SUBXIDS) and,
	// past that, slows down every snapshot taken in the cluster while the
	// transaction is open.
	MaxBatchSize = 64
)

// DedupTable is the table the worker inserts (consumer, message_id) into;
// package outbox's migrations create it.
const DedupTable = "processed_messages"

// AttemptsTable is the table of failed attempts per (consumer,
// message_id): the number of the last failed attempt, its error and
// whether the DLQ was decided. The worker reads it with the dedup insert
// and writes it in its own transaction after each failed attempt, before
// settling, so a settlement the broker never received loses no attempt
// (package doc, "Attempts and lost settlements"). Package outbox's
// migrations create it.
const AttemptsTable = "worker_attempts"

// dedupSQL inserts the dedup row; zero rows inserted means a duplicate.
// attemptSQL, sent in the same round trip (pipelined) as a statement of
// its own, reads the message's attempt record. It must be a separate
// statement: when the insert waited for a concurrent copy of the message
// to roll back (a redelivery racing the failed attempt it replaces), only
// a statement started after the wait sees the attempt that copy recorded
// just before its rollback.
const (
	dedupSQL   = `INSERT INTO processed_messages (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`
	attemptSQL = `SELECT attempts, dead, last_error, snoozes FROM worker_attempts WHERE consumer = $1 AND message_id = $2`
)

// recordAttemptSQL records a failed attempt; it never lowers the count
// nor clears the dead flag.
const recordAttemptSQL = `INSERT INTO worker_attempts (consumer, message_id, attempts, last_error, dead) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (consumer, message_id) DO UPDATE SET
	attempts = GREATEST(worker_attempts.attempts, EXCLUDED.attempts),
	last_error = EXCLUDED.last_error,
	dead = worker_attempts.dead OR EXCLUDED.dead,
	updated_at = now()`

// clearAttemptsSQL deletes the attempt record of a message that succeeded
// or reached the DLQ.
const clearAttemptsSQL = `DELETE FROM worker_attempts WHERE consumer = $1 AND message_id = $2`

// attemptRecord is a message's row of AttemptsTable (zero: none).
type attemptRecord struct {
	attempts  int    // the number of the last failed attempt
	dead      bool   // the DLQ was decided and not confirmed
	lastError string // the reason of the last failed attempt
	snoozes   int    // deliveries sent back by Snooze, not counted as attempts
}

// withAttempt returns msg with Attempt set to the attempt the record
// says this delivery is: the broker's count less the snoozes (Snooze:
// each was a delivery the broker counted, not an attempt), at least one
// past the last failed attempt, or, for a
// message whose DLQ was decided, that last attempt (whatever the broker
// counted since). A message without HeaderLastError gets the record's
// reason (the broker retried it in place, Capabilities.RetryInPlace, or
// the Retry was lost). msg is returned as is when it already says so;
// otherwise a shallow copy (Body is shared and must not be modified
// either; Headers is a new map when the reason was added).
func withAttempt(msg *broker.Message, rec attemptRecord) *broker.Message {
	want := max(msg.Attempt-rec.snoozes, 1, rec.attempts+1)
	if rec.dead {
		want = max(rec.attempts, 1)
	}
	addReason := rec.lastError != "" && msg.Headers[broker.HeaderLastError] == ""
	if want == msg.Attempt && !addReason {
		return msg
	}
	c := *msg
	c.Attempt = want
	if addReason {
		c.Headers = make(map[string]string, len(msg.Headers)+1)
		maps.Copy(c.Headers, msg.Headers)
		c.Headers[broker.HeaderLastError] = rec.lastError
	}
	return &c
}

// errDatabase marks a failure to begin the transaction or to insert the
// dedup row for a reason that is not the message's: the worker holds the
// delivery and tries again instead of spending an attempt.
var errDatabase = errors.New("worker: database unavailable")

// settleTimeout bounds a settlement (Ack, Retry, DeadLetter, Extend) and a
// rollback, which run on a context that a shutdown does not cancel.
const settleTimeout = 10 * time.Second

// Config configures a Worker. The zero value of every optional field means
// the documented default.
type Config struct {
	// Consumer names the consuming application for deduplication: a message
	// ID is processed once per Consumer, so two consumers of one event each
	// handle it once. Required.
	Consumer string
	// Queue is the declared work queue to consume. Required.
	Queue string
	// Pool is the PostgreSQL pool holding processed_messages and the
	// handler's tables. Size it to at least Concurrency connections
	// (pgxpool's pool_max_conns); New logs a warning when it is smaller.
	// Required.
	Pool *pgxpool.Pool
	// Broker delivers the messages. Required.
	Broker broker.Broker
	// Handler handles each message. Required, unless SQLHandler or Router
	// is set instead.
	Handler Handler
	// SQLHandler, set instead of Handler, handles each message in a
	// database/sql transaction (pgx's stdlib driver over Pool) holding the
	// dedup row: for services written on database/sql. With BatchSize > 1
	// the batch's transaction, a savepoint per message, as for Handler.
	// Without per-type options or abandonment of a handler that overruns
	// HandlerTimeout.
	SQLHandler SQLHandler
	// Router, instead of Handler, handles each message
	// (Router.HandleMessage) with the options of its type
	// (Router.Route): the type's MaxAttempts and RetryDelays take the
	// place of Policy, and its Timeout that of HandlerTimeout, for its
	// messages; a type without options, or without a route, uses the
	// worker's. New and Run refuse options the broker cannot honour, as
	// for the worker's own settings. *ferry.Mux is a Router. Set one of
	// Handler, SQLHandler or Router.
	Router Router
	// Topology, when its Exchange is set, is declared by Run before
	// subscribing (broker.Broker.Declare is idempotent), must contain Queue,
	// is checked against the broker's Capabilities, and gives the default
	// policy its delays (the queue's RetryDelays). Optional: without it the
	// queue must have been declared on Broker before Run.
	Topology broker.Topology
	// Concurrency is the number of messages handled at once, each holding
	// one database connection while it runs. Defaults to
	// DefaultConcurrency (10).
	Concurrency int
	// Prefetch bounds the deliveries received and not yet settled
	// (broker.SubscribeOptions.Prefetch). Defaults to broker.DefaultPrefetch
	// (10), or to Concurrency × BatchSize when that is larger, so no
	// handler idles for want of a delivery; on a queue with priorities
	// (per level) to twice Concurrency × BatchSize, so that a free
	// handler finds the top level's next delivery already fetched.
	Prefetch int
	// Ordered asks the subscription for per-key order
	// (broker.SubscribeOptions.Ordered): a message with a Key is handed to
	// a handler only after the previous message of its Key was settled, so
	// the handlers of one key run one after the other, in the order the
	// broker holds them, up to retries (a retried message comes back after
	// later messages of its key). Messages of other keys run concurrently.
	// It holds per worker: several workers on one queue share its messages.
	// Run fails with an error wrapping broker.ErrUnsupported on a broker
	// whose Capabilities.Ordering is broker.OrderingNone.
	Ordered bool
	// PriorityWeights, for a queue with priorities (Topology's
	// broker.Queue.Priorities), are the levels' shares, lowest level
	// first, one per level: when several levels have messages ready they
	// are handled in proportion (smooth weighted round robin), so a low
	// level is never starved. Nil: strict, a level is served only while
	// every higher one is empty. See broker.Prioritized for what either
	// guarantees. New fails with ErrInvalidConfig when the count is not
	// the queue's level count or a weight is not positive.
	PriorityWeights []int
	// BatchSize is the most deliveries one handling goroutine handles in
	// one transaction. Defaults to DefaultBatchSize (1): one transaction per
	// delivery. With BatchSize > 1 a goroutine takes the deliveries already
	// received (up to BatchSize, waiting at most BatchLinger for each
	// further one, never for a full batch), inserts their dedup
	// rows with one statement, runs the handler for each new message in
	// its own SAVEPOINT, and commits once: fewer transactions and WAL
	// flushes per message, hence more messages per second, with the same
	// guarantees per message (package doc, "Batches"). Use it only for
	// handlers whose effects are all in the transaction: a side effect
	// outside the database (an e-mail) happens before the whole batch
	// commits, so a crash or a failed commit repeats it for every message
	// of the batch. At most MaxBatchSize (64).
	BatchSize int
	// BatchLinger is how long, with BatchSize > 1, a handling goroutine
	// waits for each further delivery once it holds one: it bridges the
	// hand-off from the broker adapter's receiving goroutine, and a batch
	// is cut at the first wait that expires. Defaults to
	// DefaultBatchLinger (200 µs); at most MaxBatchLinger (1 s). Every
	// batch not filled up waits it once, so a long linger delays messages
	// that trickle in.
	BatchLinger time.Duration
	// AckDeadline is the broker's ack deadline (broker.SubscribeOptions);
	// while a handler runs, the worker calls Delivery.Extend every
	// AckDeadline/3. Defaults to DefaultAckDeadline (30 s).
	AckDeadline time.Duration
	// HandlerTimeout bounds each attempt: the handler's ctx is cancelled
	// that long after the attempt began, and its error (wrapped in
	// ErrHandlerTimeout) is an ordinary failed attempt, retried under the
	// policy. A handler that ignores its ctx and is still running
	// HandlerTimeoutGrace (1 s) later is abandoned: the worker cancels its
	// query and closes its database connection, so PostgreSQL rolls its
	// transaction back (releasing the dedup row for the retry), records
	// the failed attempt and settles the delivery (Retry or the DLQ); the
	// goroutine left running returns its connection to the pool, closed,
	// when the handler returns. A Router's type may set its own
	// (TypeOptions.Timeout). Defaults to 0: no bound (the handler's own
	// timeouts, e.g. the sample app's SMTP timeouts, are then all there
	// is). It must be shorter than the broker's
	// broker.Limits.SettleTimeout (RabbitMQ consumer_timeout, SQS 12 h per
	// receive), which Run checks.
	HandlerTimeout time.Duration
	// Policy decides retries after ordinary handler errors. Defaults to
	// BackoffPolicy{} (5 attempts) with the Topology queue's RetryDelays as
	// Delays when Topology is set, else 30 s.
	Policy RetryPolicy
	// ShutdownTimeout is how long Run waits, after its ctx is cancelled, for
	// the in-flight handlers to finish before cancelling their ctx; Run
	// returns at most ShutdownGrace (2 s) later. Defaults to
	// DefaultShutdownTimeout (30 s).
	ShutdownTimeout time.Duration
	// Logger receives the worker's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// OnFailure, when set, is called after every failed attempt; see
	// FailureFunc.
	OnFailure FailureFunc
	// OnOutcome, when set, is called after each delivery was settled (or
	// its settlement failed, which is logged and reported to
	// OnSettleFailure: OutcomeUnsettled for a failed Ack, Retry or
	// DeadLetter), with the outcome (msg.Attempt as the handler saw it) and the
	// time spent in the transaction (dedup insert, handler and commit; with
	// BatchSize > 1 the whole batch's transaction, the same for each of its
	// messages). It is called concurrently from the handling goroutines
	// (the settles of one batch go out at once, so its outcomes come in no
	// set order) and must be fast; the ops helper records Prometheus
	// metrics here.
	OnOutcome func(msg *broker.Message, outcome Outcome, handlerDuration time.Duration)
	// OnSettleFailure, when set, is called once for each settlement
	// (Ack, Retry, DeadLetter, Extend) the broker did not take: those the
	// Delivery method returned an error for, and those the adapter worked
	// around by itself and reported (broker.ReportSettleFailure, e.g. an
	// SQS DeleteMessageBatch entry deleted again with DeleteMessage;
	// f.Recovered is then true). f.Reason is a bounded classification
	// (broker.SettleReason). The worker logs each one at WARN with the
	// broker's error and what happens next, whether or not this is set. It
	// is called concurrently from the handling goroutines and must be
	// fast; the ops helper counts ferry_worker_settle_failures_total here.
	OnSettleFailure func(f broker.SettleFailure)
	// MaxSnoozes is how often one message may be snoozed (Snooze, or a
	// concurrency or rate limit of its type reached) before it goes to
	// the DLQ with a reason saying so, so that a message cannot come back
	// forever unnoticed. The broker's own delivery limit, when it reports
	// one (SQS maxReceiveCount, JetStream MaxDeliver; broker.Limits), cuts
	// it further: each snooze is a delivery the broker counts. Defaults
	// to DefaultMaxSnoozes (1000); must not be negative.
	MaxSnoozes int
}

// Worker consumes one queue and runs the handler once per message ID and
// Consumer. Create it with New; it is safe for concurrent use, and Run may
// be called again after a Run returned.
type Worker struct {
	cfg     Config
	policy  RetryPolicy
	base    typeSettings // the worker's own settings
	types   typeCache    // the settings of the Router's routes
	caps    broker.Capabilities
	log     *slog.Logger
	running atomic.Bool
	sqlDB   *sql.DB // during Run, with Config.SQLHandler
	// deliveryLimit is the broker's broker.Limits.DeliveryLimit read by
	// Run (0: none or unknown).
	deliveryLimit atomic.Int64
	// gatherTurn, with BatchSize > 1, lets one handling goroutine at a
	// time receive and gather a batch (see receiveBatch).
	gatherTurn chan struct{}
}

// New validates cfg, applies the defaults and checks the configuration
// against cfg.Broker.Capabilities. The error wraps ErrInvalidConfig and
// names the field, or wraps broker.ErrUnsupported when the broker cannot
// honour the policy's delays or the topology. With a Router it checks
// every route's options the same way (see TypeOptions), naming the
// pattern.
func New(cfg Config) (*Worker, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case cfg.Consumer == "":
		return nil, bad("Config.Consumer: required (the dedup name of this consumer)")
	case len(cfg.Consumer) > 200:
		return nil, bad("Config.Consumer: %d bytes, at most 200", len(cfg.Consumer))
	case cfg.Queue == "":
		return nil, bad("Config.Queue: required")
	case cfg.Pool == nil:
		return nil, bad("Config.Pool: required")
	case cfg.Broker == nil:
		return nil, bad("Config.Broker: required")
	case cfg.Handler == nil && cfg.SQLHandler == nil && cfg.Router == nil:
		return nil, bad("Config.Handler: required (or Config.SQLHandler or Config.Router)")
	case (cfg.Handler != nil && cfg.SQLHandler != nil) || (cfg.Handler != nil && cfg.Router != nil) || (cfg.SQLHandler != nil && cfg.Router != nil):
		return nil, bad("Config.Handler, Config.SQLHandler and Config.Router: set one (Router: mux, not Handler: mux.HandleMessage)")
	case cfg.Concurrency < 0:
		return nil, bad("Config.Concurrency %d: must not be negative", cfg.Concurrency)
	case cfg.Prefetch < 0:
		return nil, bad("Config.Prefetch %d: must not be negative", cfg.Prefetch)
	case cfg.BatchSize < 0 || cfg.BatchSize > MaxBatchSize:
		return nil, bad("Config.BatchSize %d: want 0..%d", cfg.BatchSize, MaxBatchSize)
	case cfg.BatchLinger < 0 || cfg.BatchLinger > MaxBatchLinger:
		return nil, bad("Config.BatchLinger %v: want 0..%v", cfg.BatchLinger, MaxBatchLinger)
	case cfg.AckDeadline < 0:
		return nil, bad("Config.AckDeadline %v: must not be negative", cfg.AckDeadline)
	case cfg.ShutdownTimeout < 0:
		return nil, bad("Config.ShutdownTimeout %v: must not be negative", cfg.ShutdownTimeout)
	case cfg.HandlerTimeout < 0:
		return nil, bad("Config.HandlerTimeout %v: must not be negative", cfg.HandlerTimeout)
	case cfg.MaxSnoozes < 0:
		return nil, bad("Config.MaxSnoozes %d: must not be negative", cfg.MaxSnoozes)
	}
	if cfg.MaxSnoozes == 0 {
		cfg.MaxSnoozes = DefaultMaxSnoozes
	}
	if r := cfg.Router; r != nil {
		cfg.Handler = func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
			return r.HandleMessage(context.WithValue(ctx, routerKey{}, r), tx, msg)
		}
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.BatchLinger == 0 {
		cfg.BatchLinger = DefaultBatchLinger
	}
	if cfg.Prefetch == 0 {
		cfg.Prefetch = max(broker.DefaultPrefetch, cfg.Concurrency*cfg.BatchSize)
		if q, ok := cfg.Topology.Queue(cfg.Queue); ok && q.Priorities >= 2 {
			// Each level holds the handlers' worth again beyond those
			// being handled, so that the top level's next delivery is
			// here when a handler is free (the refill of a level takes
			// a round trip to the broker).
			cfg.Prefetch = max(broker.DefaultPrefetch, 2*cfg.Concurrency*cfg.BatchSize)
		}
	}
	if cfg.AckDeadline == 0 {
		cfg.AckDeadline = DefaultAckDeadline
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	hasTopology := cfg.Topology.Exchange != "" || len(cfg.Topology.Queues) > 0
	if hasTopology {
		if err := cfg.Topology.Validate(); err != nil {
			return nil, bad("Config.Topology: %v", err)
		}
		if _, ok := cfg.Topology.Queue(cfg.Queue); !ok {
			return nil, bad("Config.Queue %q: not in Config.Topology", cfg.Queue)
		}
	}
	if len(cfg.PriorityWeights) > 0 {
		q, _ := cfg.Topology.Queue(cfg.Queue)
		if n := len(q.Levels()); n < 2 || len(cfg.PriorityWeights) != n {
			return nil, bad("Config.PriorityWeights: %d weights, the queue %q has %d priority level(s) in Config.Topology", len(cfg.PriorityWeights), cfg.Queue, n)
		}
		for i, wt := range cfg.PriorityWeights {
			if wt <= 0 {
				return nil, bad("Config.PriorityWeights[%d] %d: must be positive", i, wt)
			}
		}
	}
	if cfg.Policy == nil {
		p := BackoffPolicy{}
		if q, ok := cfg.Topology.Queue(cfg.Queue); ok {
			p.Delays = append([]time.Duration(nil), q.Delays()...)
		}
		cfg.Policy = p
	}
	if v, ok := cfg.Policy.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return nil, bad("Config.Policy: %v", err)
		}
	}
	req := broker.Requirements{Topology: cfg.Topology}
	if dl, ok := cfg.Policy.(DelayLister); ok {
		req.RetryDelays = dl.RetryDelays()
	}
	caps := cfg.Broker.Capabilities()
	if err := caps.Check(req); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	w := &Worker{cfg: cfg, policy: cfg.Policy, caps: caps, log: cfg.Logger.With("consumer", cfg.Consumer, "queue", cfg.Queue),
		gatherTurn: make(chan struct{}, 1)}
	w.base = typeSettings{policy: cfg.Policy, timeout: cfg.HandlerTimeout}
	if err := w.buildTypes(); err != nil {
		return nil, err
	}
	if conns := int(cfg.Pool.Stat().MaxConns()); conns < cfg.Concurrency {
		w.log.Warn("worker: database pool smaller than Concurrency; handlers will wait for connections",
			"pool_max_conns", conns, "concurrency", cfg.Concurrency)
	}
	if hasTopology && !caps.NativeDelay {
		q, _ := cfg.Topology.Queue(cfg.Queue)
		levels := q.Delays()
		longest := levels[len(levels)-1]
		for _, d := range levels {
			longest = max(longest, d)
		}
		for _, d := range req.RetryDelays {
			if d > longest {
				w.log.Warn("worker: the policy asks for a delay longer than the queue's longest retry level; the broker will use that level",
					"delay", d, "longest_level", longest, "broker", caps.Name)
			}
		}
	}
	return w, nil
}

// Run consumes the queue until ctx is cancelled. It declares Topology when
// set, subscribes, and handles up to Concurrency messages at once. When ctx
// is cancelled it stops receiving, waits up to ShutdownTimeout for the
// in-flight handlers (their ctx stays alive meanwhile), then cancels the
// handlers still running — their deliveries are left unsettled, so the
// broker redelivers them — waits at most ShutdownGrace more for them, and
// returns nil: at most ShutdownTimeout + ShutdownGrace after ctx was
// cancelled. It returns an error when
// Declare or Subscribe fail with ctx still alive, or when the broker is
// closed under it (wrapping broker.ErrClosed); ErrAlreadyRunning when
// another Run of this Worker is active. Before subscribing it reads the
// broker's limits for the queue (broker.LimitReporter) and returns an
// error wrapping ErrInvalidConfig, naming both settings and a value that
// works, when the worker's settings, or a Router type's options, contradict
// them (see CheckLimits). With a Router it first checks the options of
// every route again (routes registered after New), and returns New's
// errors for them.
func (w *Worker) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer w.running.Store(false)
	if ctx.Err() != nil {
		return nil
	}
	// Routes registered between New and Run are checked now.
	if err := w.buildTypes(); err != nil {
		return err
	}
	if w.cfg.Topology.Exchange != "" {
		if err := w.cfg.Broker.Declare(ctx, w.cfg.Topology); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("worker: declare topology: %w", err)
		}
	}
	if err := w.checkBrokerLimits(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	sub, err := w.subscribe(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	// Handlers and settlements run on hctx, which keeps ctx's values but
	// is cancelled only when the shutdown timeout expires.
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()
	loopCtx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()

	var (
		fatalOnce sync.Once
		fatal     error
	)
	setFatal := func(err error) {
		fatalOnce.Do(func() { fatal = err })
		stopLoops()
	}

	if w.cfg.SQLHandler != nil {
		w.sqlDB = w.openSQL()
		defer w.sqlDB.Close()
	}
	w.log.Info("worker: started", "concurrency", w.cfg.Concurrency, "prefetch", w.cfg.Prefetch, "batch_size", w.cfg.BatchSize, "broker", w.caps.Name)
	var wg sync.WaitGroup
	for range w.cfg.Concurrency {
		wg.Go(func() { w.loop(loopCtx, hctx, sub, setFatal) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	<-loopCtx.Done()
	if err := sub.Close(); err != nil {
		w.log.Warn("worker: close subscription", "err", err)
	}
	timer := time.NewTimer(w.cfg.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		w.log.Warn("worker: shutdown timeout expired; cancelling the handlers still running, their messages will be redelivered",
			"shutdown_timeout", w.cfg.ShutdownTimeout)
		hcancel()
		select {
		case <-done:
		case <-time.After(ShutdownGrace):
			w.log.Error("worker: handlers still running after their context was cancelled; returning without them, their messages will be redelivered",
				"shutdown_grace", ShutdownGrace)
		}
	}
	w.log.Info("worker: stopped")
	return fatal
}

// subscribe subscribes to the queue: to each of its priority levels,
// merged by broker.Prioritized, when Config.Topology gives it
// Priorities, else to the queue alone (still through Prioritized, which
// takes the priority prefix off the Type of messages that other queues'
// priorities gave one).
func (w *Worker) subscribe(ctx context.Context) (broker.Subscription, error) {
	names := []string{w.cfg.Queue}
	q, known := w.cfg.Topology.Queue(w.cfg.Queue)
	if known {
		names = q.Levels()
	}
	opts := broker.SubscribeOptions{Prefetch: w.cfg.Prefetch, AckDeadline: w.cfg.AckDeadline, Ordered: w.cfg.Ordered}
	subs := make([]broker.Subscription, 0, len(names))
	closeAll := func() {
		for _, o := range subs {
			_ = o.Close()
		}
	}
	for _, n := range names {
		s, err := w.cfg.Broker.Subscribe(ctx, n, opts)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("worker: subscribe %s: %w", n, err)
		}
		subs = append(subs, s)
	}
	if !known {
		// Without a Topology the worker does not know whether its queue
		// has priority levels: it consumes those declared on its Broker
		// (by another part of the process, e.g. the relay's pipeline),
		// so that no level is left unconsumed.
		for k := 1; k <= broker.MaxPriority; k++ {
			n := broker.PriorityQueueName(w.cfg.Queue, k)
			s, err := w.cfg.Broker.Subscribe(ctx, n, opts)
			if err != nil {
				break // ErrUnknownQueue: no such level
			}
			w.log.Info("worker: consuming a priority level of the queue declared on this broker", "level", n)
			subs = append(subs, s)
		}
	}
	// New checked PriorityWeights against the levels of Config.Topology.
	sub, err := broker.Prioritized(subs, w.cfg.PriorityWeights)
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("%w: Config.PriorityWeights: %v", ErrInvalidConfig, err)
	}
	return sub, nil
}

// loop receives and handles deliveries until loopCtx is done; with
// BatchSize > 1 it receives them through receiveBatch.
func (w *Worker) loop(loopCtx, hctx context.Context, sub broker.Subscription, setFatal func(error)) {
	backoff := 100 * time.Millisecond
	for loopCtx.Err() == nil {
		var (
			d     broker.Delivery
			batch []broker.Delivery
			err   error
		)
		if w.cfg.BatchSize == 1 {
			d, err = sub.Receive(loopCtx)
		} else {
			batch, err = w.receiveBatch(loopCtx, sub)
		}
		if err != nil {
			if loopCtx.Err() != nil {
				return
			}
			if errors.Is(err, broker.ErrClosed) {
				setFatal(fmt.Errorf("worker: receive from %s: %w", w.cfg.Queue, err))
				return
			}
			w.log.Warn("worker: receive", "err", err, "retry_in", backoff)
			select {
			case <-loopCtx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if batch == nil {
			w.handle(loopCtx, hctx, d)
			continue
		}
		w.handleBatch(loopCtx, hctx, batch)
	}
}

// receiveBatch waits for the gathering turn (gatherTurn), receives a
// delivery, gathers the batch after it and passes the turn on, so that
// one handling goroutine at a time gathers. Without turns every idle
// goroutine waits in Receive, and a delivery that arrives during one
// goroutine's BatchLinger goes to an idle one, which starts a batch of
// its own: on a broker that pushes deliveries one at a time (RabbitMQ)
// 84 % of them were handled as batches of one (bench/README.md, "The
// third run"). The error is Receive's, or loopCtx's when it is done
// before the turn comes.
func (w *Worker) receiveBatch(loopCtx context.Context, sub broker.Subscription) ([]broker.Delivery, error) {
	select {
	case <-loopCtx.Done():
		return nil, loopCtx.Err()
	case w.gatherTurn <- struct{}{}:
	}
	defer func() { <-w.gatherTurn }()
	d, err := sub.Receive(loopCtx)
	if err != nil {
		return nil, err
	}
	return w.gather(loopCtx, sub, d), nil
}

// handle processes one delivery and settles it. runCtx is Run's ctx
// (done when the shutdown starts), ctx the handlers' ctx.
func (w *Worker) handle(runCtx, ctx context.Context, d broker.Delivery) {
	msg := d.Message()
	if msg.ID == "" {
		w.settle(ctx, d, msg, w.fail(ctx, msg, ErrNoMessageID, true), 0)
		return
	}
	w.handleExtended(runCtx, ctx, d, w.startExtender(d))
}

// handleExtended is handle for a delivery with an ID whose extender ext
// already runs; it stops ext before settling.
func (w *Worker) handleExtended(runCtx, ctx context.Context, d broker.Delivery, ext *extender) {
	msg := d.Message()
	start := time.Now()
	res := w.process(ctx, msg)
	// While the database is unavailable the message is not at fault: hold
	// the delivery and try again, without spending an attempt.
	for backoff := 100 * time.Millisecond; res.err != nil && errors.Is(res.err, errDatabase); backoff = min(2*backoff, 5*time.Second) {
		w.log.Error("worker: database unavailable; holding the message and trying again", "message_id", msg.ID, "err", res.err, "retry_in", backoff)
		select {
		case <-runCtx.Done():
			ext.stop()
			w.log.Warn("worker: shutdown while the database is unavailable; message left for redelivery", "message_id", msg.ID)
			return
		case <-time.After(backoff):
		}
		start = time.Now()
		res = w.process(ctx, msg)
	}
	dur := time.Since(start)
	ext.stop()

	switch {
	case res.dup:
		w.ack(ctx, d, msg, OutcomeDuplicate, dur)
	case res.rec.dead:
		w.deadAgain(ctx, d, res.msg, res.rec, dur)
	case res.err == nil:
		w.ack(ctx, d, res.msg, OutcomeAck, dur)
	case ctx.Err() != nil:
		// Shutdown timeout expired: leave the delivery unsettled so the
		// broker redelivers it without spending an attempt.
		w.log.Warn("worker: handler cancelled by shutdown; message left for redelivery", "message_id", msg.ID, "err", res.err)
	default:
		f := res.fail
		if f == nil {
			f = w.fail(ctx, res.msg, res.err, false)
		}
		w.settle(ctx, d, res.msg, f, dur)
	}
}

// processResult is what process found and did.
type processResult struct {
	dup  bool            // the consumer processed the message before
	rec  attemptRecord   // the message's attempt record
	msg  *broker.Message // the message as the handler saw it (Attempt from rec)
	err  error           // the handler's error, or why it did not run
	fail *failure        // the failed attempt, decided and recorded; nil if not yet
}

// process runs the dedup insert (reading the attempt record), the handler
// and the commit in one transaction. A message whose record says "dead"
// is not handled: the transaction is rolled back and res.rec.dead is set.
func (w *Worker) process(ctx context.Context, msg *broker.Message) (res processResult) {
	if w.cfg.SQLHandler != nil {
		return w.processSQL(ctx, msg)
	}
	res.msg = msg
	if fl := w.settingsFor(msg).flow; fl != nil {
		// The limits are taken before the transaction, in statements of
		// their own that the other replicas see at once; the slot is
		// released once the transaction ended (the deferred release runs
		// after the commit or rollback below).
		hold, err := w.admit(ctx, fl, msg)
		var sz *SnoozeError
		switch {
		case errors.As(err, &sz):
			res.err = err
			res.fail = w.fail(ctx, msg, err, false)
			return res
		case err != nil && ctx.Err() != nil:
			res.err = ctx.Err()
			return res
		case err != nil:
			res.err = fmt.Errorf("%w: %w", errDatabase, err)
			return res
		}
		defer hold.release(ctx)
	}
	tx, inserted, began, err := w.beginDedup(ctx, msg.ID, &res.rec)
	if err != nil {
		if tx != nil {
			w.rollback(ctx, tx)
		}
		var pgErr *pgconn.PgError
		switch {
		case ctx.Err() != nil:
			res.err = ctx.Err()
		case !began:
			res.err = fmt.Errorf("%w: begin transaction: %w", errDatabase, err)
		case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22"):
			// Data exception: the message ID itself is unusable (e.g. not
			// valid UTF-8); retrying cannot help.
			res.err = Permanent(fmt.Errorf("worker: message ID %q: insert into %s: %w", msg.ID, DedupTable, err))
		default:
			// Connection lost, table missing (migrations not run), ...:
			// not the message's fault.
			res.err = fmt.Errorf("%w: insert into %s: %w", errDatabase, DedupTable, err)
		}
		return res
	}
	if !inserted {
		w.rollback(ctx, tx)
		res.dup = true
		return res
	}
	res.msg = withAttempt(msg, res.rec)
	if res.rec.dead {
		w.rollback(ctx, tx)
		return res
	}
	ab, err := w.callHandler(ctx, tx, res.msg, func() { w.rollback(ctx, tx) })
	if ab != nil {
		// The handler overran its timeout and ignores its ctx: record the
		// failed attempt, then roll the transaction back by closing its
		// connection (tx belongs to the handler's goroutine now).
		res.fail = w.fail(ctx, res.msg, err, false)
		ab.kill()
		res.err = err
		return res
	}
	if err != nil {
		if ctx.Err() == nil {
			// Record the failed attempt before the rollback releases the
			// dedup row a redelivered copy may be waiting for.
			res.fail = w.fail(ctx, res.msg, err, false)
		}
		w.rollback(ctx, tx)
		res.err = err
		return res
	}
	if res.rec.attempts > 0 || res.rec.snoozes > 0 {
		if _, err := tx.Exec(ctx, clearAttemptsSQL, w.cfg.Consumer, msg.ID); err != nil {
			w.rollback(ctx, tx)
			res.err = fmt.Errorf("worker: delete from %s: %w", AttemptsTable, err)
			return res
		}
	}
	if err := commit(ctx, tx); err != nil {
		w.rollback(ctx, tx)
		res.err = fmt.Errorf("worker: commit: %w", err)
	}
	return res
}

// beginDedup opens the handler's transaction, inserts the dedup row of id
// and reads its attempt record into rec, all in one round trip (BEGIN
// pipelined with the two statements, pgx.Batch.BeginTx). inserted is false
// for a duplicate. began is false when the transaction could not be
// opened (no connection, BEGIN failed). tx is nil only when no connection
// was acquired; otherwise the caller rolls it back on error.
func (w *Worker) beginDedup(ctx context.Context, id string, rec *attemptRecord) (tx pgx.Tx, inserted, began bool, err error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(dedupSQL, w.cfg.Consumer, id)
	b.Queue(attemptSQL, w.cfg.Consumer, id)
	br := w.cfg.Pool.SendBatch(ctx, b)
	tx = br.Tx()
	var tag pgconn.CommandTag
	if _, err = br.Exec(); err == nil {
		began = true
		tag, err = br.Exec()
		if err == nil {
			err = br.QueryRow().Scan(&rec.attempts, &rec.dead, &rec.lastError, &rec.snoozes)
			if errors.Is(err, pgx.ErrNoRows) {
				err = nil
			}
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return tx, false, began, err
	}
	return tx, tag.RowsAffected() == 1, true, nil
}

// commit commits tx on a context detached from ctx's cancellation: once a
// handler returned nil its work, which may include a side effect outside
// the database such as a mail the SMTP server accepted, must be recorded
// even when the shutdown timeout cancelled ctx meanwhile; rolling it back
// would make the redelivery do it again.
func commit(ctx context.Context, tx pgx.Tx) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	return tx.Commit(cctx)
}

// HandlerTimeoutGrace is how long the worker waits, once an attempt's
// timeout (Config.HandlerTimeout, TypeOptions.Timeout) cancelled the
// handler's ctx, for the handler to return before it abandons it: rolls
// its transaction back by closing its database connection and settles
// the delivery as a failed attempt.
const HandlerTimeoutGrace = time.Second

// abandonment is a handler still running after its timeout and grace:
// its goroutine owns tx and rolls it back when the handler returns.
type abandonment struct {
	w  *Worker
	pc *pgconn.PgConn
	nc net.Conn
}

// kill cancels the statement the abandoned handler may be running and
// closes its connection, so that PostgreSQL rolls its transaction back
// and releases its locks (the dedup row above all) now. Both are safe
// while another goroutine uses the connection: a cancel request goes over
// a connection of its own, and net.Conn.Close may be called concurrently.
func (a *abandonment) kill() {
	if a.pc == nil || a.nc == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	if err := a.pc.CancelRequest(ctx); err != nil {
		a.w.log.Warn("worker: cancel the statement of an abandoned handler", "err", err)
	}
	if err := a.nc.Close(); err != nil {
		a.w.log.Warn("worker: close the connection of an abandoned handler", "err", err)
	}
}

// callHandler runs the handler with msg's settings (settingsFor): without
// a timeout in the calling goroutine; with one, in a goroutine of its
// own, with a ctx cancelled at the timeout. A handler's error after its
// timeout wraps ErrHandlerTimeout. When the handler is still running
// HandlerTimeoutGrace after the timeout, callHandler returns an error
// wrapping ErrHandlerTimeout and an abandonment: the caller must not
// touch tx any more, records the failed attempt and calls kill; the
// handler's goroutine calls release (the rollback) when the handler
// returns.
func (w *Worker) callHandler(ctx context.Context, tx pgx.Tx, msg *broker.Message, release func()) (*abandonment, error) {
	s := w.settingsFor(msg)
	if s.err != nil {
		return nil, s.err
	}
	if s.timeout <= 0 {
		return nil, w.runHandler(ctx, tx, msg)
	}
	ab := &abandonment{w: w}
	if c := tx.Conn(); c != nil && c.PgConn() != nil {
		ab.pc = c.PgConn()
		ab.nc = ab.pc.Conn()
	}
	hctx, cancel := context.WithTimeout(ctx, s.timeout)
	var (
		mu     sync.Mutex
		gaveUp bool
		result error
	)
	done := make(chan struct{})
	go func() {
		err := w.runHandler(hctx, tx, msg)
		if err != nil && hctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w after %v: %w", ErrHandlerTimeout, s.timeout, err)
		}
		cancel()
		mu.Lock()
		defer mu.Unlock()
		if gaveUp {
			w.log.Warn("worker: an abandoned handler returned; its transaction was rolled back", "message_id", msg.ID, "attempt", msg.Attempt, "err", err)
			release()
			return
		}
		result = err
		close(done)
	}()
	t := time.NewTimer(s.timeout + HandlerTimeoutGrace)
	defer t.Stop()
	select {
	case <-done:
		return nil, result
	case <-t.C:
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case <-done:
		return nil, result
	default:
	}
	gaveUp = true
	w.log.Error("worker: handler still running after its timeout ignores its ctx; abandoning it: its transaction is rolled back and the attempt fails",
		"message_id", msg.ID, "type", msg.Type, "attempt", msg.Attempt, "timeout", s.timeout, "grace", HandlerTimeoutGrace)
	return ab, fmt.Errorf("%w after %v: the handler ignored its ctx and was abandoned %v later; its transaction was rolled back", ErrHandlerTimeout, s.timeout, HandlerTimeoutGrace)
}

// runHandler runs the handler, turning a panic into an error wrapping
// ErrPanic; the stack goes to the log, not into the DLQ reason.
func (w *Worker) runHandler(ctx context.Context, tx pgx.Tx, msg *broker.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrPanic, r)
			w.log.Error("worker: handler panicked", "message_id", msg.ID, "attempt", msg.Attempt, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	// The timeout (Config.HandlerTimeout or the type's) is applied by
	// callHandler.
	return w.cfg.Handler(ctx, tx, msg)
}

func (w *Worker) rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if err := tx.Rollback(rctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		w.log.Warn("worker: rollback", "err", err)
	}
}

func (w *Worker) ack(ctx context.Context, d broker.Delivery, msg *broker.Message, o Outcome, dur time.Duration) {
	sctx, cancel := w.settleContext(ctx, msg)
	defer cancel()
	if err := d.Ack(sctx); err != nil {
		// The transaction committed (or the message was a duplicate): the
		// redelivery will be absorbed by the dedup row.
		next := "the broker will redeliver it and the worker will ack the redelivery as a duplicate (the transaction committed)"
		if o == OutcomeDuplicate {
			next = "the broker will redeliver it and the worker will ack the redelivery as a duplicate"
		}
		w.settleFailed(broker.SettleFailure{Op: broker.SettleAck, MessageID: msg.ID, Err: err, Next: next}, msg.Attempt)
		w.outcome(msg, OutcomeUnsettled, dur)
		return
	}
	w.outcome(msg, o, dur)
}

// settleContext returns the context of one settlement of msg: ctx's
// values without its cancellation, bounded by settleTimeout, carrying the
// SettleObserver through which the adapter reports what it worked around.
func (w *Worker) settleContext(ctx context.Context, msg *broker.Message) (context.Context, context.CancelFunc) {
	sctx := broker.WithSettleObserver(context.WithoutCancel(ctx), func(f broker.SettleFailure) {
		if f.MessageID == "" {
			f.MessageID = msg.ID
		}
		w.settleFailed(f, msg.Attempt)
	})
	return context.WithTimeout(sctx, settleTimeout)
}

// settleFailed logs a settlement the broker did not take, once, with the
// broker's error, its classification and what happens next, and passes it
// to Config.OnSettleFailure.
func (w *Worker) settleFailed(f broker.SettleFailure, attempt int) {
	if f.Reason == "" {
		f.Reason = broker.SettleReason(f.Err)
	}
	msg := "worker: " + string(f.Op) + " failed"
	if f.Recovered {
		msg = "worker: " + string(f.Op) + " refused by the broker, worked around by the adapter"
	}
	w.log.Warn(msg, "op", string(f.Op), "message_id", f.MessageID, "attempt", attempt,
		"reason", f.Reason, "err", f.Err, "next", f.Next, "broker", w.caps.Name)
	if w.cfg.OnSettleFailure == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			w.log.Error("worker: OnSettleFailure panicked", "panic", r)
		}
	}()
	w.cfg.OnSettleFailure(f)
}

// failure is a failed attempt: the decision between retry and DLQ, and
// whether it is in AttemptsTable.
type failure struct {
	err      error         // the handler's error
	snooze   bool          // a snooze: Retry after delay, no attempt counted
	quiet    bool          // a flow limit's snooze: logged at Debug
	dead     bool          // to the DLQ
	delay    time.Duration // before the retry, when not dead
	reason   string        // HeaderLastError
	recorded bool          // written to AttemptsTable
}

// fail decides between retry and DLQ for the failed attempt msg.Attempt
// (dead forces the DLQ) and records it in AttemptsTable in its own
// transaction, before anything else happens to the delivery.
func (w *Worker) fail(ctx context.Context, msg *broker.Message, herr error, dead bool) *failure {
	var sz *SnoozeError
	if !dead && msg.ID != "" && !IsPermanent(herr) && errors.As(herr, &sz) {
		return w.snooze(ctx, msg, herr, sz)
	}
	f := &failure{err: herr, dead: dead}
	if !f.dead && !IsPermanent(herr) {
		attempt := max(msg.Attempt, 1)
		var retry bool
		f.delay, retry = w.settingsFor(msg).policy.NextRetry(attempt, herr)
		f.dead = !retry
		var ra *RetryAfterError
		if retry && errors.As(herr, &ra) && ra.Delay > 0 {
			f.delay = ra.Delay
		}
		if w.caps.MaxDelay > 0 && f.delay > w.caps.MaxDelay {
			f.delay = w.caps.MaxDelay
		}
		f.delay = max(f.delay, 0)
	} else {
		f.dead = true
	}
	f.reason = broker.TruncateReason(herr.Error())
	if msg.ID == "" {
		return f
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if err := w.recordAttempt(sctx, msg, f.reason, f.dead); err != nil {
		w.log.Error("worker: could not record the failed attempt; if the settlement fails too, the redelivery's attempt number is the broker's",
			"message_id", msg.ID, "attempt", msg.Attempt, "err", err)
	} else {
		f.recorded = true
	}
	return f
}

// settle runs OnFailure for the failed attempt f and settles the delivery
// as f decided. When the broker refuses the settlement the outcome is
// OutcomeUnsettled and the attempt record decides what the redelivery is.
func (w *Worker) settle(ctx context.Context, d broker.Delivery, msg *broker.Message, f *failure, dur time.Duration) {
	sctx, cancel := w.settleContext(ctx, msg)
	defer cancel()
	if f.snooze {
		w.settleSnooze(sctx, d, msg, f, dur)
		return
	}
	if w.cfg.OnFailure != nil {
		if err := w.onFailure(sctx, msg, f.err, f.dead); err != nil {
			w.log.Error("worker: OnFailure failed", "message_id", msg.ID, "dead", f.dead, "err", err)
		}
	}
	if f.dead {
		w.log.Warn("worker: message dead-lettered", "message_id", msg.ID, "app_id", msg.Headers[broker.HeaderAppID], "type", msg.Type, "attempt", msg.Attempt, "reason", f.reason)
		if err := d.DeadLetter(sctx, f.reason); err != nil {
			then := "the broker will redeliver it and the worker will dead-letter the redelivery without running the handler"
			if !f.recorded {
				then = "the broker will redeliver it"
			}
			w.settleFailed(broker.SettleFailure{Op: broker.SettleDeadLetter, MessageID: msg.ID, Err: err, Next: then}, msg.Attempt)
			w.outcome(msg, OutcomeUnsettled, dur)
			return
		}
		if f.recorded {
			w.clearAttempts(sctx, msg)
		}
		w.recordDead(sctx, msg, max(msg.Attempt, 1), f.reason)
		w.outcome(msg, OutcomeDead, dur)
		return
	}
	w.log.Info("worker: message will be retried", "message_id", msg.ID, "app_id", msg.Headers[broker.HeaderAppID], "type", msg.Type, "attempt", msg.Attempt, "delay", f.delay, "reason", f.reason)
	if err := d.Retry(sctx, f.delay, f.reason); err != nil {
		then := fmt.Sprintf("the broker will redeliver it, without the delay, and the worker will handle the redelivery as attempt %d", msg.Attempt+1)
		if !f.recorded {
			then = "the broker will redeliver it"
		}
		w.settleFailed(broker.SettleFailure{Op: broker.SettleRetry, MessageID: msg.ID, Err: err, Next: then}, msg.Attempt)
		w.outcome(msg, OutcomeUnsettled, dur)
		return
	}
	w.outcome(msg, OutcomeRetry, dur)
}

// settleSnooze sends the snoozed delivery back after f.delay: no
// OnFailure, no attempt counted.
func (w *Worker) settleSnooze(sctx context.Context, d broker.Delivery, msg *broker.Message, f *failure, dur time.Duration) {
	lvl := slog.LevelInfo
	if f.quiet {
		lvl = slog.LevelDebug
	}
	w.log.Log(sctx, lvl, "worker: message snoozed; it comes back without counting an attempt", "message_id", msg.ID, "app_id", msg.Headers[broker.HeaderAppID], "type", msg.Type, "attempt", msg.Attempt, "delay", f.delay, "why", f.err.Error())
	if err := d.Retry(sctx, f.delay, f.reason); err != nil {
		w.settleFailed(broker.SettleFailure{Op: broker.SettleRetry, MessageID: msg.ID, Err: err,
			Next: "the broker will redeliver it, without the delay, and the worker will handle the redelivery (as the same attempt when the snooze was recorded)"}, msg.Attempt)
		w.outcome(msg, OutcomeUnsettled, dur)
		return
	}
	w.outcome(msg, OutcomeSnoozed, dur)
}

// deadAgain dead-letters a redelivery of a message whose DLQ was decided
// by an earlier attempt, whose DeadLetter the broker did not take; the
// handler does not run again. msg.Attempt is that last attempt.
func (w *Worker) deadAgain(ctx context.Context, d broker.Delivery, msg *broker.Message, rec attemptRecord, dur time.Duration) {
	sctx, cancel := w.settleContext(ctx, msg)
	defer cancel()
	w.log.Warn("worker: redelivery of a message already bound for the DLQ; dead-lettering it without running the handler",
		"message_id", msg.ID, "type", msg.Type, "attempt", msg.Attempt, "reason", rec.lastError)
	if err := d.DeadLetter(sctx, rec.lastError); err != nil {
		w.settleFailed(broker.SettleFailure{Op: broker.SettleDeadLetter, MessageID: msg.ID, Err: err,
			Next: "the broker will redeliver it and the worker will dead-letter it again"}, msg.Attempt)
		w.outcome(msg, OutcomeUnsettled, dur)
		return
	}
	w.clearAttempts(sctx, msg)
	w.recordDead(sctx, msg, max(msg.Attempt, rec.attempts, 1), rec.lastError)
	w.outcome(msg, OutcomeDead, dur)
}

// recordAttempt writes the failed attempt msg.Attempt into AttemptsTable,
// in its own transaction.
func (w *Worker) recordAttempt(ctx context.Context, msg *broker.Message, reason string, dead bool) error {
	reason = strings.ReplaceAll(reason, "\x00", "") // PostgreSQL text holds no NUL
	if _, err := w.cfg.Pool.Exec(ctx, recordAttemptSQL, w.cfg.Consumer, msg.ID, max(msg.Attempt, 1), reason, dead); err != nil {
		return fmt.Errorf("worker: insert into %s: %w", AttemptsTable, err)
	}
	return nil
}

// clearAttempts deletes the attempt record of a message the DLQ took, so
// a replay from the DLQ starts again at attempt 1.
func (w *Worker) clearAttempts(ctx context.Context, msg *broker.Message) {
	if _, err := w.cfg.Pool.Exec(ctx, clearAttemptsSQL, w.cfg.Consumer, msg.ID); err != nil {
		w.log.Warn("worker: could not delete the attempt record of a dead-lettered message; a replay of it from the DLQ will be dead-lettered at once",
			"message_id", msg.ID, "table", AttemptsTable, "err", err)
	}
}

// DeadTable is the table where the worker records, per consumer, each
// message the DLQ took (attempt number, reason, time), written after the
// broker confirmed the dead-letter; outbox.JobGet reads it to say "dead"
// (worker_attempts forgets a message once it is dead-lettered). Created by
// outbox.Migrate (migration 8).
const DeadTable = "worker_dead"

const recordDeadSQL = `INSERT INTO worker_dead (consumer, message_id, attempts, last_error) VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, message_id) DO UPDATE SET attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error, dead_at = now()`

// recordDead writes the dead-lettered message into DeadTable; a failure
// is logged and changes nothing else (the DLQ has the message).
func (w *Worker) recordDead(ctx context.Context, msg *broker.Message, attempt int, reason string) {
	reason = strings.ReplaceAll(reason, "\x00", "")
	if _, err := w.cfg.Pool.Exec(ctx, recordDeadSQL, w.cfg.Consumer, msg.ID, attempt, reason); err != nil {
		w.log.Warn("worker: could not record the dead-lettered message; ferry jobs get will not say it is dead",
			"message_id", msg.ID, "table", DeadTable, "err", err)
	}
}

// onFailure runs OnFailure in its own transaction.
func (w *Worker) onFailure(ctx context.Context, msg *broker.Message, herr error, dead bool) (err error) {
	tx, err := w.cfg.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("worker: OnFailure: begin transaction: %w", err)
	}
	defer w.rollback(ctx, tx)
	err = func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%w: OnFailure: %v", ErrPanic, r)
				w.log.Error("worker: OnFailure panicked", "message_id", msg.ID, "panic", r, "stack", string(debug.Stack()))
			}
		}()
		return w.cfg.OnFailure(ctx, tx, msg, herr, dead)
	}()
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("worker: OnFailure: commit: %w", err)
	}
	return nil
}

func (w *Worker) outcome(msg *broker.Message, o Outcome, dur time.Duration) {
	if w.cfg.OnOutcome == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			w.log.Error("worker: OnOutcome panicked", "panic", r)
		}
	}()
	w.cfg.OnOutcome(msg, o, dur)
}

// extender calls Delivery.Extend every AckDeadline/3 while a handler runs.
type extender struct {
	mu      sync.Mutex
	stopped bool
	t       *time.Timer
}

func (w *Worker) startExtender(d broker.Delivery) *extender {
	every := w.cfg.AckDeadline / 3
	e := &extender{}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.t = time.AfterFunc(every, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.stopped {
			return
		}
		msg := d.Message()
		ctx, cancel := w.settleContext(context.Background(), msg)
		ctx, cancel2 := context.WithTimeout(ctx, every)
		err := d.Extend(ctx)
		cancel2()
		cancel()
		if err != nil {
			w.settleFailed(broker.SettleFailure{Op: broker.SettleExtend, MessageID: msg.ID, Err: err,
				Next: fmt.Sprintf("the handler goes on; the worker tries again in %v, and if the ack deadline passes first the broker may redeliver the message to another consumer (the dedup row absorbs the copy once this one commits)", every)}, msg.Attempt)
		}
		e.t.Reset(every)
	})
	return e
}

// stop stops the extender and waits for a running Extend call.
func (e *extender) stop() {
	e.mu.Lock()
	e.stopped = true
	e.t.Stop()
	e.mu.Unlock()
}
