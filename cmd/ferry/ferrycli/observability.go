package ferrycli

// Observability of the long-running commands (api, relay, worker, run):
// Prometheus metrics at GET /metrics, OpenTelemetry tracing with W3C trace
// context carried API -> outbox -> broker -> worker, and the built-in
// stuck-outbox alert (relay and run). The stack calls the methods of
// *observability at its hook points; every method works on a nil
// *observability (commands without these flags) and then changes nothing.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"
	"golang.org/x/sync/errgroup"

	"github.com/ferrymq/ferry/alert"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/metrics"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/tracing"
	"github.com/ferrymq/ferry/worker"
)

// Flag names of observability.
const (
	flagMetricsAddr         = "metrics-addr"
	flagOTLPEndpoint        = "otlp-endpoint"
	flagAlertThreshold      = "alert-threshold"
	flagAlertFor            = "alert-for"
	flagAlertInterval       = "alert-interval"
	flagAlertWebhookURL     = "alert-webhook-url"
	flagAlertTelegramToken  = "alert-telegram-token"
	flagAlertTelegramChatID = "alert-telegram-chat-id"
	flagAlertTelegramAPIURL = "alert-telegram-api-url"
)

// Default --metrics-addr of the roles without an HTTP API of their own, so
// every role serves GET /metrics out of the box; they differ so that a relay
// and a worker can run on one host (compose/compose.yaml uses the ports).
// Loopback, like every default address of ferry: 0.0.0.0:9464 listens on
// every interface, as the containers of compose/compose.yaml do.
const (
	DefaultRelayMetricsAddr  = "127.0.0.1:9464"
	DefaultWorkerMetricsAddr = "127.0.0.1:9465"
)

// metricsFlags: --metrics-addr (default def), for every long-running
// command. api and run also serve GET /metrics on --addr.
func metricsFlags(def string) []cli.Flag {
	metricsUsage := "listen address, host:port, of a separate HTTP server for GET /metrics (Prometheus); 0.0.0.0:PORT listens on every interface. Empty: no separate server"
	if def == "" {
		metricsUsage += " (this command also serves GET /metrics on --addr)"
	}
	return []cli.Flag{
		&cli.StringFlag{Name: flagMetricsAddr, Value: def, EnvVars: env(flagMetricsAddr),
			Category: catObs, Usage: metricsUsage},
		&cli.StringFlag{Name: flagOTLPEndpoint, EnvVars: env(flagOTLPEndpoint), Category: catObs,
			Usage: "OTLP/HTTP trace receiver base URL, e.g. http://127.0.0.1:4318 (spans go to /v1/traces). Empty: no export; W3C traceparent is still propagated"},
	}
}

// alertFlags: the built-in stuck-outbox alert, for relay and run.
func alertFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: flagAlertThreshold, Value: alert.DefaultThreshold, Category: catAlert, EnvVars: env(flagAlertThreshold),
			Usage: "fire when more than this many outbox rows are unprocessed for --alert-for (one alert per database: of several relays only the leader notifies; state kept in the table ferry_alerts)"},
		&cli.DurationFlag{Name: flagAlertFor, Value: alert.DefaultFor, Category: catAlert, EnvVars: env(flagAlertFor),
			Usage: "how long the backlog must stay above --alert-threshold"},
		&cli.DurationFlag{Name: flagAlertInterval, Value: alert.DefaultInterval, Category: catAlert, EnvVars: env(flagAlertInterval),
			Usage: "how often the backlog is checked"},
		&cli.StringSliceFlag{Name: flagAlertWebhookURL, Category: catAlert, EnvVars: env(flagAlertWebhookURL),
			Usage: "URL that gets a JSON POST when the alert fires and when it resolves (repeat the flag for several)"},
		&cli.StringFlag{Name: flagAlertTelegramToken, Category: catAlert, EnvVars: env(flagAlertTelegramToken),
			Usage: "Telegram bot token (sendMessage); prefer the environment variable"},
		&cli.StringFlag{Name: flagAlertTelegramChatID, Category: catAlert, EnvVars: env(flagAlertTelegramChatID),
			Usage: "Telegram chat ID (numeric or @channel)"},
		&cli.StringFlag{Name: flagAlertTelegramAPIURL, Value: alert.DefaultTelegramBaseURL, Category: catAlert, EnvVars: env(flagAlertTelegramAPIURL),
			Usage: "Telegram Bot API base URL"},
	}
}

