package ferry

import (
	"fmt"
	"time"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/worker"
)

// RetryAfter returns the error a handler returns to say "come back in
// d", not counted as a failed attempt: e.g. the provider it calls
// answered 429 Too Many Requests with a Retry-After. The worker rolls the
// handler's transaction back and sends the message back through the
// broker's delayed retry (broker.Delivery.Retry); the redelivery is the
// same attempt (Job.Attempt does not grow), so the type's WithMaxAttempts
// is not spent. It is worker.Snooze(d) (a *worker.SnoozeError). On RabbitMQ
// and Kafka, which have no native delays, d is rounded up to the queue's
// next declared retry level (declare a short one, e.g. 1 s); a d that is
// not positive is worker.DefaultSnoozeDelay (1 s). After
// worker.Config.MaxSnoozes snoozes of one message (default 1000, fewer when
// the broker's own delivery limit is lower) it goes to the DLQ with a
// reason saying so.
//
// Compare worker.RetryAfter(err, d): a failed attempt with a delay of its
// own, which counts towards the attempts and ends in the DLQ after the
// last.
func RetryAfter(d time.Duration) error { return worker.Snooze(d) }

// LimitOption sets a detail of a concurrency limit (WithConcurrency) or a
// rate limit (WithRateLimit).
type LimitOption func(*limitSpec) error

type limitSpec struct {
	rate  bool // a rate limit: WithLease and WithLimitDelay do not apply
	name  string
	key   func(*broker.Message) string
	lease time.Duration
	delay time.Duration
}

// PartitionBy makes the limit hold per partition key: key(msg) names the
// partition (e.g. the message's Key, or its broker.HeaderAppID header),
// and each partition gets the whole limit of its own. key must be fast,
// safe for concurrent use and must not modify msg; a key longer than
// worker.MaxLimitKey bytes is replaced by its SHA-256, a panic gives the
// key "". Without PartitionBy the limit holds for the whole type.
func PartitionBy(key func(msg *broker.Message) string) LimitOption {
	return func(s *limitSpec) error {
		if key == nil {
			return fmt.Errorf("PartitionBy(nil): want a function")
		}
		s.key = key
		return nil
	}
}

// LimitName names the limit in the database (worker.SlotsTable,
// worker.RatesTable) in place of the default "<consumer>/<pattern>": types
// and consumers giving the same name share one limit, e.g. every type
// that calls one provider. name must not be empty.
func LimitName(name string) LimitOption {
	return func(s *limitSpec) error {
		if name == "" {
			return fmt.Errorf("LimitName(\"\"): want a name")
		}
		s.name = name
		return nil
	}
}

// WithLease sets how long a concurrency slot stays held without renewal
// (worker.ConcurrencyLimit.Lease): the worker renews it every d/3 while
// the handler runs, and a worker killed while holding it gives it back
// within d. Defaults to worker.DefaultLease (30 s); at least
// worker.MinLease (1 s). Only for WithConcurrency.
func WithLease(d time.Duration) LimitOption {
	return func(s *limitSpec) error {
		if s.rate {
			return fmt.Errorf("WithLease(%v): only for WithConcurrency", d)
		}
		if d < worker.MinLease {
			return fmt.Errorf("WithLease(%v): want at least %v", d, worker.MinLease)
		}
		s.lease = d
		return nil
	}
}

// WithLimitDelay sets how long a delivery that finds every slot held
// stays away (worker.ConcurrencyLimit.Delay), jittered by ±50 %. Defaults
// to worker.DefaultLimitDelay (1 s); must be positive. Only for
// WithConcurrency.
func WithLimitDelay(d time.Duration) LimitOption {
	return func(s *limitSpec) error {
		if s.rate {
			return fmt.Errorf("WithLimitDelay(%v): only for WithConcurrency", d)
		}
		if d <= 0 {
			return fmt.Errorf("WithLimitDelay(%v): must be positive", d)
		}
		s.delay = d
		return nil
	}
}

func (s *limitSpec) apply(opts []LimitOption) error {
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(s); err != nil {
			return err
		}
	}
	return nil
}

// WithConcurrency bounds the messages of the type handled at once to n,
// across every worker replica and process sharing the database, on any
// broker (worker.ConcurrencyLimit); with PartitionBy, n per partition key.
// Each handler holds a slot, a leased row of worker.SlotsTable taken in a
// statement of its own before the handler's transaction and deleted after
// it ended, so a crashed worker's slot comes back within its lease
// (WithLease). A delivery that finds every slot held is snoozed for about
// a second (WithLimitDelay), not counted as an attempt (see RetryAfter for
// what a snooze is and costs). Cost: two or three statements (acquire,
// release, a renewal per lease/3) per message. Needs worker.Config.BatchSize
// 1. n must be 1..worker.MaxConcurrencyLimit.
func WithConcurrency(n int, opts ...LimitOption) HandleOption {
	return func(o *worker.TypeOptions) error {
		if n < 1 || n > worker.MaxConcurrencyLimit {
			return fmt.Errorf("WithConcurrency(%d): want 1..%d", n, worker.MaxConcurrencyLimit)
		}
		var s limitSpec
		if err := s.apply(opts); err != nil {
			return fmt.Errorf("WithConcurrency(%d): %w", n, err)
		}
		o.Concurrency = &worker.ConcurrencyLimit{Limit: n, Name: s.name, Key: s.key, Lease: s.lease, Delay: s.delay}
		return nil
	}
}

// WithRateLimit bounds the messages of the type started per second to
// rate (messages per second, e.g. 20, or 0.5 for one every 2 s), with
// bursts of up to burst after a quiet period, across every worker replica
// and process sharing the database, on any broker (worker.RateLimit: GCRA
// on one row of worker.RatesTable per limit and key, one statement per
// message); with PartitionBy, per partition key. A delivery over the rate
// is snoozed until its turn (plus up to one interval of jitter), not
// counted as an attempt (see RetryAfter). On RabbitMQ and Kafka the
// snooze is rounded up to the queue's next retry level, so a queue whose
// shortest level is long makes the rate burstier, never higher. Needs
// worker.Config.BatchSize 1. rate must be above 0 and at most 1e6, burst
// at least 1.
func WithRateLimit(rate float64, burst int, opts ...LimitOption) HandleOption {
	return func(o *worker.TypeOptions) error {
		r := &worker.RateLimit{Rate: rate, Burst: burst}
		if err := r.Validate(); err != nil {
			return fmt.Errorf("WithRateLimit(%v, %d): %w", rate, burst, err)
		}
		s := limitSpec{rate: true}
		if err := s.apply(opts); err != nil {
			return fmt.Errorf("WithRateLimit(%v, %d): %w", rate, burst, err)
		}
		r.Name, r.Key = s.name, s.key
		o.Rate = r
		return nil
	}
}
