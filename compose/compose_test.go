package compose

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
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
	"go.yaml.in/yaml/v3"

	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
)

// composeFile is the file users run: docker compose -f compose/compose.yaml.
const composeFile = "compose.yaml"

// brokerProfiles are the profiles that each run one broker and ferry on it.
var brokerProfiles = []string{"rabbitmq", "kafka", "nats", "sqs"}

// clusterProfiles are the profiles that each run a 3-node cluster of one
// broker (no ferry roles: ferry runs on the host, docs/clusters.md "Running on a
// cluster"), with the node services' prefix.
var clusterProfiles = map[string]string{"rabbitmq-cluster": "rabbitmq", "nats-cluster": "nats", "kafka-cluster": "kafka"}

// brokerSpec is, per broker profile, the service that runs the broker, the
// variable that gives ferry its address, and the container port ferry must
// use on it.
type brokerSpec struct{ service, env, port string }

var brokerSpecs = map[string]brokerSpec{
	"rabbitmq": {"rabbitmq", "FERRY_RABBITMQ_URL", "5672"},
	"nats":     {"nats", "FERRY_NATS_URL", "4222"},
	"kafka":    {"kafka", "FERRY_KAFKA_BROKERS", "9092"},
	"sqs":      {"localstack", "FERRY_SQS_ENDPOINT", "4566"},
}

// roleCommands are the ferry commands a compose service may run; migrate
// is the only one-shot one.
var roleCommands = []string{"migrate", "api", "relay", "worker"}

// extraRoleEnv are the variables other than FERRY_* a role may set: the
// AWS SDK's default credential chain (SQS).
var extraRoleEnv = []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}

// loadFile reads a compose file with the given profiles ("*": all) the way
// `docker compose` does: schema validation (a wrong key fails),
// interpolation with env only (so a developer's shell cannot change the
// result), profile selection and the consistency check of depends_on (an
// unknown service fails).
func loadFile(path string, env map[string]string, profiles ...string) (*types.Project, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	details := types.ConfigDetails{
		WorkingDir:  filepath.Dir(abs),
		ConfigFiles: []types.ConfigFile{{Filename: abs}},
		Environment: types.Mapping(env),
	}
	if details.Environment == nil {
		details.Environment = types.Mapping{}
	}
	return loader.LoadWithContext(context.Background(), details, loader.WithProfiles(profiles))
}

// load reads compose.yaml with the defaults of every variable.
func load(t *testing.T, profiles ...string) *types.Project {
	t.Helper()
	p, err := loadFile(composeFile, nil, profiles...)
	require.NoError(t, err, "%s does not load with profiles %v", composeFile, profiles)
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

func env(s types.ServiceConfig, name string) string {
	if v := s.Environment[name]; v != nil {
		return *v
	}
	return ""
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, err := p.GetService(name)
	require.NoError(t, err)
	return s
}

// isRole: a service built from compose/Dockerfile runs a ferry command.
func isRole(s types.ServiceConfig) bool { return s.Build != nil }

// isOneShot: a service that runs to completion and is not restarted.
func isOneShot(s types.ServiceConfig) bool { return s.Restart == types.RestartPolicyNo }

// roleCommand is the ferry command a role runs ("" when it runs none or
// several arguments).
func roleCommand(s types.ServiceConfig) string {
	if len(s.Command) != 1 {
		return ""
	}
	return s.Command[0]
}

// ---------------------------------------------------------------- checks
// Each check returns every problem it finds in a loaded project; the tests
// run them on compose.yaml (no problem) and on the negative fixtures in
// testdata/ (the problem they were written for).

// checkImages: every image that is pulled names a version tag (not
// "latest", not a bare name that drifts with every release).
func checkImages(p *types.Project) error {
	var errs []error
	versionTag := regexp.MustCompile(`^v?\d+(\.\d+)+`)
	for _, name := range names(p.Services) {
		s := p.Services[name]
		if isRole(s) {
			continue
		}
		ref := s.Image
		if ref == "" {
			errs = append(errs, fmt.Errorf("%s: no image", name))
			continue
		}
		if strings.Contains(ref, "@") {
			continue // pinned by digest
		}
		last := ref[strings.LastIndex(ref, "/")+1:]
		_, tag, ok := strings.Cut(last, ":")
		switch {
		case !ok || tag == "":
			errs = append(errs, fmt.Errorf("%s: image %q has no tag", name, ref))
		case !versionTag.MatchString(tag):
			errs = append(errs, fmt.Errorf("%s: image %q: tag %q is not a version (major.minor at least)", name, ref, tag))
		}
	}
	return errors.Join(errs...)
}

// checkHealthchecks: every long-running service has a real healthcheck.
func checkHealthchecks(p *types.Project) error {
	var errs []error
	for _, name := range names(p.Services) {
		s := p.Services[name]
		if isOneShot(s) {
			continue
		}
		hc := s.HealthCheck
		if hc == nil || hc.Disable || len(hc.Test) == 0 || hc.Test[0] == "NONE" {
			errs = append(errs, fmt.Errorf("%s: long-running service without a healthcheck", name))
		}
	}
	return errors.Join(errs...)
}

// checkDependsOn: a service waits for a server until it is healthy and for
// a one-shot service until it completed successfully, never just until it
// was started.
func checkDependsOn(p *types.Project) error {
	var errs []error
	for _, name := range names(p.Services) {
		for dep, d := range p.Services[name].DependsOn {
			target, ok := p.Services[dep]
			if !ok {
				errs = append(errs, fmt.Errorf("%s: depends on unknown service %s", name, dep))
				continue
			}
			switch d.Condition {
			case types.ServiceConditionHealthy:
				if target.HealthCheck == nil {
					errs = append(errs, fmt.Errorf("%s: waits for %s to be healthy, which has no healthcheck", name, dep))
				}
			case types.ServiceConditionCompletedSuccessfully:
				if !isOneShot(target) {
					errs = append(errs, fmt.Errorf("%s: waits for %s to complete, which is restarted", name, dep))
				}
			default:
				errs = append(errs, fmt.Errorf("%s: depends on %s with condition %q: want service_healthy or service_completed_successfully", name, dep, d.Condition))
			}
		}
	}
	return errors.Join(errs...)
}

// checkPorts: every published port is on loopback and no two services,
// whatever their profiles, publish the same host port.
func checkPorts(p *types.Project) error {
	var errs []error
	owner := map[string]string{}
	for _, name := range names(p.Services) {
		for _, port := range p.Services[name].Ports {
			if port.HostIP != "127.0.0.1" {
				errs = append(errs, fmt.Errorf("%s: publishes %s:%d beyond loopback", name, port.Published, port.Target))
			}
			if port.Published == "" {
				errs = append(errs, fmt.Errorf("%s: port %d published on a random host port", name, port.Target))
				continue
			}
			if o, ok := owner[port.Published]; ok {
				errs = append(errs, fmt.Errorf("host port %s published by both %s and %s", port.Published, o, name))
				continue
			}
			owner[port.Published] = name
		}
	}
	return errors.Join(errs...)
}

// commandEnv returns, per ferry command, the variables its flags read,
// taken from the CLI itself: a renamed or removed flag changes them.
func commandEnv() map[string][]string {
	out := map[string][]string{}
	for _, c := range ferrycli.NewApp(io.Discard, io.Discard).Commands {
		for _, f := range c.Flags {
			if ev, ok := f.(interface{ GetEnvVars() []string }); ok {
				out[c.Name] = append(out[c.Name], ev.GetEnvVars()...)
			}
		}
	}
	return out
}

// hostPort splits an address given to ferry: a URL, or host:port.
func hostPort(addr string) (string, string, error) {
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			return "", "", err
		}
		if u.Port() == "" {
			return "", "", fmt.Errorf("%q names no port", addr)
		}
		return u.Hostname(), u.Port(), nil
	}
	return net.SplitHostPort(addr)
}

