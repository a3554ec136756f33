package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ferrymq/ferry/broker"
)

// Metric names, for tests, dashboards and the Prometheus rules in
// compose/prometheus/alerts.yml.
const (
	OutboxUnprocessedRows    = "ferry_outbox_unprocessed_rows"
	OutboxOldestAgeSeconds   = "ferry_outbox_oldest_unprocessed_age_seconds"
	OutboxParkedRows         = "ferry_outbox_parked_rows"
	OutboxWALRetainedBytes   = "ferry_outbox_wal_retained_bytes"
	OutboxWALOldestSeconds   = "ferry_outbox_wal_oldest_unconfirmed_age_seconds"
	RelayPublishedTotal      = "ferry_relay_published_total"
	RelayPublishErrorsTotal  = "ferry_relay_publish_errors_total"
	RelayBatchDuration       = "ferry_relay_batch_duration_seconds"
	RelayBlocked             = "ferry_relay_blocked"
	WorkerMessagesTotal      = "ferry_worker_messages_total"
	WorkerHandlerDuration    = "ferry_worker_handler_duration_seconds"
	WorkerEndToEndLatency    = "ferry_worker_end_to_end_latency_seconds"
	WorkerSettleFailures     = "ferry_worker_settle_failures_total"
	BrokerLabel              = "broker"
	OutcomeLabel             = "outcome"
	OpLabel                  = "op"
	ReasonLabel              = "reason"
	DefaultOutboxStatTimeout = 2 * time.Second
)

// Worker outcomes, the values of the outcome label; they equal
// worker.Outcome's String values.
const (
	OutcomeAck       = "ack"
	OutcomeRetry     = "retry"
	OutcomeDead      = "dead"
	OutcomeDuplicate = "duplicate"
	// OutcomeUnsettled: a failed attempt whose Retry or DeadLetter the
	// broker did not take; the broker redelivers the message.
	OutcomeUnsettled = "unsettled"
	// OutcomeSnoozed: a delivery sent back for later without counting an
	// attempt (worker.Snooze, ferry.RetryAfter, a concurrency or rate
	// limit reached).
	OutcomeSnoozed = "snoozed"
)

// ErrConfig is wrapped by the errors New and NewOutboxCollector return for
// bad arguments.
var ErrConfig = errors.New("metrics: invalid argument")

// Buckets of the histograms, in seconds.
var (
	// BatchBuckets: a relay batch is one claim, one Publish with confirms
	// and one commit: milliseconds normally, up to the publish timeout.
	BatchBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	// HandlerBuckets: one handler attempt (an SMTP send is tens of ms).
	HandlerBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	// LatencyBuckets: create-to-handled, which includes retry delays.
	LatencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}
)

// Metrics holds the relay and worker series of one process. Its methods
// may be called concurrently, and on a nil *Metrics (they do nothing).
type Metrics struct {
	published      prometheus.Counter
	publishErrors  prometheus.Counter
	batchDuration  prometheus.Histogram
	blocked        *prometheus.GaugeVec
	blockedMu      sync.Mutex
	blockedReason  string
	messages       *prometheus.CounterVec
	handlerSeconds prometheus.Histogram
	latency        prometheus.Histogram
	settleFailures *prometheus.CounterVec
	now            func() time.Time
}

