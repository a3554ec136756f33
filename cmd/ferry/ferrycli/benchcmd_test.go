package ferrycli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
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
// nothing about speed. The faults scenario restarts each broker through
// compose/local/services.sh and kills relay and worker, which run as
// children of this test binary (see TestMain); the peer scenario runs the
// Watermill module's benchmarks (bench/watermill) with the go command.
func TestBenchSmoke(t *testing.T) {
	testenv.RequireTCP(t, "postgres", testenv.HostPort(testenv.DatabaseURL()))
	// A bound on a hung run, not a speed check: four brokers with real
	// restarts take about 4 minutes here, more on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	out := t.TempDir()
	brokers := BrokerNames()
	var stdout, stderr bytes.Buffer
	code := Main(ctx, []string{"ferry", "bench",
		"--brokers", strings.Join(brokers, ","), "--messages", "300", "--out", out,
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
					require.Equal(t, "rabbitmq", br, "the Watermill peer runs on RabbitMQ only")
					if strings.HasSuffix(r.Variant, "end-to-end") {
						require.Positive(t, figure(r, "throughput"))
						require.Positive(t, figure(r, "ferry/watermill throughput"))
					} else {
						require.Positive(t, figure(r, "p99"))
					}
				case suite.ScenarioRetry:
					require.Equal(t, 3.0, figure(r, "attempts before DLQ"), br)
					require.Equal(t, 20.0, figure(r, "dead"), br)
				}
			}
		}
		require.Equal(t, "ok", got[key{suite.ScenarioPipeline, br}][0].Status, br)
		require.Equal(t, "ok", got[key{suite.ScenarioFaults, br}][0].Status, br)
		require.Equal(t, "ok", got[key{suite.ScenarioRouting, br}][0].Status, br)
	}

	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	require.NoError(t, err)
	for _, sc := range suite.BuiltScenarios {
		require.Contains(t, string(md), "\n## "+sc+"\n")
	}
	for _, sc := range []string{suite.ScenarioRaw, suite.ScenarioPipeline, suite.ScenarioEndToEnd, suite.ScenarioLatency, suite.ScenarioFaults, suite.ScenarioOrdering, suite.ScenarioRetry} {
		for _, ext := range []string{".svg", ".png"} {
			fi, err := os.Stat(filepath.Join(out, sc+ext))
			require.NoError(t, err, "chart of %s", sc)
			require.Positive(t, fi.Size())
		}
	}
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
		{"--brokers", "sqs", "--sqs-latency", "-1ms"},
		{"extra"},
	} {
		var stdout, stderr bytes.Buffer
		code := Main(context.Background(), append([]string{"ferry", "bench", "--database-url", "postgres://127.0.0.1:1/x"}, args...), &stdout, &stderr)
		require.Equal(t, 2, code, "%v: %s", args, stderr.String())
		require.NotEmpty(t, stderr.String())
	}
}