// obsSettings are the parsed observability flags.
type obsSettings struct {
	metricsAddr    string
	otlpEndpoint   string
	alertEnabled   bool
	alertThreshold int
	alertFor       time.Duration
	alertInterval  time.Duration
	notifiers      []alert.Notifier
}

// loadObsSettings parses the observability flags of c's command; nil when
// the command has none.
func loadObsSettings(c *cli.Context) (*obsSettings, error) {
	if !hasFlag(c, flagMetricsAddr) {
		return nil, nil
	}
	o := &obsSettings{
		metricsAddr:  c.String(flagMetricsAddr),
		otlpEndpoint: c.String(flagOTLPEndpoint),
	}
	if o.metricsAddr != "" {
		if _, _, err := net.SplitHostPort(o.metricsAddr); err != nil {
			return nil, usagef("--%s %q: want host:port or :port", flagMetricsAddr, o.metricsAddr)
		}
	}
	if !hasFlag(c, flagAlertThreshold) {
		return o, nil
	}
	o.alertEnabled = true
	o.alertThreshold = c.Int(flagAlertThreshold)
	o.alertFor = c.Duration(flagAlertFor)
	o.alertInterval = c.Duration(flagAlertInterval)
	if o.alertThreshold < 1 {
		return nil, usagef("--%s %d: must be at least 1", flagAlertThreshold, o.alertThreshold)
	}
	if o.alertFor <= 0 {
		return nil, usagef("--%s %v: must be positive", flagAlertFor, o.alertFor)
	}
	if o.alertInterval <= 0 {
		return nil, usagef("--%s %v: must be positive", flagAlertInterval, o.alertInterval)
	}
	ns, err := alert.Targets{
		WebhookURLs:     c.StringSlice(flagAlertWebhookURL),
		TelegramToken:   c.String(flagAlertTelegramToken),
		TelegramChatID:  c.String(flagAlertTelegramChatID),
		TelegramBaseURL: c.String(flagAlertTelegramAPIURL),
	}.Notifiers()
	if err != nil {
		return nil, usagef("--alert-*: %v", err)
	}
	o.notifiers = ns
	return o, nil
}

// observability is the metrics registry, the tracer provider and the alert
// configuration of one command.
type observability struct {
	set             *obsSettings
	log             *slog.Logger
	broker          string
	pool            *pgxpool.Pool
	reg             *prometheus.Registry
	metrics         *metrics.Metrics
	tracingShutdown func(context.Context) error
	// walSlot is the WAL relay's slot (--relay-mode=wal), "" otherwise:
	// the outbox gauges then include the slot's (outboxGauges).
	walSlot, destination string
	// relayBlocked is the broker's reason while this process's relay
	// holds its rows because the broker has no room ("" or nil: not
	// blocked); /readyz answers 503 with it (readyz).
	relayBlocked atomic.Pointer[string]
}

// newObservability creates the registry (Go, process, relay, worker and
// outbox series labelled with brokerName) and installs tracing. It returns
// nil for a nil set.
func newObservability(ctx context.Context, set *obsSettings, brokerName string, pool *pgxpool.Pool, log *slog.Logger) (*observability, error) {
	if set == nil {
		return nil, nil
	}
	o := &observability{set: set, log: log, broker: brokerName, pool: pool, reg: metrics.NewRegistry()}
	m, err := metrics.New(o.reg, brokerName)
	if err != nil {
		return nil, err
	}
	o.metrics = m
	if err := metrics.RegisterOutboxStats(o.reg, brokerName, o.outboxGauges); err != nil {
		return nil, err
	}
	shutdown, err := tracing.Setup(ctx, tracing.Config{OTLPEndpoint: set.otlpEndpoint, ServiceName: "ferry", Logger: log})
	if err != nil {
		if errors.Is(err, tracing.ErrConfig) {
			return nil, usagef("--%s: %v", flagOTLPEndpoint, err)
		}
		return nil, err
	}
	o.tracingShutdown = shutdown
	return o, nil
}

