package sqs_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/sqs"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// sqsServer is one SQS implementation the FIFO deduplication tests run
// against.
type sqsServer struct {
	name     string // the server, e.g. "elasticmq"
	role     string // its compose/local/services.sh role
	endpoint string
	// forgetsDeleted is true for a server that forgets a
	// MessageDeduplicationId once its message is deleted (moto 5.1), where
	// AWS and ElasticMQ keep it for the whole 5-minute window.
	forgetsDeleted bool
	// poison is the conformance suite's Harness.Poison on this server:
	// a message it refuses with the whole SendMessageBatch carrying it.
	poison func(ctx context.Context, t *testing.T, b broker.Broker, tp broker.Topology, id, typ string) *broker.Message
}

// sqsServers are the two SQS servers compose/local/services.sh runs:
// ElasticMQ (role sqs) and moto (role moto).
func sqsServers() []sqsServer {
	return []sqsServer{
		// ElasticMQ's JSON parser stops at U+FFFF and refuses the whole
		// SendMessageBatch with HTTP 400 (InvalidAction).
		{name: "elasticmq", role: "sqs", endpoint: testenv.SQSEndpoint(), poison: uffffBody},
		// moto 5.1 takes every body (TestServersDiffer): no poison, and
		// the suite's PoisonAmongGood skips, saying so.
		{name: "moto", role: "moto", endpoint: testenv.SQSMotoEndpoint(), forgetsDeleted: true},
	}
}

func uffffBody(ctx context.Context, t *testing.T, b broker.Broker, tp broker.Topology, id, typ string) *broker.Message {
	return &broker.Message{ID: id, Type: typ, Body: []byte("poison \uffff body")}
}

// dedupRig is a FIFO queue pair on one server, an outbox database and the
// deliveries a worker saw.
type dedupRig struct {
	srv  sqsServer
	b    broker.Broker
	tp   broker.Topology
	pool *pgxpool.Pool

	mu         sync.Mutex
	handled    map[string]int // handler runs per message ID
	deliveries map[string]int // deliveries per message ID (ack and duplicate outcomes)
}

func newDedupRig(t *testing.T, srv sqsServer) *dedupRig {
	t.Helper()
	testenv.RequireTCP(t, srv.role, testenv.HostPort(srv.endpoint))
	cfg := config()
	cfg.Endpoint = srv.endpoint
	cfg.FIFO = true
	ctx := ctxFor(t, 90*time.Second) // a bound on a hung server: moto, one Python process serving the package's parallel tests, once took over 30 s to answer ListQueues on a loaded machine
	sb, err := sqs.New(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Close() })
	tp := topology("dedup", "evt.dedup")
	require.NoError(t, sb.Declare(ctx, tp))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for _, n := range []string{sqs.QueueName(tp.Exchange, tp.Queues[0].Name, true), sqs.QueueName(tp.Exchange, broker.DLQName(tp.Queues[0].Name), true)} {
			if u, err := sb.Client().GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(n)}); err == nil {
				_, _ = sb.Client().DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: u.QueueUrl})
			}
		}
	})
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	return &dedupRig{srv: srv, b: sb, tp: tp, pool: pool, handled: map[string]int{}, deliveries: map[string]int{}}
}

// enqueue commits n outbox rows and returns their message IDs.
func (r *dedupRig) enqueue(t *testing.T, n int) []string {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	var evs []outbox.Event
	for i := range n {
		evs = append(evs, outbox.Event{Type: "evt.dedup", Key: fmt.Sprint("user-", i%2), Body: []byte(fmt.Sprintf(`{"i":%d}`, i))})
	}
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		var err error
		ids, err = outbox.Enqueue(ctx, tx, evs...)
		return err
	}))
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = strconv.FormatInt(id, 10)
	}
	return out
}

// publishMarkFails runs one relay batch whose mark fails for real: the
// relay's database backend is killed after SQS accepted the batch, so the
// rows stay unprocessed with the messages in the queue.
func (r *dedupRig) publishMarkFails(t *testing.T, want int) {
	t.Helper()
	ctx := ctxFor(t, 30*time.Second)
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: r.pool, Broker: r.b, Retention: -1,
		AfterPublish: func(ctx context.Context, ids []int64) error {
			_, err := r.pool.Exec(ctx, `SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
				WHERE datname = current_database() AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()`)
			return err
		}})
	require.NoError(t, err)
	n, err := relay.ProcessBatch(ctx)
	require.Error(t, err, "the mark fails")
	require.Zero(t, n)
	r.requireUnprocessed(t, want)
}

// resend runs one relay batch that publishes the unprocessed rows again
// and marks them.
func (r *dedupRig) resend(t *testing.T, want int) {
	t.Helper()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: r.pool, Broker: r.b, Retention: -1})
	require.NoError(t, err)
	n, err := relay.ProcessBatch(ctxFor(t, 30*time.Second))
	require.NoError(t, err)
	require.Equal(t, want, n)
	r.requireUnprocessed(t, 0)
}

