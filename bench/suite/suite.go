package suite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
)

// Scenario names, in the order Run runs them.
const (
	ScenarioRaw       = "raw"
	ScenarioPipeline  = "pipeline"
	ScenarioEndToEnd  = "end-to-end"
	ScenarioLatency   = "latency"
	ScenarioFaults    = "faults"
	ScenarioOrdering  = "ordering"
	ScenarioRouting   = "routing"
	ScenarioRetry     = "retry"
	ScenarioReplay    = "replay"
	ScenarioPeer      = "peer"
	ScenarioFailover  = "failover"
	ScenarioSoak      = "soak"
	statusOK          = "ok"
	statusUnsupported = "not supported"
	statusFailed      = "failed"
	statusNotBuilt    = "not built"
)

// Scenarios lists every scenario name in run order.
var Scenarios = []string{ScenarioRaw, ScenarioPipeline, ScenarioEndToEnd, ScenarioLatency, ScenarioFaults, ScenarioOrdering, ScenarioRouting, ScenarioRetry, ScenarioReplay, ScenarioPeer, ScenarioFailover, ScenarioSoak}

// BuiltScenarios are the scenarios Run measures by default (the default
// of Config.Scenarios): every scenario but failover, which starts a
// 3-node cluster per broker, and soak, which runs for an hour by default;
// both run only when asked for.
var BuiltScenarios = slices.DeleteFunc(slices.Clone(Scenarios), func(s string) bool { return s == ScenarioFailover || s == ScenarioSoak })

// ErrConfig is wrapped by the errors of Config.validate: a bad flag.
var ErrConfig = errors.New("bench: invalid configuration")

// Target is one broker to benchmark.
type Target struct {
	// Name is the broker's name in ferry's CLI (ferrycli.Brokers), e.g.
	// "rabbitmq"; it selects the raw baseline's client. Required.
	Name string
	// Open connects a new adapter; each role (relay, worker) opens its own,
	// as separate processes would. Required.
	Open func(ctx context.Context) (broker.Broker, error)
	// URL is the server's URL (amqp://, nats://): the raw client connects
	// to it and its port finds the server's process for the CPU figures.
	// Empty: no raw baseline and no broker CPU.
	URL string
	// Cleanup, when set, removes from the server what a scenario run
	// declared with tp (exchange, queues, retry levels, DLQ, streams),
	// after the run. Nil leaves them; their names are unique per run.
	Cleanup func(ctx context.Context, tp broker.Topology) error
	// Where describes the server in the report, e.g. "embedded NATS
	// JetStream in the ferry process". Defaults to URL.
	Where string
	// Cluster, when set, returns the broker's cluster for the failover
	// scenario, starting it when it does not run (its Close stops it
	// again); it is called once per failover run. Nil: failover is "not
	// supported" on this broker.
	Cluster func(ctx context.Context) (*Cluster, error)
	// ServerURL is the server's own URL when URL goes through a proxy
	// (ferry bench --sqs-latency): its port finds the server's process for
	// the CPU and memory figures. Defaults to URL.
	ServerURL string
}

// serverURL is t.ServerURL, or t.URL.
func (t Target) serverURL() string {
	if t.ServerURL != "" {
		return t.ServerURL
	}
	return t.URL
}

