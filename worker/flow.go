package worker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferrymq/ferry/broker"
)

// SnoozeError asks the worker to send the delivery back to the broker,
// to come back after Delay, without counting it as a failed attempt: a
// "come back later" (a provider answered 429, a concurrency or rate limit
// is reached). Create it with Snooze. Unlike RetryAfterError, whose attempt
// counts towards the policy's MaxAttempts, a snooze leaves the attempt
// number as it was: the next delivery is the same attempt again.
type SnoozeError struct {
	// Delay is how long the message stays away, in the broker's delayed
	// retry (broker.Delivery.Retry): on brokers without
	// Capabilities.NativeDelay (RabbitMQ, Kafka) it is rounded up to the
	// queue's next declared retry level, so declare a short one (e.g. 1 s)
	// on queues whose handlers snooze; a Delay above Capabilities.MaxDelay
	// is cut to it; a non-positive Delay is DefaultSnoozeDelay.
	Delay time.Duration
	// Err is the cause, for the log; may be nil.
	Err error
	// quiet: snoozed by a flow limit, logged at Debug instead of Info.
	quiet bool
}

// Snooze returns an error that makes the worker send the message back
// through the broker's delayed retry for d without counting an attempt
// (SnoozeError): the handler's transaction is rolled back, the snooze is
// counted in AttemptsTable's snoozes column, and the redelivery is the
// same attempt (broker.Message.Attempt) as this one. After
// Config.MaxSnoozes snoozes of one message it goes to the DLQ with a
// reason saying so. Compare RetryAfter, which is a failed attempt with a
// delay of its own.
func Snooze(d time.Duration) error { return &SnoozeError{Delay: d} }

// Error returns "worker: snoozed for <Delay>", followed by Err's text when
// set.
func (e *SnoozeError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("worker: snoozed for %v", e.Delay)
	}
	return fmt.Sprintf("worker: snoozed for %v: %v", e.Delay, e.Err)
}

// Unwrap returns Err.
func (e *SnoozeError) Unwrap() error { return e.Err }

// IsSnooze reports whether err is or wraps a *SnoozeError.
func IsSnooze(err error) bool {
	var s *SnoozeError
	return errors.As(err, &s)
}

// Defaults and bounds of flow control.
const (
	// DefaultSnoozeDelay is the delay of a Snooze whose delay is not
	// positive.
	DefaultSnoozeDelay = time.Second
	// DefaultMaxSnoozes is Config.MaxSnoozes when 0.
	DefaultMaxSnoozes = 1000
	// DefaultLease is ConcurrencyLimit.Lease when 0.
	DefaultLease = 30 * time.Second
	// MinLease is the shortest ConcurrencyLimit.Lease.
	MinLease = time.Second
	// DefaultLimitDelay is ConcurrencyLimit.Delay when 0: a delivery over
	// the limit comes back after 0.5 to 1.5 times this (jittered).
	DefaultLimitDelay = time.Second
	// MaxConcurrencyLimit is the largest ConcurrencyLimit.Limit.
	MaxConcurrencyLimit = 10000
	// MaxLimitKey is the longest partition key, in bytes, kept as it is;
	// a longer one is replaced by its SHA-256 (hex).
	MaxLimitKey = 256
)

// The tables of flow control; package outbox's migrations create them
// (migration 12).
const (
	// SlotsTable holds the concurrency slots: one row per slot held,
	// (limit_name, key, slot, holder, acquired_at, expires_at).
	SlotsTable = "worker_flow_slots"
	// RatesTable holds the rate limits' GCRA state: one row per
	// (limit_name, key), its theoretical arrival time tat.
	RatesTable = "worker_flow_rates"
)

// ConcurrencyLimit bounds how many messages of a type (or of one
// partition key of it) are handled at once, across every worker replica
// and process sharing the database: TypeOptions.Concurrency, set with
// ferry.WithConcurrency. Each handler holds a slot, a row of SlotsTable
// taken in a statement of its own before the handler's transaction begins
// (so other replicas see it at once) and deleted after that transaction
// ended; the slot is a lease of Lease, renewed every Lease/3 while the
// handler runs, so a worker killed while holding it gives it back within
// Lease. A delivery finding no free slot is snoozed (SnoozeError) for
// about Delay, not counted as an attempt.
type ConcurrencyLimit struct {
	// Limit is the number of slots per key: 1..MaxConcurrencyLimit.
	Limit int
	// Name names the limit in SlotsTable; types (and consumers) giving the
	// same Name share its slots. Defaults to "<Consumer>/<pattern>".
	Name string
	// Key returns the partition key of a message (e.g. its Key or an
	// HeaderAppID): each key has Limit slots of its own. Nil: one key ""
	// for the whole type.
	Key func(*broker.Message) string
	// Lease is how long a slot stays held without renewal. At least
	// MinLease (1 s). Defaults to DefaultLease (30 s).
	Lease time.Duration
	// Delay is the snooze of a delivery over the limit, jittered by ±50 %.
	// Defaults to DefaultLimitDelay (1 s).
	Delay time.Duration
}

