package sqs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/sqs"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/metrics"
	"github.com/ferrymq/ferry/worker"
	"github.com/ferrymq/ferry/worker/workertest"
)

// TestSettleWithStaleReceiptIsExpired: a delivery whose visibility
// timeout ran out and whose message another consumer received meanwhile
// holds a receipt handle SQS no longer takes. Its Ack (the
// DeleteMessageBatch entry refused, then DeleteMessage refused), Extend
// and Retry fail with reason "expired", and nothing is reported as
// worked around; the other consumer's Ack deletes the message.
func TestSettleWithStaleReceiptIsExpired(t *testing.T) {
	tp := topology("stale", "evt.stale")
	b := declaredRaw(t, config(), tp)
	q := tp.Queues[0].Name
	require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), []*broker.Message{{ID: "st1", Type: "evt.stale", Body: []byte(`{}`)}}))
	sub1 := subscribe(t, b, q, broker.SubscribeOptions{Prefetch: 1, AckDeadline: time.Second})
	d1, err := sub1.Receive(ctxFor(t, 20*time.Second))
	require.NoError(t, err)
	time.Sleep(1500 * time.Millisecond) // past the 1 s visibility timeout
	sub2 := subscribe(t, declaredRaw(t, config(), tp), q, broker.SubscribeOptions{Prefetch: 1, AckDeadline: 30 * time.Second})
	d2, err := sub2.Receive(ctxFor(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, "st1", d2.Message().ID)

	var reported []broker.SettleFailure
	ctx := broker.WithSettleObserver(ctxFor(t, 20*time.Second), func(f broker.SettleFailure) { reported = append(reported, f) })
	err = d1.Ack(ctx)
	require.Error(t, err)
	require.Equal(t, broker.ReasonExpired, broker.SettleReason(err), "%v", err)
	require.Contains(t, err.Error(), "DeleteMessageBatch refused the entry: ReceiptHandleIsInvalid")
	require.Contains(t, err.Error(), "and DeleteMessage failed")
	err = d1.Extend(ctx)
	require.Equal(t, broker.ReasonExpired, broker.SettleReason(err), "%v", err)
	err = d1.Retry(ctx, time.Second, "try later")
	require.Equal(t, broker.ReasonExpired, broker.SettleReason(err), "%v", err)
	require.Empty(t, reported, "nothing was worked around: the failures are the methods' errors")
	require.NoError(t, d2.Ack(ctx))
}

// settleRig is a worker on one SQS queue with its metrics, settle
// failures, outcomes and log recorded.
type settleRig struct {
	reg      *prometheus.Registry
	fails    *workertest.SettleFailures
	logs     workertest.LogRecorder
	mu       sync.Mutex
	outcomes map[worker.Outcome]int
}

func (r *settleRig) count(o worker.Outcome) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.outcomes[o]
}

func (r *settleRig) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.outcomes {
		n += c
	}
	return n
}

// failures returns ferry_worker_settle_failures_total{op, reason}.
func (r *settleRig) failures(t *testing.T, op broker.SettleOp, reason string) float64 {
	t.Helper()
	return metricValue(t, r.reg, metrics.WorkerSettleFailures, map[string]string{metrics.OpLabel: string(op), metrics.ReasonLabel: reason})
}

// metricValue returns the value of the counter name{labels, broker="sqs"}
// gathered from reg, failing when there is no such series.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l[metrics.BrokerLabel] != "sqs" {
				continue
			}
			for k, v := range labels {
				if l[k] != v {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s%v with broker=sqs", name, labels)
	return 0
}

// runSettleWorker runs a worker with handler h on queue q of tp over b
// until one outcome is recorded, wired as ferry's CLI wires it (metrics
// from OnOutcome and OnSettleFailure).
func runSettleWorker(t *testing.T, b broker.Broker, tp broker.Topology, h worker.Handler) *settleRig {
	t.Helper()
	pool, _ := testenv.NewPool(t)
	workertest.CreateSchema(t, pool)
	r := &settleRig{reg: prometheus.NewRegistry(), fails: &workertest.SettleFailures{}, logs: workertest.NewLogRecorder(), outcomes: map[worker.Outcome]int{}}
	m, err := metrics.New(r.reg, b.Capabilities().Name)
	require.NoError(t, err)
	w, err := worker.New(worker.Config{
		Consumer: "settle", Queue: tp.Queues[0].Name, Pool: pool, Broker: b, Handler: h, Topology: tp,
		Logger: slog.New(r.logs),
		OnOutcome: func(msg *broker.Message, o worker.Outcome, d time.Duration) {
			m.ObserveOutcome(msg, o.String(), d)
			r.mu.Lock()
			r.outcomes[o]++
			r.mu.Unlock()
		},
		OnSettleFailure: func(f broker.SettleFailure) {
			m.ObserveSettleFailure(f)
			r.fails.Hook(f)
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	require.Eventually(t, func() bool { return r.total() > 0 }, 30*time.Second, 20*time.Millisecond, "no outcome")
	cancel()
	require.NoError(t, <-done)
	return r
}

// TestAckOnDeletedQueueIsCounted: the handler succeeds, then an operator
// deletes the work queue before the Ack. The Ack fails for real (SQS:
// QueueDoesNotExist); ferry_worker_settle_failures_total{op="ack",
// reason="not_found"} counts it, the worker logs it once with SQS's error
// and what happens next, and no "ack" outcome is counted.
func TestAckOnDeletedQueueIsCounted(t *testing.T) {
	tp := topology("gone", "evt.gone")
	b := declaredRaw(t, config(), tp)
	require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), []*broker.Message{{ID: "g1", Type: "evt.gone", Body: []byte(`{}`)}}))
	url, err := b.Client().GetQueueUrl(ctxFor(t, 10*time.Second), &awssqs.GetQueueUrlInput{QueueName: aws.String(sqs.QueueName(tp.Exchange, tp.Queues[0].Name, false))})
	require.NoError(t, err)
	r := runSettleWorker(t, b, tp, func(ctx context.Context, _ pgx.Tx, msg *broker.Message) error {
		_, err := b.Client().DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: url.QueueUrl})
		return err
	})
	require.Equal(t, 0, r.count(worker.OutcomeAck), "an Ack SQS refused is not counted as ack")
	require.Equal(t, 1, r.count(worker.OutcomeUnsettled))
	require.Equal(t, 1.0, r.failures(t, broker.SettleAck, broker.ReasonNotFound))
	require.Equal(t, 0.0, metricValue(t, r.reg, metrics.WorkerMessagesTotal, map[string]string{metrics.OutcomeLabel: metrics.OutcomeAck}))
	lines := r.logs.Lines("worker: ack failed", "message_id=g1", "reason=not_found", "next=the broker will redeliver it")
	require.Len(t, lines, 1)
	t.Logf("logged: %s", lines[0])
}