func (o *observability) outboxStats(ctx context.Context) (int, time.Duration, error) {
	s, err := outbox.ReadStats(ctx, o.pool)
	return int(s.Unprocessed), s.OldestUnprocessedAge, err
}

// outboxGauges feeds the outbox gauges, ferry_outbox_parked_rows included.
func (o *observability) outboxGauges(ctx context.Context) (metrics.OutboxStats, error) {
	s, err := outbox.ReadStats(ctx, o.pool)
	st := metrics.OutboxStats{Unprocessed: int(s.Unprocessed), Oldest: s.OldestUnprocessedAge, Parked: int(s.Parked)}
	if err != nil || o.walSlot == "" {
		return st, err
	}
	w, err := outbox.ReadWALStats(ctx, o.pool, o.walSlot, o.destination)
	st.WAL, st.WALRetainedBytes, st.WALOldestUnconfirmed = true, w.RetainedBytes, w.OldestUnconfirmedAge
	return st, err
}

// close flushes pending spans (at most 5 s).
func (o *observability) close() {
	if o == nil || o.tracingShutdown == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := o.tracingShutdown(ctx); err != nil {
		o.log.Warn("tracing: shutdown", "err", err)
	}
}

// apiHandler serves GET /metrics beside h and traces every other request
// (server span, its traceparent stored with the outbox event).
func (o *observability) apiHandler(h http.Handler) http.Handler {
	if o == nil {
		return h
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler(o.reg))
	mux.Handle("GET /readyz", tracing.Middleware(o.readyz(h)))
	mux.Handle("/", tracing.Middleware(h))
	return mux
}

// relayBroker adds a producer span per published message.
func (o *observability) relayBroker(b broker.Broker) broker.Broker {
	if o == nil {
		return b
	}
	return tracing.WrapBroker(b)
}

// onBatch is outbox.RelayConfig.OnBatch (nil without observability).
func (o *observability) onBatch() func(outbox.BatchStats) {
	if o == nil {
		return nil
	}
	return func(s outbox.BatchStats) { o.metrics.ObserveBatch(s.Published, s.Failed, s.Duration) }
}

// onBlocked is outbox.RelayConfig.OnBlocked: the ferry_relay_blocked
// gauge and the reason /readyz gives (nil without observability).
func (o *observability) onBlocked() func(string) {
	if o == nil {
		return nil
	}
	return func(reason string) {
		o.relayBlocked.Store(&reason)
		o.metrics.SetRelayBlocked(reason)
	}
}

// blockedReason is the reason /readyz gives while the relay of this
// process is blocked by a broker without room, "" otherwise.
func (o *observability) blockedReason() string {
	if o == nil {
		return ""
	}
	if p := o.relayBlocked.Load(); p != nil && *p != "" {
		return "the broker has no room (" + *p + "): the relay holds the outbox rows and resumes by itself when the broker takes messages again"
	}
	return ""
}

// readyz answers GET /readyz with 503 {"status":"blocked","error":...}
// while the relay is blocked (blockedReason), and otherwise hands the
// request to next (the API's own check), or answers 200 {"status":"ok"}
// when next is nil (the --metrics-addr server of a relay).
func (o *observability) readyz(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reason := o.blockedReason()
		if reason == "" && next != nil {
			next.ServeHTTP(w, r)
			return
		}
		status, body := http.StatusOK, map[string]string{"status": "ok"}
		if reason != "" {
			status, body = http.StatusServiceUnavailable, map[string]string{"status": "blocked", "error": reason}
		}
		b, _ := json.Marshal(body)
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(status)
		w.Write(append(b, '\n')) //nolint:errcheck // the client is gone
	})
}

