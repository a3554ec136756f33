package ferrycli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/bench/suite"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
)

// The CI smoke run of ferry bench: every built scenario on every broker in
// Brokers, a few hundred messages each, against the servers of
// compose/local/services.sh. It checks that the run finishes, writes its
// files and that the figures users read for correctness (ordering with one
// consumer, routing by exact, '*' and '#' bindings, attempts before the
// DLQ, nothing lost) are right; it asserts
// nothing about speed. The faults scenario (on every broker but RabbitMQ,
// see below) restarts each broker through
// compose/local/services.sh and kills relay and worker, which run as
// children of this test binary (see TestMain); the peer scenario runs the
// Watermill module's benchmarks (bench/watermill, compiled with the go
// command) on every broker, beside ferry's own end-to-end and latency
// runs.
func TestBenchSmoke(t *testing.T) {
	testenv.RequireTCP(t, "postgres", testenv.HostPort(testenv.DatabaseURL()))
	// A bound on a hung run, not a speed check: four brokers with real
	// restarts take about 4 minutes here, more on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	out, faultsOut := t.TempDir(), t.TempDir()
	brokers := BrokerNames()
	// The faults scenario runs on every broker but RabbitMQ, whose
	// restart (about 40 s of the run with the recovery) the broker-outage
	// tests of internal/e2e already make with both relays; every other
	// scenario runs on every broker.
	faultBrokers := slices.DeleteFunc(slices.Clone(brokers), func(b string) bool { return b == "rabbitmq" })
	others := slices.DeleteFunc(slices.Clone(suite.BuiltScenarios), func(s string) bool { return s == suite.ScenarioFaults })
	run := func(out string, brokers, scenarios []string) suite.Results {
		var stdout, stderr bytes.Buffer
		code := Main(ctx, []string{"ferry", "bench",
			"--brokers", strings.Join(brokers, ","), "--scenarios", strings.Join(scenarios, ","), "--messages", "300", "--out", out,
			"--database-url", testenv.DatabaseURL(), "--rabbitmq-url", testenv.RabbitMQURL(), "--nats-url", testenv.NATSURL(),
			"--restart-broker", filepath.Join(testenv.RepoRoot(), "compose", "local", "services.sh") + " restart {broker}",
			"--peer-dir", filepath.Join(testenv.RepoRoot(), "bench", "watermill"),
			"--log-level", "error",
		}, &stdout, &stderr)
		require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
		b, err := os.ReadFile(filepath.Join(out, "results.json"))
		require.NoError(t, err)
		var res suite.Results
		require.NoError(t, json.Unmarshal(b, &res))
		require.NotEmpty(t, res.Servers["postgres"])
		require.Positive(t, res.Host.Cores)
		return res
	}
	res := run(out, brokers, others)
	faults := run(faultsOut, faultBrokers, []string{suite.ScenarioFaults})
	res.Results = append(res.Results, faults.Results...)

	type key struct{ scenario, broker string }
	got := map[key][]suite.Result{}
	for _, r := range res.Results {
		require.NotEqual(t, "failed", r.Status, "%s on %s: %s", r.Scenario, r.Broker, r.Note)
		got[key{r.Scenario, r.Broker}] = append(got[key{r.Scenario, r.Broker}], r)
	}
	figure := func(r suite.Result, name string) float64 {
		for _, f := range r.Figures {
			if f.Name == name {
				return f.Value
			}
		}
		t.Fatalf("%s on %s (%s): no figure %q in %+v", r.Scenario, r.Broker, r.Variant, name, r.Figures)
		return 0
	}
	for _, br := range brokers {
		for _, sc := range suite.BuiltScenarios {
			if sc == suite.ScenarioFaults && !slices.Contains(faultBrokers, br) {
				require.Empty(t, got[key{sc, br}], "faults on %s: not run here", br)
				continue
			}
			rs := got[key{sc, br}]
			require.NotEmpty(t, rs, "no result for %s on %s", sc, br)
			for _, r := range rs {
				if r.Status != "ok" {
					continue
				}
				switch sc {
				case suite.ScenarioPipeline, suite.ScenarioEndToEnd:
					require.Positive(t, figure(r, "throughput"), "%s on %s", sc, br)
					require.Equal(t, 300, r.Messages)
					if sc == suite.ScenarioEndToEnd {
						// Two ferry variants, each naming its relay and
						// giving its commits per event (at least the
						// producer's one).
						want := map[string]string{"": "poll", suite.VariantWALBatch: "wal"}[r.Variant]
						require.Equal(t, want, r.RelayMode, "%s on %s (%s)", sc, br, r.Variant)
						require.GreaterOrEqual(t, figure(r, "commits"), 1.0, "%s on %s (%s)", sc, br, r.Variant)
					}
				case suite.ScenarioLatency:
					require.NotNil(t, r.Latency)
					require.Equal(t, r.Messages, r.Latency.Count, "every committed event handled and timed")
				case suite.ScenarioOrdering:
					require.Equal(t, 300.0, figure(r, "handled"))
					// One consumer of one queue keeps publish order where
					// the adapter declares an order at all (SQS standard
					// queues declare none and do reorder).
					if r.Variant == "1 worker" && res.Capabilities[br].Ordering != broker.OrderingNone.String() {
						require.Zero(t, figure(r, "violations"), "%s: one consumer of one queue keeps publish order", br)
					}
				case suite.ScenarioFaults:
					require.Zero(t, figure(r, "lost"), "%s: events lost across a broker restart and SIGKILLs of relay and worker", br)
					require.Zero(t, figure(r, "effects applied twice"), "%s: a redelivered event was handled twice", br)
					require.NotContains(t, r.Note, "failed", br)
					figure(r, "broker restart recovery")
					figure(r, "relay SIGKILL recovery")
					figure(r, "worker SIGKILL recovery")
				case suite.ScenarioRouting:
					// Exact, '*' and '#' bindings: every queue gets what its
					// patterns match, nothing else (a binding the broker
					// refuses at Declare is left out and reported).
					require.Zero(t, figure(r, "misrouted"), "%s: %s", br, r.Note)
					require.Zero(t, figure(r, "missing"), "%s: %s", br, r.Note)
					require.Positive(t, figure(r, "copies"), br)
					if br == "rabbitmq" {
						require.Zero(t, figure(r, "refused bindings"), "RabbitMQ's topic exchange takes every pattern: %s", r.Note)
					}
				case suite.ScenarioPeer:
					switch {
					case strings.HasSuffix(r.Variant, "end-to-end"):
						require.Positive(t, figure(r, "throughput"), "%s %s", br, r.Variant)
						require.Positive(t, figure(r, "CPU all"), "%s %s", br, r.Variant)
						require.Equal(t, 300, r.Messages, "%s %s", br, r.Variant)
					case strings.HasSuffix(r.Variant, "/s"):
						require.Positive(t, figure(r, "p99"), "%s %s", br, r.Variant)
					case strings.HasPrefix(r.Variant, suite.PeerRatio):
						require.Positive(t, figure(r, suite.PeerThroughputRatio), "%s %s", br, r.Variant)
						require.Positive(t, figure(r, suite.PeerCPURatio), "%s %s", br, r.Variant)
						require.Positive(t, figure(r, suite.PeerP99Ratio+" 200/s"), "%s %s", br, r.Variant)
						require.Positive(t, figure(r, suite.PeerP99Ratio+" 1000/s"), "%s %s", br, r.Variant)
					}
				case suite.ScenarioRetry:
					require.Equal(t, 3.0, figure(r, "attempts before DLQ"), br)
					require.Equal(t, 20.0, figure(r, "dead"), br)
				}
			}
		}
		// The Watermill peer runs on every broker: ferry's runs and
		// Watermill's, both profiles, end to end and at both rates, and
		// the ratios; a delayed retry is said, not dropped.
		peer := map[string]string{}
		for _, r := range got[key{suite.ScenarioPeer, br}] {
			peer[r.Variant] = r.Status
		}
		for _, v := range []string{suite.PeerFerryEndToEnd, suite.PeerFerryWALEndToEnd, "ferry, 200/s", "ferry, 1000/s"} {
			require.Equal(t, "ok", peer[v], "peer on %s: %s", br, v)
		}
		for _, p := range []string{"defaults", "tuned"} {
			for _, v := range []string{"watermill " + p + ", end-to-end", "watermill " + p + ", 200/s", "watermill " + p + ", 1000/s", suite.PeerRatio + p, suite.PeerWALRatio + p} {
				require.Equal(t, "ok", peer[v], "peer on %s: %s", br, v)
			}
		}
		// Every end-to-end row of the peer, ferry's two and Watermill's,
		// has its per-event cost, and its relay.
		for _, r := range got[key{suite.ScenarioPeer, br}] {
			switch {
			case strings.HasSuffix(r.Variant, "end-to-end"):
				require.Positive(t, figure(r, "CPU postgres"), "%s %s", br, r.Variant)
				require.Positive(t, figure(r, "WAL"), "%s %s", br, r.Variant)
				require.GreaterOrEqual(t, figure(r, "commits"), 1.0, "%s %s", br, r.Variant)
				want := map[string]string{suite.PeerFerryEndToEnd: "poll", suite.PeerFerryWALEndToEnd: "wal"}[r.Variant]
				if want == "" {
					want = suite.RelayModeWatermill
				}
				require.Equal(t, want, r.RelayMode, "%s %s", br, r.Variant)
			case strings.HasPrefix(r.Variant, suite.PeerWALRatio):
				require.Equal(t, "wal", r.RelayMode, "%s %s", br, r.Variant)
				require.Positive(t, figure(r, suite.PeerThroughputRatio), "%s %s", br, r.Variant)
				require.Positive(t, figure(r, suite.PeerPostgresCPURatio), "%s %s", br, r.Variant)
			}
		}
		_, err := os.Stat(filepath.Join(out, suite.PeerCPUChart+".png"))
		require.NoError(t, err, "the peer's CPU chart")
		require.Contains(t, peer, "retry after 1 s", "peer on %s", br)
		require.Equal(t, "ok", got[key{suite.ScenarioPipeline, br}][0].Status, br)
		if slices.Contains(faultBrokers, br) {
			require.Equal(t, "ok", got[key{suite.ScenarioFaults, br}][0].Status, br)
		}
		require.Equal(t, "ok", got[key{suite.ScenarioRouting, br}][0].Status, br)
	}

	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	require.NoError(t, err)
	faultsMD, err := os.ReadFile(filepath.Join(faultsOut, "results.md"))
	require.NoError(t, err)
	for _, sc := range others {
		require.Contains(t, string(md), "\n## "+sc+"\n")
	}
	require.Contains(t, string(faultsMD), "\n## "+suite.ScenarioFaults+"\n")
	for _, sc := range []string{suite.ScenarioRaw, suite.ScenarioPipeline, suite.ScenarioEndToEnd, suite.ScenarioLatency, suite.ScenarioFaults, suite.ScenarioOrdering, suite.ScenarioRetry} {
		dir := out
		if sc == suite.ScenarioFaults {
			dir = faultsOut
		}
		for _, ext := range []string{".svg", ".png"} {
			fi, err := os.Stat(filepath.Join(dir, sc+ext))
			require.NoError(t, err, "chart of %s", sc)
			require.Positive(t, fi.Size())
		}
	}
}

