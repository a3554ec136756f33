package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/broker"
)

// Defaults of RelayConfig; a zero field means the default.
const (
	DefaultBatchSize         = 500
	DefaultConcurrency       = 4
	DefaultPollInterval      = 500 * time.Millisecond
	DefaultBatchDelay        = time.Millisecond
	DefaultRecheckDelay      = DefaultNotifyWindow
	DefaultPublishTimeout    = 30 * time.Second
	DefaultRetryBackoff      = time.Second
	DefaultMaxRetryBackoff   = 5 * time.Minute
	DefaultMaxBackoff        = 5 * time.Second
	DefaultRetention         = 7 * 24 * time.Hour
	DefaultRetentionInterval = 5 * time.Minute
	DefaultRetentionBatch    = 1000
)

// MinRetention is the shortest positive RelayConfig.Retention NewRelay
// accepts. The relay deletes processed_messages, the workers'
// deduplication rows, at the same age as the processed outbox rows, and a
// message must find its dedup row for as long as a copy of it can still be
// delivered: a broker redelivery after a worker crashed between its commit
// and its ack, the relay publishing a row again after a crash between
// publish and mark, a duplicate copy waiting in the retry levels
// (broker.Queue.RetryDelays), a DLQ replay. A copy arriving after its row
// was pruned runs the handler again, a silent break of idempotency. One
// hour is above the default retry schedule (5 attempts of 30 s) and a
// worker restart; a longer retry schedule needs a longer Retention, see
// RelayConfig.RedeliveryWindow.
const MinRetention = time.Hour

// MaxBatchSize is the largest RelayConfig.BatchSize accepted.
const MaxBatchSize = 10000

// minBackoff is the first pause after the broker or the database failed.
const minBackoff = 100 * time.Millisecond

