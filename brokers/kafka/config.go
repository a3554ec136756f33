package kafka

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/ferrymq/ferry/broker"
)

// Config configures the Kafka adapter. The zero value of every field means
// the documented default, so Config{} connects to 127.0.0.1:9092.
type Config struct {
	// Brokers are the bootstrap addresses, host:port. Defaults to
	// ["127.0.0.1:9092"] (ferry's --kafka-brokers default).
	Brokers []string
	// Partitions is the partition count of the work and retry topics
	// Declare creates. Defaults to 3. An existing topic with another count
	// makes Declare fail with broker.ErrTopologyMismatch: adding partitions
	// moves keys to other partitions and breaks per-key order.
	Partitions int
	// ReplicationFactor of the topics Declare creates. Defaults to 0: the
	// broker's default.replication.factor, read at New. Production clusters
	// want 3 (with min.insync.replicas=2, so RequireAll means two copies).
	ReplicationFactor int
	// PublishTimeout bounds a Publish (and a retry or DLQ write) whose
	// context has no deadline, and each produce request of one. Defaults
	// to 30s.
	PublishTimeout time.Duration
	// DialTimeout bounds a TCP connection to a broker. Defaults to 5s.
	DialTimeout time.Duration
	// SessionTimeout is the consumer group session timeout: a worker that
	// sends no heartbeat for that long loses its partitions; it is also
	// the group's rebalance timeout. Defaults to 10s. The broker accepts
	// group.min.session.timeout.ms to group.max.session.timeout.ms (6 s to
	// 30 min by default); Subscribe refuses a value outside that range
	// with broker.ErrUnsupported, naming both.
	SessionTimeout time.Duration
	// ClientID names the connections in the broker's logs and quotas.
	// Defaults to "ferry".
	ClientID string
	// Logger receives the adapter's logs. Defaults to slog.Default().
	Logger *slog.Logger
}

// Defaults of Config.
const (
	// DefaultBroker is the bootstrap address when Config.Brokers is empty.
	DefaultBroker = "127.0.0.1:9092"
	// DefaultPartitions is Config.Partitions' default.
	DefaultPartitions = 3
	// DefaultPublishTimeout is Config.PublishTimeout's default.
	DefaultPublishTimeout = 30 * time.Second
	// DefaultDialTimeout is Config.DialTimeout's default.
	DefaultDialTimeout = 5 * time.Second
	// DefaultSessionTimeout is Config.SessionTimeout's default.
	DefaultSessionTimeout = 10 * time.Second
)

func (c Config) withDefaults() Config {
	var bs []string
	for _, b := range c.Brokers {
		if b = strings.TrimSpace(b); b != "" {
			bs = append(bs, b)
		}
	}
	if len(bs) == 0 {
		bs = []string{DefaultBroker}
	}
	c.Brokers = bs
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.ClientID == "" {
		c.ClientID = "ferry"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks c with the defaults applied, as New does before it
// connects: every bootstrap address must be host:port with a port
// 1..65535, the counts and durations in range. It needs no server. The
// error is a *broker.ConfigError naming the field (several joined with
// errors.Join when several fields are wrong), wrapping
// broker.ErrInvalidConfig.
func (c Config) Validate() error { return c.withDefaults().validate() }

func (c Config) validate() error {
	bad := func(field, value, format string, args ...any) error {
		return &broker.ConfigError{Adapter: "kafka", Field: field, Value: value, Reason: fmt.Sprintf(format, args...)}
	}
	var errs []error
	for _, b := range c.Brokers {
		if reason := checkAddr(b); reason != "" {
			errs = append(errs, bad("Brokers", b, "%s", reason))
		}
	}
	if c.Partitions < 1 {
		errs = append(errs, bad("Partitions", "", "%d: want at least 1", c.Partitions))
	}
	if c.ReplicationFactor < 0 {
		errs = append(errs, bad("ReplicationFactor", "", "%d: want 0 (broker default) or more", c.ReplicationFactor))
	}
	if c.PublishTimeout < 0 {
		errs = append(errs, bad("PublishTimeout", "", "%v: must not be negative", c.PublishTimeout))
	}
	if c.DialTimeout < 0 {
		errs = append(errs, bad("DialTimeout", "", "%v: must not be negative", c.DialTimeout))
	}
	if c.SessionTimeout < 0 {
		errs = append(errs, bad("SessionTimeout", "", "%v: must not be negative", c.SessionTimeout))
	}
	return errors.Join(errs...)
}

// checkAddr returns what is wrong with one bootstrap address, or "".
func checkAddr(addr string) string {
	const want = "want host:port, e.g. 127.0.0.1:9092"
	if strings.Contains(addr, "://") {
		return "a URL; " + want + " (no scheme)"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return want
	}
	if host == "" {
		return "no host; " + want
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Sprintf("port %q: want 1..65535", port)
	}
	return ""
}
