package sqs_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// startRelay runs a relay over pool and b until the test ends.
//
// One claim loop (Concurrency 1): with several, two loops starting at
// once may split a backlog by partition key (one took only key k0's 9 of
// 25 rows in a make test run), and the tests count what one claim took.
func startRelay(t *testing.T, pool *pgxpool.Pool, b broker.Broker, onBatch func(outbox.BatchStats)) {
	t.Helper()
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: b, BatchSize: 100, Concurrency: 1, PollInterval: 100 * time.Millisecond,
		RetryBackoff: 200 * time.Millisecond, MaxRetryBackoff: 500 * time.Millisecond, MaxBackoff: 300 * time.Millisecond,
		OnBatch: onBatch})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func enqueueBodies(t *testing.T, pool *pgxpool.Pool, typ string, bodies [][]byte) []int64 {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	var evs []outbox.Event
	for i, body := range bodies {
		evs = append(evs, outbox.Event{Type: typ, Key: fmt.Sprint("k", i%3), Body: body})
	}
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		ids, err = outbox.Enqueue(ctx, tx, evs...)
		return err
	}))
	return ids
}

// TestRelayWholeCallRefusedByPoison (issue 16, item 1): one event whose body
// ElasticMQ cannot parse (U+FFFF, a noncharacter its JSON parser stops at)
// makes it refuse the whole SendMessageBatch with HTTP 400 (InvalidAction,
// MalformedRequestContentRejection), not one entry. Among 30 good events
// relayed in one batch, the good ones are published once each, at once (the
// time is printed beside that of 30 good rows alone), and
// only the poison row is parked with the broker's reason and an attempt
// counted; the relay never takes the refusal for an outage.
func TestRelayWholeCallRefusedByPoison(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx := ctxFor(t, time.Minute)
	require.NoError(t, outbox.Migrate(ctx, pool))
	tp := topology("poison", "evt.poison")
	b := newBroker(t)
	require.NoError(t, b.Declare(ctx, tp))
	var outages atomic.Int64
	startRelay(t, pool, b, func(s outbox.BatchStats) {
		if s.Err != nil && !broker.IsMessageFault(s.Err) {
			outages.Add(1)
		}
	})

	waitPublished := func(left int) {
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&n))
			return n == left
		}, 20*time.Second, 20*time.Millisecond, "the good rows are published")
	}
	var bodies [][]byte
	for i := range 31 {
		bodies = append(bodies, []byte(fmt.Sprintf(`{"n":%d}`, i)))
	}
	// The baseline: 30 good rows alone.
	start := time.Now()
	baseIDs := enqueueBodies(t, pool, "evt.poison", bodies[:30])
	waitPublished(0)
	baseline := time.Since(start)

	bodies[17] = []byte("poison \uffff body")
	start = time.Now()
	ids := enqueueBodies(t, pool, "evt.poison", bodies)
	poison := ids[17]

	waitPublished(1)
	goodAfter := time.Since(start)
	var (
		lastErr  *string
		attempts int
		slowestS float64
	)
	require.Eventually(t, func() bool {
		require.NoError(t, pool.QueryRow(ctx, `SELECT last_error, attempts FROM outbox WHERE id = $1 AND processed_at IS NULL`, poison).Scan(&lastErr, &attempts))
		return attempts >= 1
	}, 10*time.Second, 20*time.Millisecond, "the poison row is parked with an attempt counted")
	require.NoError(t, pool.QueryRow(ctx, `SELECT COALESCE(max(extract(epoch FROM processed_at - occurred_at)), 0)::float8 FROM outbox WHERE processed_at IS NOT NULL`).Scan(&slowestS))
	slowest := time.Duration(slowestS * float64(time.Second))
	require.NotNil(t, lastErr)
	require.Contains(t, *lastErr, "400", "the broker's refusal as last_error")
	require.NotContains(t, *lastErr, "broker unavailable")
	t.Logf("30 good rows published %v after the enqueue beside the poison row, %v without it (slowest commit-to-confirm %v); poison parked after %d attempt(s), %d batch(es) taken for an outage; last_error: %.200s",
		goodAfter.Round(time.Millisecond), baseline.Round(time.Millisecond), slowest.Round(time.Millisecond), attempts, outages.Load(), *lastErr)
	require.Zero(t, outages.Load(), "a refusal that is the messages' fault is not an outage")

	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 10})
	got := drain(t, sub, 3*time.Second)
	require.Len(t, got, 60)
	for i, id := range ids {
		if i != 17 {
			require.Equal(t, 1, got[fmt.Sprint(id)], "row %d delivered once", id)
		}
	}
	for _, id := range baseIDs {
		require.Equal(t, 1, got[fmt.Sprint(id)], "row %d delivered once", id)
	}
}

// failingProxy is a loopback HTTP proxy in front of ElasticMQ that answers
// HTTP 500 to every SendMessageBatch request carrying the message ID
// marker while failing is set, as an SQS server error would; everything
// else reaches ElasticMQ.
type failingProxy struct {
	marker  []byte
	failing atomic.Bool
	failed  atomic.Int64
	srv     *httptest.Server
}

