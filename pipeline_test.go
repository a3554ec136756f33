package ferry_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// New refuses, naming the field, what cannot run, before Run touches the
// broker.
func TestNewRefusesConfigs(t *testing.T) {
	forEachBroker(t, func(t *testing.T, name string) {
		bu := setup(t, name, "a.b")
		noop := func(context.Context, pgx.Tx, *broker.Message) error { return nil }
		base := func() ferry.Config {
			return ferry.Config{Pool: bu.pool, Broker: bu.b, Topology: bu.topo, Relay: &outbox.RelayConfig{}}
		}
		for _, tc := range []struct {
			name   string
			edit   func(*ferry.Config)
			is     error
			naming string
		}{
			{"no pool", func(c *ferry.Config) { c.Pool = nil }, ferry.ErrInvalidConfig, "Config.Pool"},
			{"no broker", func(c *ferry.Config) { c.Broker = nil }, ferry.ErrInvalidConfig, "Config.Broker"},
			{"nothing to run", func(c *ferry.Config) { c.Relay = nil }, ferry.ErrInvalidConfig, "nothing to run"},
			{"no topology", func(c *ferry.Config) { c.Topology = broker.Topology{} }, ferry.ErrInvalidConfig, "Config.Topology"},
			{"negative size", func(c *ferry.Config) { c.MaxMessageBytes = -1 }, ferry.ErrInvalidConfig, "MaxMessageBytes"},
			{"two workers on a queue", func(c *ferry.Config) {
				c.Workers = []worker.Config{{Queue: bu.queue, Handler: noop}, {Queue: bu.queue, Handler: noop}}
			}, ferry.ErrInvalidConfig, "Config.Workers[1].Queue"},
			{"a queue outside the topology", func(c *ferry.Config) {
				c.Workers = []worker.Config{{Queue: "elsewhere", Handler: noop}}
			}, worker.ErrInvalidConfig, "Config.Workers[0]"},
			{"a worker without handler", func(c *ferry.Config) {
				c.Workers = []worker.Config{{Queue: bu.queue}}
			}, worker.ErrInvalidConfig, "Handler"},
			{"a relay config the relay refuses", func(c *ferry.Config) { c.Relay = &outbox.RelayConfig{BatchSize: -1} },
				outbox.ErrInvalidConfig, "BatchSize"},
		} {
			cfg := base()
			tc.edit(&cfg)
			_, err := ferry.New(cfg)
			require.ErrorIs(t, err, tc.is, tc.name)
			require.Contains(t, err.Error(), tc.naming, tc.name)
		}
		if max := bu.b.Capabilities().MaxMessageBytes; max > 0 {
			cfg := base()
			cfg.MaxMessageBytes = max + 1
			_, err := ferry.New(cfg)
			require.ErrorIs(t, err, broker.ErrUnsupported, "a message larger than %s carries", name)
		}
		// Worker defaults: Consumer is the queue, Pool/Broker/Topology the
		// pipeline's.
		cfg := base()
		cfg.Relay = nil
		cfg.Workers = []worker.Config{{Queue: bu.queue, Handler: noop}}
		p, err := ferry.New(cfg)
		require.NoError(t, err)
		require.Nil(t, p.Relay())
		require.Len(t, p.Workers(), 1)
	})
}

// Run returns, instead of retrying for ever, when the broker is closed.
func TestRunReturnsOnClosedBroker(t *testing.T) {
	forEachBroker(t, func(t *testing.T, name string) {
		bu := setup(t, name, "a.b")
		p, err := ferry.New(ferry.Config{Pool: bu.pool, Broker: bu.b, Topology: bu.topo, Relay: &outbox.RelayConfig{}})
		require.NoError(t, err)
		require.NoError(t, bu.b.Close())
		ctx, cancel := context.WithTimeout(bu.ctx, 20*time.Second)
		defer cancel()
		err = p.Run(ctx)
		require.ErrorIs(t, err, broker.ErrClosed)
		require.NoError(t, ctx.Err(), "Run returned only at its deadline")
	})
}

// A topology the broker holds with other settings (RabbitMQ: a retry level
// with another x-message-ttl) is permanent: Run returns the mismatch at
// once instead of retrying.
func TestRunReturnsTopologyMismatch(t *testing.T) {
	bu := setup(t, "rabbitmq", "a.b")
	require.NoError(t, bu.b.Declare(bu.ctx, bu.topo))
	other, err := ferrycli.OpenBroker(bu.ctx, "rabbitmq", brokerOptions())
	require.NoError(t, err)
	defer other.Close()
	changed := bu.topo
	changed.Queues = []broker.Queue{{Name: bu.queue, Bindings: []string{"a.b"}, RetryDelays: []time.Duration{7 * time.Second}}}
	p, err := ferry.New(ferry.Config{Pool: bu.pool, Broker: other, Topology: changed, Relay: &outbox.RelayConfig{}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(bu.ctx, 20*time.Second)
	defer cancel()
	err = p.Run(ctx)
	require.ErrorIs(t, err, broker.ErrTopologyMismatch)
	require.NoError(t, ctx.Err())
}