// checkRoles: every ferry role runs one ferry command, sets only variables
// that are flags of that command, and names the database and the broker
// of its profile, whose services it waits for.
func checkRoles(p *types.Project) error {
	var errs []error
	flagEnv := commandEnv()
	for _, name := range names(p.Services) {
		s := p.Services[name]
		if !isRole(s) {
			continue
		}
		fail := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: "+format, append([]any{name}, args...)...))
		}
		cmd := roleCommand(s)
		if !slices.Contains(roleCommands, cmd) {
			fail("command %q: want one of %v", s.Command, roleCommands)
			continue
		}
		for k := range s.Environment {
			switch {
			case strings.HasPrefix(k, "FERRY_"):
				if !slices.Contains(flagEnv[cmd], k) {
					fail("%s is not a flag of `ferry %s` (it reads: %s)", k, cmd, strings.Join(flagEnv[cmd], ", "))
				}
			case !slices.Contains(extraRoleEnv, k):
				fail("%s: unexpected variable (ferry reads FERRY_*, the AWS SDK %v)", k, extraRoleEnv)
			}
		}
		if len(s.Profiles) != 1 {
			fail("profiles %v: want exactly one broker profile", s.Profiles)
			continue
		}
		profile := s.Profiles[0]
		if (cmd == "migrate") != isOneShot(s) {
			fail("restart %q: migrate runs once, the other roles are restarted", s.Restart)
		}

		db, err := url.Parse(env(s, "FERRY_DATABASE_URL"))
		if err != nil || db.Hostname() != "postgres" || db.Port() != "5432" {
			fail("FERRY_DATABASE_URL %q: want the postgres service on 5432", env(s, "FERRY_DATABASE_URL"))
		} else if got, want := strings.TrimPrefix(db.Path, "/"), "ferry_"+profile; got != want {
			fail("database %q: want %q, the profile's own database", got, want)
		}
		if cmd == "migrate" {
			if d := s.DependsOn["postgres"]; d.Condition != types.ServiceConditionHealthy {
				fail("migrate must wait for postgres to be healthy")
			}
			continue
		}
		// The CLI listens on loopback by default, which a published port
		// cannot reach: every role must listen on every interface.
		listen := env(s, "FERRY_METRICS_ADDR")
		if cmd == "api" {
			listen = env(s, "FERRY_ADDR")
		}
		if host, _, err := net.SplitHostPort(listen); err != nil || (host != "" && host != "0.0.0.0") {
			fail("listens on %q: want 0.0.0.0:PORT (the CLI's default is loopback, unreachable from the published port)", listen)
		}
		if d := s.DependsOn["migrate-"+profile]; d.Condition != types.ServiceConditionCompletedSuccessfully {
			fail("must wait for migrate-%s to complete", profile)
		}
		if cmd == "api" {
			continue // no broker: the API writes the outbox, which the relay publishes
		}

		if b := env(s, "FERRY_BROKER"); b != profile {
			fail("FERRY_BROKER %q: want %q, its profile", b, profile)
		}
		spec, ok := brokerSpecs[profile]
		if !ok {
			fail("profile %q is not a broker profile", profile)
			continue
		}
		addrs := strings.Split(env(s, spec.env), ",")
		for _, a := range addrs {
			host, port, err := hostPort(strings.TrimSpace(a))
			if err != nil || host != spec.service || port != spec.port {
				fail("%s %q: want the %s service on port %s (err %v)", spec.env, a, spec.service, spec.port, err)
			}
		}
		if d := s.DependsOn[spec.service]; d.Condition != types.ServiceConditionHealthy {
			fail("must wait for %s to be healthy", spec.service)
		}
		if cmd == "worker" {
			if got := env(s, "FERRY_SMTP_ADDR"); got != "mailpit:1025" {
				fail("FERRY_SMTP_ADDR %q: want mailpit:1025", got)
			}
			if d := s.DependsOn["mailpit"]; d.Condition != types.ServiceConditionHealthy {
				fail("the worker must wait for mailpit to be healthy")
			}
		}
	}
	return errors.Join(errs...)
}

