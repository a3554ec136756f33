package suite

import (
	"context"
	"errors"
	"testing"

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

	for name, mutate := range map[string]func(*Config){
		"no target":        func(c *Config) { c.Targets = nil },
		"target sans Open": func(c *Config) { c.Targets = []Target{{Name: "nats"}} },
		"no database":      func(c *Config) { c.DatabaseURL = "" },
		"no out":           func(c *Config) { c.Out = "" },
		"unknown scenario": func(c *Config) { c.Scenarios = []string{"raw", "speed"} },
		"negative rate":    func(c *Config) { c.Rate = -1 },
		"negative size":    func(c *Config) { c.Size = -1 },
	} {
		c := good
		mutate(&c)
		_, err := c.withDefaults()
		require.ErrorIs(t, err, ErrConfig, name)
	}
}
