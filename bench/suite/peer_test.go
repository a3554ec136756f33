package suite

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
)

func TestParseBench(t *testing.T) {
	out := `goos: linux
BenchmarkEndToEnd/kafka/defaults-2   	       1	       196.2 e2e-events/s	       7.13 all-cpu-s/1k	         0 ns/op
    bench_test.go:62: 300 events, 4 producers
BenchmarkLatency/nats/tuned/rate=200-2	       1	         5.400 p50-ms	        12.70 p99-ms
BenchmarkBroken	notanumber
PASS
ok  	github.com/ferrymq/ferry/bench/watermill	12.3s
`
	got := parseBench(out)
	require.Equal(t, map[string]map[string]float64{
		"BenchmarkEndToEnd/kafka/defaults":     {"e2e-events/s": 196.2, "all-cpu-s/1k": 7.13, "ns/op": 0},
		"BenchmarkLatency/nats/tuned/rate=200": {"p50-ms": 5.4, "p99-ms": 12.7},
	}, got)
}

// Every broker of the peer says what its Pub/Sub does for a delayed
// retry, and ferry's row keeps only the figures asked for, its process
// named like Watermill's.
func TestPeerRows(t *testing.T) {
	for _, b := range PeerBrokers {
		n, ok := peerRetryNotes[b]
		require.True(t, ok, b)
		require.NotEmpty(t, n.note, b)
		require.Contains(t, []string{statusUnsupported, statusNotBuilt}, n.status, b)
	}
	res := Result{Messages: 300, Note: "n"}
	res.add("throughput", 900, "events/s")
	res.add("produced", 1000, "events/s")
	res.add("CPU ferry", 0.3, "s/1k events")
	res.add("CPU all", 1.1, "s/1k events")
	row := peerFerryRow(res, PeerFerryEndToEnd, "throughput", "CPU ferry", "CPU broker", "CPU all")
	require.Equal(t, Result{Variant: PeerFerryEndToEnd, Messages: 300, Note: "n", Figures: []Figure{
		{Name: "throughput", Value: 900, Unit: "events/s"}, {Name: "CPU app", Value: 0.3, Unit: "s/1k events"}, {Name: "CPU all", Value: 1.1, Unit: "s/1k events"},
	}}, row)
}

func TestConfigDefaultsAndErrors(t *testing.T) {
	open := func(context.Context) (broker.Broker, error) { return nil, errors.New("unused") }
	good := Config{Targets: []Target{{Name: "nats", Open: open}}, DatabaseURL: "postgres://x", Out: "o"}
	cfg, err := good.withDefaults()
	require.NoError(t, err)
	require.Equal(t, 20000, cfg.Messages)
	require.Equal(t, DefaultSize, cfg.Size)
	require.Equal(t, 20, cfg.Workers)
	require.Equal(t, BuiltScenarios, cfg.Scenarios)
	require.NotContains(t, cfg.Scenarios, ScenarioSoak, "an hour: only when named")
	require.Equal(t, time.Hour, cfg.SoakDuration)
	require.Equal(t, 3*time.Minute, cfg.SoakFaultEvery)

	for name, mutate := range map[string]func(*Config){
		"no target":        func(c *Config) { c.Targets = nil },
		"target sans Open": func(c *Config) { c.Targets = []Target{{Name: "nats"}} },
		"no database":      func(c *Config) { c.DatabaseURL = "" },
		"no out":           func(c *Config) { c.Out = "" },
		"unknown scenario": func(c *Config) { c.Scenarios = []string{"raw", "speed"} },
		"negative rate":    func(c *Config) { c.Rate = -1 },
		"negative size":    func(c *Config) { c.Size = -1 },
		"negative soak":    func(c *Config) { c.SoakDuration = -time.Second },
		"negative faults":  func(c *Config) { c.SoakFaultEvery = -time.Second },
	} {
		c := good
		mutate(&c)
		_, err := c.withDefaults()
		require.ErrorIs(t, err, ErrConfig, name)
	}
}

