package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	mail "github.com/wneessen/go-mail"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
)

// Names of the event and of the broker objects the service uses.
const (
	// EventNotificationRequested is the outbox event type (and routing key)
	// enqueued for every accepted notification; its body is a
	// RequestedEvent in JSON.
	EventNotificationRequested = "notification.requested"
	// DefaultExchange is Config.Exchange's default.
	DefaultExchange = "notifications"
	// DefaultQueue is Config.Queue's default.
	DefaultQueue = "notifications.send"
)

// Defaults of Config's zero fields.
const (
	// DefaultSMTPAddr is Config.SMTPAddr's default (Mailpit's SMTP port).
	DefaultSMTPAddr = "127.0.0.1:1025"
	// DefaultSMTPFrom is Config.SMTPFrom's default.
	DefaultSMTPFrom = "ferry@localhost"
	// DefaultSMTPTimeout is Config.SMTPTimeout's default.
	DefaultSMTPTimeout = 10 * time.Second
	// DefaultSMTPDataTimeout is Config.SMTPDataTimeout's default: the
	// 10 minutes RFC 5321 section 4.5.3.2.6 ("DATA Termination: 10
	// minutes") says a client should wait for the reply to the end of the
	// mail data, since the server may process the mail before answering.
	DefaultSMTPDataTimeout = 10 * time.Minute
	// DefaultMaxBodyBytes is Config.MaxBodyBytes's default: 64 KiB.
	DefaultMaxBodyBytes = 64 << 10
)

// Notification statuses.
const (
	// StatusPending: accepted, not yet delivered.
	StatusPending = "pending"
	// StatusSent: the SMTP server accepted the mail.
	StatusSent = "sent"
	// StatusDead: the last attempt failed; LastError says why.
	StatusDead = "dead"
)

// The errors that are part of the API.
var (
	// ErrNotFound is returned by Status for an id no notification has
	// (including ids that are not positive decimal integers).
	ErrNotFound = errors.New("app: notification not found")
	// ErrConfig is wrapped by New's errors for an invalid Config.
	ErrConfig = errors.New("app: invalid config")
	// ErrDeliveryUnknown is wrapped by HandleNotification's error when the
	// whole mail was sent but the SMTP server's reply to the end of the
	// data did not arrive (Config.SMTPDataTimeout expired, or the
	// connection was cut): the server may have accepted the mail. The
	// error is retryable, so the mail may be sent again (same Message-ID);
	// see "Delivery semantics" in the package doc.
	ErrDeliveryUnknown = errors.New("app: the SMTP server may have accepted the mail; its reply to the end of the data did not arrive, so a retry may send a second copy (same Message-ID)")
)

// Config configures the notification service. The zero value of every
// field but Pool means its documented default.
type Config struct {
	// Pool is the PostgreSQL pool holding the notifications and outbox
	// tables (see Migrate and outbox.Migrate). Required.
	Pool *pgxpool.Pool
	// SMTPAddr is the SMTP server, host:port. No TLS and no authentication
	// are used (a local relay such as Mailpit). Defaults to 127.0.0.1:1025.
	SMTPAddr string
	// SMTPFrom is the envelope and header sender address. Defaults to
	// ferry@localhost.
	SMTPFrom string
	// SMTPTimeout bounds connecting to the SMTP server and the SMTP
	// dialogue up to the end of the mail data, and QUIT after the reply
	// to it. Defaults to 10s.
	SMTPTimeout time.Duration
	// SMTPDataTimeout bounds the wait for the server's reply to the end
	// of the mail data (the final "."), when the server has the whole
	// mail and decides. Defaults to 10 minutes, as RFC 5321 section
	// 4.5.3.2.6 recommends. When it expires the outcome is unknown and
	// the error wraps ErrDeliveryUnknown. A worker shutting down also
	// waits for this reply (bounded by the worker's ShutdownTimeout).
	SMTPDataTimeout time.Duration
	// DebugFailAfterOutbox makes POST /notifications fail with 500 right
	// after the outbox INSERT, inside the transaction, so neither the
	// notification nor the outbox row remains. For demonstrating the
	// transactional outbox only. Defaults to false.
	DebugFailAfterOutbox bool
	// Logger receives the service's log lines. Defaults to a logger that
	// discards everything.
	Logger *slog.Logger
	// MaxBodyBytes bounds the "body" field, in bytes of UTF-8; a larger body
	// is refused with 413. The whole HTTP request may be up to
	// 6*MaxBodyBytes+64 KiB, so a body at the limit fits even when every
	// character is JSON-escaped. Defaults to 65536 (64 KiB).
	MaxBodyBytes int
	// Exchange is the topology's exchange. Defaults to "notifications".
	Exchange string
	// Destination is the outbox destination the API enqueues its events
	// for (outbox.Event.Destination); the relay publishing them must have
	// the same outbox.RelayConfig.Destination. Defaults to
	// outbox.DefaultDestination.
	Destination string
	// Queue is the work queue bound to EventNotificationRequested.
	// Defaults to "notifications.send".
	Queue string
}

