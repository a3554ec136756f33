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
	syn := Results{Host: res.Host, Started: res.Started, Results: peerCPURows("kafka", "nats", "rabbitmq", "sqs")}
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
	require.Equal(t, map[string]string{ScenarioPeer: "peer.svg", PeerCPUChart: PeerCPUChart + ".svg", ScenarioFailover: "failover.svg"}, charts)
}

// peerCPURows are the end-to-end rows of a peer run on brokers: each
// pipeline of PeerCPUChart with CPU app, postgres and broker of
// base+0.1, base+0.2, base+0.3 s per 1,000 events (base: 0 for ferry's
// polling relay, 1 for its WAL relay, 2 for Watermill tuned), plus
// Watermill's defaults, which the chart leaves out.
func peerCPURows(brokers ...string) []Result {
	var rows []Result
	for _, br := range brokers {
		for base, v := range []string{PeerFerryEndToEnd, PeerFerryWALEndToEnd, "watermill tuned, end-to-end", "watermill defaults, end-to-end"} {
			r := Result{Scenario: ScenarioPeer, Broker: br, Variant: v, Status: statusOK, Messages: 1000, LoadAverage: 3}
			r.add("throughput", 1000, "events/s")
			r.add("CPU app", float64(base)+0.1, "s/1k events")
			r.add("CPU postgres", float64(base)+0.2, "s/1k events")
			r.add("CPU broker", float64(base)+0.3, "s/1k events")
			rows = append(rows, r)
		}
	}
	return rows
}

// The CPU chart of the peer: a panel per broker, in each a bar per
// pipeline (ferry poll, ferry WAL + batched commits, Watermill tuned; not
// Watermill's defaults) stacked from own process, PostgreSQL and broker,
// one legend for all; written as a readable PNG and SVG with the others.
func TestPeerCPUChart(t *testing.T) {
	rows := peerCPURows("nats", "rabbitmq")
	// A broker whose peer did not run end to end has no panel.
	rows = append(rows, Result{Scenario: ScenarioPeer, Broker: "sqs", Variant: peerRetry, Status: statusOK})
	brokers, bars, top := peerCPUBars(rows)
	require.Equal(t, []string{"nats", "rabbitmq"}, brokers)
	for _, br := range brokers {
		var labels []string
		var parts [][]float64
		for _, b := range bars[br] {
			labels, parts = append(labels, b.label), append(parts, b.parts)
		}
		require.Equal(t, []string{peerCPUPipelines[0].label, peerCPUPipelines[1].label, peerCPUPipelines[2].label}, labels, br)
		require.Equal(t, [][]float64{{0.1, 0.2, 0.3}, {1.1, 1.2, 1.3}, {2.1, 2.2, 2.3}}, parts, "%s: own, PostgreSQL, broker of ferry poll, ferry WAL, Watermill tuned", br)
	}
	require.InDelta(t, 6.6, top, 1e-9)
	ch, err := peerCPUChart(rows)
	require.NoError(t, err)
	require.Len(t, ch.panels, 2)
	require.NotNil(t, ch.legend)
	for i, p := range ch.panels {
		require.Contains(t, p.Title.Text, brokers[i])
		require.InDelta(t, 6.6*1.15, p.Y.Max, 1e-9, "one Y axis for every panel")
	}
	none, err := peerCPUChart([]Result{{Scenario: ScenarioPeer, Broker: "nats", Variant: peerRetry}})
	require.NoError(t, err)
	require.Nil(t, none)

	dir := t.TempDir()
	charts, err := writeCharts(dir, &Results{Host: Host{Cores: 2, CPU: "test"}, Results: rows})
	require.NoError(t, err)
	require.Equal(t, PeerCPUChart+".svg", charts[PeerCPUChart])
	for _, ext := range []string{".svg", ".png"} {
		fi, err := os.Stat(filepath.Join(dir, PeerCPUChart+ext))
		require.NoError(t, err)
		require.Greater(t, fi.Size(), int64(5000), ext)
	}
	var md strings.Builder
	WriteMarkdown(&md, &Results{Results: rows}, charts)
	require.Contains(t, md.String(), "![peer-cpu](peer-cpu.svg)")
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

// The peer chart's groups are named short, on two lines, per ferry
// relay and Watermill profile.
func TestPeerRatioLabel(t *testing.T) {
	require.Equal(t, "poll relay\n÷ tuned", peerRatioLabel(PeerRatio+"tuned"))
	require.Equal(t, "WAL + batched\n÷ defaults", peerRatioLabel(PeerWALRatio+"defaults"))
	require.Equal(t, "tuned", peerRatioLabel("tuned, end-to-end"))
}
