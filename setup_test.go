package ferry_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// brokerOptions are the addresses of the real servers started by
// compose/local/services.sh, from the environment variables the ferry
// command reads, with its defaults. An adapter added to ferrycli.Brokers
// that needs another setting adds it here.
func brokerOptions() ferrycli.BrokerOptions {
	return ferrycli.BrokerOptions{
		RabbitMQURL:  testenv.RabbitMQURL(),
		NATSURL:      testenv.NATSURL(),
		KafkaBrokers: strings.Split(testenv.Env("FERRY_KAFKA_BROKERS", ferrycli.DefaultKafkaBrokers), ","),
		SQSEndpoint:  testenv.Env("FERRY_SQS_ENDPOINT", ferrycli.DefaultSQSEndpoint),
		AWSRegion:    testenv.Env("FERRY_AWS_REGION", ferrycli.DefaultAWSRegion),
	}
}

// exampleBroker opens broker name for an Example. A server that cannot be
// reached ends the test binary with testenv's line naming it and the
// command that starts it (testenv.MustReach): an Example has no t.Fatal.
func exampleBroker(ctx context.Context, name string) (broker.Broker, error) {
	b, err := ferrycli.OpenBroker(ctx, name, brokerOptions())
	if err != nil {
		testenv.MustReach(name)
	}
	return b, err
}

// forEachBroker runs f as a parallel subtest for every broker the ferry
// command wires, so a broker added to ferrycli.Brokers is tested here too.
func forEachBroker(t *testing.T, f func(t *testing.T, name string)) {
	for _, name := range ferrycli.BrokerNames() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, name)
		})
	}
}

// bundle is what an integration test needs: a migrated database of its
// own, a broker and a topology with one queue, unique to the test.
type bundle struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	dsn   string // pool's database URL, for a child process
	b     broker.Broker
	topo  broker.Topology
	queue string
}

func setup(t *testing.T, name string, bindings ...string) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	pool, dsn := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	b, err := ferrycli.OpenBroker(ctx, name, brokerOptions())
	if err != nil {
		testenv.Require(t, name) // says which server is missing and how to start it
	}
	require.NoError(t, err, "open %s", name)
	t.Cleanup(func() { _ = b.Close() })
	ex := testenv.UniqueName("ferrylib")
	q := ex + ".jobs"
	return &bundle{ctx: ctx, pool: pool, dsn: dsn, b: b, queue: q, topo: broker.Topology{
		Exchange: ex,
		Queues:   []broker.Queue{{Name: q, Bindings: bindings, RetryDelays: []time.Duration{time.Second}}},
	}}
}

// start runs a pipeline with cfg (Pool, Broker and Topology from the
// bundle) until the test ends, failing the test if Run returns an error.
func (bu *bundle) start(t *testing.T, cfg ferry.Config) {
	t.Helper()
	cfg.Pool, cfg.Broker, cfg.Topology = bu.pool, bu.b, bu.topo
	p, err := ferry.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(bu.ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("pipeline: %v", err)
			}
		case <-time.After(time.Minute):
			t.Errorf("pipeline did not stop within a minute")
		}
	})
}
