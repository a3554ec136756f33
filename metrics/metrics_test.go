package metrics_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/metrics"
)

// scrape GETs /metrics from a real HTTP server around metrics.Handler and
// parses the text exposition with expfmt.
func scrape(t *testing.T, srv *httptest.Server) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	require.NoError(t, err, "body:\n%s", body)
	return fams
}

// one returns the single series of family name, checking its broker label
// and, when outcome is not empty, selecting by the outcome label.
func one(t *testing.T, fams map[string]*dto.MetricFamily, name, outcome string) *dto.Metric {
	t.Helper()
	f, ok := fams[name]
	require.True(t, ok, "family %s missing", name)
	var found *dto.Metric
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		require.Equal(t, "rabbitmq", labels["broker"], "%s has the broker label", name)
		if outcome != "" && labels["outcome"] != outcome {
			continue
		}
		require.Nil(t, found, "%s: more than one series", name)
		found = m
	}
	require.NotNil(t, found, "%s{outcome=%q} missing", name, outcome)
	return found
}

type setupBundle struct {
	reg *prometheus.Registry
	m   *metrics.Metrics
	srv *httptest.Server
}

func setup(t *testing.T) setupBundle {
	t.Helper()
	reg := metrics.NewRegistry()
	m, err := metrics.New(reg, "rabbitmq")
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler(reg))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return setupBundle{reg: reg, m: m, srv: srv}
}

func TestRelayHooksChangeScrapedValues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fams := scrape(t, b.srv)
	require.Equal(t, 0.0, one(t, fams, metrics.RelayPublishedTotal, "").GetCounter().GetValue())
	require.Equal(t, uint64(0), one(t, fams, metrics.RelayBatchDuration, "").GetHistogram().GetSampleCount())
	require.Contains(t, fams, "go_goroutines", "NewRegistry includes the Go collector")

	b.m.ObserveBatch(100, 0, 20*time.Millisecond)
	b.m.ObserveBatch(7, 3, 2*time.Second)
	fams = scrape(t, b.srv)
	require.Equal(t, 107.0, one(t, fams, metrics.RelayPublishedTotal, "").GetCounter().GetValue())
	require.Equal(t, 3.0, one(t, fams, metrics.RelayPublishErrorsTotal, "").GetCounter().GetValue())
	h := one(t, fams, metrics.RelayBatchDuration, "").GetHistogram()
	require.Equal(t, uint64(2), h.GetSampleCount())
	require.InDelta(t, 2.02, h.GetSampleSum(), 1e-9)
	require.Equal(t, dto.MetricType_HISTOGRAM, fams[metrics.RelayBatchDuration].GetType())
	require.Equal(t, dto.MetricType_COUNTER, fams[metrics.RelayPublishedTotal].GetType())
}

func TestWorkerHooksChangeScrapedValues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Date(2026, 3, 1, 12, 0, 10, 0, time.UTC)
	b.m.SetNow(func() time.Time { return now })

	fams := scrape(t, b.srv)
	for _, o := range []string{"ack", "retry", "dead", "duplicate", "unsettled"} {
		require.Equal(t, 0.0, one(t, fams, metrics.WorkerMessagesTotal, o).GetCounter().GetValue(), o)
	}

	msg := &broker.Message{ID: "1", Type: "notification.requested", Headers: map[string]string{
		broker.HeaderCreatedAt: now.Add(-2500 * time.Millisecond).Format(time.RFC3339Nano),
	}}
	b.m.ObserveOutcome(msg, metrics.OutcomeAck, 40*time.Millisecond)
	b.m.ObserveOutcome(msg, metrics.OutcomeRetry, 10*time.Millisecond)
	b.m.ObserveOutcome(msg, metrics.OutcomeDead, 10*time.Millisecond)
	b.m.ObserveOutcome(msg, metrics.OutcomeDuplicate, 0)
	b.m.ObserveOutcome(msg, metrics.OutcomeDuplicate, 0)
	// No or bad created-at header: counted, but no latency sample.
	b.m.ObserveOutcome(&broker.Message{ID: "2"}, metrics.OutcomeAck, 50*time.Millisecond)
	b.m.ObserveOutcome(&broker.Message{ID: "3", Headers: map[string]string{broker.HeaderCreatedAt: "yesterday"}}, metrics.OutcomeAck, 0)
	// Created "in the future" (clock skew): clamped to 0.
	b.m.ObserveOutcome(&broker.Message{ID: "4", Headers: map[string]string{
		broker.HeaderCreatedAt: now.Add(time.Second).Format(time.RFC3339Nano)}}, metrics.OutcomeAck, 0)

	fams = scrape(t, b.srv)
	require.Equal(t, 4.0, one(t, fams, metrics.WorkerMessagesTotal, "ack").GetCounter().GetValue())
	require.Equal(t, 1.0, one(t, fams, metrics.WorkerMessagesTotal, "retry").GetCounter().GetValue())
	require.Equal(t, 1.0, one(t, fams, metrics.WorkerMessagesTotal, "dead").GetCounter().GetValue())
	require.Equal(t, 2.0, one(t, fams, metrics.WorkerMessagesTotal, "duplicate").GetCounter().GetValue())

	hd := one(t, fams, metrics.WorkerHandlerDuration, "").GetHistogram()
	require.Equal(t, uint64(6), hd.GetSampleCount(), "every outcome but duplicate")
	require.InDelta(t, 0.11, hd.GetSampleSum(), 1e-9)

	lat := one(t, fams, metrics.WorkerEndToEndLatency, "").GetHistogram()
	require.Equal(t, uint64(2), lat.GetSampleCount(), "acks with a valid header only")
	require.InDelta(t, 2.5, lat.GetSampleSum(), 1e-9)
	for _, bk := range lat.GetBucket() {
		if bk.GetUpperBound() == 1 {
			require.Equal(t, uint64(1), bk.GetCumulativeCount(), "the clamped sample is in the le=1 bucket, the 2.5 s one is not")
		}
	}
}

