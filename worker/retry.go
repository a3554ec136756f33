package worker

import (
	"fmt"
	"time"

	"github.com/ferrymq/ferry/broker"
)

// RetryPolicy decides what happens after a failed attempt. The worker asks
// it for every ordinary handler error (not for Permanent errors, which go
// to the DLQ at once). The worker, not the broker adapter, owns the policy
// and the attempt counting (broker package doc).
//
// A policy is a pure function of the attempt number and the error: it
// returns a delay relative to now rather than a time, so it needs no clock
// and its tests need no sleeping. It must be safe for concurrent use.
type RetryPolicy interface {
	// NextRetry is called after the attempt numbered attempt (1-based,
	// broker.Message.Attempt) failed with err. It returns retry=false when
	// the message must go to the DLQ, otherwise the delay before the next
	// attempt.
	NextRetry(attempt int, err error) (delay time.Duration, retry bool)
}

// DelayLister is implemented by policies that can list every delay they
// may ask for. The worker checks these delays against the broker's
// Capabilities at start (broker.Capabilities.Check). BackoffPolicy
// implements it.
type DelayLister interface {
	// RetryDelays returns the delays the policy may return.
	RetryDelays() []time.Duration
}

// AttemptLimiter is implemented by policies that give up after a fixed
// number of attempts. The worker checks that number against the broker's
// delivery limit at start (broker.Limits.DeliveryLimit). BackoffPolicy
// implements it.
type AttemptLimiter interface {
	// AttemptLimit returns the number of attempts, the first included,
	// after which the policy sends a message to the DLQ.
	AttemptLimit() int
}

// DefaultMaxAttempts is the number of attempts (the first delivery
// included) when BackoffPolicy.MaxAttempts is 0.
const DefaultMaxAttempts = 5

// BackoffPolicy is the default policy: at most MaxAttempts attempts, the
// delay before retry i (1-based) being Delays[min(i-1, len(Delays)-1)] — the
// same backoff-list rule as broker.Queue.RetryDelays, so a BackoffPolicy
// whose Delays equal the queue's RetryDelays asks exactly for the retry
// levels a broker without native delays declared.
type BackoffPolicy struct {
	// MaxAttempts is the number of attempts including the first; after the
	// MaxAttempts-th failed attempt the message goes to the DLQ. 1 means no
	// retries. Defaults to DefaultMaxAttempts (5).
	MaxAttempts int
	// Delays is the backoff list; each must be positive. Defaults to
	// [broker.DefaultRetryDelay] (30 s).
	Delays []time.Duration
}

// NextRetry implements RetryPolicy: retry unless attempt >= MaxAttempts.
// An attempt below 1 counts as 1.
func (p BackoffPolicy) NextRetry(attempt int, _ error) (time.Duration, bool) {
	if attempt < 1 {
		attempt = 1
	}
	if attempt >= p.maxAttempts() {
		return 0, false
	}
	d := p.RetryDelays()
	i := attempt - 1
	if i >= len(d) {
		i = len(d) - 1
	}
	return d[i], true
}

// RetryDelays implements DelayLister: Delays, or the default [30s].
func (p BackoffPolicy) RetryDelays() []time.Duration {
	if len(p.Delays) == 0 {
		return []time.Duration{broker.DefaultRetryDelay}
	}
	return p.Delays
}

// AttemptLimit implements AttemptLimiter: MaxAttempts, or
// DefaultMaxAttempts when 0.
func (p BackoffPolicy) AttemptLimit() int { return p.maxAttempts() }

func (p BackoffPolicy) maxAttempts() int {
	if p.MaxAttempts == 0 {
		return DefaultMaxAttempts
	}
	return p.MaxAttempts
}

// Validate returns an error naming the first invalid field, or nil.
func (p BackoffPolicy) Validate() error {
	if p.MaxAttempts < 0 {
		return fmt.Errorf("worker: BackoffPolicy.MaxAttempts %d: must not be negative", p.MaxAttempts)
	}
	for i, d := range p.Delays {
		if d <= 0 {
			return fmt.Errorf("worker: BackoffPolicy.Delays[%d] %v: must be positive", i, d)
		}
	}
	return nil
}
