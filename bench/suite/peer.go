package suite

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ferrymq/ferry/outbox"
)

// Watermill profiles of the peer module (bench/watermill): its defaults
// and the tuned settings, per broker (bench/watermill/pubsubs_test.go).
var peerProfiles = []string{"defaults", "tuned"}

// PeerBrokers are the brokers the Watermill peer runs on, each with
// Watermill's own Pub/Sub for it: watermill-amqp, watermill-kafka,
// watermill-nats (JetStream) and watermill-aws's sqs.
var PeerBrokers = []string{"rabbitmq", "kafka", "nats", "sqs"}

// Variants of the peer scenario's rows, per broker: ferry's own figures
// (PeerFerry...: the polling relay with one worker transaction per
// message, and PeerFerryWALEndToEnd, the WAL relay with batched worker
// commits, VariantWALBatch), Watermill's per profile ("watermill
// <profile>, ..."), and the ratios of each ferry variant to each profile
// (PeerRatio + profile for the polling relay, PeerWALRatio + profile for
// the WAL relay), the rows a chart of ferry ÷ Watermill per broker reads.
const (
	PeerFerryEndToEnd    = "ferry, end-to-end"
	PeerFerryWALEndToEnd = "ferry " + VariantWALBatch + ", end-to-end"
	PeerRatio            = "ferry ÷ watermill "
	PeerWALRatio         = "ferry " + VariantWALBatch + " ÷ watermill "
	peerRetry            = "retry after 1 s"
)

// Figures of the PeerRatio rows: ferry's figure divided by Watermill's,
// measured side by side in one peer scenario run. Above 1 ferry is
// ahead in throughput; below 1 it is ahead in CPU and p99. The p99
// figures are named per rate ("ferry/watermill p99 200/s").
// PeerPostgresCPURatio is PostgreSQL's CPU per event (the whole
// server's, "CPU postgres") under ferry divided by the same under
// Watermill. The PeerWALRatio rows have no p99 figures: the peer measures
// latency with the polling relay only.
const (
	PeerThroughputRatio  = "ferry/watermill throughput"
	PeerCPURatio         = "ferry/watermill CPU"
	PeerPostgresCPURatio = "ferry/watermill CPU postgres"
	PeerP99Ratio         = "ferry/watermill p99"
)

// peerE2EFigures are the figures of the peer's end-to-end rows, ferry's
// and Watermill's alike: throughput (events/s), CPU per 1,000 events of
// the pipeline's own process ("CPU app"; ferry's "CPU ferry"), of
// PostgreSQL, of the broker and of all three (s), WAL bytes per event and
// commits per event.
var peerE2EFigures = []string{"throughput", "CPU ferry", "CPU postgres", "CPU broker", "CPU all", "WAL", "commits"}

// peerWatermillFigures maps the Watermill benchmark's metric units
// (runcost.Cost.Metrics, measured inside its BenchmarkEndToEnd from the
// first commit to the last event handled, per profile) to the peer's
// figure names and units; "<broker>-cpu-s/1k" is "CPU broker".
var peerWatermillFigures = []struct{ unit, name, figUnit string }{
	{"app-cpu-s/1k", "CPU app", "s/1k events"},
	{"postgres-cpu-s/1k", "CPU postgres", "s/1k events"},
	{"<broker>-cpu-s/1k", "CPU broker", "s/1k events"},
	{"all-cpu-s/1k", "CPU all", "s/1k events"},
	{"wal-B/event", "WAL", "B/event"},
	{"commits/event", "commits", "/event"},
}

// peerRetryNotes says, per broker, what Watermill's Pub/Sub offers for
// the retry scenario's need, a per-message delayed redelivery (1 s
// requested by the handler). From each Pub/Sub's source at the versions
// of bench/watermill/go.mod.
var peerRetryNotes = map[string]struct{ status, note string }{
	"rabbitmq": {statusUnsupported, "watermill-amqp's Nack requeues at once (basic.nack with requeue); a delay is only middleware.Retry's sleep in the consumer process, holding the delivery"},
	"kafka":    {statusUnsupported, "watermill-kafka redelivers a nacked message after SubscriberConfig.NackResendSleep (one value per subscriber, 100 ms by default) in the consumer process, holding up its partition meanwhile; nothing on the broker"},
	"nats":     {statusNotBuilt, "watermill-nats can delay natively (SubscriberConfig.NakDelay, a NakWithDelay per attempt number, not per message); the peer does not measure retry"},
	"sqs":      {statusUnsupported, "watermill-aws leaves a nacked message to come back after the queue's VisibilityTimeout (one value per queue, 30 s by default; no ChangeMessageVisibility) and drops the rest of the worker's received batch to the same timeout"},
}