func TestNilMetricsIsANoOp(t *testing.T) {
	t.Parallel()
	var m *metrics.Metrics
	m.ObserveBatch(1, 1, time.Second)
	m.ObserveOutcome(&broker.Message{}, metrics.OutcomeAck, time.Second)
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	_, err := metrics.New(reg, "")
	require.ErrorIs(t, err, metrics.ErrConfig)
	_, err = metrics.New(nil, "nats")
	require.ErrorIs(t, err, metrics.ErrConfig)
	_, err = metrics.New(reg, "nats")
	require.NoError(t, err)
	_, err = metrics.New(reg, "nats")
	var are prometheus.AlreadyRegisteredError
	require.ErrorAs(t, err, &are, "registering twice is an error, not a panic")

	_, err = metrics.NewOutboxCollector("nats", nil, 0)
	require.ErrorIs(t, err, metrics.ErrConfig)
	_, err = metrics.NewOutboxCollector("", func(context.Context) (int, time.Duration, error) { return 0, 0, nil }, 0)
	require.ErrorIs(t, err, metrics.ErrConfig)
}

func TestOutboxCollectorQueriesAtScrape(t *testing.T) {
	t.Parallel()
	b := setup(t)
	calls := 0
	var answer struct {
		n   int
		age time.Duration
		err error
	}
	require.NoError(t, metrics.RegisterOutbox(b.reg, "rabbitmq", func(ctx context.Context) (int, time.Duration, error) {
		calls++
		_, hasDeadline := ctx.Deadline()
		require.True(t, hasDeadline, "the stats query runs under a timeout")
		return answer.n, answer.age, answer.err
	}))
	answer.n, answer.age = 42, 90*time.Second
	fams := scrape(t, b.srv)
	require.Equal(t, 1, calls)
	require.Equal(t, 42.0, one(t, fams, metrics.OutboxUnprocessedRows, "").GetGauge().GetValue())
	require.Equal(t, 90.0, one(t, fams, metrics.OutboxOldestAgeSeconds, "").GetGauge().GetValue())

	answer.n, answer.age = 0, 0
	fams = scrape(t, b.srv)
	require.Equal(t, 2, calls)
	require.Equal(t, 0.0, one(t, fams, metrics.OutboxUnprocessedRows, "").GetGauge().GetValue())

	// The database is down: the gauges are left out, the rest still served.
	answer.err = errors.New("connection refused")
	fams = scrape(t, b.srv)
	require.NotContains(t, fams, metrics.OutboxUnprocessedRows)
	require.NotContains(t, fams, metrics.OutboxOldestAgeSeconds)
	require.Contains(t, fams, metrics.RelayPublishedTotal)
}

// TestSettleFailuresCounted: ObserveSettleFailure counts by op and
// reason, served with the broker label; every op and reason is exported
// at 0 from the start, so increase() sees the first failure.
func TestSettleFailuresCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, "rabbitmq")
	require.NoError(t, err)
	srv := httptest.NewServer(metrics.Handler(reg))
	defer srv.Close()
	m.ObserveSettleFailure(broker.SettleFailure{Op: broker.SettleAck, Err: broker.ErrClosed})
	m.ObserveSettleFailure(broker.SettleFailure{Op: broker.SettleAck, Reason: broker.ReasonClosed})
	m.ObserveSettleFailure(broker.SettleFailure{Op: broker.SettleRetry, Err: context.DeadlineExceeded})
	f := scrape(t, srv)[metrics.WorkerSettleFailures]
	require.NotNil(t, f)
	got := map[string]float64{}
	for _, s := range f.GetMetric() {
		l := map[string]string{}
		for _, p := range s.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		require.Equal(t, "rabbitmq", l[metrics.BrokerLabel])
		got[l[metrics.OpLabel]+"/"+l[metrics.ReasonLabel]] = s.GetCounter().GetValue()
	}
	require.Len(t, got, 4*len(broker.SettleReasons))
	require.Equal(t, 2.0, got["ack/closed"])
	require.Equal(t, 1.0, got["retry/timeout"])
	require.Equal(t, 0.0, got["dead_letter/expired"])
	var nilM *metrics.Metrics
	nilM.ObserveSettleFailure(broker.SettleFailure{Op: broker.SettleAck}) // no panic
}