// RelayConfig configures a Relay. The zero value of every optional field
// means its documented default.
type RelayConfig struct {
	// Pool is the database holding the outbox (migrated by Migrate).
	// Required. The relay uses up to Concurrency+1 of its connections (the
	// claim loops and retention), plus one dedicated connection of its own
	// for LISTEN (in WAL mode: for the replication stream, and up to two
	// more of the pool, one to wait until the streamed transactions are
	// visible and one to settle); pgxpool's default MaxConns is max(4,
	// GOMAXPROCS), so give a relay sharing its pool with other work a
	// larger one (pool_max_conns in the URL).
	Pool *pgxpool.Pool
	// Broker receives the messages. Required. The caller declares the
	// topology on it (broker.Broker.Declare) before Run; a message whose
	// Type no queue is bound to fails with broker.ErrUnroutable and is
	// retried with backoff like any other failing row.
	Broker broker.Broker
	// Destination is the outbox this relay publishes: it claims only the
	// rows whose Event.Destination is Destination, and never touches (so
	// never publishes or parks) another destination's rows, which their
	// own relays publish (see the package documentation, "Destinations").
	// Give the relays of each topology (exchange) their own destination
	// and enqueue with it. At most MaxDestinationBytes bytes of printable
	// ASCII without spaces. Defaults to DefaultDestination ("default").
	Destination string
	// BatchSize is the number of rows claimed and published per
	// transaction, 1..MaxBatchSize. In WAL mode it is the most events of
	// one Publish call; a batch of up to Concurrency×BatchSize events is
	// split across the publishing lanes and settled in one transaction
	// (see Concurrency). Defaults to DefaultBatchSize (500: BenchmarkCLIRelayDrain
	// measured a backlog drained 1.4× as fast as with 100, on RabbitMQ, one run).
	BatchSize int
	// Concurrency is the number of claim loops run by one relay, 1..64.
	// They claim disjoint batches (SKIP LOCKED; the rows of one partition
	// key go to one loop at a time, see the package documentation,
	// "Order", so when one batch holds every key of the backlog, as with
	// a few keys finely interleaved, the other loops find nothing to claim
	// until it commits), so one loop's database work
	// overlaps another's wait for confirms; one loop serves a light load,
	// and the others join while batches come back full. Defaults to
	// DefaultConcurrency (4; BenchmarkRelay measured about 0.5 of the raw
	// confirmed publish rate with 1-2 loops and about 0.8 with 4).
	//
	// In WAL mode it is also the number of publishing lanes of the
	// stream: the events of a partition key all go to one lane (by a
	// hash of the key; events without a key to the least loaded lane),
	// which publishes them in commit order, one Publish call after the
	// other, while the other lanes publish other keys at once; up to 4
	// batches of up to Concurrency×BatchSize events are in flight, and
	// they are settled in order (see the package documentation, "WAL
	// relay"). 1 publishes every event in commit order, one call at a
	// time.
	Concurrency int
	// PollInterval is how often the relay looks for rows without having
	// been notified, a fallback for lost notifications; it is the longest
	// a committed row waits while the relay and the broker are up (see the
	// package documentation, "Latency"). Defaults to DefaultPollInterval
	// (500 ms).
	PollInterval time.Duration
	// BatchDelay is how long a claim loop waits, after a batch that
	// claimed rows but fewer than BatchSize, before it claims again, so
	// that the rows committed meanwhile go out together in one batch (one
	// claim, one confirm round, one commit) rather than one batch per
	// NOTIFY. A loop woken from idle claims at once, so an idle relay
	// publishes a new row without this delay. Negative claims again at
	// once. Defaults to DefaultBatchDelay (1 ms).
	BatchDelay time.Duration
	// RecheckDelay is how long after an empty claim that followed a
	// wake-up or a batch the relay claims once more before going idle, to
	// find the rows whose Enqueue left the NOTIFY to another transaction
	// (SetNotifyWindow) and committed after that claim. Keep it at least
	// the producers' notify window. Negative disables the recheck (only
	// sensible with SetNotifyWindow(0)). Defaults to DefaultRecheckDelay
	// (2 ms, DefaultNotifyWindow).
	RecheckDelay time.Duration
	// PublishTimeout bounds one batch's broker.Broker.Publish. Defaults to
	// DefaultPublishTimeout (30 s).
	PublishTimeout time.Duration
	// RetryBackoff is the delay before a row that failed for a reason of
	// its own (broker.IsMessageFault: broker.ErrInvalidMessage,
	// broker.ErrUnroutable, broker.ErrMessageTooLarge, broker.ErrNacked) is
	// claimed again after its first failure; it doubles with each further
	// failure up to MaxRetryBackoff. Such rows are retried forever (or
	// until an operator drops them, see DropParked). Defaults to
	// DefaultRetryBackoff (1 s).
	RetryBackoff time.Duration
	// MaxRetryBackoff caps RetryBackoff's doubling. Defaults to
	// DefaultMaxRetryBackoff (5 min).
	MaxRetryBackoff time.Duration
	// MaxBackoff caps the relay's pause while the broker or the database is
	// unreachable: the pause starts at 100 ms and doubles, for the whole
	// relay (all its claim loops), and only one claim loop at a time tries
	// again after each pause. Defaults to DefaultMaxBackoff (5 s).
	MaxBackoff time.Duration
	// Retention is how long processed outbox rows and processed_messages
	// rows are kept before the relay deletes them. Negative disables the
	// deletion. Defaults to DefaultRetention (7 days). A positive value
	// must be at least MinRetention and at least RedeliveryWindow
	// (otherwise NewRelay returns ErrInvalidConfig): the dedup rows must
	// outlive every redelivery of their message.
	Retention time.Duration
	// RedeliveryWindow is how long after a message was first handled a
	// copy of it may still reach a worker through the retry levels: the
	// workers' longest retry delay times their maximum attempts
	// (RedeliveryWindowFor). Retention must not be shorter. Zero means
	// only MinRetention applies; negative is an error.
	RedeliveryWindow time.Duration
	// RetentionInterval is the pause between two retention passes; the
	// first runs when Run starts. Defaults to DefaultRetentionInterval
	// (5 min).
	RetentionInterval time.Duration
	// RetentionBatch is the number of rows one retention DELETE removes,
	// so that no statement holds locks for long. Defaults to
	// DefaultRetentionBatch (1000).
	RetentionBatch int
	// Logger receives the relay's logs: one line per change of the
	// broker's or database's availability (not one per batch), and one per
	// batch with failed rows. Defaults to slog.Default().
	Logger *slog.Logger
	// OnBatch, when set, is called after every batch that claimed rows,
	// and after a batch that failed, from the claim loop's goroutine (so
	// concurrently when Concurrency > 1); it must be quick. Meant for
	// metrics. In WAL mode it is called for each batch of the stream once
	// settled (from the settler; PublishDuration is its longest Publish
	// call), and for each Publish call that failed as a whole (from its
	// lane), concurrently with the claim loops'.
	OnBatch func(BatchStats)
	// OnBlocked, when set, is called each time the relay starts or stops
	// holding its rows because the broker has no room (a Publish failed
	// with broker.ErrBlocked: a RabbitMQ memory or disk alarm, a Kafka
	// partition short of in-sync replicas, a full JetStream stream), with
	// the broker's reason (broker.BlockedReason), and with "" when the
	// broker takes messages again (or fails for another reason). It is
	// called with the relay's lock held and must be quick; meant for a
	// metric and a readiness check (see Blocked).
	OnBlocked func(reason string)
	// Mode is how the relay finds the events: RelayModePoll ("poll",
	// claims and marks rows) or RelayModeWAL ("wal", reads the rows'
	// inserts from the WAL by logical replication and deletes them once
	// confirmed; the polling relay's claim loops then only publish the
	// scheduled and parked rows). See the package documentation, "WAL
	// relay", for what WAL mode needs from the database. Defaults to
	// RelayModePoll.
	Mode string
	// Slot is the logical replication slot, and the publication, of WAL
	// mode: lower-case letters, digits and '_', 1..MaxSlotNameBytes bytes,
	// unique on the server. Relays started with the same Slot stand by
	// while one of them streams (PostgreSQL lets one stream a slot at a
	// time) and take over within about a second when it dies. Defaults to
	// DefaultSlotName(Destination) ("ferry_default"). Ignored in poll mode.
	Slot string
	// StatusInterval is how often the WAL relay reports its confirmed
	// position to the server (and the longest it waits for a reply).
	// Defaults to DefaultStatusInterval (1 s). Ignored in poll mode.
	StatusInterval time.Duration
	// SettleInterval is how long the WAL relay gathers the batches the
	// broker confirmed before it settles them in one transaction (their
	// rows deleted) and moves the slot's position past them: at most this
	// long, or until walSettleRows (8,192) rows are gathered, whichever
	// comes first. A batch with a refused event or an outage is settled at
	// once, with everything gathered before it. At low rates every batch
	// holds a few events, and settling each one was a commit per batch
	// (0.34 commits per event at 1,000 events/s, bench/README.md); a crash
	// within the interval publishes the gathered events again from the
	// slot (the same message IDs: the workers' dedup absorbs them).
	// Defaults to DefaultSettleInterval (50 ms); negative settles every
	// batch at once. Ignored in poll mode.
	SettleInterval time.Duration
	// AfterPublish, when set, is called after Publish returned and before
	// the batch's rows are marked. A non-nil error rolls the transaction
	// back, as if the relay had crashed at that point: the rows stay
	// unprocessed and are published again later. In WAL mode it is called
	// after each Publish call of a lane (concurrently, ids in commit
	// order), and an error leaves that call's batch unsettled and stops
	// the stream, which restarts from the confirmed position. A test
	// hook.
	AfterPublish func(ctx context.Context, ids []int64) error
}