// RateLimit bounds how many messages of a type (or of one partition key
// of it) start per second, across every worker replica and process
// sharing the database: TypeOptions.Rate, set with ferry.WithRateLimit.
// It is the generic cell rate algorithm (GCRA) on one row of RatesTable
// per (Name, key), updated by one statement per delivery: a steady Rate
// per second with bursts of up to Burst. A delivery over the limit is
// snoozed (SnoozeError) until its turn, not counted as an attempt.
type RateLimit struct {
	// Rate is the sustained rate in messages per second; positive and
	// finite, at most one per microsecond.
	Rate float64
	// Burst is how many messages may start at once after a quiet period;
	// at least 1.
	Burst int
	// Name names the limit in RatesTable; types giving the same Name share
	// it. Defaults to "<Consumer>/<pattern>".
	Name string
	// Key returns the partition key of a message; each key has a limit of
	// its own. Nil: one key "" for the whole type.
	Key func(*broker.Message) string
}

// Validate returns an error naming the first invalid field, or nil.
func (c *ConcurrencyLimit) Validate() error {
	switch {
	case c.Limit < 1 || c.Limit > MaxConcurrencyLimit:
		return fmt.Errorf("worker: ConcurrencyLimit.Limit %d: want 1..%d", c.Limit, MaxConcurrencyLimit)
	case c.Lease != 0 && c.Lease < MinLease:
		return fmt.Errorf("worker: ConcurrencyLimit.Lease %v: want at least %v (0: %v)", c.Lease, MinLease, DefaultLease)
	case c.Delay < 0:
		return fmt.Errorf("worker: ConcurrencyLimit.Delay %v: must not be negative", c.Delay)
	}
	return nil
}

// Validate returns an error naming the first invalid field, or nil.
func (r *RateLimit) Validate() error {
	switch {
	case !(r.Rate > 0) || math.IsInf(r.Rate, 0) || r.Rate > 1e6:
		return fmt.Errorf("worker: RateLimit.Rate %v: want a rate per second above 0 and at most 1e6", r.Rate)
	case r.Burst < 1:
		return fmt.Errorf("worker: RateLimit.Burst %d: want at least 1", r.Burst)
	}
	return nil
}

// Interval is the GCRA emission interval: 1/Rate, at least 1 µs.
func (r *RateLimit) Interval() time.Duration {
	return max(time.Duration(float64(time.Second)/r.Rate), time.Microsecond)
}

// GCRA is the rule RateLimit applies, as a pure function (the worker runs
// the same arithmetic in one SQL statement on RatesTable, with the
// database's clock): given the stored theoretical arrival time tat (zero:
// none), now, the emission interval and the burst, it returns whether an
// event may start now, the new tat to store when it may, and otherwise how
// long to wait before it may. An event is allowed when
// max(tat, now) + interval - now <= burst × interval.
func GCRA(tat, now time.Time, interval time.Duration, burst int) (allowed bool, newTAT time.Time, wait time.Duration) {
	next := tat
	if next.Before(now) {
		next = now
	}
	next = next.Add(interval)
	tolerance := time.Duration(burst) * interval
	if next.Sub(now) <= tolerance {
		return true, next, 0
	}
	return false, tat, next.Add(-tolerance).Sub(now)
}

// acquireOneSlotSQL takes slot $3 when it is free: one primary-key lookup.
// acquire tries a random slot with it first; when that one is held, it
// looks for any free one with acquireSlotSQL.
const acquireOneSlotSQL = `INSERT INTO worker_flow_slots (limit_name, key, slot, holder, expires_at)
VALUES ($1, $2, $3, $4, now() + $5::bigint * interval '1 microsecond')
ON CONFLICT (limit_name, key, slot) DO UPDATE SET holder = EXCLUDED.holder, acquired_at = now(), expires_at = EXCLUDED.expires_at
	WHERE worker_flow_slots.expires_at <= now()
RETURNING slot`

