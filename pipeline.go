package ferry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// Config configures a Pipeline: the database, the broker and the topology
// shared by a relay and workers, and which of them to run. The zero value
// of every optional field means its documented default, the same default
// the ferry command uses for the matching flag.
type Config struct {
	// Pool is the PostgreSQL pool holding the outbox,
	// processed_messages, worker_attempts and ferry_periodic
	// (outbox.Migrate) and the handlers' tables.
	// Required. Size it for the relay (outbox.RelayConfig.Pool) plus each
	// worker's Concurrency.
	Pool *pgxpool.Pool
	// Broker carries the messages. Required. The caller opens it (e.g.
	// rabbitmq.New, nats.New) and closes it after Run returned.
	Broker broker.Broker
	// Topology is declared on Broker by Run before anything else runs
	// (broker.Broker.Declare is idempotent, every process declares it) and
	// checked against the broker's Capabilities by New. Required.
	Topology broker.Topology
	// Relay, when not nil, runs an outbox relay publishing the outbox to
	// Broker. Its Pool, Broker and Logger default to the Pipeline's; every
	// other field to the outbox package's defaults (&outbox.RelayConfig{}
	// is a relay with the defaults). Nil: no relay in this process.
	Relay *outbox.RelayConfig
	// Destination is the outbox the relay publishes when Relay.Destination
	// is empty: it claims only the events enqueued with
	// WithDestination(Destination) (outbox.RelayConfig.Destination). Give
	// each pipeline with its own Topology on a shared database its own
	// Destination, e.g. its exchange's name, and enqueue with it.
	// Defaults to outbox.DefaultDestination.
	Destination string
	// Workers are the workers to run, one per queue consumed, e.g.
	// {Queue: "orders", Handler: mux.HandleMessage}, or SQLHandler:
	// mux.HandleMessageSQL for HandleSQL handlers. In each, Pool, Broker,
	// Topology and Logger default to the Pipeline's and Consumer to Queue;
	// every other field to the worker package's defaults. Empty: no worker
	// in this process.
	Workers []worker.Config
	// Periodic are the periodic jobs (Periodic) this process enqueues at
	// their ticks, with a Scheduler on Pool: give every replica the same
	// list, and each tick is enqueued once across them (package doc,
	// "Periodic jobs"). Their events go through the outbox to the relay
	// like any other. Empty: none.
	Periodic []*PeriodicJob
	// MaxMessageBytes is the largest message (broker.Message.Size, bytes)
	// the application publishes; New refuses a broker that cannot carry it
	// (broker.Capabilities.Check). 0: not checked.
	MaxMessageBytes int
	// Logger receives the logs. Defaults to slog.Default().
	Logger *slog.Logger
}

// Pipeline runs a relay, workers, or both, on one database and broker:
// everything a service needs besides enqueueing in its own transactions
// (Enqueue). Create it with New; the ferry command's relay, worker and
// run commands are built on it.
type Pipeline struct {
	cfg       Config
	relay     *outbox.Relay
	workers   []*worker.Worker
	scheduler *Scheduler
}

