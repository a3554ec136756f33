package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// server is what the tests know of one server of compose/local/services.sh:
// its name for people, the services.sh role that starts it, the variable
// that sets its address and that address.
type server struct {
	name, role, env string
	addr            func() string
}

// servers maps the names tests give a server (RequireTCP's service,
// Require's and MustReach's roles; a broker name of ferrycli.Brokers is
// one) to what the message about it says.
var servers = map[string]server{
	"postgres": {"PostgreSQL", "postgres", "FERRY_DATABASE_URL", func() string { return HostPort(DatabaseURL()) }},
	"rabbitmq": {"RabbitMQ", "rabbitmq", "FERRY_RABBITMQ_URL", func() string { return HostPort(RabbitMQURL()) }},
	"nats":     {"NATS", "nats", "FERRY_NATS_URL", func() string { return HostPort(NATSURL()) }},
	"kafka":    {"Kafka", "kafka", "FERRY_KAFKA_BROKERS", func() string { return firstOr(KafkaBrokers(), "") }},
	"sqs":      {"ElasticMQ (SQS)", "sqs", "FERRY_SQS_ENDPOINT", func() string { return HostPort(SQSEndpoint()) }},
	"moto":     {"moto (SQS)", "moto", "FERRY_SQS_MOTO_ENDPOINT", func() string { return HostPort(SQSMotoEndpoint()) }},
	"smtp":     {"Mailpit (SMTP)", "smtp", "FERRY_SMTP_ADDR", SMTPAddr},
	"mailpit":  {"Mailpit (HTTP API)", "smtp", "FERRY_MAILPIT_URL", func() string { return HostPort(MailpitURL()) }},
}

func firstOr(s []string, def string) string {
	if len(s) == 0 {
		return def
	}
	return s[0]
}

// serverOf returns what is known of service; an unknown name (a cluster
// role, say) is described by the name alone.
func serverOf(service string) server {
	if s, ok := servers[service]; ok {
		return s
	}
	return server{name: service, role: service, addr: func() string { return "" }}
}

// ServerError says that a server a test needs is missing or refuses the
// test's login: which server, the address tried, the environment variable
// that sets it and the command that starts it, on one line. Require,
// RequireTCP, NewDatabase and MustReach report it.
type ServerError struct {
	// Server names the server for people ("PostgreSQL", "RabbitMQ", ...).
	Server string
	// Role is the argument of compose/local/services.sh up that starts it.
	Role string
	// Env is the environment variable that sets its address ("" if none).
	Env string
	// Addr is the host:port tried.
	Addr string
	// What says what went wrong: "cannot be reached", "refused the login",
	// "has no such database".
	What string
	// Err is the error of the dial or the login.
	Err error
}

// Error is the one-line message, e.g. `testenv: PostgreSQL at
// 127.0.0.1:5432 (FERRY_DATABASE_URL) refused the login: ...; start it
// with compose/local/services.sh up postgres, then eval "$(compose/local/services.sh env)"
// (or run make test)`.
func (e *ServerError) Error() string {
	env := ""
	if e.Env != "" {
		env = " (" + e.Env + ")"
	}
	cause := fmt.Sprint(e.Err)
	// pgx's message repeats itself (one try per address and TLS mode):
	// the server's answer or the dial's error says it all.
	var pe *pgconn.PgError
	var oe *net.OpError
	if errors.As(e.Err, &pe) {
		cause = fmt.Sprintf("%s: %s (SQLSTATE %s)", pe.Severity, pe.Message, pe.Code)
	} else if errors.As(e.Err, &oe) {
		cause = oe.Error()
	}
	cause = strings.Join(strings.Fields(cause), " ")
	return fmt.Sprintf(`testenv: %s at %s%s %s: %s; start it with compose/local/services.sh up %s, then eval "$(compose/local/services.sh env)" (or run make test, which does both)`,
		e.Server, e.Addr, env, e.What, cause, e.Role)
}

// Unwrap returns the dial's or the login's error.
func (e *ServerError) Unwrap() error { return e.Err }

