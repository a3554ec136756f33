package rabbitmq_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/broker/brokertest"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
)

// TestConnectErrors: an http:// URL is refused before dialing, a wrong
// password (403 ACCESS_REFUSED) and an unknown vhost (530 NOT_ALLOWED)
// are refusals, and connection refused is worth retrying.
func TestConnectErrors(t *testing.T) {
	real := testenv.RabbitMQURL()
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(real))
	with := func(f func(u *url.URL)) string {
		u, err := url.Parse(real)
		if err != nil {
			t.Fatal(err)
		}
		f(u)
		return u.String()
	}
	connect := func(raw string) func(context.Context) (broker.Broker, error) {
		return func(ctx context.Context) (broker.Broker, error) { return rabbitmq.New(ctx, rabbitmq.Config{URL: raw}) }
	}
	t.Run("WrongPassword", func(t *testing.T) {
		brokertest.RunConnectErrors(t, brokertest.ConnectCases{
			Malformed:    connect(with(func(u *url.URL) { u.Scheme = "http" })),
			Field:        "URL",
			Unreachable:  connect(with(func(u *url.URL) { u.Host = testenv.ClosedPort(t) })),
			Refused:      connect(with(func(u *url.URL) { u.User = url.UserPassword(u.User.Username(), "wrong") })),
			RefusedWords: "username or password not allowed",
		})
	})
	t.Run("UnknownVhost", func(t *testing.T) {
		brokertest.RunConnectErrors(t, brokertest.ConnectCases{
			Malformed:    connect("amqp://" + testenv.HostPort(real) + ":5672/"), // host:port:port
			Field:        "URL",
			Unreachable:  connect("amqp://guest:guest@" + testenv.ClosedPort(t) + "/"),
			Refused:      connect(with(func(u *url.URL) { u.Path = "/no-such-vhost" })),
			RefusedWords: "vhost no-such-vhost not found",
		})
	})
}