// acquireSlotSQL takes a free slot of (limit, key) among 0..n-1, a random
// one so that concurrent acquirers seldom pick the same, or takes over a
// slot whose lease expired. No row: every slot is held (or the slot
// picked was taken at the same moment; acquire tries once more).
const acquireSlotSQL = `INSERT INTO worker_flow_slots (limit_name, key, slot, holder, expires_at)
SELECT $1, $2, s, $4, now() + $5::bigint * interval '1 microsecond'
FROM generate_series(0, $3::int - 1) AS s
WHERE s <> ALL (ARRAY(SELECT slot FROM worker_flow_slots WHERE limit_name = $1 AND key = $2 AND expires_at > now()))
ORDER BY random() LIMIT 1
ON CONFLICT (limit_name, key, slot) DO UPDATE SET holder = EXCLUDED.holder, acquired_at = now(), expires_at = EXCLUDED.expires_at
	WHERE worker_flow_slots.expires_at <= now()
RETURNING slot`

const (
	// releaseSlotSQL frees the slot by expiring it rather than deleting
	// the row: an update that changes no indexed column stays in its heap
	// page (HOT), so the churn of slots leaves no dead index entries for
	// the next acquire's scan to step over.
	releaseSlotSQL = `UPDATE worker_flow_slots SET holder = '', expires_at = '-infinity' WHERE limit_name = $1 AND key = $2 AND slot = $3 AND holder = $4`
	renewSlotSQL   = `UPDATE worker_flow_slots SET expires_at = now() + $5::bigint * interval '1 microsecond' WHERE limit_name = $1 AND key = $2 AND slot = $3 AND holder = $4`
	// sweepFlowSQL deletes slots left by killed workers and rate rows
	// idle for an hour (a tat in the past is the same as no row).
	sweepFlowSQL = `WITH s AS (DELETE FROM worker_flow_slots WHERE expires_at < now() - interval '1 hour' AND acquired_at < now() - interval '1 hour')
DELETE FROM worker_flow_rates WHERE tat < now() - interval '1 hour'`
)

// rateSQL is GCRA on RatesTable in one statement: $3 the interval and $4
// the tolerance (burst × interval), in µs. It returns (true, 0) when the
// event may start (tat advanced), else (false, wait in µs). The wait is
// read from the statement's snapshot: under a concurrent update it may be
// short, and the snoozed delivery is refused again when it comes back
// early.
const rateSQL = `WITH up AS (
	INSERT INTO worker_flow_rates AS r (limit_name, key, tat) VALUES ($1, $2, now() + $3::bigint * interval '1 microsecond')
	ON CONFLICT (limit_name, key) DO UPDATE SET tat = GREATEST(r.tat, now()) + $3::bigint * interval '1 microsecond'
		WHERE GREATEST(r.tat, now()) + $3::bigint * interval '1 microsecond' <= now() + $4::bigint * interval '1 microsecond'
	RETURNING r.tat
)
SELECT true, 0::bigint FROM up
UNION ALL
SELECT false, GREATEST((EXTRACT(EPOCH FROM (GREATEST(r.tat, now()) + ($3::bigint - $4::bigint) * interval '1 microsecond' - now())) * 1e6)::bigint, 0)
FROM worker_flow_rates r WHERE r.limit_name = $1 AND r.key = $2 AND NOT EXISTS (SELECT 1 FROM up)`

// flowLimits are a route's limits with their names resolved.
type flowLimits struct {
	conc     *ConcurrencyLimit
	concName string
	rate     *RateLimit
	rateName string
}

func newFlowLimits(consumer, pattern string, o TypeOptions) *flowLimits {
	if o.Concurrency == nil && o.Rate == nil {
		return nil
	}
	def := consumer + "/" + pattern
	f := &flowLimits{conc: o.Concurrency, rate: o.Rate}
	if f.conc != nil {
		f.concName = f.conc.Name
		if f.concName == "" {
			f.concName = def
		}
	}
	if f.rate != nil {
		f.rateName = f.rate.Name
		if f.rateName == "" {
			f.rateName = def
		}
	}
	return f
}

// limitKey returns the partition key of msg under keyFn, hashed when
// longer than MaxLimitKey; a panicking keyFn gives the key "".
func limitKey(keyFn func(*broker.Message) string, msg *broker.Message) (key string) {
	if keyFn == nil {
		return ""
	}
	defer func() {
		if r := recover(); r != nil {
			key = ""
		}
	}()
	key = keyFn(msg)
	if len(key) > MaxLimitKey {
		sum := sha256.Sum256([]byte(key))
		key = "sha256:" + hex.EncodeToString(sum[:])
	}
	return key
}

