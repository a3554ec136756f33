// Package testenv gives integration tests the addresses of the real servers
// started by compose/local/services.sh, fresh isolated databases, and a way
// to stop and start a server for outage tests.
//
// Addresses come from the same environment variables the CLI reads
// (FERRY_DATABASE_URL, FERRY_RABBITMQ_URL, ...), with the CLI's loopback
// defaults. A server that does not answer fails the test: integration tests
// never skip because a service is missing.
package testenv

import (
	"context"
	"fmt"
	"net"
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
// connection within 5 s. The message names the service and how to start it.
func RequireTCP(t testing.TB, service, addr string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var c net.Conn
		c, err = net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
	}
	t.Fatalf("testenv: %s is not reachable at %s (%v); start it with: compose/local/services.sh up %s", service, addr, err, service)
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
		t.Fatalf("testenv: connect %s: %v", base, err)
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
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("testenv: drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", base, err)
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
