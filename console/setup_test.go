package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/console"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

const testToken = "s3cret-console-token"

// hostile is a body that runs script if a page renders it as HTML, and
// is not valid UTF-8.
const hostile = `<script>document.title='pwned'</script>"><img src=x onerror="document.title='pwned'">` + "\xff\xfe end"

func brokerOptions() ferrycli.BrokerOptions {
	return ferrycli.BrokerOptions{
		RabbitMQURL:  testenv.RabbitMQURL(),
		NATSURL:      testenv.NATSURL(),
		KafkaBrokers: testenv.KafkaBrokers(),
		SQSEndpoint:  testenv.Env("FERRY_SQS_ENDPOINT", ferrycli.DefaultSQSEndpoint),
		AWSRegion:    testenv.Env("FERRY_AWS_REGION", ferrycli.DefaultAWSRegion),
	}
}

// bundle is a running pipeline (relay and a worker whose handler fails
// permanently while failing is set) with a console on it, mounted under
// /ops, on a database of its own.
type bundle struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	dbURL   string
	b       broker.Broker
	queue   string
	dlq     broker.DeadLetterQueue
	failing atomic.Bool
	handled atomic.Int64
	srv     *httptest.Server
	base    string
	con     *console.Console
}

// setupTimeout bounds a bundle's life (the benchmark's is longer).
var setupTimeout = 4 * time.Minute

func setup(t testing.TB, brokerName string, cfg console.Config) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	t.Cleanup(cancel)
	pool, dbURL := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	bu := &bundle{ctx: ctx, pool: pool, dbURL: dbURL}
	bu.failing.Store(true)
	if brokerName != "" {
		b, err := ferrycli.OpenBroker(ctx, brokerName, brokerOptions())
		if err != nil {
			testenv.Require(t, brokerName) // says which server is missing and how to start it
		}
		require.NoError(t, err, "open %s", brokerName)
		t.Cleanup(func() { _ = b.Close() })
		bu.b = b
		ex := testenv.UniqueName("console")
		bu.queue = ex + ".jobs"
		topo := broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: bu.queue, Bindings: []string{"job.run"}, RetryDelays: []time.Duration{time.Second}}}}
		p, err := ferry.New(ferry.Config{Pool: pool, Broker: b, Topology: topo, Relay: &outbox.RelayConfig{PollInterval: 100 * time.Millisecond},
			// Concurrency 2: testenv's pools hold 4 connections, and a
			// failing handler's worker needs two at once (see the report).
			Workers: []worker.Config{{Queue: bu.queue, Concurrency: 2, Policy: worker.BackoffPolicy{MaxAttempts: 2, Delays: []time.Duration{time.Second}},
				Handler: func(_ context.Context, _ pgx.Tx, m *broker.Message) error {
					if bu.failing.Load() {
						// The message's own id in the text, as real errors
						// carry one (the DLQ page groups them as one cause).
						return worker.Permanent(fmt.Errorf("handler refuses <b>this</b> message %s", m.ID))
					}
					bu.handled.Add(1)
					return nil
				}}}})
		require.NoError(t, err)
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(rctx) }()
		t.Cleanup(func() { stop(); <-done })
		cfg.Broker, cfg.BrokerName, cfg.Exchange, cfg.Queues = b, brokerName, ex, []string{bu.queue}
		d, err := b.DLQ(bu.queue)
		require.NoError(t, err)
		bu.dlq = d
	}
	cfg.Pool = pool
	if cfg.Prefix == "" {
		cfg.Prefix = "/ops"
	}
	c, err := console.New(cfg)
	require.NoError(t, err)
	bu.con = c
	mux := http.NewServeMux()
	mux.Handle(cfg.Prefix+"/", c)
	bu.srv = httptest.NewServer(mux)
	t.Cleanup(bu.srv.Close)
	bu.base = bu.srv.URL + cfg.Prefix
	return bu
}

// enqueue commits events to the outbox and returns their ids.
func (bu *bundle) enqueue(t testing.TB, events ...outbox.Event) []int64 {
	t.Helper()
	tx, err := bu.pool.Begin(bu.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	ids, err := outbox.Enqueue(bu.ctx, tx, events...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(bu.ctx))
	return ids
}

// waitDead waits until the DLQ holds n messages.
func (bu *bundle) waitDead(t testing.TB, n int) []broker.DeadMessage {
	t.Helper()
	for {
		msgs, err := bu.dlq.List(bu.ctx, 0)
		if err == nil && len(msgs) >= n {
			return msgs
		}
		select {
		case <-bu.ctx.Done():
			t.Fatalf("the DLQ did not get %d message(s): %v (last error %v)", n, bu.ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// outboxStatsCLI runs `ferry outbox stats --format json` on the bundle's
// database and returns its unprocessed count.
func (bu *bundle) outboxStatsCLI(t *testing.T) int64 {
	t.Helper()
	var out, errOut strings.Builder
	code := ferrycli.Main(bu.ctx, []string{"ferry", "outbox", "stats", "--format", "json", "--database-url", bu.dbURL}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	var s struct {
		Unprocessed int64 `json:"unprocessed"`
	}
	require.NoError(t, json.Unmarshal([]byte(out.String()), &s))
	return s.Unprocessed
}