// New creates the relay and worker series with the constant label
// broker=brokerName and registers them on reg. brokerName must not be
// empty. It fails (wrapping ErrConfig, or the registry's
// prometheus.AlreadyRegisteredError) when the series are already
// registered on reg: create one Metrics per process and share it between
// the roles that process runs.
func New(reg prometheus.Registerer, brokerName string) (*Metrics, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registerer is nil", ErrConfig)
	}
	if brokerName == "" {
		return nil, fmt.Errorf("%w: broker name is empty", ErrConfig)
	}
	m := &Metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: RelayPublishedTotal,
			Help: "Outbox rows the relay published and the broker confirmed.",
		}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: RelayPublishErrorsTotal,
			Help: "Outbox rows whose publication failed (they stay in the outbox and are retried).",
		}),
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    RelayBatchDuration,
			Help:    "Duration of one relay batch, from claiming the rows to committing them, in seconds.",
			Buckets: BatchBuckets,
		}),
		blocked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: RelayBlocked,
			Help: "1 while the relay holds its rows because the broker has no room (a RabbitMQ memory or disk alarm, a Kafka partition short of in-sync replicas, a full JetStream stream), with the broker's reason in the reason label; one series with reason=\"\" and value 0 otherwise.",
		}, []string{ReasonLabel}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: WorkerMessagesTotal,
			Help: "Deliveries the worker settled, by outcome (ack, retry, dead, duplicate, unsettled); ack, retry, dead and duplicate count only settlements the broker took, unsettled those it did not.",
		}, []string{OutcomeLabel}),
		handlerSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    WorkerHandlerDuration,
			Help:    "Duration of one handling attempt (dedup insert, handler, commit), in seconds; duplicates excluded.",
			Buckets: HandlerBuckets,
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    WorkerEndToEndLatency,
			Help:    "Time from the outbox row's commit (x-created-at header) to the worker's ack, in seconds.",
			Buckets: LatencyBuckets,
		}),
		settleFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: WorkerSettleFailures,
			Help: "Settlements the broker did not take, by op (ack, retry, dead_letter, extend) and reason (broker.SettleReason: closed, connection, timeout, canceled, expired, not_found, throttled, refused, already_settled, other); includes refusals the adapter worked around by itself (an SQS DeleteMessageBatch entry deleted again with DeleteMessage).",
		}, []string{OpLabel, ReasonLabel}),
		now: time.Now,
	}
	for _, op := range []broker.SettleOp{broker.SettleAck, broker.SettleRetry, broker.SettleDeadLetter, broker.SettleExtend} {
		for _, r := range broker.SettleReasons {
			m.settleFailures.WithLabelValues(string(op), r) // export zeros, so increase() sees the first failure
		}
	}
	for _, o := range []string{OutcomeAck, OutcomeRetry, OutcomeDead, OutcomeDuplicate, OutcomeUnsettled, OutcomeSnoozed} {
		m.messages.WithLabelValues(o) // export zeros, so rate() works from the first delivery
	}
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{BrokerLabel: brokerName}, reg)
	m.blocked.WithLabelValues("").Set(0)
	for _, c := range []prometheus.Collector{m.published, m.publishErrors, m.batchDuration, m.blocked, m.messages, m.handlerSeconds, m.latency, m.settleFailures} {
		if err := wrapped.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: register: %w", err)
		}
	}
	return m, nil
}

// ObserveBatch records one relay batch: published rows confirmed by the
// broker, failed rows not confirmed, and the batch's wall time. It fits
// outbox.RelayConfig.OnBatch:
//
//	OnBatch: func(s outbox.BatchStats) { m.ObserveBatch(s.Published, s.Failed, s.Duration) }
func (m *Metrics) ObserveBatch(published, failed int, duration time.Duration) {
	if m == nil {
		return
	}
	if published > 0 {
		m.published.Add(float64(published))
	}
	if failed > 0 {
		m.publishErrors.Add(float64(failed))
	}
	m.batchDuration.Observe(duration.Seconds())
}

// MaxBlockedReasonBytes bounds the reason label of RelayBlocked (bytes);
// a longer reason is cut at a UTF-8 boundary.
const MaxBlockedReasonBytes = 128