// peer runs the Watermill module's end-to-end and latency benchmarks (its
// own Go module, bench/watermill in Config.PeerDir, compiled once per Run
// with `go test -c`) against the same PostgreSQL and broker t, with the
// same number of events, body size, producers and rates, alternating
// with ferry's own end-to-end and latency runs on t: ferry end to end,
// then Watermill's; per rate, ferry's latency, then Watermill's. The
// ratios of each broker come from these side-by-side runs, not from the
// end-to-end and latency scenarios of the same run (which may be minutes
// away, or absent).
func (r *runner) peer(ctx context.Context, t Target) ([]Result, error) {
	if !slices.Contains(PeerBrokers, t.Name) {
		return []Result{{Status: statusUnsupported, Note: "no Watermill Pub/Sub for " + t.Name + " in the peer module"}}, nil
	}
	if r.cfg.PeerDir == "" {
		return []Result{{Status: statusUnsupported, Note: "needs the Watermill module (bench/watermill of a ferry checkout, --peer-dir) and the go command"}}, nil
	}
	env, err := r.peerEnv(t)
	if err != nil {
		return nil, err
	}
	bin, err := r.peerBinary(ctx)
	if err != nil {
		return nil, err
	}
	n := r.cfg.Messages
	var out []Result

	// End to end: ferry (polling relay, then WAL relay with batched
	// commits), then Watermill (both profiles).
	fe, err := r.endToEndRun(ctx, t, ferryPoll)
	if err != nil {
		return nil, fmt.Errorf("ferry end-to-end: %w", err)
	}
	ferryE2E := peerFerryRow(fe, PeerFerryEndToEnd, peerE2EFigures...)
	out = append(out, ferryE2E)
	fw, err := r.endToEndRun(ctx, t, ferryWALBatch)
	var ferryWAL Result
	switch {
	case errors.Is(err, outbox.ErrWALUnavailable):
		// No WAL rows nor ratios on a server without logical replication.
		out = append(out, Result{Variant: PeerFerryWALEndToEnd, RelayMode: ferryWALBatch.mode, Status: statusUnsupported, Note: err.Error()})
	case err != nil:
		return out, fmt.Errorf("ferry end-to-end, %s: %w", VariantWALBatch, err)
	default:
		ferryWAL = peerFerryRow(fw, PeerFerryWALEndToEnd, peerE2EFigures...)
		out = append(out, ferryWAL)
	}
	b := r.newBar("peer watermill "+t.Name+" end-to-end", 1)
	e2e, err := r.goBench(ctx, bin, "^BenchmarkEndToEnd$/^"+t.Name+"$", append(env, "FERRY_BENCH_EVENTS="+strconv.Itoa(n)))
	if err != nil {
		return out, err
	}
	b.finish(1)
	wmE2E := map[string]Result{}
	for _, p := range peerProfiles {
		m, ok := e2e["BenchmarkEndToEnd/"+t.Name+"/"+p]
		if !ok {
			return out, fmt.Errorf("watermill: no BenchmarkEndToEnd/%s/%s line", t.Name, p)
		}
		res := watermillE2ERow(t.Name, p, n, m)
		if r.cfg.Rate > 0 {
			res.Note = "producers flat out (--rate applies to ferry only)"
		}
		wmE2E[p] = res
		out = append(out, res)
	}

	// Latency: per rate, ferry, then Watermill (both profiles).
	rates := []int{200, 1000}
	if r.cfg.Rate > 0 {
		rates = []int{r.cfg.Rate}
	}
	ferryP99 := map[int]float64{}
	wmP99 := map[string]map[int]float64{}
	for _, rt := range rates {
		fl, err := r.latencyAt(ctx, t, rt, ferryPoll)
		if err != nil {
			return out, fmt.Errorf("ferry latency at %d/s: %w", rt, err)
		}
		row := peerFerryRow(fl, fmt.Sprintf("ferry, %d/s", rt), "p50", "p99", "max")
		row.Latency, row.Series = fl.Latency, fl.Series
		out = append(out, row)
		ferryP99[rt], _ = fl.figure("p99")

		events := max(min(n, rt*10), 50)
		b := r.newBar(fmt.Sprintf("peer watermill %s %d/s", t.Name, rt), 1)
		lat, err := r.goBench(ctx, bin, "^BenchmarkLatency$/^"+t.Name+"$", append(env,
			"FERRY_BENCH_LATENCY_RATE="+strconv.Itoa(rt), "FERRY_BENCH_LATENCY_EVENTS="+strconv.Itoa(events)))
		if err != nil {
			return out, err
		}
		b.finish(1)
		for _, p := range peerProfiles {
			m, ok := lat[fmt.Sprintf("BenchmarkLatency/%s/%s/rate=%d", t.Name, p, rt)]
			if !ok {
				return out, fmt.Errorf("watermill: no BenchmarkLatency/%s/%s/rate=%d line", t.Name, p, rt)
			}
			res := Result{Variant: fmt.Sprintf("watermill %s, %d/s", p, rt), RelayMode: RelayModeWatermill, Messages: events}
			res.add("p50", m["p50-ms"], "ms")
			res.add("p99", m["p99-ms"], "ms")
			res.add("max", m["max-ms"], "ms")
			if paced, ok := m["paced-events/s"]; ok && paced < 0.9*float64(rt) {
				res.Note = fmt.Sprintf("producers reached %.0f/s of %d/s", paced, rt)
			}
			if wmP99[p] == nil {
				wmP99[p] = map[int]float64{}
			}
			wmP99[p][rt] = m["p99-ms"]
			out = append(out, res)
		}
	}

	// The ratios, one row per ferry variant and profile.
	for _, p := range peerProfiles {
		out = append(out, peerRatioRow(PeerRatio+p, ferryE2E, wmE2E[p], rates, ferryP99, wmP99[p]))
	}
	for _, p := range peerProfiles {
		if ferryWAL.Variant != "" {
			out = append(out, peerRatioRow(PeerWALRatio+p, ferryWAL, wmE2E[p], nil, nil, nil))
		}
	}
	if rn, ok := peerRetryNotes[t.Name]; ok {
		out = append(out, Result{Variant: peerRetry, RelayMode: RelayModeWatermill, Status: rn.status, Note: rn.note})
	}
	return out, nil
}

