package suite

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Watermill profiles of the peer module (bench/watermill): its defaults
// and the tuned settings.
var peerProfiles = []string{"defaults", "tuned"}

// peer runs the Watermill module's end-to-end and latency benchmarks (its
// own Go module, bench/watermill, run with `go test -bench` in
// Config.PeerDir) against the same PostgreSQL and RabbitMQ, with the
// same number of events and the same rates, and reports ferry's figures
// of this run beside them.
func (r *runner) peer(ctx context.Context, t Target) ([]Result, error) {
	if t.Name != "rabbitmq" {
		return []Result{{Status: statusUnsupported, Note: "the Watermill peer runs on RabbitMQ only"}}, nil
	}
	if r.cfg.PeerDir == "" {
		return []Result{{Status: statusUnsupported, Note: "needs the Watermill module (bench/watermill of a ferry checkout, --peer-dir) and the go command"}}, nil
	}
	n := r.cfg.Messages
	base := append(os.Environ(), "FERRY_DATABASE_URL="+r.cfg.DatabaseURL, "FERRY_RABBITMQ_URL="+t.URL, "FERRY_BENCH_EVENTS="+strconv.Itoa(n))
	b := r.newBar("peer watermill end-to-end", 1)
	e2e, err := r.goBench(ctx, "^BenchmarkEndToEnd$", base)
	if err != nil {
		return nil, err
	}
	b.finish(1)
	var out []Result
	ferryE2E, _ := r.ferryFigure(ScenarioEndToEnd, "", "throughput")
	for _, p := range peerProfiles {
		m, ok := e2e["BenchmarkEndToEnd/"+p]
		if !ok {
			return nil, fmt.Errorf("watermill: no BenchmarkEndToEnd/%s line", p)
		}
		res := Result{Variant: p + ", end-to-end", Messages: n}
		res.add("throughput", m["e2e-events/s"], "events/s")
		if ferryE2E > 0 && m["e2e-events/s"] > 0 {
			res.add("ferry/watermill throughput", ferryE2E/m["e2e-events/s"], "")
		}
		if v, ok := m["all-cpu-s/1k"]; ok {
			res.add("CPU all", v, "s/1k events")
		}
		out = append(out, res)
	}
	rates := []int{200, 1000}
	if r.cfg.Rate > 0 {
		rates = []int{r.cfg.Rate}
	}
	for _, rt := range rates {
		events := max(min(n, rt*10), 50)
		b := r.newBar(fmt.Sprintf("peer watermill %d/s", rt), 1)
		lat, err := r.goBench(ctx, "^BenchmarkLatency$", append(base, "FERRY_BENCH_LATENCY_RATE="+strconv.Itoa(rt), "FERRY_BENCH_LATENCY_EVENTS="+strconv.Itoa(events)))
		if err != nil {
			return out, err
		}
		b.finish(1)
		ferryP99, _ := r.ferryFigure(ScenarioLatency, fmt.Sprintf("%d/s", rt), "p99")
		for _, p := range peerProfiles {
			m, ok := lat[fmt.Sprintf("BenchmarkLatency/%s/rate=%d", p, rt)]
			if !ok {
				return out, fmt.Errorf("watermill: no BenchmarkLatency/%s/rate=%d line", p, rt)
			}
			res := Result{Variant: fmt.Sprintf("%s, %d/s", p, rt), Messages: events}
			res.add("p50", m["p50-ms"], "ms")
			res.add("p99", m["p99-ms"], "ms")
			res.add("max", m["max-ms"], "ms")
			if ferryP99 > 0 && m["p99-ms"] > 0 {
				res.add("ferry/watermill p99", ferryP99/m["p99-ms"], "")
			}
			out = append(out, res)
		}
	}
	return out, nil
}

// ferryFigure returns a figure of ferry's own rabbitmq result of this run.
func (r *runner) ferryFigure(scenario, variant, name string) (float64, bool) {
	for _, res := range r.results {
		if res.Scenario == scenario && res.Broker == "rabbitmq" && res.Variant == variant && res.Status == statusOK {
			return res.figure(name)
		}
	}
	return 0, false
}

// goBench runs `go test -run ^$ -bench pattern -benchtime 1x` in the peer
// module with env and returns each benchmark's metrics by name (the
// -GOMAXPROCS suffix cut off).
func (r *runner) goBench(ctx context.Context, pattern string, env []string) (map[string]map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", pattern, "-benchtime", "1x", "-count", "1", "-timeout", "30m", ".")
	cmd.Dir, cmd.Env = r.cfg.PeerDir, env
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("watermill: go test -bench %s in %s: %w\n%s", pattern, r.cfg.PeerDir, err, tail(buf.String(), 2000))
	}
	return parseBench(buf.String()), nil
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
