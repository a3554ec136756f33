package rabbitmq_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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

// TestDeclareRefusedPermission: a user that may log in but not configure
// the topology's names gets a Declare error wrapping broker.ErrRefused
// (403 ACCESS_REFUSED), which waiting does not cure.
func TestDeclareRefusedPermission(t *testing.T) {
	real := testenv.RabbitMQURL()
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(real))
	user := testenv.UniqueName("ferry-noconf")
	vhost := "/"
	if u, err := url.Parse(real); err == nil && strings.TrimPrefix(u.Path, "/") != "" {
		vhost = strings.TrimPrefix(u.Path, "/")
	}
	// A user that may read and write but configure nothing.
	mgmtDo(t, http.MethodPut, "/api/users/"+url.PathEscape(user), `{"password":"pw","tags":""}`)
	t.Cleanup(func() { mgmtDo(t, http.MethodDelete, "/api/users/"+url.PathEscape(user), "") })
	mgmtDo(t, http.MethodPut, "/api/permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(user), `{"configure":"^$","write":".*","read":".*"}`)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw := "amqp://" + url.UserPassword(user, "pw").String() + "@" + testenv.HostPort(real) + "/"
	if vhost != "/" {
		raw += url.PathEscape(vhost)
	}
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: raw})
	require.NoError(t, err, "the login itself is accepted")
	defer b.Close()
	err = b.Declare(ctx, topology(t, time.Second))
	t.Logf("Declare: %v", err)
	require.ErrorIs(t, err, broker.ErrRefused)
	require.True(t, broker.IsPermanent(err))
	require.ErrorContains(t, err, "ACCESS_REFUSED")
}

// mgmtDo sends a request with body (JSON, or none) to the management HTTP
// API and requires a 2xx answer.
func mgmtDo(t *testing.T, method, path, body string) {
	t.Helper()
	base, err := url.Parse(testenv.RabbitMQManagementURL())
	require.NoError(t, err)
	req, err := http.NewRequest(method, base.Scheme+"://"+base.Host+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if base.User != nil {
		pw, _ := base.User.Password()
		req.SetBasicAuth(base.User.Username(), pw)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Less(t, resp.StatusCode, 300, "%s %s: %s", method, path, resp.Status)
}
