package rabbitmq_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
)

// TestSeveralURLs: a comma list whose first node is down connects to the
// next one and publishes there; the list is validated URL by URL, and the
// settings that would lose confirmed messages on a cluster are refused
// (QuorumReplicas 1) or logged (classic queues). The failover itself, under
// load on a 3-node cluster, is internal/cluster's TestFailoverRabbitMQ.
func TestSeveralURLs(t *testing.T) {
	real := testenv.RabbitMQURL()
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(real))
	u, err := url.Parse(real)
	require.NoError(t, err)
	u.Host = testenv.ClosedPort(t)
	dead := u.String()

	t.Run("FirstNodeDown", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var logs bytes.Buffer
		b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: dead + ", " + real, QueueType: rabbitmq.QueueTypeQuorum,
			QuorumReplicas: 3, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		require.NoError(t, err)
		defer b.Close()
		ex := testenv.UniqueName("nodes")
		topo := broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: ex + "-q", Bindings: []string{"#"}}}}
		// A single node takes x-quorum-initial-group-size 3 and places one
		// replica: the count is an upper bound.
		require.NoError(t, b.Declare(ctx, topo))
		require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: "m1", Type: "t"}}))
		require.NotContains(t, logs.String(), "level=WARN", "quorum with 3 replicas is the safe setting")
	})
	t.Run("ClassicOnClusterWarns", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var logs bytes.Buffer
		b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: real + "," + dead, QueueType: rabbitmq.QueueTypeClassic,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		require.NoError(t, err)
		defer b.Close()
		require.Contains(t, logs.String(), "setting=QueueType")
	})
	t.Run("Refused", func(t *testing.T) {
		for name, cfg := range map[string]rabbitmq.Config{
			"OneReplica":  {URL: real + "," + dead, QuorumReplicas: 1},
			"BadSecond":   {URL: real + ",http://x"},
			"TwoVhosts":   {URL: real + "," + real + "other"},
			"OnlyCommas":  {URL: ", ,"},
			"NegReplicas": {URL: real, QuorumReplicas: -1},
		} {
			err := cfg.Validate()
			var ce *broker.ConfigError
			require.True(t, errors.As(err, &ce), "%s: %v", name, err)
			require.ErrorIs(t, err, broker.ErrInvalidConfig, name)
		}
		require.NoError(t, rabbitmq.Config{URL: real + "," + dead}.Validate(), "defaults on a cluster: quorum, replicas from the URL count")
	})
}
