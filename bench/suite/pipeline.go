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
		br, err := t.Open(ctx)
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
		relay, err := outbox.NewRelay(outbox.RelayConfig{
			Pool: pool, Broker: br, BatchSize: relayBatch, Concurrency: relayConcurrency, Retention: -1, Logger: log,
			OnBatch: func(st outbox.BatchStats) { p.published.Add(int64(st.Published)) },
		})
		if err != nil {
			return fail(err)
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

// declare declares tp, trying up to three times half a second apart: a
// JetStream server has been seen to refuse a stream's creation once
// ("error creating store for stream") and accept it right after.
func declare(ctx context.Context, br broker.Broker, tp broker.Topology) error {
	var err error
	for try := 0; try < 3; try++ {
		if err = br.Declare(ctx, tp); err == nil || errors.Is(err, broker.ErrUnsupported) || errors.Is(err, broker.ErrTopologyMismatch) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return err
}