// refusingProxy forwards to ElasticMQ and, in each DeleteMessageBatch
// call, keeps the first entry from the server and answers it as Failed
// (Code InternalError), as SQS does for an entry it could not process;
// the server never deletes that entry's message. It counts the entries it
// refused.
func refusingProxy(t *testing.T) (endpoint string, refused *atomic.Int64) {
	t.Helper()
	target, err := url.Parse(testenv.SQSEndpoint())
	require.NoError(t, err)
	refused = new(atomic.Int64)
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("X-Amz-Target") != "AmazonSQS.DeleteMessageBatch" {
			rp.ServeHTTP(w, req)
			return
		}
		var in struct {
			QueueUrl string
			Entries  []map[string]any
		}
		body, _ := io.ReadAll(req.Body)
		if err := json.Unmarshal(body, &in); err != nil || len(in.Entries) == 0 {
			req.Body = io.NopCloser(bytes.NewReader(body))
			rp.ServeHTTP(w, req)
			return
		}
		held := in.Entries[0]
		in.Entries = in.Entries[1:]
		var out struct {
			Successful []map[string]any `json:"Successful"`
			Failed     []map[string]any `json:"Failed"`
		}
		if len(in.Entries) > 0 {
			fwd, _ := json.Marshal(in)
			freq, _ := http.NewRequestWithContext(req.Context(), http.MethodPost, target.String()+req.URL.Path, bytes.NewReader(fwd))
			freq.Header = req.Header.Clone()
			freq.Header.Del("Content-Length")
			resp, err := http.DefaultClient.Do(freq)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			defer resp.Body.Close()
			_ = json.NewDecoder(resp.Body).Decode(&out)
		}
		refused.Add(1)
		out.Failed = append(out.Failed, map[string]any{"Id": held["Id"], "SenderFault": false, "Code": "InternalError", "Message": "injected by the test proxy"})
		if out.Successful == nil {
			out.Successful = []map[string]any{}
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, refused
}

// TestAckEntryRefusedThenDeletedIsReported: SQS refuses the Ack's entry
// of a DeleteMessageBatch call and the adapter deletes the message on
// its own with DeleteMessage, which SQS takes. The Ack returns nil and
// the outcome is "ack" (the broker took it), but the refusal is not
// hidden: the adapter reports it through the worker's SettleObserver
// (Recovered), the worker logs it once and
// ferry_worker_settle_failures_total{op="ack",reason="refused"} counts it.
// The message is gone from the queue.
func TestAckEntryRefusedThenDeletedIsReported(t *testing.T) {
	endpoint, refused := refusingProxy(t)
	cfg := config()
	cfg.Endpoint = endpoint
	tp := topology("refuse", "evt.refuse")
	b := declaredRaw(t, cfg, tp)
	require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), []*broker.Message{{ID: "r1", Type: "evt.refuse", Body: []byte(`{}`)}}))
	r := runSettleWorker(t, b, tp, func(context.Context, pgx.Tx, *broker.Message) error { return nil })
	require.Equal(t, int64(1), refused.Load(), "the proxy refused the entry")
	require.Equal(t, 1, r.count(worker.OutcomeAck))
	require.Equal(t, 1.0, r.failures(t, broker.SettleAck, broker.ReasonRefused))
	fl := r.fails.Snapshot(broker.SettleAck)
	require.Len(t, fl, 1)
	require.True(t, fl[0].Recovered)
	require.Equal(t, "r1", fl[0].MessageID)
	require.Contains(t, fl[0].Err.Error(), "DeleteMessageBatch refused the entry: InternalError")
	lines := r.logs.Lines("worker: ack refused by the broker, worked around by the adapter", "message_id=r1", "reason=refused", "next=deleted on its own with DeleteMessage")
	require.Len(t, lines, 1)
	t.Logf("logged: %s", lines[0])
	again := drain(t, subscribe(t, declaredRaw(t, config(), tp), tp.Queues[0].Name, broker.SubscribeOptions{AckDeadline: time.Second}), 3*time.Second)
	require.Empty(t, again, "DeleteMessage deleted the message")
}
