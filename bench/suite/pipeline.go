package suite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// Settings of the relay and the worker in the pipeline scenarios: the
// ones bench/README.md documents for the Go benchmarks.
const (
	relayBatch       = 500 // outbox.RelayConfig.BatchSize
	relayConcurrency = 2   // outbox.RelayConfig.Concurrency
	producers        = 4   // concurrent producers, one event per transaction
)

// topology returns a one-queue topology with unique names and the given
// retry delays (default 1 s).
func topology(delays ...time.Duration) broker.Topology {
	if len(delays) == 0 {
		delays = []time.Duration{time.Second}
	}
	ex := uniqueName("bench")
	return broker.Topology{Exchange: ex, Queues: []broker.Queue{{
		Name: ex + ".send", Bindings: []string{EventType}, RetryDelays: delays,
	}}}
}

// pipeline is a relay and a worker running in this process on one
// database and broker, each with its own pool and broker connection, as
// separate processes would have.
type pipeline struct {
	counters
	stopOnce sync.Once
	cancel   context.CancelFunc
	errs     chan error
	runs     int
	closers  []func()
	stopErr  error
}

// parts says what startPipeline runs.
type parts struct {
	relay, worker bool
	workers       int                   // worker.Config.Concurrency
	handler       worker.Handler        // default DBHandler(onHandled)
	onHandled     func(*broker.Message) // see dbHandler
	policy        worker.RetryPolicy
	onOutcome     func(*broker.Message, worker.Outcome)
	// mode is the relay's outbox.RelayConfig.Mode (default
	// outbox.RelayModePoll); with outbox.RelayModeWAL startPipeline
	// creates the database's slot before the relay runs, so every row
	// inserted after it returns is in the slot's stream.
	mode string
	// batch and linger are the worker's Config.BatchSize and BatchLinger
	// (0: the worker's defaults, one message per transaction).
	batch  int
	linger time.Duration
}

// startPipeline starts the parts of pt on db and the broker of t with
// topology tp. stop stops them and closes their pools and connections.
func startPipeline(ctx context.Context, t Target, db *database, tp broker.Topology, pt parts, log *slog.Logger) (*pipeline, error) {
	p := &pipeline{errs: make(chan error, 2)}
	var runs []func(context.Context) error
	fail := func(err error) (*pipeline, error) {
		p.closeAll()
		return nil, err
	}
	open := func(conns int) (broker.Broker, *pgxpool.Pool, error) {
		br, err := openBroker(ctx, t)
		if err != nil {
			return nil, nil, fmt.Errorf("bench: %s: %w", t.Name, err)
		}
		p.closers = append(p.closers, func() { _ = br.Close() })
		if err := declare(ctx, br, tp); err != nil {
			return nil, nil, fmt.Errorf("bench: %s: declare: %w", t.Name, err)
		}
		pool, err := db.pool(ctx, conns)
		if err != nil {
			return nil, nil, err
		}
		p.closers = append(p.closers, pool.Close)
		return br, pool, nil
	}
	if pt.relay {
		br, pool, err := open(relayConcurrency + 2)
		if err != nil {
			return fail(err)
		}
		cfg := outbox.RelayConfig{
			Pool: pool, Broker: br, BatchSize: relayBatch, Concurrency: relayConcurrency, Retention: -1, Logger: log,
			OnBatch: func(st outbox.BatchStats) { p.published.Add(int64(st.Published)) },
		}
		if pt.mode == outbox.RelayModeWAL {
			cfg.Mode, cfg.Slot = outbox.RelayModeWAL, db.slot
		}
		relay, err := outbox.NewRelay(cfg)
		if err != nil {
			return fail(err)
		}
		if pt.mode == outbox.RelayModeWAL {
			if err := relay.EnsureSlot(ctx); err != nil {
				return fail(fmt.Errorf("bench: WAL relay: %w", err))
			}
		}
		runs = append(runs, relay.Run)
	}
	if pt.worker {
		workers := max(pt.workers, 1)
		br, pool, err := open(workers + 2)
		if err != nil {
			return fail(err)
		}
		h := pt.handler
		if h == nil {
			h = DBHandler(pt.onHandled)
		}
		w, err := worker.New(worker.Config{
			Consumer: "bench", Queue: tp.Queues[0].Name, Topology: tp, Pool: pool, Broker: br, Handler: h,
			Concurrency: workers, Policy: pt.policy, Logger: log, ShutdownTimeout: 5 * time.Second,
			BatchSize: pt.batch, BatchLinger: pt.linger,
			OnOutcome: func(m *broker.Message, o worker.Outcome, _ time.Duration) {
				switch o {
				case worker.OutcomeAck:
					p.acked.Add(1)
				case worker.OutcomeDuplicate:
					p.dups.Add(1)
				case worker.OutcomeRetry:
					p.retried.Add(1)
				case worker.OutcomeDead:
					p.dead.Add(1)
				}
				if pt.onOutcome != nil {
					pt.onOutcome(m, o)
				}
			},
		})
		if err != nil {
			return fail(err)
		}
		runs = append(runs, w.Run)
	}
	rctx, cancel := context.WithCancel(ctx)
	p.cancel, p.runs = cancel, len(runs)
	for _, run := range runs {
		go func() { p.errs <- run(rctx) }()
	}
	return p, nil
}

