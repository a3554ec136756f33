package ferry

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferrymq/ferry/worker"
)

// HandleOption sets one of an event type's own settings at registration
// (Handle, Mux.Handle), in place of the worker's: worker.TypeOptions. The
// worker applies them when the Mux is its worker.Config.Router, and
// worker.New and Worker.Run check them against the broker's capabilities
// like the worker's own settings (delays a broker without native delays
// cannot keep, beyond its MaxDelay, are refused with
// broker.ErrUnsupported). The model is River's per-kind MaxAttempts and
// Timeout.
type HandleOption func(*worker.TypeOptions) error

// WithMaxAttempts sets the number of attempts, the first included, after
// which a message of the type goes to the DLQ; 1 means no retry. It
// replaces the worker's policy's count for the type (the delays stay the
// worker's unless WithRetryDelays sets them). n below 1 is refused.
func WithMaxAttempts(n int) HandleOption {
	return func(o *worker.TypeOptions) error {
		if n < 1 {
			return fmt.Errorf("WithMaxAttempts(%d): want at least 1", n)
		}
		o.MaxAttempts = n
		return nil
	}
}

// WithRetryDelays sets the type's backoff list: the delay before retry i
// (1-based) is delays[min(i-1, len-1)], as worker.BackoffPolicy.Delays.
// It replaces the worker's delays for the type (the count of attempts
// stays the worker's unless WithMaxAttempts sets it). Each delay must be
// positive, and on a broker without native delays (RabbitMQ, Kafka: only
// the queue's declared retry levels exist) one of the queue's
// broker.Queue.RetryDelays, which the worker checks at start. No delay
// is refused.
func WithRetryDelays(delays ...time.Duration) HandleOption {
	return func(o *worker.TypeOptions) error {
		if len(delays) == 0 {
			return fmt.Errorf("WithRetryDelays(): no delay")
		}
		for i, d := range delays {
			if d <= 0 {
				return fmt.Errorf("WithRetryDelays: delay %d (%v): must be positive", i, d)
			}
		}
		o.RetryDelays = slices.Clone(delays)
		return nil
	}
}

// WithTimeout bounds each attempt of a message of the type, in place of
// worker.Config.HandlerTimeout: the handler's ctx is cancelled after d,
// and the attempt fails with an error wrapping worker.ErrHandlerTimeout
// (retried under the type's policy). A handler that ignores its ctx is
// abandoned worker.HandlerTimeoutGrace later: its transaction is rolled
// back and the delivery settled as a failed attempt, never left held. d
// must be positive.
func WithTimeout(d time.Duration) HandleOption {
	return func(o *worker.TypeOptions) error {
		if d <= 0 {
			return fmt.Errorf("WithTimeout(%v): must be positive", d)
		}
		o.Timeout = d
		return nil
	}
}

func cloneOptions(o worker.TypeOptions) worker.TypeOptions {
	o.RetryDelays = slices.Clone(o.RetryDelays)
	return o
}

// describeOptions names the options set in o, for error messages.
func describeOptions(o worker.TypeOptions) string {
	var s []string
	if o.MaxAttempts > 0 {
		s = append(s, fmt.Sprintf("WithMaxAttempts(%d)", o.MaxAttempts))
	}
	if o.RetryDelays != nil {
		s = append(s, fmt.Sprintf("WithRetryDelays%v", o.RetryDelays))
	}
	if o.Timeout > 0 {
		s = append(s, fmt.Sprintf("WithTimeout(%v)", o.Timeout))
	}
	if o.Concurrency != nil {
		s = append(s, fmt.Sprintf("WithConcurrency(%d)", o.Concurrency.Limit))
	}
	if o.Rate != nil {
		s = append(s, fmt.Sprintf("WithRateLimit(%v, %d)", o.Rate.Rate, o.Rate.Burst))
	}
	return strings.Join(s, ", ")
}
