package compose

import (
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
)

// load reads docker-compose.yml with the given profiles ("*": all) the way
// `docker compose` does: schema validation, interpolation (with an empty
// environment, so defaults apply), profile selection and the consistency
// check of depends_on.
func load(t *testing.T, profiles ...string) *types.Project {
	t.Helper()
	dir, err := filepath.Abs(".")
	require.NoError(t, err)
	details := types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "docker-compose.yml")}},
		Environment: types.Mapping{},
	}
	p, err := loader.LoadWithContext(context.Background(), details, loader.WithProfiles(profiles))
	require.NoError(t, err, "docker-compose.yml does not load with profiles %v", profiles)
	return p
}

func names(s types.Services) []string {
	var out []string
	for n := range s {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

// Each profile alone, and no profile, must load: a depends_on on a service
// of another profile would break `docker compose --profile X up`.
func TestProfilesLoad(t *testing.T) {
	require.Equal(t, sorted("postgres", "mailpit", "migrate"), names(load(t).Services))
	require.Equal(t, sorted("postgres", "mailpit", "migrate", "rabbitmq", "api", "relay", "worker"),
		names(load(t, "rabbitmq").Services))
	require.Equal(t, sorted("postgres", "mailpit", "migrate", "nats", "api-nats", "relay-nats", "worker-nats"),
		names(load(t, "nats").Services))
	require.Equal(t, sorted("postgres", "mailpit", "migrate", "localstack", "api-sqs", "relay-sqs", "worker-sqs"),
		names(load(t, "sqs").Services))
	require.Equal(t, "ferry", load(t, "*").Name)
}

func port(t *testing.T, hostPort string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(hostPort)
	require.NoError(t, err, hostPort)
	return p
}

func urlPort(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err, raw)
	return u.Port()
}

// published returns the container ports published on 127.0.0.1, by the
// host port.
func published(t *testing.T, s types.ServiceConfig) map[string]uint32 {
	t.Helper()
	out := map[string]uint32{}
	for _, p := range s.Ports {
		require.Equal(t, "127.0.0.1", p.HostIP, "%s publishes %s:%d beyond loopback", s.Name, p.Published, p.Target)
		out[p.Published] = p.Target
	}
	return out
}

// The servers publish their ports where the CLI (and testenv) look by
// default, so the CLI and the tests work against the containers unchanged.
func TestServersAtCLIDefaults(t *testing.T) {
	p := load(t, "*")
	want := map[string]map[string]uint32{
		"postgres":   {urlPort(t, ferrycli.DefaultDatabaseURL): 5432},
		"rabbitmq":   {urlPort(t, ferrycli.DefaultRabbitMQURL): 5672, "15672": 15672}, // management API: testenv's default
		"nats":       {urlPort(t, ferrycli.DefaultNATSURL): 4222, "8222": 8222},
		"mailpit":    {port(t, ferrycli.DefaultSMTPAddr): 1025, "8025": 8025}, // HTTP API: testenv's default
		"localstack": {"4566": 4566},
		"api":        {port(t, ferrycli.DefaultAddr): 3000},
	}
	for name, ports := range want {
		s, err := p.GetService(name)
		require.NoError(t, err)
		require.Equal(t, ports, published(t, s), "ports of %s", name)
	}
	pg, err := p.GetService("postgres")
	require.NoError(t, err)
	u, err := url.Parse(ferrycli.DefaultDatabaseURL)
	require.NoError(t, err)
	pass, _ := u.User.Password()
	require.Equal(t, u.User.Username(), *pg.Environment["POSTGRES_USER"])
	require.Equal(t, pass, *pg.Environment["POSTGRES_PASSWORD"])
	require.Equal(t, strings.TrimPrefix(u.Path, "/"), *pg.Environment["POSTGRES_DB"])
}

func TestServersHaveHealthchecks(t *testing.T) {
	p := load(t, "*")
	for _, name := range []string{"postgres", "rabbitmq", "nats", "mailpit", "localstack"} {
		s, err := p.GetService(name)
		require.NoError(t, err)
		require.NotNil(t, s.HealthCheck, "%s has no healthcheck", name)
		require.False(t, s.HealthCheck.Disable, name)
		require.NotEmpty(t, s.HealthCheck.Test, name)
		require.NotEqual(t, "NONE", s.HealthCheck.Test[0], name)
		require.NotEmpty(t, s.Volumes, "%s keeps no data in a volume", name)
	}
}

// brokerURL is, per FERRY_BROKER value, the variable naming the broker and
// the service it must point at.
var brokerURL = map[string]struct{ env, service, port string }{
	"rabbitmq": {"FERRY_RABBITMQ_URL", "rabbitmq", "5672"},
	"nats":     {"FERRY_NATS_URL", "nats", "4222"},
	"sqs":      {"FERRY_SQS_ENDPOINT", "localstack", "4566"},
}

func env(s types.ServiceConfig, name string) string {
	if v := s.Environment[name]; v != nil {
		return *v
	}
	return ""
}

// Every ferry role is built from compose/Dockerfile, runs one CLI command,
// names its broker and database, and waits for what it talks to.
func TestRoles(t *testing.T) {
	p := load(t, "*")
	commands := map[string][]string{} // profile -> commands
	for _, name := range names(p.Services) {
		s := p.Services[name]
		if s.Build == nil {
			continue
		}
		t.Run(name, func(t *testing.T) {
			require.Equal(t, "ferry:local", s.Image)
			ctxDir := s.Build.Context
			require.FileExists(t, filepath.Join(ctxDir, "go.mod"), "build context is the repository root")
			require.FileExists(t, filepath.Join(ctxDir, s.Build.Dockerfile))
			require.Len(t, s.Command, 1)
			cmd := s.Command[0]
			require.Contains(t, []string{"migrate", "api", "relay", "worker"}, cmd)

			db := env(s, "FERRY_DATABASE_URL")
			require.NotEmpty(t, db, "FERRY_DATABASE_URL")
			u, err := url.Parse(db)
			require.NoError(t, err)
			require.Equal(t, "postgres", u.Hostname())
			require.Equal(t, "5432", u.Port())
			broker := env(s, "FERRY_BROKER")
			require.NotEmpty(t, broker, "FERRY_BROKER")
			if cmd == "migrate" {
				require.Empty(t, s.Profiles, "migrate runs with every profile")
				require.Equal(t, "service_healthy", s.DependsOn["postgres"].Condition)
				return
			}
			require.Len(t, s.Profiles, 1)
			require.Equal(t, s.Profiles[0], broker, "a role's FERRY_BROKER is its profile")
			b, ok := brokerURL[broker]
			require.True(t, ok, "unknown broker %q", broker)
			bu, err := url.Parse(env(s, b.env))
			require.NoError(t, err, b.env)
			require.Equal(t, b.service, bu.Hostname(), b.env)
			require.Equal(t, b.port, bu.Port(), b.env)
			require.Equal(t, "service_healthy", s.DependsOn[b.service].Condition, "waits for %s", b.service)
			require.Equal(t, "service_completed_successfully", s.DependsOn["migrate"].Condition, "waits for migrate")
			if cmd == "worker" {
				require.Equal(t, "mailpit:1025", env(s, "FERRY_SMTP_ADDR"))
				require.Equal(t, "service_healthy", s.DependsOn["mailpit"].Condition)
			}
			commands[broker] = append(commands[broker], cmd)
		})
	}
	for _, broker := range []string{"rabbitmq", "nats", "sqs"} {
		require.ElementsMatch(t, []string{"api", "relay", "worker"}, commands[broker], "roles of profile %s", broker)
	}
}

// The image builds the CLI with the Go version go.mod asks for.
func TestDockerfile(t *testing.T) {
	df, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	mod, err := os.ReadFile(filepath.Join("..", "go.mod"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^go (1\.\d+)`).FindSubmatch(mod)
	require.NotNil(t, m, "go directive in go.mod")
	require.Contains(t, string(df), "FROM golang:"+string(m[1])+" AS build")
	require.Contains(t, string(df), "./cmd/ferry")
	require.Regexp(t, `(?m)^ENTRYPOINT \["ferry"\]`, string(df))
}