// checkProject runs every check.
func checkProject(p *types.Project) error {
	return errors.Join(checkImages(p), checkHealthchecks(p), checkDependsOn(p), checkPorts(p), checkRoles(p))
}

// ----------------------------------------------------------------- tests

func profileServices(broker string) []string {
	return []string{"postgres", "mailpit", brokerSpecs[broker].service,
		"migrate-" + broker, "api-" + broker, "relay-" + broker, "worker-" + broker}
}

// Each profile alone, with observability, and all at once load and pass
// every check: a depends_on on a service of another profile would break
// `docker compose --profile X up`.
func TestProfiles(t *testing.T) {
	t.Parallel()
	require.Equal(t, sorted("postgres", "mailpit"), names(load(t).Services), "no profile")
	require.Equal(t, sorted("postgres", "mailpit", "prometheus", "grafana"), names(load(t, "observability").Services))

	all := load(t, "*")
	require.Equal(t, "ferry", all.Name)
	var profiles []string
	for _, s := range all.Services {
		for _, pr := range s.Profiles {
			if !slices.Contains(profiles, pr) {
				profiles = append(profiles, pr)
			}
		}
	}
	want := append(slices.Clone(brokerProfiles), "observability")
	for cp := range clusterProfiles {
		want = append(want, cp)
	}
	require.ElementsMatch(t, want, profiles, "the profiles of compose.yaml")
	require.NoError(t, checkProject(all))

	for _, b := range brokerProfiles {
		t.Run(b, func(t *testing.T) {
			p := load(t, b)
			require.ElementsMatch(t, profileServices(b), names(p.Services))
			require.NoError(t, checkProject(p))
			p = load(t, b, "observability")
			require.ElementsMatch(t, append(profileServices(b), "prometheus", "grafana"), names(p.Services))
			require.NoError(t, checkProject(p))
		})
	}
}

// Every long-running service has a healthcheck; the one-shot services are
// exactly the migrate of each profile.
func TestHealthchecks(t *testing.T) {
	t.Parallel()
	p := load(t, "*")
	require.NoError(t, checkHealthchecks(p))
	var oneShot []string
	for _, name := range names(p.Services) {
		if isOneShot(p.Services[name]) {
			oneShot = append(oneShot, name)
		}
	}
	var want []string
	for _, b := range brokerProfiles {
		want = append(want, "migrate-"+b)
	}
	require.ElementsMatch(t, want, oneShot)
}

// The start order per profile: postgres healthy -> migrate completed; the
// broker healthy and migrate completed -> api, relay, worker; mailpit
// healthy -> worker; Prometheus healthy -> Grafana.
func TestDependencyOrder(t *testing.T) {
	t.Parallel()
	p := load(t, "*")
	require.NoError(t, checkDependsOn(p))
	deps := func(name string) map[string]string {
		out := map[string]string{}
		for d, c := range service(t, p, name).DependsOn {
			out[d] = c.Condition
		}
		return out
	}
	for _, b := range brokerProfiles {
		broker := brokerSpecs[b].service
		require.Equal(t, map[string]string{"postgres": "service_healthy"}, deps("migrate-"+b))
		roles := map[string]string{"migrate-" + b: "service_completed_successfully", broker: "service_healthy"}
		require.Equal(t, roles, deps("api-"+b))
		require.Equal(t, roles, deps("relay-"+b))
		roles["mailpit"] = "service_healthy"
		require.Equal(t, roles, deps("worker-"+b))
	}
	require.Equal(t, map[string]string{"prometheus": "service_healthy"}, deps("grafana"))
	for _, name := range []string{"postgres", "mailpit", "prometheus", "rabbitmq", "kafka", "nats", "localstack"} {
		require.Empty(t, deps(name), "%s waits for nothing", name)
	}
}

