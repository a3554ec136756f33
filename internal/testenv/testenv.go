// Package testenv gives integration tests the addresses of the real servers
// started by compose/local/services.sh, fresh isolated databases, and a way
// to stop and start a server for outage tests.
//
// Addresses come from the same environment variables the CLI reads
// (FERRY_DATABASE_URL, FERRY_RABBITMQ_URL, ...), with the CLI's loopback
// defaults. A server that does not answer, or refuses the login, fails the
// test (Require, RequireTCP, NewDatabase) or, in an Example, ends the test
// binary with status 1 (MustReach, ExampleDatabase), with one line that
// names the server, the address tried, the variable that sets it and the
// command that starts it (ServerError): integration tests never skip
// because a service is missing.
package testenv

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Env returns the environment variable name, or def when it is unset.
func Env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// DatabaseURL is FERRY_DATABASE_URL, default postgres://ferry:ferry@127.0.0.1:5432/ferry.
func DatabaseURL() string {
	return Env("FERRY_DATABASE_URL", "postgres://ferry:ferry@127.0.0.1:5432/ferry")
}

// RabbitMQURL is FERRY_RABBITMQ_URL, default amqp://guest:guest@127.0.0.1:5672/.
func RabbitMQURL() string { return Env("FERRY_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/") }

// RabbitMQManagementURL is FERRY_RABBITMQ_MANAGEMENT_URL, default
// http://guest:guest@127.0.0.1:15672 (the management plugin's HTTP API).
func RabbitMQManagementURL() string {
	return Env("FERRY_RABBITMQ_MANAGEMENT_URL", "http://guest:guest@127.0.0.1:15672")
}

// NATSURL is FERRY_NATS_URL, default nats://127.0.0.1:4222.
func NATSURL() string { return Env("FERRY_NATS_URL", "nats://127.0.0.1:4222") }