// RedeliveryWindowFor returns the RelayConfig.RedeliveryWindow of workers
// that retry a message at most maxAttempts times in all (the first
// included) with the retry delays delays (a backoff list, the last one
// repeating): the longest delay times maxAttempts, an upper bound of the
// time a copy can spend in the retry levels. It returns 0 for no delays or
// maxAttempts < 1, and saturates instead of overflowing.
func RedeliveryWindowFor(delays []time.Duration, maxAttempts int) time.Duration {
	var longest time.Duration
	for _, d := range delays {
		longest = max(longest, d)
	}
	if longest <= 0 || maxAttempts < 1 {
		return 0
	}
	if longest > math.MaxInt64/time.Duration(maxAttempts) {
		return math.MaxInt64
	}
	return longest * time.Duration(maxAttempts)
}

// BatchStats describes one batch of the relay, for RelayConfig.OnBatch.
type BatchStats struct {
	// Claimed is the number of rows claimed.
	Claimed int
	// Published is the number of rows confirmed by the broker and marked
	// processed.
	Published int
	// Failed is the number of rows that were not confirmed.
	Failed int
	// Duration is the wall time of the whole batch, claim to commit.
	Duration time.Duration
	// PublishDuration is the part of Duration spent in broker.Broker.Publish
	// waiting for the confirms (0 when nothing was published).
	PublishDuration time.Duration
	// MarkDuration is the part of Duration spent marking the rows and
	// committing, after Publish returned.
	MarkDuration time.Duration
	// Err is the batch's error: nil, a *broker.PublishError for rows that
	// failed, or the broker's or database's error.
	Err error
}

// Relay publishes committed outbox rows to a broker. Create it with
// NewRelay; run it with Run, or drive it batch by batch with ProcessBatch.
// Several relays, in one process or many, may run on the same database.
type Relay struct {
	cfg     RelayConfig
	log     *slog.Logger
	wake    chan struct{}
	running atomic.Bool

	more  chan struct{} // a loop's batch came back full: one more may join
	nudge chan struct{} // a wake-up was set aside for the active loops

	brokerName string // Capabilities().Name, for last_error and logs

	mu          sync.Mutex
	unavailable bool          // the broker or the database failed the last batch
	backoff     time.Duration // the current outage pause (0: none)
	pauseUntil  time.Time     // no claim before this while unavailable
	probing     bool          // a loop is trying again during an outage
	gate        chan struct{} // closed (and replaced) when the outage state changes
	active      int           // claim loops between a wake-up and going idle again
	waiting     int           // active loops waiting (BatchDelay, RecheckDelay) to claim again
	dirty       bool          // a wake-up was set aside for the active loops
	blockedBy   string        // the broker's reason while it has no room ("": not blocked)
}