// SetRelayBlocked records the relay's blocked state: reason is the
// broker's reason while the relay holds its rows because the broker has
// no room, "" when it is not blocked. The series of the previous reason is
// removed, so RelayBlocked has one series at a time. It fits
// outbox.RelayConfig.OnBlocked:
//
//	OnBlocked: m.SetRelayBlocked
func (m *Metrics) SetRelayBlocked(reason string) {
	if m == nil {
		return
	}
	reason = strings.ToValidUTF8(reason, "\uFFFD")
	if len(reason) > MaxBlockedReasonBytes {
		cut := MaxBlockedReasonBytes
		for cut > 0 && (reason[cut]&0xC0) == 0x80 {
			cut--
		}
		reason = reason[:cut]
	}
	m.blockedMu.Lock()
	defer m.blockedMu.Unlock()
	if reason == m.blockedReason {
		return
	}
	m.blocked.DeleteLabelValues(m.blockedReason)
	m.blockedReason = reason
	if reason == "" {
		m.blocked.WithLabelValues("").Set(0)
	} else {
		m.blocked.WithLabelValues(reason).Set(1)
	}
}

// ObserveOutcome records one settled delivery: the outcome (OutcomeAck,
// OutcomeRetry, OutcomeDead, OutcomeDuplicate, OutcomeUnsettled, OutcomeSnoozed; any other non-empty value is
// counted under its own label, an empty one as "unknown") and the time the
// attempt took. For OutcomeAck it also records the end-to-end latency from
// msg's broker.HeaderCreatedAt header; a message without a parseable one
// (published by something other than the relay) has no latency sample. It
// fits worker.Config.OnOutcome:
//
//	OnOutcome: func(msg *broker.Message, o worker.Outcome, d time.Duration) { m.ObserveOutcome(msg, o.String(), d) }
func (m *Metrics) ObserveOutcome(msg *broker.Message, outcome string, handlerDuration time.Duration) {
	if m == nil {
		return
	}
	if outcome == "" {
		outcome = "unknown"
	}
	m.messages.WithLabelValues(outcome).Inc()
	if outcome == OutcomeDuplicate {
		return
	}
	m.handlerSeconds.Observe(handlerDuration.Seconds())
	if outcome != OutcomeAck || msg == nil {
		return
	}
	created, err := time.Parse(time.RFC3339Nano, msg.Headers[broker.HeaderCreatedAt])
	if err != nil {
		return
	}
	lat := m.now().Sub(created)
	if lat < 0 { // clock skew between the database and this host
		lat = 0
	}
	m.latency.Observe(lat.Seconds())
}

// ObserveSettleFailure counts one settlement the broker did not take in
// ferry_worker_settle_failures_total, by f.Op and f.Reason (an empty
// reason is counted as broker.SettleReason(f.Err)). It fits
// worker.Config.OnSettleFailure:
//
//	OnSettleFailure: m.ObserveSettleFailure
func (m *Metrics) ObserveSettleFailure(f broker.SettleFailure) {
	if m == nil {
		return
	}
	reason := f.Reason
	if reason == "" {
		reason = broker.SettleReason(f.Err)
	}
	if reason == "" {
		reason = broker.ReasonOther
	}
	op := string(f.Op)
	if op == "" {
		op = "unknown"
	}
	m.settleFailures.WithLabelValues(op, reason).Inc()
}

// StatsFunc reports the outbox backlog: unprocessed rows and the age of the
// oldest one (0 when none). Adapt outbox.ReadStats:
//
//	func(ctx context.Context) (int, time.Duration, error) {
//		s, err := outbox.ReadStats(ctx, pool)
//		return int(s.Unprocessed), s.OldestUnprocessedAge, err
//	}
type StatsFunc func(ctx context.Context) (unprocessed int, oldest time.Duration, err error)

// OutboxStats is what an OutboxStatsFunc reports at a scrape.
type OutboxStats struct {
	// Unprocessed is the number of rows not yet published.
	Unprocessed int
	// Oldest is the age of the oldest unprocessed row, 0 when none.
	Oldest time.Duration
	// Parked is the number of unprocessed rows whose publication failed
	// for a reason of their own (outbox.Stats.Parked).
	Parked int
	// WAL is true for a relay in WAL mode (outbox.RelayModeWAL): the
	// collector then also exports ferry_outbox_wal_retained_bytes and
	// ferry_outbox_wal_oldest_unconfirmed_age_seconds from the two fields
	// below (outbox.ReadWALStats).
	WAL bool
	// WALRetainedBytes is the WAL the relay's slot keeps on the server
	// (bytes; outbox.WALStats.RetainedBytes).
	WALRetainedBytes int64
	// WALOldestUnconfirmed is the age of the oldest event not yet
	// confirmed by the WAL relay (outbox.WALStats.OldestUnconfirmedAge),
	// 0 when none.
	WALOldestUnconfirmed time.Duration
}