func (c Config) withDefaults() Config {
	if c.SMTPAddr == "" {
		c.SMTPAddr = DefaultSMTPAddr
	}
	if c.SMTPFrom == "" {
		c.SMTPFrom = DefaultSMTPFrom
	}
	if c.SMTPTimeout == 0 {
		c.SMTPTimeout = DefaultSMTPTimeout
	}
	if c.SMTPDataTimeout == 0 {
		c.SMTPDataTimeout = DefaultSMTPDataTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Exchange == "" {
		c.Exchange = DefaultExchange
	}
	if c.Queue == "" {
		c.Queue = DefaultQueue
	}
	return c
}

func (c Config) validate() error {
	if c.Pool == nil {
		return fmt.Errorf("%w: Pool is required", ErrConfig)
	}
	host, port, err := net.SplitHostPort(c.SMTPAddr)
	if err != nil || host == "" {
		return fmt.Errorf("%w: SMTPAddr %q: want host:port", ErrConfig, c.SMTPAddr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%w: SMTPAddr %q: port must be 1..65535", ErrConfig, c.SMTPAddr)
	}
	if e := checkAddress(c.SMTPFrom); e != nil {
		return fmt.Errorf("%w: SMTPFrom %q: not a bare email address", ErrConfig, c.SMTPFrom)
	}
	if c.SMTPTimeout < 0 {
		return fmt.Errorf("%w: SMTPTimeout %v: must be positive", ErrConfig, c.SMTPTimeout)
	}
	if c.SMTPDataTimeout < 0 {
		return fmt.Errorf("%w: SMTPDataTimeout %v: must be positive", ErrConfig, c.SMTPDataTimeout)
	}
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("%w: MaxBodyBytes %d: must be positive", ErrConfig, c.MaxBodyBytes)
	}
	if err := outbox.ValidateDestination(c.Destination); err != nil {
		return fmt.Errorf("%w: Destination %q: %v", ErrConfig, c.Destination, err)
	}
	t := broker.Topology{Exchange: c.Exchange, Queues: []broker.Queue{{Name: c.Queue, Bindings: []string{EventNotificationRequested}}}}
	if err := t.Validate(); err != nil {
		return fmt.Errorf("%w: Exchange/Queue: %v", ErrConfig, err)
	}
	return nil
}

// App is the notification service: its HTTP API, its event handler and
// its failure hook. Its methods may be called concurrently.
type App struct {
	cfg        Config
	pool       *pgxpool.Pool
	log        *slog.Logger
	mail       *mail.Client
	fromDomain string
	// schemaOK is set once CheckSchema passed; the schema is not checked
	// again (migrations only move forward).
	schemaOK atomic.Bool
	// lastUnready is the last reason /readyz gave (a string; "" when
	// ready), to log each change once.
	lastUnready atomic.Value
	// mux routes the worker's messages to the typed handlers.
	mux *ferry.Mux
}

// New checks cfg, applies the defaults and returns the service. It does
// not connect to anything; call Migrate (and outbox.Migrate) first. Errors
// wrap ErrConfig and name the field.
func New(cfg Config) (*App, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	host, portS, _ := net.SplitHostPort(cfg.SMTPAddr)
	port, _ := strconv.Atoi(portS)
	mc, err := mail.NewClient(host,
		mail.WithPort(port),
		mail.WithTLSPolicy(mail.NoTLS),
		mail.WithTimeout(cfg.SMTPTimeout),
		// One connection per mail, closed after it: no RSET after the
		// accept, one round trip less between the accept and the commit.
		mail.WithoutRset(),
		mail.WithDialContextFunc(dialSMTP),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: SMTP client: %v", ErrConfig, err)
	}
	a := &App{
		cfg:        cfg,
		pool:       cfg.Pool,
		log:        cfg.Logger,
		mail:       mc,
		fromDomain: cfg.SMTPFrom[strings.LastIndexByte(cfg.SMTPFrom, '@')+1:],
	}
	if a.mux, err = a.newMux(); err != nil {
		return nil, err
	}
	return a, nil
}

// Topology returns what the service needs declared: exchange Config.Exchange
// ("notifications") with queue Config.Queue ("notifications.send") bound to
// EventNotificationRequested, retrying after retryDelays (nil: the broker
// default, see broker.Queue.RetryDelays).
func (a *App) Topology(retryDelays []time.Duration) broker.Topology {
	return broker.Topology{
		Exchange: a.cfg.Exchange,
		Queues: []broker.Queue{{
			Name:        a.cfg.Queue,
			Bindings:    []string{EventNotificationRequested},
			RetryDelays: append([]time.Duration(nil), retryDelays...),
		}},
	}
}

// Queue returns the name of the work queue whose messages HandleNotification
// handles (Config.Queue).
func (a *App) Queue() string { return a.cfg.Queue }

// Ping reports whether the database answers within ctx (at most 2s when
// ctx has no deadline).
func (a *App) Ping(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
	}
	if err := a.pool.Ping(ctx); err != nil {
		return fmt.Errorf("app: database: %w", err)
	}
	return nil
}

// Ready reports whether the service can take requests: the database
// answers within ctx (at most 2s when ctx has no deadline) and has the
// schema (CheckSchema; checked until it first passes, then remembered).
// The error wraps the database's error or is a *SchemaError.
func (a *App) Ready(ctx context.Context) error {
	_, err := a.ready(ctx)
	return err
}

// ready is Ready plus a reason fit for an HTTP answer: it names neither
// users, hosts nor databases.
func (a *App) ready(ctx context.Context) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
	}
	if err := a.Ping(ctx); err != nil {
		return "the database does not answer", err
	}
	if a.schemaOK.Load() {
		return "", nil
	}
	err := CheckSchema(ctx, a.pool)
	var se *SchemaError
	if errors.As(err, &se) {
		return se.Reason() + `: run "ferry migrate"`, err
	}
	if err != nil {
		return "the database schema could not be checked", err
	}
	a.schemaOK.Store(true)
	return "", nil
}