// NewRelay checks cfg, applies the defaults and returns a relay. Errors
// wrap ErrInvalidConfig and name the field.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	if cfg.Pool == nil {
		return nil, fmt.Errorf("%w: Pool is required", ErrInvalidConfig)
	}
	if cfg.Broker == nil {
		return nil, fmt.Errorf("%w: Broker is required", ErrInvalidConfig)
	}
	if err := ValidateDestination(cfg.Destination); err != nil {
		return nil, fmt.Errorf("%w: Destination %q: %v", ErrInvalidConfig, cfg.Destination, err)
	}
	if cfg.Destination == "" {
		cfg.Destination = DefaultDestination
	}
	type dur struct {
		name string
		v    *time.Duration
		def  time.Duration
	}
	for _, d := range []dur{
		{"PollInterval", &cfg.PollInterval, DefaultPollInterval},
		{"PublishTimeout", &cfg.PublishTimeout, DefaultPublishTimeout},
		{"RetryBackoff", &cfg.RetryBackoff, DefaultRetryBackoff},
		{"MaxRetryBackoff", &cfg.MaxRetryBackoff, DefaultMaxRetryBackoff},
		{"MaxBackoff", &cfg.MaxBackoff, DefaultMaxBackoff},
		{"RetentionInterval", &cfg.RetentionInterval, DefaultRetentionInterval},
	} {
		if *d.v < 0 {
			return nil, fmt.Errorf("%w: %s %v: must not be negative", ErrInvalidConfig, d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	switch cfg.Mode {
	case "":
		cfg.Mode = RelayModePoll
	case RelayModePoll, RelayModeWAL:
	default:
		return nil, fmt.Errorf("%w: Mode %q: want %q or %q", ErrInvalidConfig, cfg.Mode, RelayModePoll, RelayModeWAL)
	}
	if cfg.Slot == "" {
		cfg.Slot = DefaultSlotName(cfg.Destination)
	}
	if err := ValidateSlotName(cfg.Slot); err != nil {
		return nil, fmt.Errorf("%w: Slot %q: %v", ErrInvalidConfig, cfg.Slot, err)
	}
	switch {
	case cfg.StatusInterval < 0:
		return nil, fmt.Errorf("%w: StatusInterval %v: must not be negative", ErrInvalidConfig, cfg.StatusInterval)
	case cfg.StatusInterval == 0:
		cfg.StatusInterval = DefaultStatusInterval
	}
	switch {
	case cfg.SettleInterval > MaxSettleInterval:
		return nil, fmt.Errorf("%w: SettleInterval %v: at most %v (negative: settle every batch at once)", ErrInvalidConfig, cfg.SettleInterval, MaxSettleInterval)
	case cfg.SettleInterval == 0:
		cfg.SettleInterval = DefaultSettleInterval
	}
	if cfg.MaxRetryBackoff < cfg.RetryBackoff {
		return nil, fmt.Errorf("%w: MaxRetryBackoff %v: must be at least RetryBackoff %v", ErrInvalidConfig, cfg.MaxRetryBackoff, cfg.RetryBackoff)
	}
	if cfg.RedeliveryWindow < 0 {
		return nil, fmt.Errorf("%w: RedeliveryWindow %v: must not be negative", ErrInvalidConfig, cfg.RedeliveryWindow)
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.Retention > 0 {
		if minimum := max(MinRetention, cfg.RedeliveryWindow); cfg.Retention < minimum {
			return nil, fmt.Errorf("%w: Retention %v: must be at least %v (MinRetention %v, RedeliveryWindow %v) so that the dedup rows outlive every redelivery, or negative to keep rows forever",
				ErrInvalidConfig, cfg.Retention, minimum, MinRetention, cfg.RedeliveryWindow)
		}
	}
	if cfg.BatchDelay == 0 {
		cfg.BatchDelay = DefaultBatchDelay
	}
	if cfg.RecheckDelay == 0 {
		cfg.RecheckDelay = DefaultRecheckDelay
	}
	switch {
	case cfg.BatchSize < 0 || cfg.BatchSize > MaxBatchSize:
		return nil, fmt.Errorf("%w: BatchSize %d: want 1..%d", ErrInvalidConfig, cfg.BatchSize, MaxBatchSize)
	case cfg.BatchSize == 0:
		cfg.BatchSize = DefaultBatchSize
	}
	switch {
	case cfg.Concurrency < 0 || cfg.Concurrency > 64:
		return nil, fmt.Errorf("%w: Concurrency %d: want 1..64", ErrInvalidConfig, cfg.Concurrency)
	case cfg.Concurrency == 0:
		cfg.Concurrency = DefaultConcurrency
	}
	switch {
	case cfg.RetentionBatch < 0:
		return nil, fmt.Errorf("%w: RetentionBatch %d: must not be negative", ErrInvalidConfig, cfg.RetentionBatch)
	case cfg.RetentionBatch == 0:
		cfg.RetentionBatch = DefaultRetentionBatch
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	name := cfg.Broker.Capabilities().Name
	if name == "" {
		name = fmt.Sprintf("%T", cfg.Broker)
	}
	return &Relay{cfg: cfg, log: log, brokerName: name, wake: make(chan struct{}, 1),
		more: make(chan struct{}, 1), nudge: make(chan struct{}, 1), gate: make(chan struct{})}, nil
}

// Config returns the relay's configuration with the defaults applied.
func (r *Relay) Config() RelayConfig { return r.cfg }

// Run publishes rows until ctx is done, then returns nil once its
// goroutines have stopped (a batch in flight is finished and marked first,
// within a few seconds). It listens for Enqueue's notifications on a
// dedicated connection, reconnecting when it drops, polls every
// PollInterval, runs Concurrency claim loops, and deletes old rows
// every RetentionInterval. Unreachable brokers and databases are waited
// out with backoff, not returned. Run returns an error only when the
// broker was closed (broker.ErrClosed) or when it is already running.
// It logs "outbox: relay: started" (with the broker, destination, batch size,
// concurrency, poll interval and retention) and "outbox: relay: stopped"
// at INFO on RelayConfig.Logger, as worker.Worker.Run logs "worker:
// started" and "worker: stopped".
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("outbox: relay: Run called while already running")
	}
	defer r.running.Store(false)

	r.mu.Lock()
	r.active, r.waiting, r.dirty = 0, 0, false
	r.probing = false
	r.mu.Unlock()
	for _, ch := range []chan struct{}{r.more, r.nudge} {
		select {
		case <-ch:
		default:
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		fatalMu  sync.Mutex
		fatalErr error
	)
	if r.cfg.Mode == RelayModeWAL {
		// The WAL stream publishes what is due at once; the claim loops
		// only the scheduled and parked rows, found by the poll (a NOTIFY
		// is for an event the stream carries).
		wg.Go(func() {
			if err := r.walRun(ctx); err != nil {
				r.log.Error("outbox: wal relay: stopping", "slot", r.cfg.Slot, "err", err)
				fatalMu.Lock()
				if fatalErr == nil {
					fatalErr = err
				}
				fatalMu.Unlock()
				cancel()
			}
		})
	} else {
		wg.Go(func() { r.listen(ctx) })
	}
	wg.Go(func() { r.poll(ctx) })
	if r.cfg.Retention > 0 {
		wg.Go(func() { r.retain(ctx) })
	}
	for range r.cfg.Concurrency {
		wg.Go(func() {
			if err := r.claimLoop(ctx); err != nil {
				fatalMu.Lock()
				if fatalErr == nil {
					fatalErr = err
				}
				fatalMu.Unlock()
				cancel()
			}
		})
	}
	r.signal()
	r.log.Info("outbox: relay: started", "mode", r.cfg.Mode, "broker", r.brokerName, "destination", r.cfg.Destination, "batch_size", r.cfg.BatchSize,
		"concurrency", r.cfg.Concurrency, "poll_interval", r.cfg.PollInterval, "retention", r.cfg.Retention)
	wg.Wait()
	r.log.Info("outbox: relay: stopped", "broker", r.brokerName)
	return fatalErr
}

// signal wakes one idle claim loop (or the next one to become idle).
func (r *Relay) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Relay) poll(ctx context.Context) {
	t := time.NewTicker(r.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.signal()
		}
	}
}

// listen keeps a dedicated connection LISTENing on NotifyChannel and turns
// each notification into a wake-up.
func (r *Relay) listen(ctx context.Context) {
	backoff := time.Duration(0)
	broken := false
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, r.cfg.Pool.Config().ConnConfig.Copy())
		if err == nil {
			if _, err = conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
				closeConn(conn)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !broken {
				r.log.Warn("outbox: relay: cannot LISTEN, relying on polling until it reconnects", "err", err)
				broken = true
			}
			backoff = nextBackoff(backoff, r.cfg.MaxBackoff)
			if !sleep(ctx, backoff) {
				return
			}
			continue
		}
		if broken {
			r.log.Info("outbox: relay: LISTEN connection restored")
			broken = false
		}
		backoff = 0
		r.signal() // rows committed while we were not listening
		for {
			if _, err = conn.WaitForNotification(ctx); err != nil {
				break
			}
			r.signal()
		}
		closeConn(conn)
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("outbox: relay: LISTEN connection lost, reconnecting", "err", err)
		broken = true
	}
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn.Close(ctx)
}