// Config configures Run. Zero values mean the documented defaults; the
// fields map one to one onto ferry bench's flags.
type Config struct {
	// Targets are the brokers, each measured by every scenario. Required.
	Targets []Target
	// DatabaseURL is a PostgreSQL URL whose user may create databases:
	// every scenario run gets a fresh database, dropped afterwards.
	// Required.
	DatabaseURL string
	// Scenarios to run, a subset of Scenarios, run in Scenarios' order.
	// Defaults to BuiltScenarios.
	Scenarios []string
	// Messages per scenario run (--messages). Defaults to 20,000.
	Messages int
	// Size is the event body in bytes (--size). Defaults to DefaultSize
	// (160 bytes, a message of about 300 bytes).
	Size int
	// Rate is the producers' rate in events/s in end-to-end and latency
	// (--rate); 0 means as fast as they go in end-to-end, and 200/s then
	// 1,000/s in latency.
	Rate int
	// Workers is the worker's Concurrency (--workers). Defaults to 20.
	Workers int
	// Out is the folder results.json, results.md and the charts are
	// written to (--out); created when missing. Required.
	Out string
	// Command is the command line, recorded in the results.
	Command string
	// Progress receives the progress lines; nil discards them.
	Progress io.Writer
	// Logger receives the relay's and worker's logs; defaults to warnings
	// and errors on stderr.
	Logger *slog.Logger
	// Spawn returns the command that runs `ferry bench-child` with args
	// (--role, --database-url, --broker, --exchange, --workers) plus the
	// flags that reach the broker: the faults scenario runs the relay and
	// the worker as such child processes, to kill them with SIGKILL. Nil:
	// faults is "not supported".
	Spawn func(ctx context.Context, args []string) *exec.Cmd
	// RestartBroker stops the named broker's server and starts it again
	// (same port, same data), returning once it accepts connections; the
	// faults scenario calls it a quarter into the run. Nil: no broker
	// restart.
	RestartBroker func(ctx context.Context, broker string) error
	// PeerDir is the folder of the Watermill peer module (bench/watermill
	// of a ferry checkout), run with the go command by the peer scenario.
	// Empty: peer is "not supported".
	PeerDir string
	// Database describes the PostgreSQL server in the report (e.g.
	// "embedded PostgreSQL 18"). Defaults to "PostgreSQL".
	Database string
	// SoakDuration is how long the soak scenario's producers commit at
	// Rate (--soak-duration). Defaults to an hour.
	SoakDuration time.Duration
	// SoakFaultEvery is the time between two of the soak scenario's
	// faults (--soak-fault-every), which cycle through a SIGKILL of the
	// relay, a SIGKILL of the worker and RestartBroker (when set).
	// Defaults to 3 minutes.
	SoakFaultEvery time.Duration
}

func (c *Config) withDefaults() (Config, error) {
	cfg := *c
	bad := func(format string, args ...any) (Config, error) {
		return cfg, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
	}
	if len(cfg.Targets) == 0 {
		return bad("no broker to benchmark")
	}
	for _, t := range cfg.Targets {
		if t.Name == "" || t.Open == nil {
			return bad("Target %q: Name and Open are required", t.Name)
		}
	}
	if cfg.DatabaseURL == "" {
		return bad("DatabaseURL: required")
	}
	if cfg.Out == "" {
		return bad("Out: required (the folder for results.json, results.md and the charts)")
	}
	if len(cfg.Scenarios) == 0 {
		cfg.Scenarios = BuiltScenarios
	}
	for _, s := range cfg.Scenarios {
		if !slices.Contains(Scenarios, s) {
			return bad("scenario %q: want some of %s", s, strings.Join(Scenarios, ","))
		}
	}
	switch {
	case cfg.Messages < 0:
		return bad("messages %d: must be positive", cfg.Messages)
	case cfg.Size < 0:
		return bad("size %d: must be positive", cfg.Size)
	case cfg.Rate < 0:
		return bad("rate %d: must not be negative (0: flat out)", cfg.Rate)
	case cfg.Workers < 0:
		return bad("workers %d: must be positive", cfg.Workers)
	case cfg.SoakDuration < 0:
		return bad("soak duration %v: must be positive", cfg.SoakDuration)
	case cfg.SoakFaultEvery < 0:
		return bad("soak fault interval %v: must be positive", cfg.SoakFaultEvery)
	}
	if cfg.SoakDuration == 0 {
		cfg.SoakDuration = time.Hour
	}
	if cfg.SoakFaultEvery == 0 {
		cfg.SoakFaultEvery = 3 * time.Minute
	}
	if cfg.Messages == 0 {
		cfg.Messages = 20000
	}
	if cfg.Size == 0 {
		cfg.Size = DefaultSize
	}
	if cfg.Workers == 0 {
		cfg.Workers = 20
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if cfg.Database == "" {
		cfg.Database = "PostgreSQL"
	}
	return cfg, nil
}

// Figure is one measured value.
type Figure struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit,omitempty"`
}

// Point is one point of a series (lag over time: seconds and rows;
// latency CDF: milliseconds and fraction).
type Point struct {
	X float64 `json:"x"`
	Y float64 `json:"y"`
}

