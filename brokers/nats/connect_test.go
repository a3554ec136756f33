package nats_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/broker/brokertest"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/internal/testenv"
)

// TestConnectErrors: an http:// URL is refused before connecting (nats.go
// would dial it and report the server's Authorization Violation), wrong
// credentials are a refusal with the server's words, and connection
// refused is worth retrying.
func TestConnectErrors(t *testing.T) {
	real := testenv.NATSURL()
	testenv.RequireTCP(t, "nats", testenv.HostPort(real))
	u, err := url.Parse(real)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("ferry", "wrong")
	connect := func(raw string) func(context.Context) (broker.Broker, error) {
		return func(ctx context.Context) (broker.Broker, error) { return nats.New(ctx, nats.Config{URL: raw}) }
	}
	brokertest.RunConnectErrors(t, brokertest.ConnectCases{
		Malformed:    connect("http://" + testenv.HostPort(real)),
		Field:        "URL",
		Unreachable:  connect("nats://" + testenv.ClosedPort(t)),
		Refused:      connect(u.String()),
		RefusedWords: "Authorization Violation",
	})
}