// New validates cfg and builds the relay and the workers it asks for. It
// returns an error wrapping ErrInvalidConfig naming the field, or
// broker.ErrUnsupported when the broker cannot honour the topology, the
// retry delays or MaxMessageBytes, or the error of outbox.NewRelay or
// worker.New (which name the field too).
func New(cfg Config) (*Pipeline, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case cfg.Pool == nil:
		return nil, bad("Config.Pool: required")
	case cfg.Broker == nil:
		return nil, bad("Config.Broker: required")
	case cfg.Relay == nil && len(cfg.Workers) == 0 && len(cfg.Periodic) == 0:
		return nil, bad("Config.Relay, Config.Workers and Config.Periodic: nothing to run (set a Relay, Workers, Periodic jobs, or several)")
	case cfg.MaxMessageBytes < 0:
		return nil, bad("Config.MaxMessageBytes %d: must not be negative", cfg.MaxMessageBytes)
	}
	if err := cfg.Topology.Validate(); err != nil {
		return nil, bad("Config.Topology: %v", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	req := broker.Requirements{MaxMessageBytes: cfg.MaxMessageBytes, Topology: cfg.Topology}
	for _, q := range cfg.Topology.Queues {
		req.RetryDelays = append(req.RetryDelays, q.Delays()...)
	}
	if err := cfg.Broker.Capabilities().Check(req); err != nil {
		return nil, fmt.Errorf("ferry: %w", err)
	}
	p := &Pipeline{cfg: cfg}
	if err := validateJobs("Config.Periodic", cfg.Periodic); err != nil {
		return nil, err
	}
	if len(cfg.Periodic) > 0 {
		s, err := NewScheduler(SchedulerConfig{Pool: cfg.Pool, Jobs: cfg.Periodic, Logger: cfg.Logger.With("component", "periodic")})
		if err != nil {
			return nil, fmt.Errorf("ferry: Config.Periodic: %w", err)
		}
		p.scheduler = s
	}
	if cfg.Relay != nil {
		rc := *cfg.Relay
		if rc.Pool == nil {
			rc.Pool = cfg.Pool
		}
		if rc.Broker == nil {
			rc.Broker = cfg.Broker
		}
		if rc.Destination == "" {
			rc.Destination = cfg.Destination
		}
		if rc.Logger == nil {
			rc.Logger = cfg.Logger.With("component", "relay")
		}
		r, err := outbox.NewRelay(rc)
		if err != nil {
			return nil, err
		}
		p.relay = r
	}
	queues := map[string]bool{}
	for i, wc := range cfg.Workers {
		if queues[wc.Queue] {
			return nil, bad("Config.Workers[%d].Queue %q: a second worker on the same queue; raise Concurrency instead", i, wc.Queue)
		}
		queues[wc.Queue] = true
		if wc.Pool == nil {
			wc.Pool = cfg.Pool
		}
		if wc.Broker == nil {
			wc.Broker = cfg.Broker
		}
		if wc.Topology.Exchange == "" && len(wc.Topology.Queues) == 0 {
			wc.Topology = cfg.Topology
		}
		if wc.Consumer == "" {
			wc.Consumer = wc.Queue
		}
		if wc.Logger == nil {
			wc.Logger = cfg.Logger.With("component", "worker")
		}
		w, err := worker.New(wc)
		if err != nil {
			return nil, fmt.Errorf("ferry: Config.Workers[%d]: %w", i, err)
		}
		p.workers = append(p.workers, w)
	}
	return p, nil
}

// Relay returns the pipeline's relay, nil when Config.Relay was nil.
func (p *Pipeline) Relay() *outbox.Relay { return p.relay }

// Workers returns the pipeline's workers in the order of Config.Workers.
func (p *Pipeline) Workers() []*worker.Worker { return p.workers }

// Run declares the topology, then runs the relay, the workers and the
// periodic jobs' Scheduler until ctx is done and returns nil once they all
// stopped (each within its own shutdown bound: outbox.Relay.Run,
// worker.Config.ShutdownTimeout). While
// the broker refuses Declare for a passing reason (unreachable), Run
// retries it with backoff (0.5 s doubling to 5 s), so a service started
// before its broker waits for it. It returns an error when Declare fails
// for good (broker.IsPermanent: broker.ErrTopologyMismatch,
// broker.ErrUnsupported, broker.ErrRefused; and broker.ErrClosed), or when the relay or a worker returns one (e.g. the
// broker was closed under them); the others are stopped first.
func (p *Pipeline) Run(ctx context.Context) error {
	if err := p.declare(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	if p.relay != nil {
		g.Go(func() error { return p.relay.Run(gctx) })
	}
	for _, w := range p.workers {
		g.Go(func() error { return w.Run(gctx) })
	}
	if p.scheduler != nil {
		g.Go(func() error { return p.scheduler.Run(gctx) })
	}
	return g.Wait()
}

func (p *Pipeline) declare(ctx context.Context) error {
	backoff := 500 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := p.cfg.Broker.Declare(ctx, p.cfg.Topology)
		if err == nil {
			if attempt > 1 {
				p.cfg.Logger.Info("ferry: topology declared; the broker is reachable", "broker", p.cfg.Broker.Capabilities().Name)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if broker.IsPermanent(err) || errors.Is(err, broker.ErrClosed) {
			return fmt.Errorf("ferry: declare topology: %w", err)
		}
		if attempt == 1 || attempt%10 == 0 {
			p.cfg.Logger.Warn("ferry: cannot declare the topology; retrying", "broker", p.cfg.Broker.Capabilities().Name,
				"attempt", attempt, "retry_in", backoff, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}
