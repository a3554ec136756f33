package ferrycli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
)

// TestConnectBrokerTopologyMismatch: a Declare the broker refuses because
// the queue exists with another retry delay is permanent; connectBroker
// returns it at once (the relay and worker exit 1 with it) instead of
// retrying it as "broker not reachable".
func TestConnectBrokerTopologyMismatch(t *testing.T) {
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
	base := testenv.UniqueName("cli-mismatch")
	tp := broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{
		Name: base + ".work", Bindings: []string{"x"}, RetryDelays: []time.Duration{30 * time.Second},
	}}}
	t.Cleanup(func() {
		conn, err := amqp.Dial(testenv.RabbitMQURL())
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		for _, q := range []string{tp.Queues[0].Name, tp.Queues[0].Name + ".dlq", tp.Queues[0].Name + ".retry.0"} {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		_ = ch.ExchangeDelete(tp.Exchange, false, false)
	})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts := BrokerOptions{RabbitMQURL: testenv.RabbitMQURL(), Logger: log}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := connectBroker(ctx, "rabbitmq", opts, tp, 0, log)
	require.NoError(t, err)
	b.Close()

	changed := tp
	changed.Queues = []broker.Queue{tp.Queues[0]}
	changed.Queues[0].RetryDelays = []time.Duration{200 * time.Millisecond}
	start := time.Now()
	_, err = connectBroker(ctx, "rabbitmq", opts, changed, 0, log)
	require.ErrorIs(t, err, broker.ErrTopologyMismatch)
	require.Less(t, time.Since(start), 10*time.Second, "not retried until ctx ends")
	msg := fmt.Sprint(err)
	require.Contains(t, msg, tp.Queues[0].Name+".retry.0")
	require.Contains(t, msg, "x-message-ttl")
	require.Contains(t, msg, "--retry-delay")
}

// TestRequirementsRefuseSmallBroker: the start-up capability check asks
// for the service's largest event and every retry delay, so a broker that
// holds less is refused before any message is lost to it.
func TestRequirementsRefuseSmallBroker(t *testing.T) {
	tp := broker.Topology{Exchange: "x", Queues: []broker.Queue{{Name: "q", Bindings: []string{"a.b"}, RetryDelays: []time.Duration{time.Second, time.Hour}}}}
	r := requirements(tp)
	require.Equal(t, app.MaxEventBytes, r.MaxMessageBytes)
	require.Equal(t, []time.Duration{time.Second, time.Hour}, r.RetryDelays)
	small := broker.Capabilities{Name: "tiny", MaxMessageBytes: app.MaxEventBytes - 1, Wildcards: true}
	require.ErrorIs(t, small.Check(r), broker.ErrUnsupported)
	short := broker.Capabilities{Name: "short", MaxDelay: time.Minute, Wildcards: true}
	require.ErrorIs(t, short.Check(r), broker.ErrUnsupported)
	require.NoError(t, broker.Capabilities{Name: "big", Wildcards: true}.Check(r))
}
