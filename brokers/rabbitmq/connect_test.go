package rabbitmq_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
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

// TestRefusedLoginIsNotLoggedAsARetry: a wrong password on the first
// connection is returned by New (wrapping broker.ErrRefused) and never
// redialled, so the log does not say "dial failed; retrying" (ferry
// exits 1 with the server's words instead).
func TestRefusedLoginIsNotLoggedAsARetry(t *testing.T) {
	real := testenv.RabbitMQURL()
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(real))
	u, err := url.Parse(real)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), "wrong")
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: u.String(), Logger: logger})
	if b != nil {
		b.Close()
	}
	require.ErrorIs(t, err, broker.ErrRefused)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("log:\n%s", logs.String())
	require.NotContains(t, logs.String(), "retrying", "a refused login is not retried")
}

// writerFunc is an io.Writer.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

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
	mgmtOK(t, http.MethodPut, "/api/users/"+url.PathEscape(user), `{"password":"pw","tags":""}`)
	t.Cleanup(func() { mgmtOK(t, http.MethodDelete, "/api/users/"+url.PathEscape(user), "") })
	mgmtOK(t, http.MethodPut, "/api/permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(user), `{"configure":"^$","write":".*","read":".*"}`)

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

// mgmtOK calls the management API (mgmtDo) with a JSON body ("" for
// none) and requires a 2xx answer.
func mgmtOK(t *testing.T, method, path, body string) {
	t.Helper()
	var b any
	if body != "" {
		b = json.RawMessage(body)
	}
	code := mgmtDo(t, method, path, b)
	require.Less(t, code, 300, "%s %s: HTTP %d", method, path, code)
}