// KafkaBrokers is FERRY_KAFKA_BROKERS split at commas, default
// [127.0.0.1:9092].
func KafkaBrokers() []string {
	var out []string
	for _, b := range strings.Split(Env("FERRY_KAFKA_BROKERS", "127.0.0.1:9092"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// SMTPAddr is FERRY_SMTP_ADDR, default 127.0.0.1:1025 (Mailpit's SMTP).
func SMTPAddr() string { return Env("FERRY_SMTP_ADDR", "127.0.0.1:1025") }

// MailpitURL is FERRY_MAILPIT_URL, default http://127.0.0.1:8025 (Mailpit's HTTP API).
func MailpitURL() string { return Env("FERRY_MAILPIT_URL", "http://127.0.0.1:8025") }

// RequireTCP fails the test unless addr (host:port) accepts a TCP
// connection within 5 s and the server there is this checkout's
// (CheckOwnServer); for service "postgres" at FERRY_DATABASE_URL's
// address it also logs in. The message is ServerError's line: the
// server, addr, the variable that sets it and the command that starts it.
func RequireTCP(t testing.TB, service, addr string) {
	t.Helper()
	if err := dialTCP(addr); err != nil {
		t.Fatal(newServerError(service, addr, err).Error())
	}
	if service == "postgres" && addr == HostPort(DatabaseURL()) {
		if err := loginPostgres(DatabaseURL()); err != nil {
			t.Fatal(newServerError(service, addr, err).Error())
		}
	}
	if err := CheckOwnServer(service); err != nil {
		t.Fatal(err.Error())
	}
}

// Names of the environment variables with which compose/local/services.sh
// env says which servers belong to this checkout (CheckOwnServer).
const (
	// EnvPostgresCheckout is the value of the setting ferry.checkout that
	// services.sh sets on the role of FERRY_DATABASE_URL.
	EnvPostgresCheckout = "FERRY_POSTGRES_CHECKOUT"
	// EnvRabbitMQNode is the RabbitMQ node name of this checkout.
	EnvRabbitMQNode = "FERRY_RABBITMQ_NODE"
	// EnvNATSServerName is the NATS server name of this checkout.
	EnvNATSServerName = "FERRY_NATS_SERVER_NAME"
)

// CheckOwnServer returns an error when the server of service ("postgres",
// "rabbitmq" or "nats") at the address the tests use is not the one this
// checkout's compose/local/services.sh runs: another checkout's server
// that took a port this checkout freed (services.sh stop), seen in outage
// tests. It compares the server's name (PostgreSQL: the role setting
// ferry.checkout) with the one services.sh env exported; without that
// variable (servers not started by services.sh) it checks nothing. The
// per-checkout passwords services.sh sets make another checkout's server
// refuse the login, which is reported the same way.
func CheckOwnServer(service string) error {
	hint := "another checkout's server may have taken the port this checkout's server freed (compose/local/services.sh stop): run compose/local/services.sh status and up, then eval \"$(compose/local/services.sh env)\" again"
	switch service {
	case "postgres":
		want := os.Getenv(EnvPostgresCheckout)
		if want == "" {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, DatabaseURL())
		if err != nil {
			return fmt.Errorf("testenv: the PostgreSQL server at %s refused this checkout's login (%v); %s", HostPort(DatabaseURL()), err, hint)
		}
		defer conn.Close(ctx)
		var got string
		if err := conn.QueryRow(ctx, "SELECT coalesce(current_setting('ferry.checkout', true), '')").Scan(&got); err != nil {
			return fmt.Errorf("testenv: PostgreSQL at %s: read ferry.checkout: %w", HostPort(DatabaseURL()), err)
		}
		if got != want {
			return fmt.Errorf("testenv: the PostgreSQL server at %s belongs to checkout %q, not to this one (%q); %s", HostPort(DatabaseURL()), got, want, hint)
		}
	case "rabbitmq":
		want := os.Getenv(EnvRabbitMQNode)
		if want == "" {
			return nil
		}
		got, err := rabbitNode()
		if err != nil {
			return fmt.Errorf("testenv: RabbitMQ at %s: %v; %s", HostPort(RabbitMQManagementURL()), err, hint)
		}
		if got != want {
			return fmt.Errorf("testenv: the RabbitMQ server at %s is node %q, not this checkout's %q; %s", HostPort(RabbitMQURL()), got, want, hint)
		}
	case "nats":
		want := os.Getenv(EnvNATSServerName)
		if want == "" {
			return nil
		}
		got, err := natsServerName(HostPort(NATSURL()))
		if err != nil {
			return fmt.Errorf("testenv: NATS at %s: %v; %s", HostPort(NATSURL()), err, hint)
		}
		if got != want {
			return fmt.Errorf("testenv: the NATS server at %s is %q, not this checkout's %q; %s", HostPort(NATSURL()), got, want, hint)
		}
	}
	return nil
}

// rabbitNode asks the management API of RabbitMQManagementURL, with its
// credentials, for the node's name.
func rabbitNode() (string, error) {
	u, err := url.Parse(RabbitMQManagementURL())
	if err != nil {
		return "", err
	}
	req, err := http.NewRequest(http.MethodGet, u.Scheme+"://"+u.Host+"/api/overview", nil)
	if err != nil {
		return "", err
	}
	if u.User != nil {
		pw, _ := u.User.Password()
		req.SetBasicAuth(u.User.Username(), pw)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized {
		return "", errors.New("the management API refused this checkout's credentials (401)")
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /api/overview: %s", resp.Status)
	}
	var ov struct {
		Node string `json:"node"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ov); err != nil {
		return "", fmt.Errorf("GET /api/overview: %w", err)
	}
	return ov.Node, nil
}

// natsServerName reads the INFO line a NATS server sends first on every
// connection and returns its server_name.
func natsServerName(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read INFO: %w", err)
	}
	js, ok := strings.CutPrefix(strings.TrimSpace(line), "INFO ")
	if !ok {
		return "", fmt.Errorf("not a NATS server: first line %q", line)
	}
	var info struct {
		Name string `json:"server_name"`
	}
	if err := json.Unmarshal([]byte(js), &info); err != nil {
		return "", fmt.Errorf("INFO: %w", err)
	}
	return info.Name, nil
}

// HostPort returns host:port of a URL such as amqp://u:p@h:5672/.
func HostPort(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	return u.Host
}

var dbSeq atomic.Int64

// NewDatabase creates a fresh, empty database on the server of
// DatabaseURL, drops it when the test ends, and returns its URL. Each test
// that calls it sees only its own rows.
func NewDatabase(t testing.TB) string {
	t.Helper()
	base := DatabaseURL()
	RequireTCP(t, "postgres", HostPort(base))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(newServerError("postgres", "", err).Error())
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("ferry_test_%d_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9, dbSeq.Add(1))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testenv: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("testenv: drop database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		// A logical replication slot (the WAL relay's) keeps its
		// database from being dropped: end its stream and drop it first.
		if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, name); err != nil {
			t.Logf("testenv: end the replication streams of %s: %v", name, err)
		}
		for range 50 {
			if _, err = c.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond) // a terminated stream lets go of its slot
		}
		if err != nil {
			t.Logf("testenv: drop the replication slots of %s: %v", name, err)
		}
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("testenv: drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("testenv: FERRY_DATABASE_URL is not a URL: %v", errors.Unwrap(err))
	}
	u.Path = "/" + name
	return u.String()
}

// NewPool returns a pool on a fresh database from NewDatabase, closed when
// the test ends.
func NewPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatalf("testenv: pool %s: %v", dsn, err)
	}
	t.Cleanup(pool.Close)
	return pool, dsn
}

// UniqueName returns prefix plus a suffix unique to this process and call,
// for exchange and queue names that must not collide between tests.
func UniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid()%100000, dbSeq.Add(1))
}

// RepoRoot returns the repository root (the folder holding go.mod).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Services runs compose/local/services.sh with args (e.g. "stop",
// "rabbitmq") and fails the test if it fails. Outage tests use it to stop
// and start a server; such tests must not call t.Parallel, and the test
// command runs packages one at a time (go test -p 1).
func Services(t testing.TB, args ...string) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{filepath.Join(RepoRoot(), "compose", "local", "services.sh")}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("testenv: services.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// ClosedPort returns "127.0.0.1:N" for a loopback port that was free a
// moment ago and has nothing listening: connecting to it is refused.
func ClosedPort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: listen: %v", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}
