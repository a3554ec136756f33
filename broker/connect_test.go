package broker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
)

func TestIsPermanent(t *testing.T) {
	cfg := &broker.ConfigError{Adapter: "kafka", Field: "Brokers", Value: "127.0.0.1", Reason: "want host:port"}
	require.Equal(t, `kafka: Config.Brokers "127.0.0.1": want host:port`, cfg.Error())
	require.Equal(t, "nats: Config.Replicas: 9: want 1 to 5",
		(&broker.ConfigError{Adapter: "nats", Field: "Replicas", Reason: "9: want 1 to 5"}).Error())
	wrapped := fmt.Errorf("ferry: %w", errors.Join(cfg, errors.New("other")))
	require.ErrorIs(t, wrapped, broker.ErrInvalidConfig)
	var got *broker.ConfigError
	require.ErrorAs(t, wrapped, &got)
	require.Equal(t, "Brokers", got.Field)

	for _, err := range []error{
		wrapped,
		fmt.Errorf("rabbitmq: connect: %w: Exception (403)", broker.ErrRefused),
		fmt.Errorf("declare: %w", broker.ErrTopologyMismatch),
		broker.ErrUnsupported,
	} {
		require.True(t, broker.IsPermanent(err), "%v", err)
	}
	for _, err := range []error{
		errors.New("dial tcp 127.0.0.1:1: connect: connection refused"),
		context.DeadlineExceeded,
		fmt.Errorf("nats: connect: %w", context.Canceled),
		broker.ErrClosed,
		nil,
	} {
		require.False(t, broker.IsPermanent(err), "%v", err)
	}
}
