package kafka_test

import (
	"context"
	"testing"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/broker/brokertest"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/internal/testenv"
)

// TestConnectErrors: a bootstrap address without a port is refused before
// dialing; connection refused is worth retrying. The adapter speaks
// PLAINTEXT, so no server refuses its credentials.
func TestConnectErrors(t *testing.T) {
	connect := func(addrs ...string) func(context.Context) (broker.Broker, error) {
		return func(ctx context.Context) (broker.Broker, error) { return kafka.New(ctx, kafka.Config{Brokers: addrs}) }
	}
	brokertest.RunConnectErrors(t, brokertest.ConnectCases{
		Malformed:   connect(testenv.KafkaBrokers()[0], "127.0.0.1"),
		Field:       "Brokers",
		Unreachable: connect(testenv.ClosedPort(t)),
	})
}