// Result is one scenario on one broker (and variant, such as a rate).
type Result struct {
	Scenario string `json:"scenario"`
	Broker   string `json:"broker"`
	// RelayMode is the outbox relay's mode the result was measured with
	// (outbox.RelayConfig.Mode): "poll" (RelayMode) for every scenario's
	// rows but end-to-end's and peer's VariantWALBatch rows (and the
	// ratios of those), which are "wal", and the peer's Watermill rows,
	// RelayModeWatermill (no ferry relay in them). More WAL relay figures,
	// side by side with the polling relay's, come from the Go benchmarks
	// (bench/README.md, "Polling and WAL relays").
	RelayMode string `json:"relay_mode"`
	// Variant distinguishes several runs of a scenario on one broker, e.g.
	// "200/s" or "4 workers, ordered".
	Variant string `json:"variant,omitempty"`
	// Status is "ok", "not supported" (the broker lacks the capability),
	// "not built" or "failed".
	Status   string        `json:"status"`
	Note     string        `json:"note,omitempty"`
	Messages int           `json:"messages"`
	Seconds  float64       `json:"seconds"`
	Figures  []Figure      `json:"figures,omitempty"`
	Latency  *LatencyStats `json:"latency,omitempty"`
	// Series is the scenario's curve: the outbox lag over time
	// (pipeline), the events handled over time (faults), the latency CDF
	// (latency), the backlog around the kill (failover).
	Series []Point `json:"series,omitempty"`
	// Soak are the soak scenario's rows: the pipeline's processes and
	// tables at the start, at each fault and at the end.
	Soak []SoakRow `json:"soak,omitempty"`
	// LoadAverage is the machine's 1-minute load average at the end of
	// the run (/proc/loadavg; 0: not read): how busy the (possibly
	// shared) machine was while it ran. The charts' captions quote it.
	LoadAverage float64 `json:"load_average,omitempty"`
}

// figure returns the value of the named figure and whether it is there.
func (r Result) figure(name string) (float64, bool) {
	for _, f := range r.Figures {
		if f.Name == name {
			return f.Value, true
		}
	}
	return 0, false
}

func (r *Result) add(name string, v float64, unit string) {
	r.Figures = append(r.Figures, Figure{Name: name, Value: v, Unit: unit})
}

// Results is what Run measured, written to results.json.
type Results struct {
	Started  time.Time         `json:"started"`
	Seconds  float64           `json:"seconds"`
	Command  string            `json:"command,omitempty"`
	Host     Host              `json:"host"`
	Servers  map[string]string `json:"servers"`
	Clients  map[string]string `json:"clients"`
	Settings map[string]any    `json:"settings"`
	Results  []Result          `json:"results"`
	// Capabilities are what each broker's adapter declares.
	Capabilities map[string]Capabilities `json:"capabilities,omitempty"`
	// Operations are each server's processes and memory at the end of
	// the run, and each cluster's at the end of its failover run.
	Operations []Operations `json:"operations,omitempty"`
}

// runner is one Run in progress.
type runner struct {
	cfg Config
	log *slog.Logger
	// rawPublish is each broker's raw publish rate (msgs/s) measured in
	// this run, the denominator of pipeline's ratio.
	rawPublish map[string]float64
	servers    map[string]string
	// results are the results so far.
	results []Result
	// clusterOps are the clusters' processes and memory, measured by
	// the failover scenario while they ran.
	clusterOps []Operations
	// peerBin is the peer module's compiled benchmarks (peerBinary);
	// peerCleanup removes them at the end of Run.
	peerBin     string
	peerCleanup []func()
}

// Run runs the scenarios of cfg on every target, writes results.json,
// results.md and one chart per scenario (SVG and PNG) to cfg.Out and
// returns the results. A scenario that fails on a broker is recorded
// with status "failed" and its error, and the run goes on; Run returns an
// error only for a bad Config, an unreachable database, ctx's end or
// files it could not write.
func Run(ctx context.Context, c Config) (*Results, error) {
	cfg, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, fmt.Errorf("bench: --out %s: %w", cfg.Out, err)
	}
	r := &runner{cfg: cfg, log: cfg.Logger, rawPublish: map[string]float64{}, servers: map[string]string{}}
	defer func() {
		for _, f := range r.peerCleanup {
			f()
		}
	}()
	res := &Results{
		Started: time.Now().UTC(), Command: cfg.Command, Host: readHost(), Servers: r.servers, Clients: clientVersions(),
		Settings: map[string]any{
			"messages": cfg.Messages, "body_bytes": cfg.Size, "rate": cfg.Rate, "workers": cfg.Workers,
			"relay_batch": relayBatch, "relay_concurrency": relayConcurrency, "producers": producers,
		},
	}
	if slices.Contains(cfg.Scenarios, ScenarioSoak) {
		res.Settings["soak_duration"], res.Settings["soak_fault_every"] = cfg.SoakDuration.String(), cfg.SoakFaultEvery.String()
	}
	if v, err := postgresVersion(ctx, cfg.DatabaseURL); err != nil {
		return nil, err
	} else {
		r.servers["postgres"] = v + " (" + cfg.Database + ")"
	}
	for _, t := range cfg.Targets {
		where := t.Where
		if where == "" {
			where = t.URL
		}
		r.servers[t.Name] = where
	}
	start := time.Now()
	for _, sc := range Scenarios {
		if !slices.Contains(cfg.Scenarios, sc) {
			continue
		}
		for _, t := range cfg.Targets {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			res.Results = append(res.Results, r.runScenario(ctx, sc, t)...)
			r.results = res.Results
		}
	}
	res.Seconds = time.Since(start).Seconds()
	r.collectOps(ctx, res)
	if err := write(cfg.Out, res); err != nil {
		return res, err
	}
	return res, ctx.Err()
}

