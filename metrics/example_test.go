package metrics_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/metrics"
)

// One registry per process: the relay and worker hooks feed Metrics, the
// outbox collector asks the database at scrape time, and Handler serves
// GET /metrics.
func Example() {
	reg := metrics.NewRegistry()
	m, err := metrics.New(reg, "rabbitmq")
	if err != nil {
		panic(err)
	}
	// In a real process: outbox.ReadStats(ctx, pool).
	stats := func(ctx context.Context) (int, time.Duration, error) { return 3, 42 * time.Second, nil }
	if err := metrics.RegisterOutbox(reg, "rabbitmq", stats); err != nil {
		panic(err)
	}

	m.ObserveBatch(10, 0, 15*time.Millisecond)                                          // outbox.RelayConfig.OnBatch
	m.ObserveOutcome(&broker.Message{ID: "1"}, metrics.OutcomeAck, 30*time.Millisecond) // worker.Config.OnOutcome

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler(reg))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		panic(err)
	}
	for _, name := range []string{metrics.OutboxUnprocessedRows, metrics.OutboxOldestAgeSeconds, metrics.RelayPublishedTotal} {
		mf := fams[name]
		v := mf.GetMetric()[0]
		val := v.GetGauge().GetValue() + v.GetCounter().GetValue()
		fmt.Printf("%s{%s=%q} %g\n", name, v.GetLabel()[0].GetName(), v.GetLabel()[0].GetValue(), val)
	}
	// Output:
	// ferry_outbox_unprocessed_rows{broker="rabbitmq"} 3
	// ferry_outbox_oldest_unprocessed_age_seconds{broker="rabbitmq"} 42
	// ferry_relay_published_total{broker="rabbitmq"} 10
}