// slotHold is a concurrency slot held for one delivery, renewed until
// release.
type slotHold struct {
	w            *Worker
	name, key    string
	slot         int
	holder       string
	lease, every time.Duration
	stop         chan struct{}
	done         chan struct{}
}

var holderPrefix = func() string {
	h, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", h, os.Getpid())
}()

func newHolder(msgID string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return holderPrefix + ":" + msgID + ":" + hex.EncodeToString(b[:])
}

// admit applies the flow limits of msg's type before its transaction
// begins: it takes a concurrency slot, then passes the rate limit. It
// returns the slot held (nil without a concurrency limit), or a
// *SnoozeError when a limit refused the delivery, or the database's
// error. With a slot held and the rate limit refusing, the slot is
// released.
func (w *Worker) admit(ctx context.Context, f *flowLimits, msg *broker.Message) (*slotHold, error) {
	var hold *slotHold
	if c := f.conc; c != nil {
		lease := c.Lease
		if lease == 0 {
			lease = DefaultLease
		}
		h := &slotHold{w: w, name: f.concName, key: limitKey(c.Key, msg), holder: newHolder(msg.ID), lease: lease, every: lease / 3}
		got := false
		for try := 0; try < 2 && !got; try++ {
			sql, args := acquireOneSlotSQL, []any{h.name, h.key, mrand.IntN(c.Limit), h.holder, lease.Microseconds()}
			if try == 1 {
				sql, args = acquireSlotSQL, []any{h.name, h.key, c.Limit, h.holder, lease.Microseconds()}
			}
			_, err := w.flowStatement(ctx, sql, args, &h.slot)
			switch {
			case err == nil:
				got = true
			case errors.Is(err, pgx.ErrNoRows):
			default:
				return nil, fmt.Errorf("worker: acquire a slot of %s: %w", SlotsTable, err)
			}
		}
		w.maybeSweep(ctx)
		if !got {
			delay := c.Delay
			if delay == 0 {
				delay = DefaultLimitDelay
			}
			delay = delay/2 + time.Duration(mrand.Int64N(int64(delay)+1))
			return nil, &SnoozeError{Delay: delay, quiet: true,
				Err: fmt.Errorf("concurrency limit %q key %q: all %d slots held", h.name, h.key, c.Limit)}
		}
		h.start()
		hold = h
	}
	if r := f.rate; r != nil {
		key := limitKey(r.Key, msg)
		iv := r.Interval()
		var (
			ok   bool
			wait int64
		)
		_, err := w.flowStatement(ctx, rateSQL, []any{f.rateName, key, iv.Microseconds(), (time.Duration(r.Burst) * iv).Microseconds()}, &ok, &wait)
		if errors.Is(err, pgx.ErrNoRows) {
			// A concurrent first insert of the row: refused, try again in
			// one interval.
			err, ok, wait = nil, false, iv.Microseconds()
		}
		if err != nil {
			hold.release(ctx)
			return nil, fmt.Errorf("worker: rate limit in %s: %w", RatesTable, err)
		}
		if !ok {
			hold.release(ctx)
			delay := max(time.Duration(wait)*time.Microsecond, time.Millisecond)
			// Spread the comebacks over one more interval so that the
			// deliveries refused together do not all return together.
			delay += time.Duration(mrand.Int64N(int64(iv) + 1))
			return nil, &SnoozeError{Delay: delay, quiet: true,
				Err: fmt.Errorf("rate limit %q key %q: %v/s, burst %d", f.rateName, key, r.Rate, r.Burst)}
		}
	}
	return hold, nil
}

// flowStatement runs one statement of flow control in a transaction of
// its own with synchronous_commit off, in one round trip (BEGIN, SET
// LOCAL, the statement and COMMIT pipelined): its rows are visible to
// every other worker at its commit, as with a synchronous commit, but the
// worker does not wait for the WAL flush. A PostgreSQL crash may lose the
// last of these commits (a slot taken or released, a rate step): the
// connections of the handlers holding the lost slots die with it, so
// their transactions roll back too. With dest it scans the statement's
// single row into dest (pgx.ErrNoRows when none); it returns the command
// tag.
func (w *Worker) flowStatement(ctx context.Context, sql string, args []any, dest ...any) (pgconn.CommandTag, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit = off")
	var tag pgconn.CommandTag
	if len(dest) > 0 {
		b.Queue(sql, args...).QueryRow(func(row pgx.Row) error { return row.Scan(dest...) })
	} else {
		b.Queue(sql, args...).Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
	}
	b.Queue("COMMIT")
	err := w.cfg.Pool.SendBatch(ctx, b).Close()
	return tag, err
}