// Every role sets only variables that are flags of its command, read from
// the CLI; it names its profile's broker service and port, and its
// profile's database.
func TestRoles(t *testing.T) {
	t.Parallel()
	p := load(t, "*")
	require.NoError(t, checkRoles(p))
	commands := map[string][]string{}
	for _, name := range names(p.Services) {
		s := p.Services[name]
		if !isRole(s) {
			continue
		}
		require.Equal(t, "ferry:local", s.Image, name)
		require.FileExists(t, filepath.Join(s.Build.Context, "go.mod"), "%s: build context is the repository root", name)
		require.FileExists(t, filepath.Join(s.Build.Context, s.Build.Dockerfile), name)
		commands[s.Profiles[0]] = append(commands[s.Profiles[0]], roleCommand(s))
	}
	for _, b := range brokerProfiles {
		require.ElementsMatch(t, roleCommands, commands[b], "roles of profile %s", b)
	}

	// The broker names are ones ferry has an adapter for.
	for _, b := range brokerProfiles {
		require.Contains(t, ferrycli.Brokers, b, "--broker %s", b)
	}

	// SQS: region and credentials for the AWS SDK (not the API, which
	// talks to no broker).
	for _, r := range []string{"relay-sqs", "worker-sqs"} {
		s := service(t, p, r)
		require.Equal(t, ferrycli.DefaultAWSRegion, env(s, "FERRY_AWS_REGION"), r)
		require.NotEmpty(t, env(s, "AWS_ACCESS_KEY_ID"), r)
		require.NotEmpty(t, env(s, "AWS_SECRET_ACCESS_KEY"), r)
	}
}

// Each database a role names is created on the postgres service, whose
// user and password are the ones in the roles' URLs and the CLI's default.
func TestDatabases(t *testing.T) {
	t.Parallel()
	p := load(t, "*")
	pg := service(t, p, "postgres")
	def, err := url.Parse(ferrycli.DefaultDatabaseURL)
	require.NoError(t, err)
	pass, _ := def.User.Password()
	require.Equal(t, def.User.Username(), env(pg, "POSTGRES_USER"))
	require.Equal(t, pass, env(pg, "POSTGRES_PASSWORD"))
	require.Equal(t, strings.TrimPrefix(def.Path, "/"), env(pg, "POSTGRES_DB"))

	var initSQL string
	for _, v := range pg.Volumes {
		if strings.HasPrefix(v.Target, "/docker-entrypoint-initdb.d/") {
			data, err := os.ReadFile(v.Source)
			require.NoError(t, err)
			initSQL = string(data)
		}
	}
	require.NotEmpty(t, initSQL, "postgres mounts an init script")
	created := regexp.MustCompile(`(?m)^CREATE DATABASE (\w+);`).FindAllStringSubmatch(initSQL, -1)
	var dbs []string
	for _, m := range created {
		dbs = append(dbs, m[1])
	}
	for _, name := range names(p.Services) {
		s := p.Services[name]
		if !isRole(s) {
			continue
		}
		u, err := url.Parse(env(s, "FERRY_DATABASE_URL"))
		require.NoError(t, err)
		require.Contains(t, dbs, strings.TrimPrefix(u.Path, "/"), "%s: its database is created by the init script", name)
		upass, _ := u.User.Password()
		require.Equal(t, def.User.Username(), u.User.Username(), name)
		require.Equal(t, pass, upass, name)
	}
}

// published returns the container ports of s by host port.
func published(s types.ServiceConfig) map[string]uint32 {
	out := map[string]uint32{}
	for _, p := range s.Ports {
		out[p.Published] = p.Target
	}
	return out
}

// targets returns the container ports s publishes.
func targets(s types.ServiceConfig) []uint32 {
	return slices.Collect(maps.Values(published(s)))
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := hostPort(addr)
	require.NoError(t, err, addr)
	return p
}

// The servers publish their ports where the CLI (and the tests' testenv)
// look by default, so `ferry ...` on the host works against the containers
// unchanged; the roles of the rabbitmq profile publish at the CLI's own
// defaults and the other profiles next to them, so that no two profiles
// fight over a host port.
func TestPortsAtCLIDefaults(t *testing.T) {
	t.Parallel()
	p := load(t, "*")
	require.NoError(t, checkPorts(p))
	relay, worker := port(t, ferrycli.DefaultRelayMetricsAddr), port(t, ferrycli.DefaultWorkerMetricsAddr)
	api := port(t, ferrycli.DefaultAddr)
	want := map[string]map[string]uint32{
		"postgres":         {port(t, ferrycli.DefaultDatabaseURL): 5432},
		"mailpit":          {port(t, ferrycli.DefaultSMTPAddr): 1025, "8025": 8025}, // HTTP API: testenv's default
		"rabbitmq":         {port(t, ferrycli.DefaultRabbitMQURL): 5672, "15672": 15672},
		"nats":             {port(t, ferrycli.DefaultNATSURL): 4222, "8222": 8222},
		"kafka":            {port(t, ferrycli.DefaultKafkaBrokers): 29092},
		"localstack":       {port(t, ferrycli.DefaultSQSEndpoint): 4566},
		"api-rabbitmq":     {api: 3000},
		"relay-rabbitmq":   {relay: 9464},
		"worker-rabbitmq":  {worker: 9465},
		"api-nats":         {"3001": 3000},
		"relay-nats":       {"9466": 9464},
		"worker-nats":      {"9467": 9465},
		"api-kafka":        {"3002": 3000},
		"relay-kafka":      {"9468": 9464},
		"worker-kafka":     {"9469": 9465},
		"api-sqs":          {"3003": 3000},
		"relay-sqs":        {"9470": 9464},
		"worker-sqs":       {"9471": 9465},
		"prometheus":       {"9090": 9090},
		"grafana":          {"3030": 3000},
		"migrate-rabbitmq": {},
		"migrate-nats":     {},
		"migrate-kafka":    {},
		"migrate-sqs":      {},
	}
	for cp, prefix := range clusterProfiles {
		for n := 1; n <= 3; n++ {
			want[fmt.Sprintf("%s-%d", prefix, n)] = clusterPorts(cp, n)
		}
	}
	require.ElementsMatch(t, names(p.Services), slices.Collect(maps.Keys(want)))
	for name, ports := range want {
		require.Equal(t, ports, published(service(t, p, name)), "ports of %s", name)
	}
}