// watermillE2ERow is the peer's row of Watermill's end-to-end run on
// broker with profile, of n events, from the metrics m of its
// BenchmarkEndToEnd line (peerWatermillFigures; a metric missing from m
// is left out).
func watermillE2ERow(broker, profile string, n int, m map[string]float64) Result {
	res := Result{Variant: "watermill " + profile + ", end-to-end", RelayMode: RelayModeWatermill, Messages: n}
	if v, ok := m["e2e-events/s"]; ok {
		res.add("throughput", v, "events/s")
	}
	for _, c := range peerWatermillFigures {
		if v, ok := m[strings.Replace(c.unit, "<broker>", broker, 1)]; ok {
			res.add(c.name, v, c.figUnit)
		}
	}
	return res
}

// peerRatioRow is the ratio row variant of ferry's end-to-end row fe to
// Watermill's wm: throughput, CPU of all processes and PostgreSQL's CPU,
// ferry's over Watermill's, and the p99 at each of rates where both
// ferryP99 and wmP99 have it (ms). A figure either side lacks (or a
// Watermill figure of 0) is left out. Its RelayMode is fe's.
func peerRatioRow(variant string, fe, wm Result, rates []int, ferryP99, wmP99 map[int]float64) Result {
	res := Result{Variant: variant, RelayMode: fe.RelayMode, Messages: fe.Messages,
		Note: "each pair measured one after the other; CPU of all processes (own, PostgreSQL, broker)"}
	for _, c := range []struct{ fig, ratio string }{
		{"throughput", PeerThroughputRatio}, {"CPU all", PeerCPURatio}, {"CPU postgres", PeerPostgresCPURatio},
	} {
		if f, ok := fe.figure(c.fig); ok {
			if w, ok := wm.figure(c.fig); ok && w > 0 {
				res.add(c.ratio, f/w, "")
			}
		}
	}
	for _, rt := range rates {
		if w := wmP99[rt]; w > 0 && ferryP99[rt] > 0 {
			res.add(fmt.Sprintf("%s %d/s", PeerP99Ratio, rt), ferryP99[rt]/w, "")
		}
	}
	return res
}