// maybeSweep deletes, about once per 1000 admissions, the flow rows left
// behind (sweepFlowSQL).
func (w *Worker) maybeSweep(ctx context.Context) {
	if mrand.IntN(1000) != 0 {
		return
	}
	if _, err := w.cfg.Pool.Exec(ctx, sweepFlowSQL); err != nil {
		w.log.Debug("worker: sweep the flow-control tables", "err", err)
	}
}

// start renews the lease every lease/3 until release.
func (h *slotHold) start() {
	h.stop, h.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(h.done)
		t := time.NewTicker(h.every)
		defer t.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), h.every)
			tag, err := h.w.flowStatement(ctx, renewSlotSQL, []any{h.name, h.key, h.slot, h.holder, h.lease.Microseconds()})
			cancel()
			switch {
			case err != nil:
				h.w.log.Warn("worker: could not renew a concurrency slot; if this lasts past its lease another worker may take it",
					"limit", h.name, "key", h.key, "slot", h.slot, "lease", h.lease, "err", err)
			case tag.RowsAffected() == 0:
				h.w.log.Error("worker: concurrency slot lost (its lease expired and another worker took it): the limit may be exceeded while this handler runs",
					"limit", h.name, "key", h.key, "slot", h.slot, "lease", h.lease)
				return
			}
		}
	}()
}

// release stops the renewal and deletes the slot; a failure is logged and
// the slot comes back when its lease expires. A nil h is a no-op.
func (h *slotHold) release(ctx context.Context) {
	if h == nil {
		return
	}
	close(h.stop)
	<-h.done
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if _, err := h.w.flowStatement(rctx, releaseSlotSQL, []any{h.name, h.key, h.slot, h.holder}); err != nil {
		h.w.log.Warn("worker: could not release a concurrency slot; it comes back when its lease expires",
			"limit", h.name, "key", h.key, "slot", h.slot, "lease", h.lease, "err", err)
	}
}

// recordSnoozeSQL counts one snooze of a message and returns the counts.
const recordSnoozeSQL = `INSERT INTO worker_attempts (consumer, message_id, attempts, snoozes) VALUES ($1, $2, 0, 1)
ON CONFLICT (consumer, message_id) DO UPDATE SET snoozes = worker_attempts.snoozes + 1, updated_at = now()
RETURNING snoozes, attempts`

// snooze decides and records the snooze s of msg: a failure whose
// settlement is a Retry after s's delay that counts no attempt, or the
// DLQ once the message was snoozed Config.MaxSnoozes times (or as often
// as the broker's delivery limit allows).
func (w *Worker) snooze(ctx context.Context, msg *broker.Message, herr error, s *SnoozeError) *failure {
	f := &failure{err: herr, snooze: true, quiet: s.quiet}
	f.delay = s.Delay
	if f.delay <= 0 {
		f.delay = DefaultSnoozeDelay
	}
	if w.caps.MaxDelay > 0 && f.delay > w.caps.MaxDelay {
		f.delay = w.caps.MaxDelay
	}
	// The redelivery keeps the reason of the last failed attempt, if any.
	f.reason = msg.Headers[broker.HeaderLastError]
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	var snoozes, attempts int
	if err := w.cfg.Pool.QueryRow(sctx, recordSnoozeSQL, w.cfg.Consumer, msg.ID).Scan(&snoozes, &attempts); err != nil {
		// Not recorded: the redelivery's attempt number is one higher than
		// it should be (the broker counted the delivery).
		w.log.Error("worker: could not record a snooze; the redelivery will count as the next attempt",
			"message_id", msg.ID, "attempt", msg.Attempt, "err", err)
		return f
	}
	f.recorded = true
	why := ""
	if snoozes > w.cfg.MaxSnoozes {
		why = fmt.Sprintf("worker: snoozed %d times, more than Config.MaxSnoozes (%d)", snoozes-1, w.cfg.MaxSnoozes)
	} else if dl := w.deliveryLimit.Load(); dl > 0 && int64(snoozes+attempts+1) >= dl {
		why = fmt.Sprintf("worker: snoozed %d times; one more delivery would reach the broker's delivery limit (%d), after which %s would take the message away by itself", snoozes-1, dl, w.caps.Name)
	}
	if why == "" {
		return f
	}
	f.snooze, f.dead = false, true
	f.reason = broker.TruncateReason(why + ": last: " + herr.Error())
	if err := w.recordAttempt(sctx, msg, f.reason, true); err != nil {
		w.log.Error("worker: could not record the DLQ decision of a message snoozed too often", "message_id", msg.ID, "err", err)
	}
	return f
}
