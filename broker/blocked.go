package broker

import (
	"errors"
	"fmt"
)

// ErrBlocked is wrapped by the error of a Publish (the whole call's, or a
// *PublishError entry's) that the broker refused, or left unanswered,
// because it has no room for messages right now, not because of the
// messages: the server is reachable and says so. The cases the adapters
// map to it:
//
//   - RabbitMQ: a memory or disk alarm. The server sends
//     connection.blocked to the publishing connections and stops reading
//     from them until connection.unblocked (RabbitMQ docs, "Blocked
//     Connection Notifications" and "Memory and Disk Alarms"), so a
//     publish with confirms would wait forever; the adapter fails it with
//     ErrBlocked as soon as the notification comes, and fails the
//     publishes that follow at once until the alarm clears.
//   - Kafka: the partition leader refuses the write with
//     NOT_ENOUGH_REPLICAS or NOT_ENOUGH_REPLICAS_AFTER_APPEND (fewer
//     in-sync replicas than the topic's min.insync.replicas with acks=all)
//     or KAFKA_STORAGE_ERROR (its log directory is offline) (Kafka
//     protocol guide, "Error Codes").
//   - NATS JetStream: a stream with DiscardNew that reached MaxBytes,
//     MaxMsgs or MaxMsgsPerSubject ("maximum bytes exceeded", err_code
//     10077), or a server out of JetStream resources (err_codes 10023,
//     10047) (nats-server server/errors.json).
//
// It is not a message fault (IsMessageFault is false): the same messages
// are taken once the broker has room again, so a caller waits, as for an
// outage, without counting attempts. The outbox relay holds the rows,
// logs the reason once, reports it (outbox.Relay.Blocked,
// RelayConfig.OnBlocked) and resumes by itself. Use BlockedReason for the
// broker's reason.
var ErrBlocked = errors.New("broker: blocked, no room on the broker")

// BlockedError is the error an adapter returns for ErrBlocked: Reason is
// the broker's own words (RabbitMQ: the connection.blocked reason, e.g.
// "low on memory"; Kafka: the error code's name; JetStream: the API
// error's description), Err the underlying error (may be nil).
type BlockedError struct {
	Reason string
	Err    error
}

// Error returns "broker: blocked, no room on the broker: <Reason>".
func (e *BlockedError) Error() string {
	s := ErrBlocked.Error()
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	if e.Err != nil && (e.Reason == "" || e.Err.Error() != e.Reason) {
		s += " (" + e.Err.Error() + ")"
	}
	return s
}

// Unwrap returns ErrBlocked and Err, so that errors.Is finds both.
func (e *BlockedError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrBlocked}
	}
	return []error{ErrBlocked, e.Err}
}

// Blocked returns a *BlockedError with the broker's reason and the
// underlying error (which may be nil).
func Blocked(reason string, err error) error {
	return &BlockedError{Reason: reason, Err: err}
}

// BlockedReason reports whether err wraps ErrBlocked, with the broker's
// reason: the first *BlockedError's Reason, or err's text when ErrBlocked
// was wrapped without one. For a *PublishError it looks at every entry.
func BlockedReason(err error) (reason string, ok bool) {
	if err == nil {
		return "", false
	}
	var pe *PublishError
	if errors.As(err, &pe) {
		for _, f := range pe.Failed {
			if r, ok := BlockedReason(f.Err); ok {
				return r, true
			}
		}
		return "", false
	}
	if !errors.Is(err, ErrBlocked) {
		return "", false
	}
	var be *BlockedError
	if errors.As(err, &be) && be.Reason != "" {
		return be.Reason, true
	}
	return fmt.Sprint(err), true
}
