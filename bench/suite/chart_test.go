package suite

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/plot"
)

// TestChartsOfCommittedRun draws every chart of the committed run
// (bench/results/results.json) plus a failover and a peer on several
// brokers: each is written as SVG and PNG. FERRY_CHART_DIR keeps them
// there, to look at.
func TestChartsOfCommittedRun(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "results", "results.json"))
	require.NoError(t, err)
	var res Results
	require.NoError(t, json.Unmarshal(b, &res))
	dir := os.Getenv("FERRY_CHART_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	charts, err := writeCharts(dir, &res)
	require.NoError(t, err)
	for _, sc := range []string{ScenarioRaw, ScenarioPipeline, ScenarioEndToEnd, ScenarioLatency, ScenarioFaults, ScenarioOrdering, ScenarioRouting, ScenarioRetry, ScenarioReplay, ScenarioPeer} {
		require.Equal(t, sc+".svg", charts[sc], sc)
		for _, ext := range []string{".svg", ".png"} {
			fi, err := os.Stat(filepath.Join(dir, sc+ext))
			require.NoError(t, err)
			require.Greater(t, fi.Size(), int64(2000), sc+ext)
		}
	}

	// The peer on every broker (the committed run has it on RabbitMQ
	// only) and a failover on three: the charts take any set of brokers.
	syn := Results{Host: res.Host, Started: res.Started}
	for i, br := range []string{"kafka", "nats", "rabbitmq", "sqs"} {
		f := float64(i + 1)
		for _, r := range res.Results {
			if r.Scenario != ScenarioPeer || r.Broker != "rabbitmq" || r.Status != statusOK {
				continue
			}
			r.Broker = br
			r.Figures = slices.Clone(r.Figures)
			for k := range r.Figures {
				if strings.HasPrefix(r.Figures[k].Name, peerRatioPrefix) {
					r.Figures[k].Value *= f
				}
			}
			syn.Results = append(syn.Results, r)
		}
		if br == "sqs" {
			continue
		}
		fo := Result{Scenario: ScenarioFailover, Broker: br, Status: statusOK, LoadAverage: 2 + f/10}
		for x := -5.0; x < 20; x += 0.1 {
			lag := 10.0
			if x > 0 && x < 3*f {
				lag = 200 * x
			} else if x >= 3*f && x < 5*f {
				lag = 600 * f * (5*f - x) / (2 * f)
			}
			fo.Series = append(fo.Series, Point{X: x, Y: lag})
		}
		fo.add("publish resumed", 2*f, "s")
		fo.add("handling resumed", 2.5*f, "s")
		fo.add("backlog drained", 5*f, "s")
		if br == "nats" {
			fo.Figures[2].Value = -1 // never
		}
		fo.add("lost", 0, "")
		fo.add("effects applied twice", 0, "")
		fo.add("cluster processes", 3*f, "")
		fo.add("cluster memory", 150*f, "MiB")
		syn.Results = append(syn.Results, fo)
	}
	sdir := filepath.Join(dir, "synthetic")
	require.NoError(t, os.MkdirAll(sdir, 0o755))
	charts, err = writeCharts(sdir, &syn)
	require.NoError(t, err)
	require.Equal(t, map[string]string{ScenarioPeer: "peer.svg", ScenarioFailover: "failover.svg"}, charts)
}

func TestChartTicksAndLabels(t *testing.T) {
	labels := func(ticks []plot.Tick) []string {
		var out []string
		for _, tk := range ticks {
			if tk.Label != "" {
				out = append(out, tk.Label)
			}
		}
		return out
	}
	require.Equal(t, []string{"0", "10", "20", "30", "40", "50", "60", "70"}, labels(plainTicks{}.Ticks(-0.4, 75)))
	require.Equal(t, []string{"0", "5,000", "10,000", "15,000", "20,000"}, labels(plainTicks{}.Ticks(0, 20000)))
	require.Empty(t, plainTicks{}.Ticks(1, 1), "an empty range has no ticks (gonum's DefaultTicks panics)")
	require.Equal(t, []string{"0.1 ms", "1 ms", "10 ms", "100 ms", "1 s", "10 s"}, labels(msLogTicks{}.Ticks(0.1, 50000)))
	require.Equal(t, []string{"0.001", "0.002", "0.005", "0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1", "2"}, labels(ratioLogTicks{}.Ticks(0.001, 2)))
	require.Equal(t, 50.0, roundUp125(21.2))
	require.Equal(t, 0.2, roundUp125(0.2))
	require.Equal(t, "100,895", shortValue(100895.15))
	require.Equal(t, "0", shortValue(math.Copysign(0, -1)))
	require.Equal(t, []string{"aaa bbb", "ccc"}, wrap("aaa bbb ccc", 8))
}