// runScenario runs one scenario on one broker and records a failure as a
// result.
func (r *runner) runScenario(ctx context.Context, sc string, t Target) []Result {
	label := sc + " " + t.Name
	fmt.Fprintf(r.cfg.Progress, "ferry bench: %s…\n", label)
	start := time.Now()
	var (
		out []Result
		err error
	)
	switch sc {
	case ScenarioRaw:
		out, err = r.raw(ctx, t)
	case ScenarioPipeline:
		out, err = r.pipeline(ctx, t)
	case ScenarioEndToEnd:
		out, err = r.endToEnd(ctx, t)
	case ScenarioLatency:
		out, err = r.latency(ctx, t)
	case ScenarioFaults:
		out, err = r.faults(ctx, t)
	case ScenarioOrdering:
		out, err = r.ordering(ctx, t)
	case ScenarioRouting:
		out, err = r.routing(ctx, t)
	case ScenarioRetry:
		out, err = r.retry(ctx, t)
	case ScenarioReplay:
		out, err = r.replay(ctx, t)
	case ScenarioPeer:
		out, err = r.peer(ctx, t)
	case ScenarioFailover:
		out, err = r.failover(ctx, t)
	case ScenarioSoak:
		out, err = r.soak(ctx, t)
	default:
		out = []Result{{Scenario: sc, Broker: t.Name, Status: statusNotBuilt, Note: "not built yet; see bench/README.md"}}
	}
	if err != nil {
		out = append(out, Result{Scenario: sc, Broker: t.Name, Status: statusFailed, Note: err.Error()})
		fmt.Fprintf(r.cfg.Progress, "ferry bench: %s failed: %v\n", label, err)
	}
	for i := range out {
		out[i].Scenario, out[i].Broker = sc, t.Name
		if out[i].RelayMode == "" {
			out[i].RelayMode = RelayMode
		}
		if out[i].Status == "" {
			out[i].Status = statusOK
		}
		if out[i].Seconds == 0 && len(out) == 1 {
			out[i].Seconds = time.Since(start).Seconds()
		}
		out[i].LoadAverage = loadAverage()
		fmt.Fprintf(r.cfg.Progress, "ferry bench: %s\n", summaryLine(out[i]))
	}
	return out
}

// RelayMode is the relay mode of every scenario's relay
// (Result.RelayMode) unless its result names another: the polling relay.
const RelayMode = outbox.RelayModePoll

// RelayModeWatermill is the Result.RelayMode of the peer scenario's
// Watermill rows: Watermill's SQL subscriber forwards the rows, no ferry
// relay runs.
const RelayModeWatermill = "watermill"

// summaryLine is one result in one line, for the progress output.
func summaryLine(r Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Scenario, r.Broker)
	if r.RelayMode != "" {
		fmt.Fprintf(&b, " [relay %s]", r.RelayMode)
	}
	if r.Variant != "" {
		fmt.Fprintf(&b, " (%s)", r.Variant)
	}
	fmt.Fprintf(&b, ": %s", r.Status)
	for _, f := range r.Figures {
		fmt.Fprintf(&b, "; %s %s", f.Name, formatValue(f.Value))
		if f.Unit != "" {
			fmt.Fprintf(&b, " %s", f.Unit)
		}
	}
	if r.Note != "" {
		fmt.Fprintf(&b, " — %s", r.Note)
	}
	return b.String()
}

// cleanup runs t.Cleanup on tp, logging a failure.
func (r *runner) cleanup(t Target, tp broker.Topology) {
	if t.Cleanup == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := t.Cleanup(ctx, tp); err != nil {
		r.log.Warn("bench: remove the run's queues", "broker", t.Name, "error", err)
	}
}