func newFailingProxy(t *testing.T, target string) *failingProxy {
	u, err := url.Parse(target)
	require.NoError(t, err)
	p := &failingProxy{}
	rp := httputil.NewSingleHostReverseProxy(u)
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if p.failing.Load() && bytes.Contains([]byte(r.Header.Get("X-Amz-Target")), []byte("SendMessageBatch")) &&
			p.marker != nil && bytes.Contains(body, p.marker) {
			p.failed.Add(1)
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"__type":"InternalFailure","message":"injected by the test's proxy"}`))
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// TestRelayPartlyAcceptedNotResent (issue 16, item 2): a relay batch of 25
// rows goes out as three SendMessageBatch calls (10, 10, 5); the middle one
// fails with HTTP 500 even after the SDK's retries while the other two are
// accepted. Publish reports only the middle call's ten as failed (an
// outage, no attempt charged), the relay marks the other fifteen
// published, and after the server recovers every row is on the queue
// exactly once.
func TestRelayPartlyAcceptedNotResent(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx := ctxFor(t, time.Minute)
	require.NoError(t, outbox.Migrate(ctx, pool))
	proxy := newFailingProxy(t, testenv.SQSEndpoint())
	cfg := config()
	cfg.Endpoint = proxy.srv.URL
	tp := topology("partial", "evt.partial")
	b := newBrokerCfg(t, cfg)
	require.NoError(t, b.Declare(ctx, tp))

	// The rows are enqueued before the relay starts, so one claim takes
	// all 25 and one Publish sends them.
	var bodies [][]byte
	for i := range 25 {
		bodies = append(bodies, []byte(fmt.Sprintf(`{"n":%d}`, i)))
	}
	ids := enqueueBodies(t, pool, "evt.partial", bodies)
	proxy.marker = []byte(fmt.Sprintf(`"StringValue":"%d"`, ids[14])) // in the second call
	proxy.failing.Store(true)

	var (
		mu      sync.Mutex
		batches []outbox.BatchStats
	)
	startRelay(t, pool, b, func(s outbox.BatchStats) {
		mu.Lock()
		defer mu.Unlock()
		batches = append(batches, s)
		if s.Err != nil {
			proxy.failing.Store(false) // the server recovers after the first failed batch
		}
	})
	require.Eventually(t, func() bool {
		var left int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&left))
		return left == 0
	}, 30*time.Second, 50*time.Millisecond, "every row published after the recovery")
	mu.Lock()
	first := batches[0]
	mu.Unlock()
	t.Logf("first batch: claimed %d, published %d, failed %d, err %v; proxy answered 500 %d time(s)",
		first.Claimed, first.Published, first.Failed, first.Err, proxy.failed.Load())
	require.Equal(t, 25, first.Claimed)
	require.Equal(t, 15, first.Published, "the two accepted calls' rows are marked published")
	require.Equal(t, 10, first.Failed, "only the failed call's rows are not")
	require.False(t, broker.IsMessageFault(first.Err), "a 500 is an outage, not the messages' fault")
	var attempts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT COALESCE(sum(attempts), 0) FROM outbox`).Scan(&attempts))
	require.Zero(t, attempts, "an outage charges no attempt")

	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 10})
	got := drain(t, sub, 3*time.Second)
	require.Len(t, got, 25)
	for _, id := range ids {
		require.Equal(t, 1, got[fmt.Sprint(id)], "row %d on the queue exactly once", id)
	}
}

// TestFIFOPoisonKeepsOrder: on a FIFO queue, one Publish of 25 messages of
// one key (three SendMessageBatch calls, one after another) with a body
// ElasticMQ refuses with the whole call in the second call: only that
// message fails, and the other 24 arrive once each, in publish order (the
// refused call's halves are sent before the later calls' messages).
func TestFIFOPoisonKeepsOrder(t *testing.T) {
	cfg := config()
	cfg.FIFO = true
	tp := topology("fifopoison", "evt.fifo")
	b := declaredRaw(t, cfg, tp)
	var msgs []*broker.Message
	for i := range 25 {
		msgs = append(msgs, &broker.Message{ID: fmt.Sprintf("m%02d", i), Type: "evt.fifo", Key: "one-key", Body: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	msgs[13].Body = []byte("poison \uffff")
	err := b.Publish(ctxFor(t, 30*time.Second), msgs)
	failed := broker.FailedIndexes(err, len(msgs))
	require.Len(t, failed, 1, "only the poison message fails: %v", err)
	require.True(t, broker.IsMessageFault(failed[13]))

	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 10})
	var got []string
	for len(got) < 24 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := sub.Receive(ctx)
		cancel()
		require.NoError(t, err, "received %d of 24", len(got))
		got = append(got, d.Message().ID)
		require.NoError(t, d.Ack(ctxFor(t, 10*time.Second)))
	}
	var want []string
	for i, m := range msgs {
		if i != 13 {
			want = append(want, m.ID)
		}
	}
	require.Equal(t, want, got, "in publish order, each once")
	require.Empty(t, drain(t, sub, time.Second))
}
