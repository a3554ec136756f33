package ferrycli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"
	"golang.org/x/sync/errgroup"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// stack is what the api, relay and worker commands share: the settings,
// the database pool and the notification service.
type stack struct {
	s    *settings
	log  *slog.Logger
	pool *pgxpool.Pool
	app  *app.App
	// onOutcome, when set, is the worker's OnOutcome hook (the demo counts
	// duplicates with it).
	onOutcome func(*broker.Message, worker.Outcome, time.Duration)
	// apiReady, when set, receives the API's listen address once it
	// accepts connections.
	apiReady func(addr string)
	// apiAfterBroker makes runAll start the API only once the relay and
	// the worker have declared the topology on the broker (demo: nothing
	// is accepted that a broker refusing the topology would leave
	// pending). Unset (run), the API accepts into the outbox while the
	// broker is still unreachable.
	apiAfterBroker bool
	// brokerReady, when set, is called by runRelay and runWorker once
	// their broker is connected and the topology declared.
	brokerReady func()
	// brokerGiveUp, when positive, is how long runRelay and runWorker
	// wait for an unreachable broker before they fail (demo); zero waits
	// until ctx is done.
	brokerGiveUp time.Duration
	// obs adds metrics, tracing and the stuck-outbox alert; nil changes
	// nothing.
	obs *observability
	// console, when set, makes runAll serve the web console too.
	console *consoleOpts
	// schemaChecked is set once checkSchema passed with the app's tables,
	// so run checks once for its three roles.
	schemaChecked bool
}

// where describes the servers a command uses, for logs and the demo
// summary.
type where struct {
	database, broker, smtp string
	sink                   *smtpSink
	// dbRemovedAtExit is set when the database is the embedded one in a
	// temporary folder (no --data-dir), deleted with what it holds.
	dbRemovedAtExit bool
}

// startEmbedded starts, for demo and run, the embedded servers that the
// flags leave out: PostgreSQL when --database-url is not given, NATS when
// neither --broker nor --nats-url is given, the SMTP sink when
// --smtp-addr is not given. It updates s to point at them and registers
// their shutdown with stops.
func startEmbedded(ctx context.Context, s *settings, log *slog.Logger, stops *stopper) (*where, error) {
	w := &where{database: redactURL(s.databaseURL), smtp: s.smtpAddr}
	dir := s.dataDir
	if !s.databaseSet || (!s.brokerSet && !s.natsSet) || !s.smtpSet {
		if dir == "" {
			tmp, err := os.MkdirTemp("", "ferry-")
			if err != nil {
				return nil, fmt.Errorf("ferry: data folder: %w", err)
			}
			stops.add(func() { _ = os.RemoveAll(tmp) })
			dir = tmp
		} else if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("ferry: --%s %s: %w", flagDataDir, dir, err)
		}
	}
	if !s.databaseSet {
		pg, err := startEmbeddedPG(ctx, dir, log)
		if err != nil {
			return nil, err
		}
		stops.add(func() {
			if err := pg.Stop(); err != nil {
				log.Warn("stopping embedded PostgreSQL", "error", err)
			}
		})
		s.databaseURL = pg.URL()
		w.dbRemovedAtExit = s.dataDir == ""
		w.database = "embedded PostgreSQL " + string(embeddedPGVersion) + " at " + redactURL(pg.URL()) + " (data in " + pg.dir + ")"
	}
	if !s.brokerSet {
		s.broker = "nats"
		if !s.natsSet {
			ns, err := startEmbeddedNATS(dir)
			if err != nil {
				return nil, err
			}
			stops.add(ns.Stop)
			s.brokerOpts.NATSURL = ns.URL()
			w.broker = "embedded NATS JetStream at " + ns.URL() + " (data in " + ns.dir + ")"
		}
	}
	if w.broker == "" {
		w.broker = s.broker + " at " + redactURL(s.brokerURL())
	}
	if !s.smtpSet {
		mailDir := ""
		if s.dataDir != "" {
			mailDir = filepath.Join(s.dataDir, "mail")
		}
		sink, err := startSMTPSink(mailDir)
		if err != nil {
			return nil, err
		}
		stops.add(sink.Stop)
		s.smtpAddr = sink.Addr()
		w.sink = sink
		w.smtp = "built-in SMTP sink on " + sink.Addr() + " (in process)"
	} else {
		w.smtp = "SMTP server " + s.smtpAddr
	}
	return w, nil
}

// brokerURL is the URL of the selected broker.
func (s *settings) brokerURL() string { return brokerAddress(s.broker, s.brokerOpts) }

