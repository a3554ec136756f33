package bench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go/middleware"

	"github.com/ferrymq/ferry/brokers/sqs"
	"github.com/ferrymq/ferry/internal/latencyproxy"
	"github.com/ferrymq/ferry/internal/testenv"
)

// sqsSettings is what the SQS benchmarks set on the SQS adapter.
type sqsSettings struct {
	endpoint        string       // the adapter's endpoint (a latencyproxy in front of the server); "": the kind's server
	sendConcurrency int          // sqs.Config.SendConcurrency; 0: the adapter's default
	pollers         int          // sqs.Config.ReceivePollers; 0: the adapter's default
	counter         *callCounter // counts the adapter's HTTP requests; nil: none
}

// config is the adapter's configuration for kind ("sqs" or kindMoto).
func (q sqsSettings) config(kind string) sqs.Config {
	cfg := sqs.Config{Endpoint: sqsEndpoint(kind), Region: testenv.AWSRegion(), Logger: quietLogger,
		SendConcurrency: q.sendConcurrency, ReceivePollers: q.pollers}
	if q.endpoint != "" {
		cfg.Endpoint = q.endpoint
	}
	if q.counter != nil {
		cfg.APIOptions = q.counter.apiOptions()
	}
	return cfg
}

// callCounter counts the SQS adapter's HTTP requests by operation and adds
// up the time they took, through the SDK's middleware stack
// (sqs.Config.APIOptions): a middleware at the end of the finalize step,
// after the retry middleware, so each attempt counts, as the server sees
// it.
type callCounter struct {
	mu    sync.Mutex
	calls map[string]int64
	busy  time.Duration // the requests' durations, summed
}

func newCallCounter() *callCounter { return &callCounter{calls: map[string]int64{}} }

func (c *callCounter) apiOptions() []func(*middleware.Stack) error {
	return []func(*middleware.Stack) error{func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("FerryBenchCallCounter",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				start := time.Now()
				out, md, err := next.HandleFinalize(ctx, in)
				c.add(awsmiddleware.GetOperationName(ctx), time.Since(start))
				return out, md, err
			}), middleware.After)
	}}
}

func (c *callCounter) add(op string, d time.Duration) {
	c.mu.Lock()
	c.calls[op]++
	c.busy += d
	c.mu.Unlock()
}

// reset zeroes the counts and returns those before.
func (c *callCounter) reset() (map[string]int64, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls, busy := c.calls, c.busy
	c.calls, c.busy = map[string]int64{}, 0
	return calls, busy
}

// sqsOps are the operations of the SQS data path, reported one by one;
// the others (CreateQueue, GetQueueAttributes, ListQueueTags: Declare)
// are summed as "other".
var sqsOps = []string{"SendMessageBatch", "ReceiveMessage", "DeleteMessageBatch", "ChangeMessageVisibilityBatch"}

// reportCalls reports calls per event (all, and each data-path
// operation) as metrics prefixed by prefix and returns them in words.
func reportCalls(b *testing.B, calls map[string]int64, events int, prefix string) string {
	var total int64
	for _, n := range calls {
		total += n
	}
	per := func(n int64) float64 { return float64(n) / float64(events) }
	b.ReportMetric(per(total), prefix+"calls/event")
	parts := []string{fmt.Sprintf("%.3f calls per event (%d calls)", per(total), total)}
	other := total
	for _, op := range sqsOps {
		b.ReportMetric(per(calls[op]), prefix+op+"/event")
		parts = append(parts, fmt.Sprintf("%s %.3f", op, per(calls[op])))
		other -= calls[op]
	}
	parts = append(parts, fmt.Sprintf("other %.4f (%s)", per(other), otherOps(calls)))
	return strings.Join(parts, ", ")
}

func otherOps(calls map[string]int64) string {
	var ops []string
	for op, n := range calls {
		if !contains(sqsOps, op) {
			ops = append(ops, fmt.Sprintf("%s %d", op, n))
		}
	}
	sort.Strings(ops)
	if len(ops) == 0 {
		return "none"
	}
	return strings.Join(ops, ", ")
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// envInt is the positive integer in the environment variable name, or
// def when it is not set; a bad value fails the benchmark.
func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("bench: %s=%q: want a positive integer", name, v)
	}
	return n
}