func (r *dedupRig) requireUnprocessed(t *testing.T, want int) {
	t.Helper()
	var n int
	require.NoError(t, r.pool.QueryRow(ctxFor(t, 10*time.Second), `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&n))
	require.Equal(t, want, n)
}

// consume runs a worker until no delivery came for quiet.
func (r *dedupRig) consume(t *testing.T, quiet time.Duration) {
	t.Helper()
	var last time.Time
	w, err := worker.New(worker.Config{Consumer: "dedup", Queue: r.tp.Queues[0].Name, Pool: r.pool, Broker: r.b, Topology: r.tp, Concurrency: 4,
		Handler: func(_ context.Context, _ pgx.Tx, msg *broker.Message) error {
			r.mu.Lock()
			r.handled[msg.ID]++
			r.mu.Unlock()
			return nil
		},
		OnOutcome: func(msg *broker.Message, o worker.Outcome, _ time.Duration) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if o == worker.OutcomeAck || o == worker.OutcomeDuplicate {
				r.deliveries[msg.ID]++
			}
			last = time.Now()
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	start := time.Now()
	for {
		time.Sleep(100 * time.Millisecond)
		r.mu.Lock()
		l := last
		r.mu.Unlock()
		if (l.IsZero() && time.Since(start) > quiet+5*time.Second) || (!l.IsZero() && time.Since(l) > quiet) {
			break
		}
	}
	cancel()
	require.NoError(t, <-done)
}

func (r *dedupRig) counts() (handled, deliveries map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return clone(r.handled), clone(r.deliveries)
}

func clone(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestFIFODedupInsideWindow (issue 16, item 7): what ferry relies on from
// SQS FIFO's 5-minute deduplication window (MessageDeduplicationId = the
// outbox row id), on both SQS servers. The relay publishes rows, its mark
// fails (the relay's database backend is killed after SQS accepted the
// batch), and a relay publishes them again, inside the window:
//
//   - "queued": the first copies are still in the queue: SQS drops the
//     resend; each row is delivered once.
//   - "consumed": a worker handled and deleted the first copies before
//     the resend: AWS and ElasticMQ drop it too, moto 5.1 (which forgets
//     the ID of a deleted message) delivers it again, and the worker's
//     dedup acks that copy as a duplicate without running the handler.
//
// On every server each row's handler runs once. The after-window case is
// TestFIFODedupAfterWindow (five minutes, behind an environment variable).
func TestFIFODedupInsideWindow(t *testing.T) {
	for _, srv := range sqsServers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			t.Run("queued", func(t *testing.T) {
				r := newDedupRig(t, srv)
				ids := r.enqueue(t, 5)
				r.publishMarkFails(t, len(ids))
				r.resend(t, len(ids))
				r.consume(t, 2*time.Second)
				handled, deliveries := r.counts()
				for _, id := range ids {
					require.Equal(t, 1, handled[id], "row %s handled once", id)
					require.Equal(t, 1, deliveries[id], "row %s: SQS dropped the resend inside the window", id)
				}
			})
			t.Run("consumed", func(t *testing.T) {
				r := newDedupRig(t, srv)
				ids := r.enqueue(t, 5)
				r.publishMarkFails(t, len(ids))
				r.consume(t, 2*time.Second)
				r.resend(t, len(ids))
				r.consume(t, 2*time.Second)
				handled, deliveries := r.counts()
				want := 1
				if srv.forgetsDeleted {
					want = 2
				}
				for _, id := range ids {
					require.Equal(t, 1, handled[id], "row %s handled once", id)
					require.Equal(t, want, deliveries[id], "row %s: deliveries on %s", id, srv.name)
				}
				t.Logf("%s: %d deliveries per row after a resend of consumed rows inside the window", srv.name, want)
			})
		})
	}
}

// dedupWindowEnv enables TestFIFODedupAfterWindow, which waits out SQS's
// 5-minute deduplication window (neither ElasticMQ 1.6.11 nor moto 5.1 can
// shorten it: both hard-code 5 minutes). `make test-long` sets it.
const dedupWindowEnv = "FERRY_SQS_DEDUP_WINDOW_TEST"

// TestFIFODedupAfterWindow: a resend after a failed mark that comes after
// the 5-minute window, while the first copies are still in the queue, is
// delivered again by SQS, on both servers, and the worker's dedup absorbs
// it: two deliveries per row, one handler run. It takes about 5.5 minutes
// (both servers in parallel) and runs only with FERRY_SQS_DEDUP_WINDOW_TEST=1
// (make test-long).
func TestFIFODedupAfterWindow(t *testing.T) {
	if os.Getenv(dedupWindowEnv) == "" {
		t.Skipf("waits out the 5-minute deduplication window; set %s=1 (make test-long)", dedupWindowEnv)
	}
	const window = 5 * time.Minute
	for _, srv := range sqsServers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			r := newDedupRig(t, srv)
			ids := r.enqueue(t, 5)
			r.publishMarkFails(t, len(ids))
			time.Sleep(window + 10*time.Second)
			r.resend(t, len(ids))
			r.consume(t, 3*time.Second)
			handled, deliveries := r.counts()
			for _, id := range ids {
				require.Equal(t, 1, handled[id], "row %s handled once", id)
				require.Equal(t, 2, deliveries[id], "row %s: after the window SQS delivers the resend; the dedup absorbs it", id)
			}
		})
	}
}