// checkBrokerFlags validates, without any network access, the flags of
// the broker the command will use (see checkBroker), so a malformed one
// fails at start with exit 2 instead of being retried. With embedded
// (demo, run) and no --broker, that broker is NATS: the --nats-url given,
// else the embedded server (nothing to check). Commands without --broker
// have nothing to check.
func checkBrokerFlags(c *cli.Context, s *settings, embedded bool) error {
	if !hasFlag(c, flagBroker) {
		return nil
	}
	name := s.broker
	if embedded && !s.brokerSet {
		if !s.natsSet {
			return nil
		}
		name = "nats"
	}
	return checkBroker(name, s.brokerOpts)
}

// openMigratedStack is openStack without migrating, for the operator
// commands (outbox, jobs, console): it refuses a database without ferry's
// schema with the relay's error ("run ferry migrate first") rather than
// the raw SQLSTATE 42P01 of the first query.
func openMigratedStack(ctx context.Context, s *settings, log *slog.Logger) (*stack, error) {
	st, err := openStack(ctx, s, log, false)
	if err != nil {
		return nil, err
	}
	if err := st.checkSchema(ctx, false); err != nil {
		st.close()
		return nil, err
	}
	return st, nil
}

// openStack connects to the database (pool sized for the worker's
// concurrency and the relay) and builds the notification service. With
// migrate it applies the outbox's and the app's migrations first.
func openStack(ctx context.Context, s *settings, log *slog.Logger, migrate bool) (*stack, error) {
	cfg, err := pgxpool.ParseConfig(s.databaseURL)
	if err != nil {
		return nil, databaseURLError(s.databaseURL, err)
	}
	if want := int32(max(s.concurrency, 1) + 20); cfg.MaxConns < want {
		cfg.MaxConns = want
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("ferry: database %s: %w", redactURL(s.databaseURL), err)
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		if pe, ok := dbRefusal(err); ok {
			return nil, fmt.Errorf("ferry: --%s %s: refused by the server (check the user, password and database name): %s (SQLSTATE %s)",
				flagDatabaseURL, redactURL(s.databaseURL), pe.Message, pe.Code)
		}
		return nil, fmt.Errorf("ferry: database %s: %w", redactURL(s.databaseURL), err)
	}
	if migrate {
		if err := migrateAll(ctx, pool); err != nil {
			pool.Close()
			return nil, err
		}
	}
	a, err := app.New(app.Config{
		Pool:                 pool,
		SMTPAddr:             s.smtpAddr,
		SMTPTimeout:          s.smtpTimeout,
		SMTPDataTimeout:      s.smtpDataTimeout,
		DebugFailAfterOutbox: s.debugFail,
		Logger:               log,
		Exchange:             s.exchange,
		Destination:          s.destination,
		Queue:                s.queue,
	})
	if err != nil {
		pool.Close()
		return nil, err
	}
	obs, err := newObservability(ctx, s.obs, metricsBrokerLabel(s.broker), pool, log)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if obs != nil && s.relayMode == outbox.RelayModeWAL {
		obs.walSlot, obs.destination = s.walSlot, s.destination
		if obs.walSlot == "" {
			obs.walSlot = outbox.DefaultSlotName(s.destination)
		}
	}
	return &stack{s: s, log: log, pool: pool, app: a, obs: obs}, nil
}

// NoBrokerLabel is the broker label of the metrics of the api command,
// which talks to no broker (it only writes the outbox).
const NoBrokerLabel = "none"

// metricsBrokerLabel is the metrics' broker label of a command whose
// --broker is name ("" for api, which has no --broker).
func metricsBrokerLabel(name string) string {
	if name == "" {
		return NoBrokerLabel
	}
	return name
}

// databaseURLError is the usage error of a --database-url that pgx could
// not parse (err): it shows the value with only its password hidden
// (redactURL; pgx's own best-effort redaction garbles URLs of other
// schemes), says that a PostgreSQL URL is wanted and, for a URL of another
// scheme, names the scheme.
func databaseURLError(raw string, err error) error {
	const want = "want a PostgreSQL URL, postgres://user:password@host:port/database"
	if u, perr := url.Parse(raw); perr == nil && u.Scheme != "" && strings.Contains(raw, "://") &&
		u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return usagef("--%s %q: scheme %q: %s", flagDatabaseURL, redactURL(raw), u.Scheme, want)
	}
	// pgconn's message is "cannot parse `<its redaction>`: <reason>".
	reason := err.Error()
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		reason = pe.Error()
		if i := strings.Index(reason, "`: "); i >= 0 {
			reason = reason[i+3:]
		}
	}
	return usagef("--%s %q: %s; %s", flagDatabaseURL, redactURL(raw), reason, want)
}

