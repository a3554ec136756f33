package broker

import (
	"errors"
	"fmt"
)

// Errors of an adapter's constructor (New): which failures to connect are
// worth waiting out. A caller that waits for its broker (ferry relay and
// worker started before the broker) retries an error for which IsPermanent
// is false and stops at once on the others.
var (
	// ErrInvalidConfig is wrapped by the error of an adapter's New (and of
	// its Config.Validate) for a Config it refuses before any network
	// access: a malformed URL, an unknown scheme, an address without a
	// port, a negative timeout. The error is a *ConfigError naming the
	// field. Connecting again with the same Config fails the same way.
	ErrInvalidConfig = errors.New("broker: invalid configuration")
	// ErrRefused is wrapped by the error of an adapter's New when the
	// server answered and refused the connection for a reason that waiting
	// does not cure: authentication failed (a wrong user or password,
	// credentials the server does not know), the user may not use what
	// the Config names (RabbitMQ: a vhost that does not exist or is not
	// allowed, AMQP 403 ACCESS_REFUSED and 530 NOT_ALLOWED; NATS:
	// Authorization Violation; SQS: an unknown access key or a bad
	// signature). Declare wraps it too when the server refuses the user's
	// permissions on the objects (RabbitMQ: 403 ACCESS_REFUSED on a
	// declaration). The error keeps the server's own words. Errors that can
	// pass (connection refused, timeouts, DNS failures, a server that is
	// starting) never wrap it.
	ErrRefused = errors.New("broker: refused by the server")
)

// ConfigError is an adapter Config field the adapter refuses; it wraps
// ErrInvalidConfig. Callers that map Config fields to their own settings
// (the ferry command's flags) use Adapter and Field to name theirs.
type ConfigError struct {
	// Adapter is the adapter's name, as in Capabilities.Name ("rabbitmq").
	Adapter string
	// Field is the Config field, e.g. "URL", "Brokers", "Endpoint".
	Field string
	// Value is the refused value as text (passwords hidden), or "" when
	// the value says nothing more than the reason (a negative duration is
	// shown in Reason).
	Value string
	// Reason says what is wrong and what is expected, e.g. "want
	// host:port, e.g. 127.0.0.1:9092".
	Reason string
}

// Error implements error: "<adapter>: Config.<Field> "<value>": <reason>".
func (e *ConfigError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s: Config.%s: %s", e.Adapter, e.Field, e.Reason)
	}
	return fmt.Sprintf("%s: Config.%s %q: %s", e.Adapter, e.Field, e.Value, e.Reason)
}

// Unwrap returns ErrInvalidConfig, so errors.Is(err, ErrInvalidConfig)
// holds for every *ConfigError.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// IsPermanent reports whether err, returned by an adapter's New or by
// Declare, will come back unchanged when the same call is made again:
// ErrInvalidConfig (a Config the adapter refuses), ErrRefused (the server
// refused the credentials, the vhost or the permissions), ErrTopologyMismatch and
// ErrUnsupported. Anything else, including context errors, is a failure
// that can pass (an unreachable server, a timeout, a DNS failure), worth
// retrying with a backoff.
func IsPermanent(err error) bool {
	return errors.Is(err, ErrInvalidConfig) || errors.Is(err, ErrRefused) ||
		errors.Is(err, ErrTopologyMismatch) || errors.Is(err, ErrUnsupported)
}