// OutboxStatsFunc reports the outbox backlog including the parked rows;
// adapt outbox.ReadStats:
//
//	func(ctx context.Context) (metrics.OutboxStats, error) {
//		s, err := outbox.ReadStats(ctx, pool)
//		return metrics.OutboxStats{Unprocessed: int(s.Unprocessed),
//			Oldest: s.OldestUnprocessedAge, Parked: int(s.Parked)}, err
//	}
type OutboxStatsFunc func(ctx context.Context) (OutboxStats, error)

// OutboxCollector is a prometheus.Collector that calls a StatsFunc at
// every scrape and exports ferry_outbox_unprocessed_rows and
// ferry_outbox_oldest_unprocessed_age_seconds, and ferry_outbox_parked_rows
// when made by NewOutboxStatsCollector. When the StatsFunc fails or
// exceeds its timeout, the scrape omits these series (the error is logged
// by Handler) instead of exporting a stale or zero value.
type OutboxCollector struct {
	stats   OutboxStatsFunc
	timeout time.Duration
	rows    *prometheus.Desc
	age     *prometheus.Desc
	parked  *prometheus.Desc // nil without an OutboxStatsFunc
	walRet  *prometheus.Desc
	walAge  *prometheus.Desc
}

var _ prometheus.Collector = (*OutboxCollector)(nil)

// NewOutboxCollector returns a collector for the outbox gauges with the
// constant label broker=brokerName. timeout bounds one StatsFunc call;
// 0 means DefaultOutboxStatTimeout (2 s). Register it with
// RegisterOutbox or reg.MustRegister.
func NewOutboxCollector(brokerName string, stats StatsFunc, timeout time.Duration) (*OutboxCollector, error) {
	if stats == nil {
		return nil, fmt.Errorf("%w: stats func is nil", ErrConfig)
	}
	c, err := NewOutboxStatsCollector(brokerName, func(ctx context.Context) (OutboxStats, error) {
		n, age, err := stats(ctx)
		return OutboxStats{Unprocessed: n, Oldest: age}, err
	}, timeout)
	if c != nil {
		c.parked = nil
	}
	return c, err
}

// NewOutboxStatsCollector is NewOutboxCollector with an OutboxStatsFunc:
// the collector also exports ferry_outbox_parked_rows (OutboxParkedRows),
// the rows whose publication failed for a reason of their own and that the
// relay retries with backoff (see `ferry outbox stats`, and `ferry outbox
// retry` or `drop`).
func NewOutboxStatsCollector(brokerName string, stats OutboxStatsFunc, timeout time.Duration) (*OutboxCollector, error) {
	if brokerName == "" {
		return nil, fmt.Errorf("%w: broker name is empty", ErrConfig)
	}
	if stats == nil {
		return nil, fmt.Errorf("%w: stats func is nil", ErrConfig)
	}
	if timeout < 0 {
		return nil, fmt.Errorf("%w: timeout %s is negative", ErrConfig, timeout)
	}
	if timeout == 0 {
		timeout = DefaultOutboxStatTimeout
	}
	labels := prometheus.Labels{BrokerLabel: brokerName}
	return &OutboxCollector{
		stats:   stats,
		timeout: timeout,
		rows: prometheus.NewDesc(OutboxUnprocessedRows,
			"Outbox rows not yet published (read from the database at scrape time).", nil, labels),
		age: prometheus.NewDesc(OutboxOldestAgeSeconds,
			"Age of the oldest unprocessed outbox row in seconds, 0 when there is none.", nil, labels),
		parked: prometheus.NewDesc(OutboxParkedRows,
			"Unprocessed outbox rows whose publication failed for a reason of their own (refused, unroutable, too large), retried with backoff; 0 when none.", nil, labels),
		walRet: prometheus.NewDesc(OutboxWALRetainedBytes,
			"WAL relay: bytes of WAL the replication slot keeps on the PostgreSQL server (from its restart position to the current WAL position); grows while the relay is down or behind.", nil, labels),
		walAge: prometheus.NewDesc(OutboxWALOldestSeconds,
			"WAL relay: age in seconds of the oldest event not yet confirmed by the broker and settled, 0 when there is none.", nil, labels),
	}, nil
}