// peerFerryRow is ferry's result res of this peer run under variant,
// with only the named figures ("CPU ferry" renamed "CPU app", the
// column of Watermill's own process) and res's RelayMode.
func peerFerryRow(res Result, variant string, names ...string) Result {
	row := Result{Variant: variant, RelayMode: res.RelayMode, Messages: res.Messages, Seconds: res.Seconds, Note: res.Note}
	for _, name := range names {
		for _, f := range res.Figures {
			if f.Name == name {
				if name == "CPU ferry" {
					f.Name = "CPU app"
				}
				row.Figures = append(row.Figures, f)
			}
		}
	}
	return row
}

// peerEnv is the environment of the peer's benchmarks on t: the run's
// database, t's server, body size and producers.
func (r *runner) peerEnv(t Target) ([]string, error) {
	env := append(os.Environ(), "FERRY_DATABASE_URL="+r.cfg.DatabaseURL,
		"FERRY_BENCH_SIZE="+strconv.Itoa(r.cfg.Size), "FERRY_BENCH_PRODUCERS="+strconv.Itoa(producers))
	if t.URL == "" {
		return nil, fmt.Errorf("watermill: no server URL for %s", t.Name)
	}
	switch t.Name {
	case "rabbitmq":
		env = append(env, "FERRY_RABBITMQ_URL="+t.URL)
	case "kafka":
		env = append(env, "FERRY_KAFKA_BROKERS="+strings.TrimPrefix(t.URL, "kafka://"))
	case "nats":
		env = append(env, "FERRY_NATS_URL="+t.URL)
	case "sqs":
		// The region is FERRY_AWS_REGION's, as the peer finds it.
		env = append(env, "FERRY_SQS_ENDPOINT="+t.URL)
	}
	return env, nil
}

// peerBinary compiles the peer module's benchmarks once per Run (`go test
// -c` in Config.PeerDir, into a temporary folder removed at the end of
// Run) and returns the binary's path.
func (r *runner) peerBinary(ctx context.Context) (string, error) {
	if r.peerBin != "" {
		return r.peerBin, nil
	}
	dir, err := os.MkdirTemp("", "ferry-bench-peer-")
	if err != nil {
		return "", fmt.Errorf("watermill: %w", err)
	}
	r.peerCleanup = append(r.peerCleanup, func() { _ = os.RemoveAll(dir) })
	bin := filepath.Join(dir, "watermill.test")
	b := r.newBar("peer watermill: go test -c", 1)
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, ".")
	cmd.Dir = r.cfg.PeerDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("watermill: go test -c in %s: %w\n%s", r.cfg.PeerDir, err, tail(string(out), 2000))
	}
	b.finish(1)
	r.peerBin = bin
	return bin, nil
}

// goBench runs the peer's test binary bin with `-test.run ^$ -test.bench
// pattern -test.benchtime 1x` in Config.PeerDir with env and returns each
// benchmark's metrics by name (the -GOMAXPROCS suffix cut off).
func (r *runner) goBench(ctx context.Context, bin, pattern string, env []string) (map[string]map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run", "^$", "-test.bench", pattern, "-test.benchtime", "1x", "-test.count", "1", "-test.timeout", "30m")
	cmd.Dir, cmd.Env = r.cfg.PeerDir, env
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("watermill: -test.bench %s in %s: %w\n%s", pattern, r.cfg.PeerDir, err, tail(buf.String(), 2000))
	}
	res := parseBench(buf.String())
	if len(res) == 0 {
		return nil, fmt.Errorf("watermill: -test.bench %s in %s: no benchmark ran\n%s", pattern, r.cfg.PeerDir, tail(buf.String(), 2000))
	}
	return res, nil
}

// parseBench reads the result lines of `go test -bench`:
// "BenchmarkX/sub-2   1   123.4 unit-a   5.6 unit-b ...".
func parseBench(out string) map[string]map[string]float64 {
	res := map[string]map[string]float64{}
	s := bufio.NewScanner(strings.NewReader(out))
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := f[0]
		if i := strings.LastIndex(name, "-"); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		m := map[string]float64{}
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				m[f[i+1]] = v
			}
		}
		res[name] = m
	}
	return res
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