// clusterPorts are the host ports of node n of a cluster profile: the
// single-node port plus 10×n, as compose/local/cluster.sh chooses them.
func clusterPorts(profile string, n int) map[string]uint32 {
	switch profile {
	case "rabbitmq-cluster":
		return map[string]uint32{fmt.Sprint(5672 + 10*n): 5672}
	case "nats-cluster":
		return map[string]uint32{fmt.Sprint(4232 + 10*n): 4222}
	default:
		return map[string]uint32{fmt.Sprint(9192 + 10*n): 29092}
	}
}

// Each cluster profile runs three nodes of its broker, the same image as
// the single-node service, configured as one cluster with the replication
// ferry's failover tests rely on: Kafka's three KRaft voters, replication
// factor 3, min.insync.replicas 2 and no unclean leader election; NATS
// routes to all three under one cluster name; RabbitMQ one Erlang cookie
// and a peer list naming all three.
func TestClusterProfiles(t *testing.T) {
	t.Parallel()
	for cp, prefix := range clusterProfiles {
		t.Run(cp, func(t *testing.T) {
			p := load(t, cp)
			require.NoError(t, checkProject(p))
			var nodes []string
			for n := 1; n <= 3; n++ {
				nodes = append(nodes, fmt.Sprintf("%s-%d", prefix, n))
			}
			require.ElementsMatch(t, append([]string{"postgres", "mailpit"}, nodes...), names(p.Services))
			single := service(t, load(t, prefix), prefix)
			ids := map[string]bool{}
			for n, name := range nodes {
				s := service(t, p, name)
				require.Equal(t, single.Image, s.Image, "%s runs the single-node image", name)
				require.Equal(t, clusterPorts(cp, n+1), published(s))
				switch prefix {
				case "kafka":
					require.Equal(t, fmt.Sprint(n+1), env(s, "KAFKA_NODE_ID"))
					ids[env(s, "CLUSTER_ID")] = true
					require.Equal(t, "1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093", env(s, "KAFKA_CONTROLLER_QUORUM_VOTERS"))
					require.Equal(t, "3", env(s, "KAFKA_DEFAULT_REPLICATION_FACTOR"))
					require.Equal(t, "2", env(s, "KAFKA_MIN_INSYNC_REPLICAS"))
					require.Equal(t, "false", env(s, "KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"))
					require.Equal(t, "3", env(s, "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"))
					require.Contains(t, env(s, "KAFKA_ADVERTISED_LISTENERS"), "PLAINTEXT://"+name+":9092")
				case "nats":
					cmd := strings.Join(s.Command, " ")
					require.Contains(t, cmd, "-js")
					require.Contains(t, cmd, "--cluster_name ferry")
					require.Contains(t, cmd, "--routes nats://nats-1:6222,nats://nats-2:6222,nats://nats-3:6222")
					require.Contains(t, cmd, "-n "+name)
				case "rabbitmq":
					require.Equal(t, name, s.Hostname)
					ids[env(s, "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS")] = true
					require.Equal(t, env(s, "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"), env(s, "RABBITMQ_CTL_ERL_ARGS"), "the CLI tools use the node's cookie")
				}
			}
			if prefix != "nats" {
				require.Len(t, ids, 1, "one cluster id / Erlang cookie for the three nodes")
			}
			if prefix == "rabbitmq" {
				conf, err := os.ReadFile(filepath.Join("rabbitmq-cluster", "rabbitmq.conf"))
				require.NoError(t, err)
				for _, name := range nodes {
					require.Contains(t, string(conf), "= rabbit@"+name)
				}
				require.Contains(t, string(conf), "cluster_partition_handling = pause_minority")
			}
		})
	}
}