// claimLoop processes batches until ctx is done; it returns a non-nil
// error only for a fatal condition (the broker was closed).
//
// A loop is idle (waiting for a wake-up) or active. Active, it claims again
// at once after a full batch (and asks an idle loop to join in), BatchDelay
// after a partial one, RecheckDelay after the first empty one, and goes
// idle after the second empty claim in a row unless a wake-up was set
// aside meanwhile (dirty). A wake-up (NOTIFY, poll) makes an idle loop
// active unless an active loop is waiting to claim again: then it is
// handed to that loop (dirty, and a recheck's wait is cut short), whose
// claim starts after it. So every notification is followed by a claim
// that starts after it, a new row waits for no batch in flight (only
// BatchDelay when one is: a loop joining a busy one lingers first), and
// the rows committed during a batch or a BatchDelay go out together. When a
// loop's batch was not full and another loop is active, it goes idle,
// leaving the rest to that one.
func (r *Relay) claimLoop(ctx context.Context) error {
	var (
		active    bool
		rechecked bool // the last claim was the recheck after an empty one
	)
	defer func() {
		if active {
			r.mu.Lock()
			r.active--
			r.mu.Unlock()
		}
	}()
	for {
		if !active {
			select {
			case <-ctx.Done():
				return nil
			case <-r.more:
				r.join(true)
			case <-r.wake:
				joined, busy := r.join(false)
				if !joined {
					continue
				}
				active, rechecked = true, false
				// Another loop's batch is in flight: a load is on, so
				// let the rows gather for BatchDelay (an idle relay
				// claims at once).
				if busy && r.cfg.BatchDelay > 0 && !r.wait(ctx, r.cfg.BatchDelay, false) {
					return nil
				}
			}
			active, rechecked = true, false
		}
		probe, ok := r.awaitAvailable(ctx)
		if !ok {
			return nil
		}
		r.beforeClaim()
		res := r.processBatch(ctx)
		if ctx.Err() != nil {
			r.endProbe(probe)
			return nil
		}
		if res.fatal {
			r.endProbe(probe)
			r.log.Error("outbox: relay: broker closed, stopping", "err", res.err)
			return fmt.Errorf("outbox: relay: %w", res.err)
		}
		if res.outage {
			r.setUnavailable(res, probe)
			continue
		}
		if res.claimed > 0 {
			// Only a batch that reached the broker tells it is back: an
			// empty claim (other loops hold the rows) says nothing.
			r.setAvailable()
		}
		r.endProbe(probe)
		switch {
		case res.claimed == r.cfg.BatchSize:
			// More rows are probably waiting: let another loop join in and
			// go on at once.
			r.askForHelp()
			rechecked = false
		case r.leaveIfOthersActive():
			// Another active loop claims again later (dirty makes sure of
			// it); one loop is enough for what is left.
			active = false
		case res.claimed > 0 || res.deferred:
			// Let the rows being committed now gather into the next batch.
			rechecked = false
			if r.cfg.BatchDelay > 0 && !r.wait(ctx, r.cfg.BatchDelay, false) {
				return nil
			}
		case !rechecked && r.cfg.RecheckDelay > 0:
			// A row whose Enqueue left the NOTIFY to another transaction
			// (SetNotifyWindow) may commit just after this claim.
			rechecked = true
			if !r.wait(ctx, r.cfg.RecheckDelay, true) {
				return nil
			}
		default:
			if r.leave() {
				active = false
			}
		}
	}
}

// join makes an idle loop active. A loop woken by a notification or the
// poll (help false) stays idle when an active loop is waiting to claim
// again (its claim starts after the wake-up, so it sees the new rows): it
// records the wake-up for it (dirty) and cuts short its wait for the
// recheck. It reports whether the loop is now active, and whether other
// loops were active (busy with a batch) when it joined.
func (r *Relay) join(help bool) (joined, busy bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !help && r.waiting > 0 {
		r.dirty = true
		select {
		case r.nudge <- struct{}{}:
		default:
		}
		return false, false
	}
	busy = r.active > 0
	r.active++
	return true, busy
}

// leave makes the calling active loop idle and reports true, unless it is
// the last active loop and a wake-up was set aside since the last claim
// began: then it stays active, to claim once more, and reports false.
func (r *Relay) leave() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active == 1 && r.dirty {
		return false
	}
	r.active--
	return true
}

// leaveIfOthersActive makes the calling active loop idle when another loop
// is active, and sets dirty so that one of those claims once more after
// this (it covers the rows the leaving loop would have claimed next). It
// reports whether the caller left.
func (r *Relay) leaveIfOthersActive() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active <= 1 {
		return false
	}
	r.active--
	r.dirty = true
	return true
}

// beforeClaim clears the wake-ups set aside so far: the claim about to
// start sees every row committed before them.
func (r *Relay) beforeClaim() {
	for _, ch := range []chan struct{}{r.wake, r.nudge} {
		select {
		case <-ch:
		default:
		}
	}
	r.mu.Lock()
	r.dirty = false
	r.mu.Unlock()
}

// askForHelp wakes an idle loop to claim alongside (after a full batch).
func (r *Relay) askForHelp() {
	select {
	case r.more <- struct{}{}:
	default:
	}
}

// wait pauses an active loop for d before its next claim, counted in
// waiting meanwhile; with wakeable, a wake-up ends the pause early. It
// reports false when ctx is done.
func (r *Relay) wait(ctx context.Context, d time.Duration, wakeable bool) bool {
	r.mu.Lock()
	r.waiting++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.waiting--
		r.mu.Unlock()
	}()
	var wake, nudge <-chan struct{}
	if wakeable {
		wake, nudge = r.wake, r.nudge
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-wake:
	case <-nudge:
	}
	return true
}

// awaitAvailable holds a claim loop back while the relay is unavailable:
// until the current pause ends, and then while another loop is trying
// again (the probe), so that an outage costs one failed batch per pause
// for the whole relay, not one per loop. It reports whether the caller's
// claim is the probe (the caller must then end it, see setUnavailable,
// setAvailable and endProbe), and false when ctx is done.
func (r *Relay) awaitAvailable(ctx context.Context) (probe, ok bool) {
	for {
		r.mu.Lock()
		if !r.unavailable {
			r.mu.Unlock()
			return false, true
		}
		wait := time.Until(r.pauseUntil)
		if wait <= 0 && !r.probing {
			r.probing = true
			r.mu.Unlock()
			return true, true
		}
		gate := r.gate
		r.mu.Unlock()
		var (
			t     *time.Timer
			timer <-chan time.Time
		)
		if wait > 0 {
			t = time.NewTimer(wait)
			timer = t.C
		}
		select {
		case <-ctx.Done():
		case <-gate:
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return false, false
		}
	}
}

