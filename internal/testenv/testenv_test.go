package testenv

import (
	"net/url"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCheckOwnServer: the servers services.sh runs for this checkout pass
// the check, and a server whose name is not this checkout's is refused
// with a message that says what happened (issue: two checkouts on one
// machine, where one took the port the other freed).
func TestCheckOwnServer(t *testing.T) {
	for _, c := range []struct{ service, env string }{
		{"postgres", EnvPostgresCheckout},
		{"rabbitmq", EnvRabbitMQNode},
		{"nats", EnvNATSServerName},
	} {
		t.Run(c.service, func(t *testing.T) {
			require.NotEmpty(t, os.Getenv(c.env), "%s is unset: run eval \"$(compose/local/services.sh env)\" first", c.env)
			require.NoError(t, CheckOwnServer(c.service), "this checkout's own %s", c.service)
			t.Setenv(c.env, "ferry-another-checkout")
			err := CheckOwnServer(c.service)
			require.Error(t, err, "a %s server of another checkout must be refused", c.service)
			require.Contains(t, err.Error(), "ferry-another-checkout")
			require.Contains(t, err.Error(), "another checkout's server")
		})
	}
	t.Run("wrong password", func(t *testing.T) {
		// Another checkout's PostgreSQL knows role ferry with another
		// password: the login is refused and reported as a foreign server.
		t.Setenv("FERRY_DATABASE_URL", replacePassword(t, DatabaseURL(), "not-this-checkouts"))
		err := CheckOwnServer("postgres")
		require.Error(t, err)
		require.Contains(t, err.Error(), "refused this checkout's login")
	})
}

func replacePassword(t *testing.T, raw, pw string) string {
	u, err := url.Parse(raw)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), pw)
	return u.String()
}