// Every published host port comes from a variable with a default, and
// setting the variable moves it (for Kafka, also the address the broker
// advertises to the host).
func TestPortsFromVariables(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(composeFile)
	require.NoError(t, err)
	var doc struct {
		Services map[string]struct {
			Ports []string `yaml:"ports"`
		} `yaml:"services"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	spec := regexp.MustCompile(`^127\.0\.0\.1:\$\{([A-Z0-9_]+):-(\d+)\}:(\d+)$`)
	vars := map[string]string{}
	for name, s := range doc.Services {
		for _, p := range s.Ports {
			m := spec.FindStringSubmatch(p)
			require.NotNil(t, m, "%s: port %q: want 127.0.0.1:${VAR:-default}:port", name, p)
			require.NotContains(t, vars, m[1], "%s: variable %s used twice", name, m[1])
			vars[m[1]] = name
		}
	}

	p, err := loadFile(composeFile, map[string]string{"KAFKA_PORT": "19092", "KAFKA_API_PORT": "13002"}, "kafka")
	require.NoError(t, err)
	kafka := service(t, p, "kafka")
	require.Equal(t, map[string]uint32{"19092": 29092}, published(kafka))
	require.Contains(t, env(kafka, "KAFKA_ADVERTISED_LISTENERS"), "HOST://127.0.0.1:19092")
	require.Equal(t, map[string]uint32{"13002": 3000}, published(service(t, p, "api-kafka")))
}

// listeners parses a Kafka listener list: NAME -> host:port.
func listeners(t *testing.T, list string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, l := range strings.Split(list, ",") {
		name, addr, ok := strings.Cut(strings.TrimSpace(l), "://")
		require.True(t, ok, "listener %q", l)
		out[name] = addr
	}
	return out
}

// The port each broker spec gives ferry is the one its server listens on
// in the container; for Kafka, the listener ferry uses is advertised under
// the service's name and the host listener under the published port.
func TestBrokerServers(t *testing.T) {
	t.Parallel()
	p := load(t, "*")
	for _, b := range []string{"rabbitmq", "nats", "sqs"} {
		spec := brokerSpecs[b]
		require.Contains(t, targets(service(t, p, spec.service)), uint32(mustAtoi(t, spec.port)), "%s listens on %s", spec.service, spec.port)
	}

	k := service(t, p, "kafka")
	require.Equal(t, "kafka", k.Hostname)
	ls := listeners(t, env(k, "KAFKA_LISTENERS"))
	adv := listeners(t, env(k, "KAFKA_ADVERTISED_LISTENERS"))
	var internal, host string
	for name, addr := range ls {
		if strings.HasSuffix(addr, ":"+brokerSpecs["kafka"].port) {
			internal = name
		}
		if addr == ":29092" {
			host = name
		}
	}
	require.NotEmpty(t, internal, "a listener on %s", brokerSpecs["kafka"].port)
	require.Equal(t, "kafka:"+brokerSpecs["kafka"].port, adv[internal], "what ferry's containers are told to use")
	require.Equal(t, internal, env(k, "KAFKA_INTER_BROKER_LISTENER_NAME"))
	require.NotEmpty(t, host)
	require.Equal(t, "127.0.0.1:"+port(t, ferrycli.DefaultKafkaBrokers), adv[host], "what the host is told to use")
	require.Contains(t, env(k, "KAFKA_CONTROLLER_QUORUM_VOTERS"), "@kafka:"+port(t, ls[env(k, "KAFKA_CONTROLLER_LISTENER_NAMES")]))
	require.Equal(t, "broker,controller", env(k, "KAFKA_PROCESS_ROLES"), "KRaft, one node")
	require.NotEmpty(t, env(k, "CLUSTER_ID"))
	require.Equal(t, "/var/lib/kafka/data", env(k, "KAFKA_LOG_DIRS"))
	// The healthcheck asks the broker itself, on the listener ferry uses.
	require.Equal(t, []string{"CMD", "/opt/kafka/bin/kafka-broker-api-versions.sh", "--bootstrap-server", "kafka:" + brokerSpecs["kafka"].port},
		[]string(k.HealthCheck.Test))

	// LocalStack runs SQS only; ferry's Declare creates the queues, so no
	// init hook is mounted.
	ls2 := service(t, p, "localstack")
	require.Equal(t, "sqs", env(ls2, "SERVICES"))
	for _, v := range ls2.Volumes {
		require.NotContains(t, v.Target, "/etc/localstack/init", "queues come from ferry's Declare, not an init script")
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	_, err := fmt.Sscanf(s, "%d", &n)
	require.NoError(t, err, s)
	return n
}

// Images: every pulled image has a version tag; the Kafka, NATS and
// Mailpit images run the versions compose/local/services.sh runs (Kafka:
// the same major), RabbitMQ a 4.x management image.
func TestImages(t *testing.T) {
	t.Parallel()
	p := load(t, "*")
	require.NoError(t, checkImages(p))
	script, err := os.ReadFile(filepath.Join("local", "services.sh"))
	require.NoError(t, err)
	version := func(name string) string {
		m := regexp.MustCompile(`(?m)^` + name + `=v?([0-9.]+)$`).FindSubmatch(script)
		if m == nil {
			return ""
		}
		return string(m[1])
	}
	tag := func(svc string) string {
		img := service(t, p, svc).Image
		return img[strings.LastIndex(img, ":")+1:]
	}
	require.Equal(t, "apache/kafka", strings.Split(service(t, p, "kafka").Image, ":")[0], "the official image")
	major := func(v string) string { return strings.Split(v, ".")[0] }
	if v := version("KAFKA_VERSION"); v != "" {
		require.Equal(t, major(v), major(tag("kafka")), "Kafka major version: services.sh runs %s", v)
	} else {
		require.Equal(t, "4", major(tag("kafka")), "services.sh runs no Kafka yet: Kafka 4")
	}
	require.NotEmpty(t, version("NATS_VERSION"))
	require.Equal(t, version("NATS_VERSION")+"-alpine", tag("nats"))
	require.NotEmpty(t, version("MAILPIT_VERSION"))
	require.Equal(t, "v"+version("MAILPIT_VERSION"), tag("mailpit"))
	require.Regexp(t, `^4\.\d+\.\d+-management$`, tag("rabbitmq"))
}

// Data lives in named volumes declared at the top level; the only bind
// mounts are read-only configuration files of this folder.
func TestVolumes(t *testing.T) {
	t.Parallel()
	p := load(t, "*")
	for _, name := range names(p.Services) {
		s := p.Services[name]
		named := 0
		for _, v := range s.Volumes {
			switch v.Type {
			case types.VolumeTypeVolume:
				require.Contains(t, p.Volumes, v.Source, "%s: volume %s is declared", name, v.Source)
				named++
			case types.VolumeTypeBind:
				require.True(t, v.ReadOnly, "%s: bind mount %s is read-only", name, v.Source)
				dir, err := filepath.Abs(".")
				require.NoError(t, err)
				require.True(t, strings.HasPrefix(v.Source, dir+string(filepath.Separator)), "%s: %s is in compose/", name, v.Source)
				_, err = os.Stat(v.Source)
				require.NoError(t, err, name)
			default:
				t.Fatalf("%s: volume type %s", name, v.Type)
			}
		}
		if !isRole(s) {
			require.Equal(t, 1, named, "%s keeps its data in one named volume", name)
		}
	}
}

// healthURL is the http:// URL a healthcheck asks.
func healthURL(t *testing.T, s types.ServiceConfig) *url.URL {
	t.Helper()
	require.NotNil(t, s.HealthCheck, s.Name)
	for _, a := range s.HealthCheck.Test {
		if strings.HasPrefix(a, "http://") {
			u, err := url.Parse(a)
			require.NoError(t, err)
			return u
		}
	}
	t.Fatalf("%s: healthcheck %v asks no URL", s.Name, s.HealthCheck.Test)
	return nil
}

// scrapeConfig is the part of prometheus/prometheus.yml the profile relies
// on, decoded strictly (a misspelled key fails).
type scrapeConfig struct {
	Global        map[string]string `yaml:"global"`
	RuleFiles     []string          `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName      string `yaml:"job_name"`
		DNSSDConfigs []struct {
			Names           []string `yaml:"names"`
			Type            string   `yaml:"type"`
			Port            int      `yaml:"port"`
			RefreshInterval string   `yaml:"refresh_interval"`
		} `yaml:"dns_sd_configs"`
		RelabelConfigs []map[string]any `yaml:"relabel_configs"`
	} `yaml:"scrape_configs"`
}