// changed wakes the loops waiting in awaitAvailable; r.mu is held.
func (r *Relay) changed() {
	close(r.gate)
	r.gate = make(chan struct{})
}

// endProbe ends a probe that told nothing about the broker (an empty
// claim, a shutdown): the next loop may try again after the current
// pause.
func (r *Relay) endProbe(probe bool) {
	if !probe {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.probing {
		r.probing = false
		r.pauseUntil = time.Now().Add(jitter(r.backoff))
		r.changed()
	}
}

// setUnavailable records a batch that failed because the broker or the
// database did: the first one starts an outage (logged once, naming what
// failed) and a pause of 100 ms; a failed probe doubles the pause up to
// MaxBackoff. Other loops' batches that were in flight when the outage
// began do not lengthen it.
func (r *Relay) setUnavailable(res batchResult, probe bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	reason, blocked := "", false
	if !res.dbFault {
		reason, blocked = broker.BlockedReason(res.err)
	}
	first := !r.unavailable
	if first || probe {
		r.setBlocked(reason, blocked)
	}
	switch {
	case first:
		r.unavailable = true
		r.backoff = nextBackoff(0, r.cfg.MaxBackoff)
		switch {
		case res.dbFault:
			r.log.Warn("outbox: relay: database unavailable, backing off", "err", res.err)
		case !blocked:
			r.log.Warn("outbox: relay: broker unavailable, backing off", "broker", r.brokerName, "err", res.err)
		}
	case probe:
		r.backoff = nextBackoff(r.backoff, r.cfg.MaxBackoff)
	default:
		return
	}
	r.probing = false
	r.pauseUntil = time.Now().Add(jitter(r.backoff))
	r.changed()
}

// setAvailable ends an outage (logged once) after a batch reached the
// broker.
func (r *Relay) setAvailable() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setBlocked("", false)
	if !r.unavailable {
		return
	}
	r.unavailable, r.probing, r.backoff, r.pauseUntil = false, false, 0, time.Time{}
	r.log.Info("outbox: relay: publishing again", "broker", r.brokerName)
	r.changed()
}

// setBlocked records whether the broker's last answer was that it has no
// room (broker.ErrBlocked), logging each change once (not once per
// retry) and calling RelayConfig.OnBlocked; r.mu is held.
func (r *Relay) setBlocked(reason string, blocked bool) {
	if !blocked {
		reason = ""
	} else if reason == "" {
		reason = "no reason given"
	}
	if reason == r.blockedBy {
		return
	}
	prev := r.blockedBy
	r.blockedBy = reason
	switch {
	case reason != "":
		r.log.Warn("outbox: relay: the broker has no room, holding the rows until it takes them again",
			"broker", r.brokerName, "reason", reason)
	case prev != "":
		r.log.Info("outbox: relay: the broker is no longer blocked", "broker", r.brokerName, "was", prev)
	}
	if r.cfg.OnBlocked != nil {
		r.cfg.OnBlocked(reason)
	}
}

// Blocked returns the broker's reason while the relay holds its rows
// because the broker has no room (its last Publish failed with
// broker.ErrBlocked: a resource alarm, too few in-sync replicas, a full
// stream), and "" otherwise. The relay tries again after each pause
// (MaxBackoff at most) and resumes by itself once the broker takes the
// messages; nothing is marked published or charged an attempt meanwhile.
func (r *Relay) Blocked() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blockedBy
}

// nextBackoff doubles d from minBackoff up to max.
func nextBackoff(d, max time.Duration) time.Duration {
	if d < minBackoff {
		return min(minBackoff, max)
	}
	return min(2*d, max)
}

