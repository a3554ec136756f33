package ferry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/metrics"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// README: observability begin (docs/library.md's "Metrics and logs in your service" shows this code verbatim)

// instrument gives cfg the metrics and logs of the ferry command. The
// relay's OnBatch and the workers' OnOutcome hooks feed package metrics'
// series, with the names and the broker label of `ferry relay` and
// `ferry worker`; the outbox gauges (unprocessed and parked rows, oldest
// age) are read from the database at each scrape, and each worker's
// queue backlog gauges (ferry_queue_messages, oldest age, retention) from
// the broker, on the brokers that report one; the relay and the
// workers log on logger ("outbox: relay: started" and "worker: started"
// at INFO, then retries and dead letters). Serve the handler it returns
// at GET /metrics.
func instrument(cfg *ferry.Config, logger *slog.Logger) (http.Handler, error) {
	name := cfg.Broker.Capabilities().Name
	reg := metrics.NewRegistry()
	m, err := metrics.New(reg, name)
	if err != nil {
		return nil, err
	}
	pool := cfg.Pool
	err = metrics.RegisterOutboxStats(reg, name, func(ctx context.Context) (metrics.OutboxStats, error) {
		s, err := outbox.ReadStats(ctx, pool)
		return metrics.OutboxStats{Unprocessed: int(s.Unprocessed), Oldest: s.OldestUnprocessedAge, Parked: int(s.Parked)}, err
	})
	if err != nil {
		return nil, err
	}
	cfg.Logger = logger
	if cfg.Relay != nil {
		cfg.Relay.OnBatch = func(s outbox.BatchStats) { m.ObserveBatch(s.Published, s.Failed, s.Duration) }
	}
	queues := map[string]bool{}
	for i := range cfg.Workers {
		w := &cfg.Workers[i]
		w.OnOutcome = func(msg *broker.Message, o worker.Outcome, d time.Duration) {
			m.ObserveOutcome(msg, o.String(), d)
		}
		b := w.Broker
		if b == nil {
			b = cfg.Broker
		}
		backlog, ok := b.(broker.BacklogReporter) // Kafka, NATS, SQS
		if !ok || queues[w.Queue] {
			continue
		}
		queues[w.Queue] = true
		c, err := metrics.NewQueueCollector(name, w.Queue, backlog, 0)
		if err != nil {
			return nil, err
		}
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return metrics.Handler(reg), nil
}

// README: observability end

// lockedBuffer is a bytes.Buffer for the concurrent writes of a logger.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Example_instrument runs a relay and a worker instrumented by
// instrument on NATS JetStream (the real server of
// compose/local/services.sh, on a fresh database), enqueues one event and
// reads GET /metrics (the queue's backlog gauges included, as `ferry
// worker --broker nats` exposes them) and the log lines a service gets,
// the same as the ferry command's.
func Example_instrument() {
	if err := instrumentOn("nats"); err != nil {
		fmt.Println(err)
	}
	// Output:
	// log: outbox: relay: started
	// log: worker: started
	// ferry_relay_published_total{broker="nats"} 1
	// ferry_worker_messages_total{broker="nats",outcome="ack"} 1
	// ferry_outbox_unprocessed_rows{broker="nats"} 0
	// ferry_outbox_parked_rows{broker="nats"} 0
	// ferry_queue_messages{broker="nats"} 0
	// ferry_queue_oldest_message_age_seconds{broker="nats"} 0
	// ferry_queue_retention_seconds{broker="nats"} 0
}

func instrumentOn(name string) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, drop, err := testenv.ExampleDatabase(ctx)
	if err != nil {
		return err
	}
	defer drop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		return err
	}
	b, err := exampleBroker(ctx, name)
	if err != nil {
		return err
	}
	defer b.Close()

	exchange := testenv.UniqueName("observed")
	mux := ferry.NewMux()
	handled := make(chan struct{}, 1)
	if err := ferry.Handle(mux, "order.placed", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[OrderPlaced]) error {
		handled <- struct{}{}
		return nil
	}); err != nil {
		return err
	}
	cfg := ferry.Config{
		Pool: pool, Broker: b,
		Topology: broker.Topology{Exchange: exchange, Queues: []broker.Queue{{Name: exchange + ".orders", Bindings: mux.Patterns()}}},
		Relay:    &outbox.RelayConfig{},
		Workers:  []worker.Config{{Queue: exchange + ".orders", Handler: mux.HandleMessage}},
	}
	var logs lockedBuffer
	handler, err := instrument(&cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		return err
	}
	srv := httptest.NewServer(handler)
	defer srv.Close()
	p, err := ferry.New(cfg)
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	defer func() {
		stop()
		if rerr := <-done; rerr != nil && err == nil {
			err = rerr
		}
	}()

	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ferry.Enqueue(ctx, tx, "order.placed", OrderPlaced{OrderID: 7, Email: "ada@example.com"})
		return err
	}); err != nil {
		return err
	}
	select {
	case <-handled:
	case <-ctx.Done():
		return errors.New("the event was not handled within a minute")
	}
	want := []struct{ name, label string }{
		{metrics.RelayPublishedTotal, ""},
		{metrics.WorkerMessagesTotal, metrics.OutcomeAck},
		{metrics.OutboxUnprocessedRows, ""},
		{metrics.OutboxParkedRows, ""},
		{metrics.QueueMessages, ""},
		{metrics.QueueOldestAgeSeconds, ""},
		{metrics.QueueRetentionSeconds, ""},
	}
	var lines []string
	for { // the hooks run just after the commit and the ack: wait for them
		lines, err = scrape(srv.URL, want)
		if err != nil {
			return err
		}
		// and for the broker to count the ack (ferry_queue_messages 0)
		if strings.HasSuffix(lines[0], " 1") && strings.HasSuffix(lines[1], " 1") && strings.HasSuffix(lines[4], " 0") {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("metrics not updated within a minute: %v", lines)
		case <-time.After(20 * time.Millisecond):
		}
	}
	for _, msg := range []string{"outbox: relay: started", "worker: started"} {
		if strings.Contains(logs.String(), fmt.Sprintf("msg=%q", msg)) {
			fmt.Println("log:", msg)
		}
	}
	for _, l := range lines {
		fmt.Println(l)
	}
	return nil
}

// scrape reads GET /metrics at url and returns one line per series of
// want (an outcome label value when label is set), as "name{labels} value".
func scrape(url string, want []struct{ name, label string }) ([]string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, w := range want {
		line := w.name + " missing"
		for _, m := range fams[w.name].GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if w.label != "" && labels[metrics.OutcomeLabel] != w.label {
				continue
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			if w.label != "" {
				line = fmt.Sprintf("%s{broker=%q,outcome=%q} %g", w.name, labels[metrics.BrokerLabel], w.label, v)
			} else {
				line = fmt.Sprintf("%s{broker=%q} %g", w.name, labels[metrics.BrokerLabel], v)
			}
		}
		out = append(out, line)
	}
	return out, nil
}