// stop stops the relay and the worker, waits for them and closes their
// pools and broker connections. It returns the first error a part
// stopped with (a context error of the stop itself is not one).
func (p *pipeline) stop() error {
	p.stopOnce.Do(func() {
		p.cancel()
		for range p.runs {
			if err := <-p.errs; err != nil && !errors.Is(err, context.Canceled) {
				p.stopErr = errors.Join(p.stopErr, err)
			}
		}
		p.closeAll()
	})
	return p.stopErr
}

func (p *pipeline) closeAll() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
	p.closers = nil
}

// waitFor polls cond every 10 ms until it is true, ctx is done or timeout
// passed; progress, when set, is called on every poll.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool, progress func()) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if progress != nil {
			progress()
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: not done after %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if progress != nil {
		progress()
	}
	return nil
}

// errorsOnly returns log without its records below slog.LevelError: the
// retry scenario dead-letters on purpose, and the worker's warning for
// each would bury the progress.
func errorsOnly(log *slog.Logger) *slog.Logger {
	return slog.New(levelFilter{h: log.Handler(), min: slog.LevelError})
}

type levelFilter struct {
	h   slog.Handler
	min slog.Level
}

func (f levelFilter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= f.min && f.h.Enabled(ctx, l)
}
func (f levelFilter) Handle(ctx context.Context, r slog.Record) error { return f.h.Handle(ctx, r) }
func (f levelFilter) WithAttrs(as []slog.Attr) slog.Handler {
	return levelFilter{h: f.h.WithAttrs(as), min: f.min}
}
func (f levelFilter) WithGroup(name string) slog.Handler {
	return levelFilter{h: f.h.WithGroup(name), min: f.min}
}

// Opening and declaring wait out a broker that is not ready yet: a
// JetStream cluster whose meta group is electing a leader (4-9 s in
// nats-server, and a loaded machine, whose servers miss Raft heartbeats,
// makes elections of its own, e.g. right after a cluster started) refuses
// every API request at once with err_code 10008 "JetStream system
// temporarily unavailable" and never answers one sent just before; a
// JetStream server has also been seen to refuse a stream's creation once
// ("error creating store for stream") and accept it right after. Three
// tries half a second apart gave up within the election (ferry bench's
// failover scenario failed at its start on a loaded machine).
const (
	// settleTimeout bounds the whole wait: several elections.
	settleTimeout = time.Minute
	// settleAttempt bounds one attempt, so that a request the old leader
	// will never answer is given up and sent again after the election.
	settleAttempt = 10 * time.Second
)

// settled reports whether err ends the wait: nil, or an error that no
// election or restart changes (a refused login, a bad configuration, a
// topology the broker cannot hold or holds otherwise).
func settled(err error) bool {
	return err == nil || errors.Is(err, broker.ErrUnsupported) || errors.Is(err, broker.ErrTopologyMismatch) ||
		errors.Is(err, broker.ErrRefused) || errors.Is(err, broker.ErrInvalidConfig) || errors.Is(err, broker.ErrClosed)
}

// settle calls f, each call bounded by settleAttempt, until it returns
// nil or an error that settled accepts, or settleTimeout passed (then the
// last error), or ctx is done (then ctx's error).
func settle(ctx context.Context, f func(ctx context.Context) error) error {
	deadline := time.Now().Add(settleTimeout)
	for {
		actx, cancel := context.WithTimeout(ctx, settleAttempt)
		err := f(actx)
		cancel()
		if settled(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// declare declares tp on br, waiting out a broker that is not ready
// (settle).
func declare(ctx context.Context, br broker.Broker, tp broker.Topology) error {
	return settle(ctx, func(ctx context.Context) error { return br.Declare(ctx, tp) })
}

// openBroker opens t's adapter, waiting out a broker that is not ready
// (settle): the NATS adapter, for one, checks JetStream's account info
// when it connects.
func openBroker(ctx context.Context, t Target) (broker.Broker, error) {
	var br broker.Broker
	err := settle(ctx, func(actx context.Context) error {
		b, err := t.Open(actx)
		if err == nil {
			br = b
		}
		return err
	})
	return br, err
}