// newServerError describes err, met at addr while reaching service.
func newServerError(service, addr string, err error) *ServerError {
	s := serverOf(service)
	if addr == "" {
		addr = s.addr()
	}
	what := "cannot be reached"
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "3D000":
			what = "has no such database"
		case strings.HasPrefix(pe.Code, "28"): // invalid_authorization_specification, invalid_password
			what = "refused the login"
		}
	}
	return &ServerError{Server: s.name, Role: s.role, Env: s.env, Addr: addr, What: what, Err: err}
}

// unreachable holds the addresses dialTCP gave up on in the last 30 s,
// with the error and when: the next tests of the process that need one
// fail at once instead of waiting out 5 s each (a suite of 20 subtests on
// a missing server), and a server started again is seen after 30 s.
var unreachable sync.Map // addr -> refusal

type refusal struct {
	err error
	at  time.Time
}

// dialTCP tries addr for up to 5 s (a server that is just starting),
// unless it gave up on addr in the last 30 s.
func dialTCP(addr string) error {
	if r, ok := unreachable.Load(addr); ok && time.Since(r.(refusal).at) < 30*time.Second {
		return r.(refusal).err
	}
	err := dialTCPFor(addr)
	if err != nil {
		unreachable.Store(addr, refusal{err: err, at: time.Now()})
	} else {
		unreachable.Delete(addr)
	}
	return err
}

func dialTCPFor(addr string) error {
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return nil
		}
	}
	return err
}

// loginPostgres logs in to dsn, the way the tests do.
func loginPostgres(dsn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// Reach checks that the server of service ("postgres", "rabbitmq",
// "nats", "kafka", "sqs", "moto", "smtp", "mailpit") answers at the
// address the tests use: a TCP connection, and for PostgreSQL a login to
// FERRY_DATABASE_URL. It returns a *ServerError when it does not.
func Reach(service string) error {
	s := serverOf(service)
	addr := s.addr()
	if addr == "" {
		return fmt.Errorf("testenv: no address known for server %q", service)
	}
	if err := dialTCP(addr); err != nil {
		return newServerError(service, addr, err)
	}
	if service == "postgres" {
		if err := loginPostgres(DatabaseURL()); err != nil {
			return newServerError(service, addr, err)
		}
	}
	return nil
}

// Require fails the test, with ServerError's one line, unless every
// server of services answers (Reach) and is this checkout's
// (CheckOwnServer). A broker name of ferrycli.Brokers is a service.
func Require(t testing.TB, services ...string) {
	t.Helper()
	for _, service := range services {
		if err := Reach(service); err != nil {
			t.Fatal(err.Error())
		}
		if err := CheckOwnServer(service); err != nil {
			t.Fatal(err.Error())
		}
	}
}

// exitMu makes the first MustReach that fails the only one that prints:
// Examples reach their servers from several goroutines at once.
var exitMu sync.Mutex

// exitWith prints err's line on standard error and ends the test binary
// with status 1; it does not return.
func exitWith(err error) {
	exitMu.Lock() // never unlocked: the process ends here
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

// MustReach is Require for Examples and TestMain, which have no
// testing.TB: when a server of services does not answer, it prints the
// same line on standard error and ends the test binary with status 1 (an
// Example cannot fail otherwise than by its output, and a missing server
// must not read as a wrong output or a skip).
func MustReach(services ...string) {
	for _, service := range services {
		if err := Reach(service); err != nil {
			exitWith(err)
		}
		if err := CheckOwnServer(service); err != nil {
			exitWith(err)
		}
	}
}

// ExampleDatabase creates a fresh database on the server of
// FERRY_DATABASE_URL for an Example and returns its URL and a function
// that drops it. A server that cannot be reached or refuses the login
// ends the test binary as MustReach does; a failed CREATE DATABASE is
// returned.
func ExampleDatabase(ctx context.Context) (string, func(), error) {
	base := DatabaseURL()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		exitWith(newServerError("postgres", "", err))
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("ferry_example_%d_%d", os.Getpid(), dbSeq.Add(1))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, fmt.Errorf("testenv: create database %s: %w", name, err)
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, errors.New("testenv: FERRY_DATABASE_URL is not a URL")
	}
	u.Path = "/" + name
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(ctx)
		}
	}
	return u.String(), drop, nil
}