// BenchmarkSQSCost measures, on ElasticMQ (FERRY_SQS_ENDPOINT) and on
// moto (FERRY_SQS_MOTO_ENDPOINT), where an event's cost goes on the SQS
// path: the CPU seconds per 1,000 events of this process (relay, worker
// and producers), of PostgreSQL and of the SQS server (ElasticMQ's java,
// moto's python, found by the endpoint's port), and the adapter's HTTP
// requests per event by operation (counted by SDK middleware, each attempt
// once). Three stages on a fresh database and queue each: the relay alone
// draining N committed events, then the worker alone draining the N
// queued messages, then end to end (4 producers committing N events while
// a relay and a worker run). N is FERRY_BENCH_SQS_COST_EVENTS (default
// 2,000: moto takes about 20 ms of CPU per message); the other settings
// are the other benchmarks' (relay BatchSize 500, Concurrency 2; worker
// Concurrency 20, Prefetch 40).
func BenchmarkSQSCost(b *testing.B) {
	for _, kind := range []string{"sqs", kindMoto} {
		b.Run(kind, func(b *testing.B) {
			s := loadSettings(b)
			n := envInt(b, "FERRY_BENCH_SQS_COST_EVENTS", 2000)
			ctx := benchCtx(b)
			counter := newCallCounter()
			s.sqs.counter = counter
			server := "ElasticMQ at " + sqsEndpoint(kind)
			if kind == kindMoto {
				server = "moto at " + sqsEndpoint(kind)
			}
			b.Logf("%s: %s; %d events, %s; %s", kind, server, n, describeMessage(), s)

			// The relay alone, then the worker alone, on one database.
			db := newDatabase(b)
			fillBusiness(b, db, n)
			tp := newTopology(b, kind)
			newBroker(b, kind, tp, s) // declared before the meter starts
			counter.reset()
			m := startCost(b, db, kind)
			rate, phases := drain(b, kind, db, tp, s, n, "")
			cost := stopCost(b, m, db, n, "relay-")
			calls, _ := counter.reset()
			b.Logf("%s: relay alone %.0f events/s (%s); %s", kind, rate, phases, cost)
			b.Logf("%s: relay alone: %s", kind, reportCalls(b, calls, n, "relay-"))
			b.ReportMetric(rate, "relay-events/s")

			m = startCost(b, db, kind)
			start := time.Now()
			wp := startPipeline(b, kind, db, tp, s, parts{worker: true, target: int64(n)})
			wp.wait(b, 10*time.Minute)
			rate = float64(n) / time.Since(start).Seconds()
			wp.stop()
			cost = stopCost(b, m, db, n, "worker-")
			calls, _ = counter.reset()
			if sent := countSent(b, db); sent != int64(n) {
				b.Errorf("bench: worker alone: %d of %d business rows marked sent", sent, n)
			}
			b.Logf("%s: worker alone %.0f events/s (%s; %d duplicates, %d retried/dead); %s", kind, rate, wp.workerStats(), wp.dups.Load(), wp.other.Load(), cost)
			b.Logf("%s: worker alone: %s", kind, reportCalls(b, calls, n, "worker-"))
			b.ReportMetric(rate, "worker-events/s")

			// End to end on a fresh database and queue.
			db = newDatabase(b)
			tp = newTopology(b, kind)
			p := startPipeline(b, kind, db, tp, s, parts{relay: true, worker: true, target: int64(n)})
			pool := db.newPool(b, s.producers)
			counter.reset()
			m = startCost(b, db, kind)
			start = time.Now()
			_, err := produceBurst(ctx, pool, s.producers, n)
			must(b, err)
			p.wait(b, 10*time.Minute)
			rate = float64(n) / time.Since(start).Seconds()
			p.stop()
			pool.Close()
			cost = stopCost(b, m, db, n, "e2e-")
			calls, _ = counter.reset()
			if sent := countSent(b, db); sent != int64(n) {
				b.Errorf("bench: end to end: %d of %d business rows marked sent", sent, n)
			}
			b.Logf("%s: end to end %.0f events/s (%s; %d duplicates, %d retried/dead); %s", kind, rate, p.stats(), p.dups.Load(), p.other.Load(), cost)
			b.Logf("%s: end to end: %s", kind, reportCalls(b, calls, n, "e2e-"))
			b.ReportMetric(rate, "e2e-events/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// scaleRow is one setting of BenchmarkSQSScaling: a relay row sets the
// relay's Concurrency (a) and BatchSize (b) and the adapter's
// SendConcurrency (c); a worker row the worker's Concurrency (a),
// Prefetch (b) and BatchSize (d, default 1) and the adapter's
// ReceivePollers (c, 0: its default).
type scaleRow struct{ a, b, c, d int }

// parseGrid reads rows "a:b:c" or "a:b:c:d" separated by commas from the
// environment variable name, or def.
func parseGrid(b *testing.B, name, def string) []scaleRow {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	var rows []scaleRow
	for _, f := range strings.Split(v, ",") {
		r := scaleRow{d: 1}
		var err error
		var fields []int
		for _, p := range strings.Split(strings.TrimSpace(f), ":") {
			n, perr := strconv.Atoi(p)
			if perr != nil || n < 0 {
				err = fmt.Errorf("%q", p)
			}
			fields = append(fields, n)
		}
		switch {
		case err == nil && len(fields) == 3:
			r.a, r.b, r.c = fields[0], fields[1], fields[2]
		case err == nil && len(fields) == 4:
			r.a, r.b, r.c, r.d = fields[0], fields[1], fields[2], fields[3]
		default:
			err = fmt.Errorf("want 3 or 4 fields")
		}
		if err != nil || r.a <= 0 || r.b <= 0 || r.d <= 0 {
			b.Fatalf("bench: %s=%q: want rows a:b:c or a:b:c:d of positive integers (c may be 0) separated by commas", name, v)
		}
		rows = append(rows, r)
	}
	return rows
}

// BenchmarkSQSScaling measures how the relay's and the worker's
// throughput on SQS grow with the calls they keep in flight when every
// call takes FERRY_BENCH_SQS_LATENCY longer (default 15ms, what AWS SQS
// costs from inside its region): ElasticMQ (FERRY_SQS_ENDPOINT) behind a
// latencyproxy on loopback. Each row runs on a fresh database and queue
// with N = FERRY_BENCH_SQS_SCALE_EVENTS events (default 10,000).
//
//   - relay/conc=C,batch=B,send=S: the relay (Concurrency C, BatchSize B)
//     drains N committed rows through the adapter with SendConcurrency S:
//     at most C × min(S, B/10) SendMessageBatch calls in flight. Rows:
//     FERRY_BENCH_SQS_RELAY_GRID, "C:B:S,...".
//   - worker/conc=C,prefetch=P,pollers=R,batch=B: the worker (Concurrency
//     C, Prefetch P, BatchSize B) drains N queued messages (queued
//     beforehand without the proxy) through the adapter with
//     ReceivePollers R (0: the adapter's default). Rows:
//     FERRY_BENCH_SQS_WORKER_GRID, "C:P:R:B,..." (B may be left out: 1).
//
// Figures per row: events/s, the adapter's HTTP requests per second and
// per event, the mean requests in flight (their summed durations over the
// run's time; long polls waiting on an empty queue count too) and the
// mean time of one (the added latency plus the server's time: above the
// latency, the server is the bound), and the CPU seconds per 1,000 events
// of this process, PostgreSQL and ElasticMQ (as BenchmarkSQSCost).
func BenchmarkSQSScaling(b *testing.B) {
	latency := 15 * time.Millisecond
	if v := os.Getenv("FERRY_BENCH_SQS_LATENCY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			b.Fatalf("bench: FERRY_BENCH_SQS_LATENCY=%q: want a duration such as 15ms", v)
		}
		latency = d
	}
	const kind = "sqs"
	testenv.RequireTCP(b, kind, testenv.HostPort(sqsEndpoint(kind)))
	proxy, err := latencyproxy.Start(sqsEndpoint(kind), latency)
	must(b, err)
	b.Cleanup(func() { _ = proxy.Close() })
	relayGrid := parseGrid(b, "FERRY_BENCH_SQS_RELAY_GRID", "1:100:8,1:100:16,4:100:8,4:100:16,2:500:8,2:500:16,4:500:50")
	workerGrid := parseGrid(b, "FERRY_BENCH_SQS_WORKER_GRID", "10:10:0,20:40:0,64:128:4,64:128:0,20:200:0:10,40:400:0:10")

	report := func(b *testing.B, what string, n int, elapsed time.Duration, counter *callCounter, cost string) {
		calls, busy := counter.reset()
		var total int64
		for _, c := range calls {
			total += c
		}
		rate := float64(n) / elapsed.Seconds()
		callMS := ms(busy / time.Duration(max(total, 1)))
		b.ReportMetric(rate, "events/s")
		b.ReportMetric(float64(total)/elapsed.Seconds(), "calls/s")
		b.ReportMetric(busy.Seconds()/elapsed.Seconds(), "in-flight")
		b.ReportMetric(callMS, "call-ms")
		b.ReportMetric(0, "ns/op")
		b.Logf("%s: %.0f events/s with %v added per call (ElasticMQ at %s through %s); %.0f calls/s, %.1f in flight on average, %.1f ms each; %s; load average %s",
			what, rate, latency, sqsEndpoint(kind), proxy.URL(), float64(total)/elapsed.Seconds(), busy.Seconds()/elapsed.Seconds(), callMS,
			reportCalls(b, calls, n, ""), machineLoad())
		b.Logf("%s", cost)
	}

	b.Run("relay", func(b *testing.B) {
		for _, r := range relayGrid {
			b.Run(fmt.Sprintf("conc=%d,batch=%d,send=%d", r.a, r.b, r.c), func(b *testing.B) {
				s := loadSettings(b)
				n := envInt(b, "FERRY_BENCH_SQS_SCALE_EVENTS", 10000)
				s.relayConc, s.relayBatch = r.a, r.b
				counter := newCallCounter()
				s.sqs = sqsSettings{endpoint: proxy.URL(), sendConcurrency: r.c, counter: counter}
				db := newDatabase(b)
				fillOutbox(b, db, n)
				tp := newTopology(b, kind)
				newBroker(b, kind, tp, loadSettings(b)) // declared without the proxy
				counter.reset()
				m := startCost(b, db, kind)
				start := time.Now()
				_, phases := drain(b, kind, db, tp, s, n, "")
				elapsed := time.Since(start)
				cost := stopCost(b, m, db, n, "")
				report(b, fmt.Sprintf("relay Concurrency %d, BatchSize %d, SendConcurrency %d (at most %d calls in flight); %s",
					r.a, r.b, r.c, r.a*min(r.c, (r.b+9)/10), phases), n, elapsed, counter, cost)
			})
		}
	})
	b.Run("worker", func(b *testing.B) {
		for _, r := range workerGrid {
			b.Run(fmt.Sprintf("conc=%d,prefetch=%d,pollers=%d,batch=%d", r.a, r.b, r.c, r.d), func(b *testing.B) {
				s := loadSettings(b)
				n := envInt(b, "FERRY_BENCH_SQS_SCALE_EVENTS", 10000)
				db := newDatabase(b)
				fillBusiness(b, db, n)
				tp := newTopology(b, kind)
				// Queue the messages without the proxy, as fast as the
				// server takes them.
				fill := loadSettings(b)
				fill.relayConc, fill.relayBatch, fill.sqs.sendConcurrency = 4, 500, 50
				drain(b, kind, db, tp, fill, n, "")

				s.workerConc, s.workerPrefetch, s.workerBatch = r.a, r.b, r.d
				counter := newCallCounter()
				s.sqs = sqsSettings{endpoint: proxy.URL(), pollers: r.c, counter: counter}
				m := startCost(b, db, kind)
				start := time.Now()
				p := startPipeline(b, kind, db, tp, s, parts{worker: true, target: int64(n)})
				p.wait(b, 10*time.Minute)
				elapsed := time.Since(start)
				p.stop()
				cost := stopCost(b, m, db, n, "")
				if sent := countSent(b, db); sent != int64(n) {
					b.Errorf("bench: worker: %d of %d business rows marked sent", sent, n)
				}
				pollers := "the adapter's default"
				if r.c > 0 {
					pollers = strconv.Itoa(r.c)
				}
				report(b, fmt.Sprintf("worker Concurrency %d, Prefetch %d, BatchSize %d, ReceivePollers %s; %s; %d duplicates, %d retried/dead",
					r.a, r.b, r.d, pollers, p.workerStats(), p.dups.Load(), p.other.Load()), n, elapsed, counter, cost)
			})
		}
	})
}