func TestBenchCommandLineHidesPasswords(t *testing.T) {
	require.Equal(t, "ferry bench --database-url postgres://ferry:xxxxx@127.0.0.1:5432/ferry --rabbitmq-cluster-url=amqp://u:xxxxx@h:1/,amqp://u:xxxxx@h:2/ --brokers all",
		benchCommandLine([]string{"bench", "--database-url", "postgres://ferry:secret@127.0.0.1:5432/ferry",
			"--rabbitmq-cluster-url=amqp://u:p@h:1/,amqp://u:p@h:2/", "--brokers", "all"}))
}

// TestBenchSQSLatency: with --sqs-latency every SQS call of the run goes
// through a proxy that adds the delay, the report says so, and the SQS
// server's CPU is still measured (found by its own port, not the proxy's).
func TestBenchSQSLatency(t *testing.T) {
	testenv.RequireTCP(t, "postgres", testenv.HostPort(testenv.DatabaseURL()))
	testenv.RequireTCP(t, "sqs", testenv.HostPort(testenv.SQSEndpoint()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a bound on a hung run
	defer cancel()
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := Main(ctx, []string{"ferry", "bench", "--brokers", "sqs", "--scenarios", "raw,end-to-end", "--messages", "100",
		"--out", out, "--database-url", testenv.DatabaseURL(), "--sqs-endpoint", testenv.SQSEndpoint(), "--sqs-latency", "15ms",
		"--log-level", "error"}, &stdout, &stderr)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	require.NoError(t, err)
	var res suite.Results
	require.NoError(t, json.Unmarshal(b, &res))
	require.Contains(t, res.Servers["sqs"], "through a proxy adding 15ms to every call")
	require.Contains(t, res.Servers["sqs"], testenv.SQSEndpoint(), "the server, not only the proxy")
	var e2e *suite.Result
	for i, r := range res.Results {
		require.Equal(t, "ok", r.Status, "%s: %s", r.Scenario, r.Note)
		if r.Scenario == suite.ScenarioEndToEnd {
			e2e = &res.Results[i]
		}
	}
	require.NotNil(t, e2e)
	require.Contains(t, e2e.Note, "ferry's CPU includes the proxy")
	names := []string{}
	for _, f := range e2e.Figures {
		names = append(names, f.Name)
	}
	require.Contains(t, names, "CPU broker", "ElasticMQ's CPU, found by the server's port behind the proxy")
}

func TestBenchUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--brokers", "carrier-pigeon"},
		{"--brokers", ""},
		{"--scenarios", "raw,speed"},
		{"--messages", "0"},
		{"--rate", "-1"},
		{"--soak-duration", "0s"},
		{"--soak-fault-every", "500ms"},
		{"--brokers", "sqs", "--sqs-latency", "-1ms"},
		{"extra"},
		{"--brokers", "nats", "--nats-cluster-url", "nats://127.0.0.1:4222"},
		{"--brokers", "kafka", "--kafka-cluster-brokers", "127.0.0.1:9092,127.0.0.1"},
		{"--brokers", "rabbitmq", "--rabbitmq-cluster-url", "amqp://127.0.0.1:5672/,amqp://127.0.0.1:5673/"},
	} {
		var stdout, stderr bytes.Buffer
		code := Main(context.Background(), append([]string{"ferry", "bench", "--database-url", "postgres://127.0.0.1:1/x"}, args...), &stdout, &stderr)
		require.Equal(t, 2, code, "%v: %s", args, stderr.String())
		require.NotEmpty(t, stderr.String())
	}
}

