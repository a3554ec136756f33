package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferry/broker"
)

// Names of the worker's settings in the errors of CheckLimits: the Config
// field and, where ferry's CLI has one, its flag.
const (
	settingMaxAttempts    = "worker.Config.Policy's attempts (BackoffPolicy.MaxAttempts, ferry --max-attempts)"
	settingRetryDelays    = "worker.Config.Policy's delays (BackoffPolicy.Delays, ferry --retry-delay) over its attempts (--max-attempts)"
	settingAckDeadline    = "worker.Config.AckDeadline"
	settingHandlerTimeout = "worker.Config.HandlerTimeout (ferry --handler-timeout)"
)

// checkBrokerLimits reads the broker's limits for the queue, when the
// adapter reports them, and checks the worker's settings against them.
func (w *Worker) checkBrokerLimits(ctx context.Context) error {
	lr, ok := LimitReporterOf(w.cfg.Broker)
	if !ok {
		return nil
	}
	l, err := lr.Limits(ctx, w.cfg.Queue)
	if err != nil {
		return fmt.Errorf("worker: read the broker's limits of %s: %w", w.cfg.Queue, err)
	}
	w.deliveryLimit.Store(int64(max(l.DeliveryLimit, 0)))
	if err := CheckLimits(w.cfg, w.caps, l); err != nil {
		return err
	}
	// A Router type's own max attempts, retry delays and timeout must
	// agree with the same limits.
	return w.checkTypes(func(_ Route, c Config) error { return CheckLimits(c, w.caps, l) })
}

// LimitReporterOf finds the broker.LimitReporter of b, looking through up
// to 10 wrappers that expose the broker they wrap with Unwrap()
// broker.Broker (tracing.WrapBroker); false when none implements it. Run
// reads the limits it checks (CheckLimits) through it.
func LimitReporterOf(b broker.Broker) (broker.LimitReporter, bool) {
	for range 10 {
		if lr, ok := b.(broker.LimitReporter); ok {
			return lr, true
		}
		u, ok := b.(interface{ Unwrap() broker.Broker })
		if !ok {
			return nil, false
		}
		b = u.Unwrap()
	}
	return nil, false
}

// CheckLimits reports the first of cfg's settings that contradicts the
// broker's limits l (see broker.Limits), or nil. The error wraps
// ErrInvalidConfig and names both settings (cfg's field and ferry's CLI
// flag, the broker's setting as l names it) and a value that works. Run
// calls it with the limits the adapter reports (broker.LimitReporter);
// zero fields of cfg mean their defaults, as in New. The pairs:
//
//   - the policy's attempts (AttemptLimiter) must be below
//     l.DeliveryLimit, else the broker moves the message away before the
//     last attempt, without the worker's reason (SQS redrive,
//     JetStream MaxDeliver, RabbitMQ quorum delivery-limit);
//   - AckDeadline at most l.MaxAckDeadline;
//   - HandlerTimeout, when set, below l.SettleTimeout (RabbitMQ
//     consumer_timeout, SQS 12 h per receive);
//   - the policy's delays (DelayLister), summed over all its retries,
//     below l.Retention, else a message that keeps failing is deleted by
//     the broker before its last attempt (SQS MessageRetentionPeriod).
func CheckLimits(cfg Config, caps broker.Capabilities, l broker.Limits) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	policy := cfg.Policy
	if policy == nil {
		p := BackoffPolicy{}
		if q, ok := cfg.Topology.Queue(cfg.Queue); ok {
			p.Delays = q.Delays()
		}
		policy = p
	}
	ackDeadline := cfg.AckDeadline
	if ackDeadline == 0 {
		ackDeadline = DefaultAckDeadline
	}
	attempts := 0
	if al, ok := policy.(AttemptLimiter); ok {
		attempts = al.AttemptLimit()
	}
	if l.DeliveryLimit > 0 && attempts >= l.DeliveryLimit {
		return bad("%s = %d contradicts %s = %d: %s gives up on a message by itself after %d deliveries (moves it to its own DLQ, drops it or stops delivering it); each attempt needs a delivery (a retry in place, a redelivery after a crash or a lost settlement), so such a message is taken away before the worker's last attempt %d, without its reason; "+
			"set --max-attempts to at most %d, or raise %s to at least %d",
			settingMaxAttempts, attempts, l.DeliveryLimitSetting, l.DeliveryLimit, caps.Name, l.DeliveryLimit, attempts, max(l.DeliveryLimit-1, 1), l.DeliveryLimitSetting, attempts+1)
	}
	if l.MaxAckDeadline > 0 && ackDeadline > l.MaxAckDeadline {
		return bad("%s = %v contradicts %s: %s holds an ack deadline of at most %v; set %s to %v or less",
			settingAckDeadline, ackDeadline, l.MaxAckDeadlineSetting, caps.Name, l.MaxAckDeadline, settingAckDeadline, l.MaxAckDeadline)
	}
	if l.SettleTimeout > 0 && cfg.HandlerTimeout >= l.SettleTimeout {
		return bad("%s = %v contradicts %s = %v: %s takes a delivery back after %v unsettled, however often the worker extends it, so a handler running that long is redelivered and runs twice; "+
			"set %s below %v, e.g. %v",
			settingHandlerTimeout, cfg.HandlerTimeout, l.SettleTimeoutSetting, l.SettleTimeout, caps.Name, l.SettleTimeout,
			settingHandlerTimeout, l.SettleTimeout, suggestBelow(l.SettleTimeout))
	}
	if l.Retention > 0 && attempts > 1 {
		var total time.Duration
		probe := errors.New("worker: limits check")
		for a := 1; a < attempts; a++ {
			d, retry := policy.NextRetry(a, probe)
			if !retry {
				break
			}
			if caps.MaxDelay > 0 && d > caps.MaxDelay {
				d = caps.MaxDelay
			}
			total += max(d, 0)
		}
		if total >= l.Retention {
			return bad("%s: a message failing every attempt waits %v in all before attempt %d, which contradicts %s = %v: %s deletes a message that long after it was sent, also while a retry waits; "+
				"shorten --retry-delay or lower --max-attempts so the delays add up to less than %v",
				settingRetryDelays, total, attempts, l.RetentionSetting, l.Retention, caps.Name, l.Retention)
		}
	}
	return nil
}

// suggestBelow returns a round duration a little below d: a tenth less,
// rounded down to the second (to the millisecond below 10 s).
func suggestBelow(d time.Duration) time.Duration {
	s := d - d/10
	if s >= 10*time.Second {
		return s.Truncate(time.Second)
	}
	return s.Truncate(time.Millisecond)
}
