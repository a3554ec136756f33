package broker

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
)

// SettleOp names a settlement: the Delivery method that was called. Its
// values are the op label of ferry_worker_settle_failures_total.
type SettleOp string

// The settlements.
const (
	// SettleAck is Delivery.Ack.
	SettleAck SettleOp = "ack"
	// SettleRetry is Delivery.Retry.
	SettleRetry SettleOp = "retry"
	// SettleDeadLetter is Delivery.DeadLetter.
	SettleDeadLetter SettleOp = "dead_letter"
	// SettleExtend is Delivery.Extend.
	SettleExtend SettleOp = "extend"
)

// Reasons of a failed settlement: a short, bounded classification of the
// broker's error (the reason label of ferry_worker_settle_failures_total).
// SettleReason returns one of them; the broker's own error text goes to
// the log, never into a label.
const (
	// ReasonClosed: the Broker was closed (ErrClosed).
	ReasonClosed = "closed"
	// ReasonConnection: the connection or channel the delivery came on is
	// gone, or the broker could not be reached.
	ReasonConnection = "connection"
	// ReasonTimeout: the settlement's deadline passed before the broker
	// answered.
	ReasonTimeout = "timeout"
	// ReasonCanceled: the settlement's context was cancelled.
	ReasonCanceled = "canceled"
	// ReasonExpired: the broker no longer lets this delivery be settled:
	// its lease ended and the message may be with another consumer (SQS:
	// a receipt handle that is invalid after the visibility timeout;
	// Kafka: the partition was revoked by a rebalance).
	ReasonExpired = "expired"
	// ReasonNotFound: the queue (or stream, topic) of the delivery no
	// longer exists.
	ReasonNotFound = "not_found"
	// ReasonThrottled: the broker refused the call because of its rate
	// limits; trying again later may work.
	ReasonThrottled = "throttled"
	// ReasonRefused: the broker answered with an error about the request
	// not covered by the reasons above.
	ReasonRefused = "refused"
	// ReasonAlreadySettled: the delivery was already settled
	// (ErrAlreadyAcked).
	ReasonAlreadySettled = "already_settled"
	// ReasonOther: any other error.
	ReasonOther = "other"
)

// SettleReasons lists every value SettleReason returns.
var SettleReasons = []string{ReasonClosed, ReasonConnection, ReasonTimeout, ReasonCanceled, ReasonExpired,
	ReasonNotFound, ReasonThrottled, ReasonRefused, ReasonAlreadySettled, ReasonOther}

// SettleError is an error of a settlement that an adapter classified:
// Reason is one of the Reason constants. Adapters wrap the errors of
// their broker that SettleReason cannot classify on its own (an API error
// code, a revoked partition) with SettleFault; Error and Unwrap are the
// wrapped error's.
type SettleError struct {
	// Reason is one of the Reason constants.
	Reason string
	// Err is the broker's error.
	Err error
}

// Error returns Err's text.
func (e *SettleError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *SettleError) Unwrap() error { return e.Err }

// SettleFault returns err wrapped in a *SettleError with reason, or nil
// when err is nil.
func SettleFault(reason string, err error) error {
	if err == nil {
		return nil
	}
	return &SettleError{Reason: reason, Err: err}
}

// SettleReason classifies the error of a settlement into one of the
// Reason constants: the Reason of the outermost *SettleError it wraps;
// else ReasonAlreadySettled for ErrAlreadyAcked, ReasonClosed for
// ErrClosed, ReasonTimeout for context.DeadlineExceeded or a network
// timeout, ReasonCanceled for context.Canceled, ReasonConnection for a
// network error (refused, reset, broken pipe, EOF, a closed connection);
// ReasonOther for anything else, and "" for nil.
func SettleReason(err error) string {
	if err == nil {
		return ""
	}
	var se *SettleError
	if errors.As(err, &se) && se.Reason != "" {
		return se.Reason
	}
	var ne net.Error
	switch {
	case errors.Is(err, ErrAlreadyAcked):
		return ReasonAlreadySettled
	case errors.Is(err, ErrClosed):
		return ReasonClosed
	case errors.Is(err, context.DeadlineExceeded):
		return ReasonTimeout
	case errors.Is(err, context.Canceled):
		return ReasonCanceled
	case errors.As(err, &ne) && ne.Timeout():
		return ReasonTimeout
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return ReasonConnection
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return ReasonConnection
	}
	return ReasonOther
}

// SettleFailure is one settlement the broker did not take.
type SettleFailure struct {
	// Op is the settlement.
	Op SettleOp
	// MessageID is the delivery's Message.ID.
	MessageID string
	// Reason is SettleReason(Err).
	Reason string
	// Err is the broker's error.
	Err error
	// Recovered is true for a failure an adapter worked around by itself:
	// it tried again in another way and the broker took the settlement
	// (SQS: an entry DeleteMessageBatch refused, deleted with
	// DeleteMessage), so the Delivery method returned nil. A failure the
	// adapter reports with Recovered false is followed by the Delivery
	// method's own error.
	Recovered bool
	// Next says what happens next, for the log, e.g. "deleting it on its
	// own with DeleteMessage".
	Next string
}

// SettleObserver receives the failures of settlements. It is called
// synchronously, possibly from several goroutines at once, and must be
// fast.
type SettleObserver func(SettleFailure)

type settleObserverKey struct{}

// WithSettleObserver returns a context carrying obs. A Delivery method
// called with such a context (or one derived from it) reports to obs,
// through ReportSettleFailure, the failures it handles inside the adapter
// and that its result does not show: package worker passes one to every
// settlement, so these failures are logged and counted like those the
// methods return.
func WithSettleObserver(ctx context.Context, obs SettleObserver) context.Context {
	return context.WithValue(ctx, settleObserverKey{}, obs)
}

// SettleObserverFrom returns the SettleObserver of ctx, or nil.
func SettleObserverFrom(ctx context.Context) SettleObserver {
	obs, _ := ctx.Value(settleObserverKey{}).(SettleObserver)
	return obs
}

// ReportSettleFailure passes f to the SettleObserver of ctx, if any,
// setting f.Reason from f.Err when empty. Adapters call it for a refusal
// they work around (f.Recovered) or that happened in a step their result
// does not name; it does nothing without an observer.
func ReportSettleFailure(ctx context.Context, f SettleFailure) {
	obs := SettleObserverFrom(ctx)
	if obs == nil {
		return
	}
	if f.Reason == "" {
		f.Reason = SettleReason(f.Err)
	}
	obs(f)
}