// TestBenchFailoverSmoke: the failover scenario on NATS, the lightest of
// the clusters (three nats-servers), end to end through the command: the
// script starts nats-cluster, the leader of the stream is found and
// killed, started again, nothing is lost or applied twice, the figures
// and the chart are written, and the cluster is stopped at the end. Not
// timed; RabbitMQ and Kafka run the same code in `make bench-failover`.
// SQS has no cluster: not supported.
func TestBenchFailoverSmoke(t *testing.T) {
	testenv.RequireTCP(t, "postgres", testenv.HostPort(testenv.DatabaseURL()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a bound on a hung run
	defer cancel()
	script := filepath.Join(testenv.RepoRoot(), "compose", "local", "services.sh")
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := Main(ctx, []string{"ferry", "bench", "--brokers", "nats,sqs", "--scenarios", "failover", "--messages", "300",
		"--out", out, "--database-url", testenv.DatabaseURL(), "--sqs-endpoint", testenv.SQSEndpoint(),
		"--cluster-script", script, "--nats-cluster-url", "", "--log-level", "error",
	}, &stdout, &stderr)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())

	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	require.NoError(t, err)
	var res suite.Results
	require.NoError(t, json.Unmarshal(b, &res))
	var nats, sqs *suite.Result
	for i, r := range res.Results {
		switch r.Broker {
		case "nats":
			nats = &res.Results[i]
		case "sqs":
			sqs = &res.Results[i]
		}
	}
	require.NotNil(t, sqs)
	require.Equal(t, "not supported", sqs.Status, sqs.Note)
	require.NotNil(t, nats)
	require.Equal(t, "ok", nats.Status, nats.Note)
	figs := map[string]float64{}
	for _, f := range nats.Figures {
		figs[f.Name] = f.Value
	}
	require.Zero(t, figs["lost"], nats.Note)
	require.Zero(t, figs["effects applied twice"], nats.Note)
	require.Positive(t, figs["publish resumed"], "publishing stopped at the kill and resumed: %s", nats.Note)
	require.Positive(t, figs["handling resumed"], nats.Note)
	require.Equal(t, 3.0, figs["cluster processes"], "three nats-servers")
	require.Positive(t, figs["cluster memory"])
	require.NotEmpty(t, nats.Series)
	require.Contains(t, res.Servers["nats cluster"], "nats-cluster")
	for _, ext := range []string{".svg", ".png"} {
		_, err := os.Stat(filepath.Join(out, "failover"+ext))
		require.NoError(t, err)
	}
	st, err := exec.Command("bash", script, "status", "nats-cluster").Output()
	require.NoError(t, err)
	require.NotContains(t, string(st), "running", "the scenario stops the cluster it started")
}

// TestBenchSoakShort: `make soak` in 20 s on the shared RabbitMQ, a
// fault every 6 s (a SIGKILL of the relay, then of the worker, then of the
// relay again; no broker restart: the server is shared). The rows are
// printed and recorded with the children's real figures (heap and
// goroutines from their stats files, open files and RSS from /proc),
// nothing is lost and nothing applied twice, and the flatness is
// printed. Not timed. RabbitMQ rather than NATS: it hands a killed
// worker's unacked deliveries on at once, where JetStream waits out its
// AckWait (30 s), which would double the test's time.
func TestBenchSoakShort(t *testing.T) {
	testenv.RequireTCP(t, "postgres", testenv.HostPort(testenv.DatabaseURL()))
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a bound on a hung run
	defer cancel()
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := Main(ctx, []string{"ferry", "bench", "--brokers", "rabbitmq", "--scenarios", "soak",
		"--soak-duration", "20s", "--soak-fault-every", "6s", "--restart-broker", "none",
		"--out", out, "--database-url", testenv.DatabaseURL(), "--rabbitmq-url", testenv.RabbitMQURL(), "--log-level", "error",
	}, &stdout, &stderr)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	t.Logf("stdout:\n%s", stdout.String())

	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	require.NoError(t, err)
	var res suite.Results
	require.NoError(t, json.Unmarshal(b, &res))
	require.Len(t, res.Results, 1)
	r := res.Results[0]
	require.Equal(t, "ok", r.Status, r.Note)
	// start, 3 faults (6, 12, 18 s), end, drained.
	require.Len(t, r.Soak, 6, "%+v", r.Soak)
	faults := []string{"start", "relay SIGKILL", "worker SIGKILL", "relay SIGKILL", "end", "drained"}
	pids := map[string]map[int]bool{"relay": {}, "worker": {}}
	for i, row := range r.Soak {
		require.Equal(t, faults[i], row.Fault)
		for role, ps := range map[string]suite.ProcessStats{"relay": row.Relay, "worker": row.Worker} {
			require.Positive(t, ps.HeapInuse, "row %d %s: %+v", i, role, ps)
			require.Positive(t, ps.Goroutines, "row %d %s: %+v", i, role, ps)
			require.Greater(t, ps.OpenFiles, 3, "row %d %s: stdin, stdout, stderr and sockets", i, role)
			require.Positive(t, ps.RSS, "row %d %s", i, role)
			pids[role][ps.PID] = true
		}
		require.Zero(t, row.Lost, "row %d", i)
		require.Zero(t, row.Twice, "row %d", i)
	}
	require.Len(t, pids["relay"], 3, "the relay was killed twice and started again each time")
	require.Len(t, pids["worker"], 2, "the worker was killed once and started again")
	final := r.Soak[len(r.Soak)-1]
	require.Equal(t, final.Committed, final.Handled, "every committed event handled")
	require.Greater(t, final.Committed, int64(1000), "20 s at 200/s")
	require.Positive(t, r.Soak[3].Handled)
	for _, s := range []string{"elapsed  fault", "relay SIGKILL", "worker SIGKILL", "lost 0, effects applied twice 0", "flatness", "relay heap", "worker open files", "WAL retained"} {
		require.Contains(t, stdout.String(), s)
	}
}