// Each role listens where its healthcheck asks, publishes that port, and
// carries the network alias under which Prometheus finds it on that port;
// the image has what the healthchecks run.
func TestRolesAreScrapedAndChecked(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("prometheus", "prometheus.yml"))
	require.NoError(t, err)
	var cfg scrapeConfig
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&cfg))
	require.Len(t, cfg.ScrapeConfigs, 1)
	scrape := map[string]int{} // alias -> port
	for _, sd := range cfg.ScrapeConfigs[0].DNSSDConfigs {
		require.Equal(t, "A", sd.Type)
		for _, n := range sd.Names {
			scrape[n] = sd.Port
		}
	}
	require.Equal(t, map[string]int{"ferry-api": 3000, "ferry-relay": 9464, "ferry-worker": 9465}, scrape)

	df, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	p := load(t, "*")
	for _, name := range names(p.Services) {
		s := p.Services[name]
		cmd := roleCommand(s)
		if !isRole(s) || cmd == "migrate" {
			continue
		}
		listen := env(s, "FERRY_METRICS_ADDR")
		if cmd == "api" {
			listen = env(s, "FERRY_ADDR")
		}
		lport := port(t, listen)
		u := healthURL(t, s)
		require.Equal(t, lport, u.Port(), "%s: healthcheck asks the port it listens on", name)
		require.Equal(t, map[string]bool{"/readyz": cmd == "api", "/metrics": cmd != "api"}[u.Path], true, "%s: %s", name, u.Path)
		require.Contains(t, targets(s), uint32(mustAtoi(t, lport)), "%s publishes %s", name, lport)
		alias := "ferry-" + cmd
		require.NotNil(t, s.Networks["default"], name)
		require.Contains(t, s.Networks["default"].Aliases, alias, name)
		require.Equal(t, mustAtoi(t, lport), scrape[alias], "%s: Prometheus scrapes %s on the port it listens on", name, alias)
		require.Equal(t, "curl", s.HealthCheck.Test[1], name)
		require.Regexp(t, `apt-get install [^\n]*\bcurl\b`, string(df), "the image has curl for the healthchecks")
	}
}