// jitter returns d ±20%.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// sleep waits d, with ±20% jitter, or until ctx is done (returns false).
func sleep(ctx context.Context, d time.Duration) bool {
	d = jitter(d)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ProcessBatch claims one batch of due rows, publishes it and marks it,
// once, and returns the number of rows confirmed and marked processed. The
// error is nil when every claimed row was published (also when there was
// nothing to publish), a *broker.PublishError when some rows failed (those
// that failed for a reason of their own were recorded with attempts+1,
// last_error and their backoff; those the broker failed got only
// last_error "broker unavailable ..."), or the broker's or database's
// error. It does not pause after an outage: Run does. Tests and benchmarks use it to drive the relay by hand;
// it may run concurrently with Run and other relays.
func (r *Relay) ProcessBatch(ctx context.Context) (published int, err error) {
	res := r.processBatch(ctx)
	return res.published, res.err
}

type batchResult struct {
	claimed, published, failed int
	publishDur, markDur        time.Duration
	err                        error
	outage                     bool // the broker or the database as a whole failed
	dbFault                    bool // the outage is the database's
	deferred                   bool // rows were claimed but left for the next batch (overtaken, see claimSQL)
	fatal                      bool // the broker is closed
}

// keyLockClass is the first key of the transaction-level advisory locks
// (pg_try_advisory_xact_lock(int, int)) the claim takes on the partition
// key slots; keySlots is the number of slots. A slot's lock is held from
// the claim to the commit, so the rows of one key are published by one
// claimer at a time, in id order. At most keySlots such locks exist at
// once across all relays (a batch holds at most one per slot), well below
// PostgreSQL's lock table (max_locks_per_transaction 64 times
// max_connections by default).
const (
	keyLockClass = 0x66657279 // "fery"
	keySlots     = 1024
)

// claimSQL claims the due rows in id order, skipping the rows other
// claimers hold (SKIP LOCKED), among the ids from the lowest due id (lo:
// the lowest id without next_attempt_at, the first entry of
// outbox_ready_dest_idx after ($3, 0), NULL when that is another
// destination's, or the lowest whose next_attempt_at has passed, a range
// of outbox_waiting_dest_idx) to that plus $2 (claimWindow): a
// claim whose keys are all held by others gives up there instead of
// walking the whole backlog, and the rows waiting below the lowest due
// one (scheduled, parked) are not read.
//
// A keyed row is claimed only together with its key's slot lock, taken
// (in the CASE, before the row lock) while the index is walked in id
// order: a key whose slot another transaction holds is skipped, so no
// claimer publishes a key's later rows while another still publishes its
// earlier ones. The slot can be freed during the walk (its holder
// committed), after the walk passed the key's first rows: the last column
// (overtaken) is then true for the key's claimed rows, because a lower due
// row of the key is still unprocessed, and the relay leaves them to the
// next batch. The statement's snapshot may still show rows the holder has
// just published as unprocessed; overtaken is then true without need,
// which only defers the key's rows by one batch. A row not yet due
// (next_attempt_at in the future) is not claimable and does not hold back
// the rows behind it.
//
// Everything is within the relay's destination $3 (RelayConfig.Destination;
// the indexes of migration 5 lead with it), so the rows of other
// destinations are neither read nor locked, and the key order is per
// destination. The bounds are row comparisons on (destination, id),
// whose two ends hold destination to $3, and the order is (destination,
// id): only those indexes serve them, as the start and end of an ordered
// index range, so the walk stops after $1 claimable rows. With plain
// "destination = $3 AND id < x ... ORDER BY id" the planner, which takes
// destination and processed_at for independent, may walk the primary key
// in id order and filter out every processed row and every other
// destination's row (TestClaimReadsOnlyItsDestination). The slot of a key
// mixes in $4 (destinationSalt), so relays of two destinations do not
// wait for each other's keys.
var claimSQL = fmt.Sprintf(`WITH lo AS (
  SELECT COALESCE(LEAST(
    (SELECT CASE WHEN r.destination = $3 THEN r.id END FROM outbox r
     WHERE r.processed_at IS NULL AND r.next_attempt_at IS NULL AND (r.destination, r.id) > ($3, 0)
     ORDER BY r.destination, r.id LIMIT 1),
    (SELECT min(w.id) FROM outbox w
     WHERE w.processed_at IS NULL AND w.next_attempt_at IS NOT NULL AND w.destination = $3 AND w.next_attempt_at <= now())), 0) AS id
), c AS (
  SELECT id, event_type, partition_key, payload, headers, occurred_at, attempts
  FROM outbox
  WHERE processed_at IS NULL
    AND (destination, id) >= ($3, (SELECT id FROM lo))
    AND (destination, id) < ($3, (SELECT id FROM lo) + $2)
    AND CASE
          WHEN next_attempt_at > now() THEN false
          WHEN partition_key = '' THEN true
          ELSE pg_try_advisory_xact_lock(%d, (hashtext(partition_key) # $4::int) & %d)
        END
  ORDER BY destination, id
  LIMIT $1
  FOR UPDATE SKIP LOCKED
), overtaken AS (
  SELECT f.k FROM (SELECT partition_key AS k, min(id) AS first_id FROM c WHERE partition_key <> '' GROUP BY partition_key) f
  WHERE EXISTS (SELECT 1 FROM outbox e
                WHERE e.destination = $3 AND e.partition_key = f.k AND e.processed_at IS NULL AND e.id < f.first_id
                  AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now()))
)
SELECT c.id, c.event_type, c.partition_key, c.payload, c.headers, c.occurred_at, c.attempts,
       c.partition_key IN (SELECT k FROM overtaken)
FROM c
ORDER BY c.id`, keyLockClass, keySlots-1)

// claimWaitingSQL is claimSQL for the claim loops of a WAL relay: only
// the rows with next_attempt_at (scheduled, parked, or handed over when
// the slot was created or reset) are theirs; the others are the WAL
// stream's (see the package documentation, "WAL relay"), and do not hold
// back a key's waiting rows.
var claimWaitingSQL = mustReplace(claimSQL,
	[2]string{`(SELECT CASE WHEN r.destination = $3 THEN r.id END FROM outbox r
     WHERE r.processed_at IS NULL AND r.next_attempt_at IS NULL AND (r.destination, r.id) > ($3, 0)
     ORDER BY r.destination, r.id LIMIT 1)`, `NULL::bigint`},
	[2]string{"  WHERE processed_at IS NULL\n    AND (destination, id) >=", "  WHERE processed_at IS NULL AND next_attempt_at IS NOT NULL\n    AND (destination, id) >="},
	[2]string{"AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now())", "AND e.next_attempt_at <= now()"})

// mustReplace replaces each pair's first string, which must occur, in s.
func mustReplace(s string, pairs ...[2]string) string {
	for _, p := range pairs {
		if !strings.Contains(s, p[0]) {
			panic("outbox: claim query variant: missing " + p[0])
		}
		s = strings.Replace(s, p[0], p[1], 1)
	}
	return s
}

// markSQL marks the confirmed rows: processed_at is the time Publish
// returned (the broker's last confirm of the batch), as the transaction's
// start (now(), the claim) plus $2 microseconds measured by the relay.
// last_error is cleared: a sent row is not failing, whatever an outage or
// an earlier failure of its own wrote there (attempts keeps the count).
const markSQL = `UPDATE outbox SET processed_at = now() + $2::bigint * interval '1 microsecond', last_error = NULL WHERE id = ANY($1::bigint[])`

// outageSQL records why rows could not be published during an outage,
// without counting an attempt or delaying them; a parked row (attempts >
// 0) keeps the reason of its own last failure.
const outageSQL = `UPDATE outbox SET last_error = $2 WHERE id = ANY($1::bigint[]) AND attempts = 0`

const failSQL = `UPDATE outbox AS o
SET attempts = o.attempts + 1,
    last_error = f.err,
    next_attempt_at = CASE WHEN f.delay_ms > 0 THEN now() + f.delay_ms * interval '1 millisecond' END
FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS f(id, err, delay_ms)
WHERE o.id = f.id`

func (r *Relay) processBatch(ctx context.Context) (res batchResult) {
	start := time.Now()
	defer func() { r.observe(ctx, start, res) }()
	dbErr := func(op string, err error) batchResult {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return batchResult{err: ctxErr}
		}
		return batchResult{err: fmt.Errorf("outbox: relay: %s: %w", op, err), outage: true, dbFault: true}
	}

	// One round trip opens the transaction and claims (BEGIN pipelined
	// with the SELECT), one marks and commits: the locks are held across
	// Publish, and a connection left inside a transaction is rolled back.
	c, err := r.cfg.Pool.Acquire(ctx)
	if err != nil {
		return dbErr("acquire", err)
	}
	defer func() {
		if c.Conn().PgConn().TxStatus() != 'I' && !c.Conn().IsClosed() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_, _ = c.Exec(rctx, "ROLLBACK")
			cancel()
		}
		c.Release() // the pool drops a connection still in a transaction
	}()

	claim := &pgx.Batch{}
	began := time.Now() // about when the transaction's now() is taken
	claim.Queue("BEGIN")
	q := claimSQL
	if r.cfg.Mode == RelayModeWAL {
		q = claimWaitingSQL
	}
	claim.Queue(q, r.cfg.BatchSize, r.claimWindow(), r.cfg.Destination, destinationSalt(r.cfg.Destination))
	br := c.SendBatch(ctx, claim)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return dbErr("begin", err)
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return dbErr("claim", err)
	}
	var (
		msgs     []*broker.Message
		ids      []int64
		attempts []int
	)
	for rows.Next() {
		var (
			id         int64
			m          broker.Message
			rawHeaders []byte
			occurredAt time.Time
			att        int
			overtaken  bool
		)
		if err := rows.Scan(&id, &m.Type, &m.Key, &m.Body, &rawHeaders, &occurredAt, &att, &overtaken); err != nil {
			rows.Close()
			return dbErr("claim", err)
		}
		if overtaken {
			// A lower row of this key is still to publish: leave this one
			// (locked until the commit) to the next batch.
			res.deferred = true
			continue
		}
		m.ID = strconv.FormatInt(id, 10)
		m.Headers = map[string]string{}
		if len(rawHeaders) > 2 {
			if err := json.Unmarshal(rawHeaders, &m.Headers); err != nil {
				// Only Enqueue writes rows; a hand-written row with
				// non-string header values is published without them
				// rather than blocking the outbox.
				r.log.Warn("outbox: relay: ignoring unreadable headers", "id", id, "err", err)
				m.Headers = map[string]string{}
			}
		}
		m.Headers[broker.HeaderCreatedAt] = broker.FormatTime(occurredAt)
		msgs = append(msgs, &m)
		ids = append(ids, id)
		attempts = append(attempts, att)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		br.Close()
		return dbErr("claim", err)
	}
	if err := br.Close(); err != nil {
		return dbErr("claim", err)
	}
	res.claimed = len(msgs)
	if len(msgs) == 0 {
		if _, err := c.Exec(ctx, "COMMIT"); err != nil {
			return dbErr("commit", err)
		}
		return res
	}

	sb := r.publish(ctx, msgs)
	res.publishDur = sb.publishDur
	if sb.fatal {
		res.err, res.fatal = sb.perr, true
		return res
	}
	if r.cfg.AfterPublish != nil {
		if err := r.cfg.AfterPublish(ctx, ids); err != nil {
			res.err = fmt.Errorf("outbox: relay: after publish: %w", err)
			return res
		}
	}
	shutdown := ctx.Err() != nil
	st := r.classify(ids, attempts, sb.perr, shutdown)
	confirmedAfter := sb.confirmedAt.Sub(began).Microseconds()

	// Mark even when ctx was cancelled meanwhile: the broker has the
	// confirmed messages, and not marking them would publish them again.
	mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer mcancel()
	mark := &pgx.Batch{}
	if len(st.okIDs) > 0 {
		mark.Queue(markSQL, st.okIDs, confirmedAfter)
	}
	r.queueSettlement(mark, st)
	mark.Queue("COMMIT")
	if err := c.SendBatch(mctx, mark).Close(); err != nil || c.Conn().PgConn().TxStatus() != 'I' {
		if err == nil {
			err = errors.New("transaction still open after COMMIT")
		}
		return batchResult{claimed: len(msgs), publishDur: res.publishDur, err: fmt.Errorf("outbox: relay: mark: %w", err), outage: !shutdown, dbFault: true}
	}
	res.markDur = time.Since(sb.confirmedAt)
	r.settled(&res, sb, st)
	return res
}

// destinationSalt is the claim's $4: 0 for DefaultDestination, so its key
// slots are those of the relays before destinations existed, and an FNV-1a
// hash of the name for the others.
func destinationSalt(d string) int32 {
	if d == DefaultDestination {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(d))
	return int32(h.Sum32())
}

// claimWindow is how many ids, from the lowest due one, a claim looks at:
// enough to pass the batches in flight of 16 claimers of this relay's
// BatchSize (several relays' loops), at least 10000. Rows beyond it are
// claimed once the rows below are published.
func (r *Relay) claimWindow() int {
	return max(10000, 16*r.cfg.BatchSize)
}

// unavailableReason is the last_error of a row the relay could not publish
// because the broker as a whole failed: it starts with "broker
// unavailable" and names the broker.
func (r *Relay) unavailableReason(err error) string {
	return fmt.Sprintf("broker unavailable (%s): %v", r.brokerName, err)
}

// retryDelay is base * 2^attempts, capped at max (attempts before this
// failure).
func retryDelay(attempts int, base, max time.Duration) time.Duration {
	d := base
	for range min(attempts, 40) {
		d *= 2
		if d >= max {
			return max
		}
	}
	return min(d, max)
}