// workerHandler runs h inside a consumer span continuing the message's
// trace.
func (o *observability) workerHandler(h worker.Handler) worker.Handler {
	if o == nil {
		return h
	}
	return tracing.WrapHandler(h)
}

// onOutcome is worker.Config.OnOutcome: metrics, then next when set.
func (o *observability) onOutcome(next func(*broker.Message, worker.Outcome, time.Duration)) func(*broker.Message, worker.Outcome, time.Duration) {
	if o == nil {
		return next
	}
	return func(msg *broker.Message, out worker.Outcome, d time.Duration) {
		o.metrics.ObserveOutcome(msg, out.String(), d)
		if next != nil {
			next(msg, out, d)
		}
	}
}

// onSettleFailure is worker.Config.OnSettleFailure: it counts the failure
// in ferry_worker_settle_failures_total (the worker logs it). nil without
// metrics.
func (o *observability) onSettleFailure() func(broker.SettleFailure) {
	if o == nil {
		return nil
	}
	return o.metrics.ObserveSettleFailure
}

// serveMetrics serves GET /metrics on --metrics-addr until ctx is done; it
// returns nil at once when the flag is empty.
func (o *observability) serveMetrics(ctx context.Context) error {
	if o == nil || o.set.metricsAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", o.set.metricsAddr)
	if err != nil {
		return fmt.Errorf("ferry: metrics: --%s %s: %w", flagMetricsAddr, o.set.metricsAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler(o.reg))
	mux.Handle("GET /readyz", o.readyz(nil))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(o.log.Handler(), slog.LevelWarn)}
	o.log.Info("metrics listening", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("ferry: metrics: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

// runAlert runs the stuck-outbox alert until ctx is done (relay and run);
// it returns nil at once for a command without the alert flags. The alert
// is one per database (alert.Config.Pool): of several relays on one
// database only the one holding the leader lock notifies.
func (o *observability) runAlert(ctx context.Context) error {
	if o == nil || !o.set.alertEnabled {
		return nil
	}
	a, err := alert.New(alert.Config{
		Threshold: o.set.alertThreshold,
		For:       o.set.alertFor,
		Interval:  o.set.alertInterval,
		Notifiers: o.set.notifiers,
		Logger:    o.log.With("component", "alert"),
		Source:    o.outboxStats,
		Labels:    map[string]string{"broker": o.broker},
		// One alert per database: the relays (and runs) on one database
		// elect a leader that alone notifies, and a replacement continues
		// a firing alert from the table ferry_alerts.
		Pool: o.pool,
	})
	if err != nil {
		return err
	}
	o.log.Info("stuck-outbox alert armed", "threshold", o.set.alertThreshold, "for", o.set.alertFor,
		"notifiers", len(o.set.notifiers))
	_ = a.Run(ctx)
	return nil
}

// startAlert runs the stuck-outbox alert in the background (before the
// relay waits for an unreachable broker: that is when the outbox gets
// stuck) and returns the function that stops it and waits for it.
func (o *observability) startAlert(ctx context.Context) (stop func()) {
	if o == nil || !o.set.alertEnabled {
		return func() {}
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := o.runAlert(actx); err != nil {
			o.log.Error("stuck-outbox alert not running", "err", err)
		}
	}()
	return func() { cancel(); <-done }
}

// withMetrics runs f while serving --metrics-addr; a failure of either
// stops the other.
func (o *observability) withMetrics(ctx context.Context, f func(context.Context) error) error {
	if o == nil || o.set.metricsAddr == "" {
		return f(ctx)
	}
	g, gctx := errgroup.WithContext(ctx)
	mctx, stopMetrics := context.WithCancel(gctx)
	g.Go(func() error { return o.serveMetrics(mctx) })
	g.Go(func() error {
		defer stopMetrics()
		return f(gctx)
	})
	return g.Wait()
}
