package sqs_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/broker/brokertest"
	"github.com/ferrymq/ferry/brokers/sqs"
	"github.com/ferrymq/ferry/internal/testenv"
)

// TestConnectErrors: an endpoint that is not an http(s) URL is refused
// before any request; credentials the server refuses are a refusal with
// its words (ElasticMQ checks none, so a loopback stand-in answers as AWS
// does); connection refused is worth retrying.
func TestConnectErrors(t *testing.T) {
	connect := func(endpoint string) func(context.Context) (broker.Broker, error) {
		return func(ctx context.Context) (broker.Broker, error) {
			b, err := sqs.New(ctx, sqs.Config{Endpoint: endpoint, Region: testenv.AWSRegion()})
			if err != nil {
				return nil, err
			}
			return b, nil
		}
	}
	brokertest.RunConnectErrors(t, brokertest.ConnectCases{
		Malformed:    connect("127.0.0.1:9324"),
		Field:        "Endpoint",
		Unreachable:  connect("http://" + testenv.ClosedPort(t)),
		Refused:      connect(testenv.RefusingSQS(t)),
		RefusedWords: "The security token included in the request is invalid",
	})
}

func TestRegionValidated(t *testing.T) {
	err := sqs.Config{Endpoint: testenv.SQSEndpoint(), Region: "US East"}.Validate()
	var ce *broker.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "Region", ce.Field)
	require.ErrorIs(t, err, broker.ErrInvalidConfig)
}