// dbRefusal returns the server's error when err is PostgreSQL refusing
// the connection for good: SQLSTATE class 28 (invalid authorization:
// 28P01 wrong password, 28000 no pg_hba.conf entry or role) or 3D000 (the
// database does not exist), which waiting does not cure.
func dbRefusal(err error) (*pgconn.PgError, bool) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "28") || pe.Code == "3D000") {
		return pe, true
	}
	return nil, false
}

func migrateAll(ctx context.Context, pool *pgxpool.Pool) error {
	if err := outbox.Migrate(ctx, pool); err != nil {
		return err
	}
	return app.Migrate(ctx, pool)
}

// checkSchema makes a role fail at start, with a clear error, on a
// database without the migrations it needs (instead of a /readyz 200
// followed by 500s, or a relay backing off forever): the outbox's for
// every role, the app's too when withApp (api, worker). It never migrates:
// only "ferry migrate", demo and run with embedded PostgreSQL do.
func (st *stack) checkSchema(ctx context.Context, withApp bool) error {
	if st.schemaChecked {
		return nil
	}
	var err error
	if withApp {
		err = app.CheckSchema(ctx, st.pool)
	} else {
		cur, latest, verr := outbox.MigrationVersion(ctx, st.pool)
		switch {
		case verr != nil:
			err = verr
		case cur < latest:
			err = &app.SchemaError{Component: "outbox", Current: cur, Latest: latest}
		}
	}
	var se *app.SchemaError
	if errors.As(err, &se) {
		return fmt.Errorf(`ferry: %s: run "ferry migrate" first (only "ferry demo", and "ferry run" with its embedded PostgreSQL, migrate on their own)`,
			se.Reason())
	}
	if err != nil {
		return fmt.Errorf("ferry: database %s: checking the schema: %w", redactURL(st.s.databaseURL), err)
	}
	st.schemaChecked = withApp
	return nil
}

func (st *stack) close() {
	st.obs.close()
	closePool(st.pool, st.log)
}

func (st *stack) topology() broker.Topology { return st.app.Topology(st.s.retryDelays) }

// apiServerTimeouts are the API server's timeouts (a variable for tests):
// a client gets ReadHeader to send its headers and Read for the whole
// request including the body (so a stalled body, slowloris style, cannot
// hold a connection and a goroutine for ever); Write bounds the handler
// plus the answer, generously; Idle bounds a kept-alive connection
// between requests.
var apiServerTimeouts = struct{ readHeader, read, write, idle time.Duration }{
	readHeader: 10 * time.Second,
	read:       30 * time.Second,
	write:      2 * time.Minute,
	idle:       120 * time.Second,
}

// newAPIServer builds the API's http.Server around h.
func newAPIServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: apiServerTimeouts.readHeader,
		ReadTimeout:       apiServerTimeouts.read,
		WriteTimeout:      apiServerTimeouts.write,
		IdleTimeout:       apiServerTimeouts.idle,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// runAPI serves the HTTP API on s.addr until ctx is done, then shuts down