// Prometheus loads prometheus.yml and alerts.yml from this folder; Grafana
// gets the data source and the dashboard provider from grafana/provisioning
// and the dashboards from grafana/dashboards.
func TestObservability(t *testing.T) {
	t.Parallel()
	p := load(t, "observability")
	prom := service(t, p, "prometheus")
	var config string
	for _, a := range prom.Command {
		if v, ok := strings.CutPrefix(a, "--config.file="); ok {
			config = v
		}
	}
	require.NotEmpty(t, config, "--config.file")
	mounts := func(s types.ServiceConfig) map[string]string { // target -> source
		out := map[string]string{}
		for _, v := range s.Volumes {
			out[v.Target] = v.Source
		}
		return out
	}
	promDir, err := filepath.Abs("prometheus")
	require.NoError(t, err)
	require.Equal(t, promDir, mounts(prom)[filepath.Dir(config)], "the config folder is compose/prometheus")
	require.Equal(t, "prometheus.yml", filepath.Base(config))
	var cfg scrapeConfig
	data, err := os.ReadFile(filepath.Join(promDir, "prometheus.yml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(data, &cfg))
	require.Equal(t, []string{"alerts.yml"}, cfg.RuleFiles)
	require.FileExists(t, filepath.Join(promDir, "alerts.yml"))

	g := service(t, p, "grafana")
	gm := mounts(g)
	prov, err := filepath.Abs(filepath.Join("grafana", "provisioning"))
	require.NoError(t, err)
	require.Equal(t, prov, gm["/etc/grafana/provisioning"])

	var ds struct {
		Datasources []struct{ Name, UID, Type, URL string } `yaml:"datasources"`
	}
	readYAML(t, filepath.Join(prov, "datasources", "prometheus.yaml"), &ds)
	require.Len(t, ds.Datasources, 1)
	require.Equal(t, "prometheus", ds.Datasources[0].Type)
	du, err := url.Parse(ds.Datasources[0].URL)
	require.NoError(t, err)
	require.Equal(t, "prometheus", du.Hostname(), "the prometheus service")
	require.Contains(t, targets(prom), uint32(mustAtoi(t, du.Port())))

	var dp struct {
		Providers []struct {
			Name, Type string
			Options    struct{ Path string } `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, filepath.Join(prov, "dashboards", "ferry.yaml"), &dp)
	require.Len(t, dp.Providers, 1)
	require.Equal(t, "file", dp.Providers[0].Type)
	dashDir, err := filepath.Abs(filepath.Join("grafana", "dashboards"))
	require.NoError(t, err)
	require.Equal(t, dashDir, gm[dp.Providers[0].Options.Path], "the provider reads compose/grafana/dashboards")
	home := env(g, "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
	require.Equal(t, dp.Providers[0].Options.Path, filepath.Dir(home))
	require.FileExists(t, filepath.Join(dashDir, filepath.Base(home)))

	d := readDashboard(t)
	for _, uid := range d.datasourceUIDs() {
		require.Equal(t, ds.Datasources[0].UID, uid, "the dashboard queries the provisioned data source")
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(data, v), path)
}

// The image builds the CLI with the Go version go.mod asks for.
func TestDockerfile(t *testing.T) {
	t.Parallel()
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

// The checks fail on what they are there to catch: each fixture in
// testdata/ has one defect.
func TestNegativeFixtures(t *testing.T) {
	t.Parallel()
	cases := []struct {
		file, want string
		check      func(*types.Project) error // nil: the loader itself refuses it
	}{
		{"wrong-key.yaml", "healthchek", nil},
		{"unknown-dependency.yaml", "nosuchservice", nil},
		{"untagged-image.yaml", `image "postgres" has no tag`, checkImages},
		{"untagged-image.yaml", `image "rabbitmq:latest": tag "latest" is not a version`, checkImages},
		{"no-healthcheck.yaml", "nats: long-running service without a healthcheck", checkHealthchecks},
		{"no-healthcheck.yaml", `depends on nats with condition "service_started"`, checkDependsOn},
		{"port-clash.yaml", "host port 5672 published by both", checkPorts},
		{"port-clash.yaml", "publishes 15672:15672 beyond loopback", checkPorts},
		{"unknown-flag.yaml", "FERRY_RABBIT_URL is not a flag of `ferry relay`", checkRoles},
		{"unknown-flag.yaml", "FERRY_SMTP_ADDR is not a flag of `ferry relay`", checkRoles},
		{"wrong-broker-address.yaml", `FERRY_RABBITMQ_URL "amqp://guest:guest@rabbit:5672/": want the rabbitmq service on port 5672`, checkRoles},
		{"wrong-broker-address.yaml", `FERRY_BROKER "nats": want "rabbitmq"`, checkRoles},
		{"wrong-broker-address.yaml", "must wait for migrate-rabbitmq to complete", checkRoles},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			p, err := loadFile(filepath.Join("testdata", c.file), nil, "*")
			if c.check == nil {
				require.Error(t, err)
				require.Contains(t, err.Error(), c.want)
				return
			}
			require.NoError(t, err)
			err = c.check(p)
			require.Error(t, err)
			require.Contains(t, err.Error(), c.want)
		})
	}
}

// PostgreSQL runs with wal_level=logical, so that a relay may run with
// --relay-mode=wal (FERRY_RELAY_MODE=wal; outbox.RelayModeWAL), whose
// start-up check refuses a server without it.
func TestPostgresAllowsTheWALRelay(t *testing.T) {
	t.Parallel()
	pg, err := load(t).GetService("postgres")
	require.NoError(t, err)
	cmd := strings.Join(pg.Command, " ")
	require.Contains(t, cmd, "-c wal_level=logical", "the postgres service's command")
}