// The peer's rows of both ferry variants and of Watermill: each says its
// relay, Watermill's carries its own per-event cost (CPU, WAL, commits)
// from its benchmark's metrics, and the ratio rows divide ferry's figures
// by Watermill's, the WAL variant's without p99 (its latency is not
// measured).
func TestPeerVariantRowsAndRatios(t *testing.T) {
	fe := Result{Variant: "", RelayMode: "poll", Messages: 2000}
	fe.add("throughput", 1800, "events/s")
	fe.add("CPU ferry", 0.3, "s/1k events")
	fe.add("CPU postgres", 0.5, "s/1k events")
	fe.add("CPU all", 1.0, "s/1k events")
	fe.add("WAL", 2400, "B/event")
	fe.add("commits", 2.4, "/event")
	fe.add("produced", 1900, "events/s")
	poll := peerFerryRow(fe, PeerFerryEndToEnd, peerE2EFigures...)
	require.Equal(t, "poll", poll.RelayMode)
	require.Equal(t, []string{"throughput", "CPU app", "CPU postgres", "CPU all", "WAL", "commits"}, figureNames(poll))

	fw := Result{Variant: VariantWALBatch, RelayMode: "wal", Messages: 2000}
	fw.add("throughput", 2000, "events/s")
	fw.add("CPU postgres", 0.25, "s/1k events")
	fw.add("CPU all", 0.8, "s/1k events")
	wal := peerFerryRow(fw, PeerFerryWALEndToEnd, peerE2EFigures...)
	require.Equal(t, "wal", wal.RelayMode)
	require.Equal(t, "ferry WAL + batched commits, end-to-end", wal.Variant)

	m := parseBench("BenchmarkEndToEnd/nats/tuned-2 1 1000 e2e-events/s 0.31 app-cpu-s/1k 0.5 postgres-cpu-s/1k 0.2 nats-cpu-s/1k 1.01 all-cpu-s/1k 2000 wal-B/event 2.2 commits/event 0.9 walsyncs/event 0 ns/op\n")["BenchmarkEndToEnd/nats/tuned"]
	wm := watermillE2ERow("nats", "tuned", 2000, m)
	require.Equal(t, Result{Variant: "watermill tuned, end-to-end", RelayMode: RelayModeWatermill, Messages: 2000, Figures: []Figure{
		{Name: "throughput", Value: 1000, Unit: "events/s"},
		{Name: "CPU app", Value: 0.31, Unit: "s/1k events"}, {Name: "CPU postgres", Value: 0.5, Unit: "s/1k events"},
		{Name: "CPU broker", Value: 0.2, Unit: "s/1k events"}, {Name: "CPU all", Value: 1.01, Unit: "s/1k events"},
		{Name: "WAL", Value: 2000, Unit: "B/event"}, {Name: "commits", Value: 2.2, Unit: "/event"},
	}}, wm)

	r := peerRatioRow(PeerRatio+"tuned", poll, wm, []int{200, 1000}, map[int]float64{200: 2, 1000: 6}, map[int]float64{200: 10, 1000: 0})
	require.Equal(t, "poll", r.RelayMode)
	require.Equal(t, []Figure{{Name: PeerThroughputRatio, Value: 1.8}, {Name: PeerCPURatio, Value: 1.0 / 1.01}, {Name: PeerPostgresCPURatio, Value: 1}, {Name: PeerP99Ratio + " 200/s", Value: 0.2}}, r.Figures,
		"a Watermill p99 of 0 gives no ratio")
	r = peerRatioRow(PeerWALRatio+"tuned", wal, wm, nil, nil, nil)
	require.Equal(t, "ferry WAL + batched commits ÷ watermill tuned", r.Variant)
	require.Equal(t, "wal", r.RelayMode)
	require.Equal(t, []Figure{{Name: PeerThroughputRatio, Value: 2}, {Name: PeerCPURatio, Value: 0.8 / 1.01}, {Name: PeerPostgresCPURatio, Value: 0.5}}, r.Figures)
	require.False(t, strings.HasPrefix(PeerWALRatio, PeerRatio), "the polling relay's ratio rows keep a prefix of their own")
	require.Empty(t, peerRatioRow(PeerWALRatio+"tuned", wal, Result{}, nil, nil, nil).Figures, "no Watermill figures, no ratios")

	// ferry's variants: the default is the polling relay with one
	// transaction per message, the other the WAL relay with batches.
	require.Equal(t, ferryVariant{mode: "poll"}, ferryPoll)
	require.Equal(t, "", ferryPoll.note())
	require.Equal(t, ferryVariant{name: VariantWALBatch, mode: "wal", batch: WALBatchSize, linger: WALBatchLinger}, ferryWALBatch)
	require.Contains(t, ferryWALBatch.note(), "BatchSize 8, BatchLinger 2ms")
}

func figureNames(r Result) []string {
	var out []string
	for _, f := range r.Figures {
		out = append(out, f.Name)
	}
	return out
}
