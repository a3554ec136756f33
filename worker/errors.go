package worker

import (
	"errors"
	"fmt"
	"time"
)

// The errors that are part of the API; test with errors.Is.
var (
	// ErrInvalidConfig is wrapped by the errors New returns for a Config it
	// refuses; the message names the field.
	ErrInvalidConfig = errors.New("worker: invalid config")
	// ErrPanic is wrapped by the error that stands for a handler (or
	// OnFailure) panic. The panic is recovered and the attempt counts as an
	// ordinary failed attempt: it is retried under the policy.
	ErrPanic = errors.New("worker: handler panicked")
	// ErrNoMessageID is the reason a message without an ID is dead-lettered
	// at once: it cannot be deduplicated.
	ErrNoMessageID = errors.New("worker: message has no ID")
	// ErrHandlerTimeout is wrapped by the error of an attempt that
	// overran its timeout (Config.HandlerTimeout, TypeOptions.Timeout): an
	// ordinary failed attempt, retried under the policy.
	ErrHandlerTimeout = errors.New("worker: handler timed out")
	// ErrAlreadyRunning is returned by Run when the Worker is already running.
	ErrAlreadyRunning = errors.New("worker: already running")
)

// PermanentError marks a handler error that retrying cannot fix: the message
// goes straight to the DLQ with Err's text as the reason. Create it with
// Permanent.
type PermanentError struct {
	// Err is the cause; may be nil.
	Err error
}

// Permanent wraps err so that the worker dead-letters the message at once,
// whatever attempt it is, with err's text as HeaderLastError. The model is
// river's JobCancel. errors.Is/As see through it to err.
func Permanent(err error) error { return &PermanentError{Err: err} }

// Error returns the text of Err (the DLQ reason), or "permanent failure"
// when Err is nil.
func (e *PermanentError) Error() string {
	if e.Err == nil {
		return "permanent failure"
	}
	return e.Err.Error()
}

// Unwrap returns Err.
func (e *PermanentError) Unwrap() error { return e.Err }

// IsPermanent reports whether err is or wraps a *PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// RetryAfterError asks for the next attempt after a specific delay instead
// of the policy's. Create it with RetryAfter.
type RetryAfterError struct {
	// Err is the cause; may be nil.
	Err error
	// Delay is the wanted delay before the next attempt; a non-positive
	// Delay means "the policy's delay".
	Delay time.Duration
}

// RetryAfter wraps err so that, when the policy allows another attempt, it
// happens after d instead of the policy's delay (e.g. an SMTP server's
// "try again in 5 minutes"). The attempt still counts: after the policy's
// last attempt the message goes to the DLQ. On brokers without
// Capabilities.NativeDelay d is rounded up to the next declared retry level
// (broker.Delivery.Retry); a d above Capabilities.MaxDelay is cut to it.
// For a "come back later" that must not spend an attempt (a provider's
// 429), use Snooze (ferry.RetryAfter) instead: the attempt number stays
// as it was.
func RetryAfter(err error, d time.Duration) error { return &RetryAfterError{Err: err, Delay: d} }

// Error returns the text of Err, or "retry after <Delay>" when Err is nil.
func (e *RetryAfterError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("retry after %v", e.Delay)
	}
	return e.Err.Error()
}

// Unwrap returns Err.
func (e *RetryAfterError) Unwrap() error { return e.Err }