// within the shutdown timeout.
func (st *stack) runAPI(ctx context.Context) error {
	if err := st.checkSchema(ctx, true); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", st.s.addr)
	if err != nil {
		return fmt.Errorf("ferry: api: --%s %s: %w", flagAddr, st.s.addr, err)
	}
	srv := newAPIServer(st.obs.apiHandler(st.app.Handler()), st.log)
	st.log.Info("api listening", "addr", ln.Addr().String())
	if st.apiReady != nil {
		st.apiReady(ln.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("ferry: api: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), st.s.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("ferry: api: shutdown: %w", err)
	}
	st.log.Info("api stopped")
	return nil
}

// runRelay publishes the outbox to the broker until ctx is done; it waits
// for an unreachable broker.
func (st *stack) runRelay(ctx context.Context) error {
	if err := st.checkSchema(ctx, false); err != nil {
		return err
	}
	defer st.obs.startAlert(ctx)()
	b, err := connectBroker(ctx, st.s.broker, st.brokerOptions("relay"), st.topology(), st.brokerGiveUp, st.log)
	if err != nil {
		return ignoreCanceled(ctx, err)
	}
	defer b.Close()
	if st.brokerReady != nil {
		st.brokerReady()
	}
	p, err := ferry.New(ferry.Config{
		Pool:            st.pool,
		Broker:          st.obs.relayBroker(b),
		Topology:        st.topology(),
		MaxMessageBytes: app.MaxEventBytes,
		Relay: &outbox.RelayConfig{
			Destination:      st.s.destination,
			OnBatch:          st.obs.onBatch(),
			OnBlocked:        st.obs.onBlocked(),
			BatchSize:        st.s.batchSize,
			PollInterval:     st.s.pollInterval,
			Mode:             st.s.relayMode,
			Slot:             st.s.walSlot,
			Retention:        st.s.retention,
			RedeliveryWindow: st.s.retryWindow,
		},
		Logger: st.log,
	})
	if err != nil {
		return err
	}
	st.log.Info("relay running", "broker", st.s.broker)
	return p.Run(ctx)
}

// runWorker consumes the notification queue until ctx is done; it waits
// for an unreachable broker.
func (st *stack) runWorker(ctx context.Context) error {
	if err := st.checkSchema(ctx, true); err != nil {
		return err
	}
	b, err := connectBroker(ctx, st.s.broker, st.brokerOptions("worker"), st.topology(), st.brokerGiveUp, st.log)
	if err != nil {
		return ignoreCanceled(ctx, err)
	}
	defer b.Close()
	// The flags against the broker's limits, before "worker running".
	if err := checkWorkerLimits(ctx, b, worker.Config{Queue: st.app.Queue(), HandlerTimeout: st.s.handlerTimeout,
		Policy: worker.BackoffPolicy{MaxAttempts: st.s.maxAttempts, Delays: st.s.retryDelays}}); err != nil {
		return err
	}
	st.obs.registerBacklog(b, st.app.Queue())
	if st.brokerReady != nil {
		st.brokerReady()
	}
	p, err := ferry.New(ferry.Config{
		Pool:            st.pool,
		Broker:          b,
		Topology:        st.topology(),
		MaxMessageBytes: app.MaxEventBytes,
		Workers: []worker.Config{{
			Queue:           st.app.Queue(),
			Handler:         st.obs.workerHandler(st.app.HandleNotification),
			Concurrency:     st.s.concurrency,
			Prefetch:        st.s.workerPrefetch(),
			BatchSize:       st.s.workerBatch,
			BatchLinger:     st.s.workerLinger,
			Policy:          worker.BackoffPolicy{MaxAttempts: st.s.maxAttempts, Delays: st.s.retryDelays},
			ShutdownTimeout: st.s.shutdownTimeout,
			HandlerTimeout:  st.s.handlerTimeout,
			OnFailure:       st.app.OnFailure,
			OnOutcome:       st.obs.onOutcome(st.onOutcome),
			OnSettleFailure: st.obs.onSettleFailure(),
		}},
		Logger: st.log,
	})
	if err != nil {
		return err
	}
	st.log.Info("worker running", "broker", st.s.broker, "queue", st.app.Queue())
	return p.Run(ctx)
}

func (st *stack) brokerOptions(component string) BrokerOptions {
	o := st.s.brokerOpts
	// No "broker" attribute here: the adapters tag their own lines with it
	// (rabbitmq.New, nats.New), also for callers such as the dlq commands.
	o.Logger = st.log.With("component", component)
	return o
}

// runAll runs api, relay and worker until ctx is done or one of them
// fails; a failure stops the others. With apiAfterBroker the API starts
// only after the relay and the worker declared the topology, so a broker
// that refuses it (broker.ErrTopologyMismatch) stops runAll before any
// request is accepted.
func (st *stack) runAll(ctx context.Context) error {
	if err := st.checkSchema(ctx, true); err != nil { // once for the three roles
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	brokerUp := make(chan struct{})
	if st.apiAfterBroker {
		var left atomic.Int32
		left.Store(2) // relay and worker
		st.brokerReady = func() {
			if left.Add(-1) == 0 {
				close(brokerUp)
			}
		}
	} else {
		close(brokerUp)
	}
	g.Go(func() error {
		select {
		case <-brokerUp:
		case <-gctx.Done():
			return nil // stopped, or the relay or worker failed: its error is runAll's
		}
		return st.runAPI(gctx)
	})
	g.Go(func() error { return st.runRelay(gctx) })
	g.Go(func() error { return st.runWorker(gctx) })
	if st.console != nil {
		g.Go(func() error { return st.runConsole(gctx, st.console) })
	}
	return g.Wait()
}

// ignoreStopped returns nil when ctx was cancelled (SIGINT/SIGTERM)
// while a command was still starting: whatever failed then failed
// because of the stop, which is a graceful exit.
func ignoreStopped(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func ignoreCanceled(ctx context.Context, err error) error {
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return nil
	}
	return err
}