// RegisterOutboxStats creates an OutboxCollector from an OutboxStatsFunc
// (so with ferry_outbox_parked_rows) with the default timeout and
// registers it on reg.
func RegisterOutboxStats(reg prometheus.Registerer, brokerName string, stats OutboxStatsFunc) error {
	if reg == nil {
		return fmt.Errorf("%w: registerer is nil", ErrConfig)
	}
	c, err := NewOutboxStatsCollector(brokerName, stats, 0)
	if err != nil {
		return err
	}
	if err := reg.Register(c); err != nil {
		return fmt.Errorf("metrics: register outbox collector: %w", err)
	}
	return nil
}

// RegisterOutbox creates an OutboxCollector with the default timeout and
// registers it on reg.
func RegisterOutbox(reg prometheus.Registerer, brokerName string, stats StatsFunc) error {
	if reg == nil {
		return fmt.Errorf("%w: registerer is nil", ErrConfig)
	}
	c, err := NewOutboxCollector(brokerName, stats, 0)
	if err != nil {
		return err
	}
	if err := reg.Register(c); err != nil {
		return fmt.Errorf("metrics: register outbox collector: %w", err)
	}
	return nil
}

// Describe implements prometheus.Collector.
func (c *OutboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rows
	ch <- c.age
	if c.parked != nil {
		ch <- c.parked
	}
	// The WAL series are exported only by a WAL relay: Describe leaves
	// them out (an unchecked collector for them), so a poll relay's
	// registry has no such series at all.
}

// Collect implements prometheus.Collector: one StatsFunc call per scrape.
func (c *OutboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	st, err := c.stats(ctx)
	if err != nil {
		err = fmt.Errorf("metrics: outbox stats: %w", err)
		ch <- prometheus.NewInvalidMetric(c.rows, err)
		ch <- prometheus.NewInvalidMetric(c.age, err)
		if c.parked != nil {
			ch <- prometheus.NewInvalidMetric(c.parked, err)
		}
		return
	}
	ch <- prometheus.MustNewConstMetric(c.rows, prometheus.GaugeValue, float64(st.Unprocessed))
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, st.Oldest.Seconds())
	if c.parked != nil {
		ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(st.Parked))
	}
	if st.WAL {
		ch <- prometheus.MustNewConstMetric(c.walRet, prometheus.GaugeValue, float64(st.WALRetainedBytes))
		ch <- prometheus.MustNewConstMetric(c.walAge, prometheus.GaugeValue, st.WALOldestUnconfirmed.Seconds())
	}
}

// NewRegistry returns a registry holding the Go runtime and process
// collectors, the usual base for Handler.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves the metrics gathered from g in the Prometheus text (or
// negotiated OpenMetrics) format; mount it at GET /metrics. A collector
// that fails (e.g. the outbox collector while the database is down) is
// logged at ERROR on slog.Default() and left out; the other series are
// still served with status 200.
func Handler(g prometheus.Gatherer) http.Handler {
	logger := slog.Default()
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:          slogPrinter{logger},
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	})
}

type slogPrinter struct{ l *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.l.Error("metrics: " + fmt.Sprint(v...)) }
