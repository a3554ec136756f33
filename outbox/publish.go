package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferrymq/ferry/broker"
)

// This file is the path both relays share once they hold a batch of
// messages: the polling relay (claimed rows, relay.go) and the WAL relay
// (rows read from the replication stream, wal.go) publish it, classify the
// broker's answer, park the messages refused for a reason of their own,
// record an outage, count the batch (RelayConfig.OnBatch, metrics) and log
// it the same way, so that a fix to one reaches the other. Tracing is the
// broker's (a tracing.Broker wrapper around RelayConfig.Broker), so it is
// shared too.

// published is what broker.Broker.Publish made of one batch.
type published struct {
	perr        error         // Publish's error (nil: every message confirmed)
	publishDur  time.Duration // time spent in Publish
	confirmedAt time.Time     // when Publish returned
	fatal       bool          // the broker was closed and confirmed nothing
	closed      bool          // the broker was closed meanwhile (some were confirmed)
}

// publish publishes msgs within PublishTimeout.
func (r *Relay) publish(ctx context.Context, msgs []*broker.Message) published {
	start := time.Now()
	msgs = prioritised(msgs)
	pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	perr := r.cfg.Broker.Publish(pctx, msgs)
	cancel()
	p := published{perr: perr, confirmedAt: time.Now()}
	p.publishDur = p.confirmedAt.Sub(start)
	var partial *broker.PublishError
	if errors.Is(perr, broker.ErrClosed) && !errors.As(perr, &partial) {
		p.fatal = true
	}
	// A *broker.PublishError from a broker closed meanwhile still lists
	// only the messages it did not confirm: the others are settled (never
	// sent again) before the relay stops.
	p.closed = errors.Is(perr, broker.ErrClosed)
	return p
}

// settlement sorts the messages of a published batch (by row id) into
// confirmed, refused for a reason of their own (to park), and not taken
// because the broker as a whole failed (an outage).
type settlement struct {
	okIDs      []int64
	failIDs    []int64
	failErrs   []string
	failDelays []int64 // ms
	downIDs    []int64
	downErr    error
	failed     int // messages not confirmed, of any cause
}

// classify sorts ids (the batch in publishing order, with the failed
// attempts of each so far) by Publish's error perr. A message interrupted
// by the relay's own shutdown is in none of the lists: it stays to publish.
func (r *Relay) classify(ids []int64, attempts []int, perr error, shutdown bool) settlement {
	failed := broker.FailedIndexes(perr, len(ids))
	st := settlement{okIDs: make([]int64, 0, len(ids)-len(failed)), failed: len(failed)}
	for i, id := range ids {
		ferr, bad := failed[i]
		if !bad {
			st.okIDs = append(st.okIDs, id)
			continue
		}
		if shutdown && (errors.Is(ferr, context.Canceled) || errors.Is(ferr, context.DeadlineExceeded)) {
			continue // interrupted by our own shutdown: not the row's failure
		}
		if !broker.IsMessageFault(ferr) {
			// The broker failed, not the row: no attempt is counted and
			// the row keeps its place; the relay pauses as a whole.
			st.downIDs = append(st.downIDs, id)
			if st.downErr == nil {
				st.downErr = ferr
			}
			continue
		}
		st.failIDs = append(st.failIDs, id)
		st.failErrs = append(st.failErrs, broker.TruncateReason(ferr.Error()))
		st.failDelays = append(st.failDelays, retryDelay(attempts[i], r.cfg.RetryBackoff, r.cfg.MaxRetryBackoff).Milliseconds())
	}
	return st
}

// queueSettlement queues on b the statements that park the refused rows
// (failSQL: attempts+1, last_error, next_attempt_at, which hands them to
// the polling relay in WAL mode) and record an outage's reason on the
// others (outageSQL). The caller queues what it does with the confirmed
// rows (mark them processed, or delete them) and the COMMIT.
func (r *Relay) queueSettlement(b *pgx.Batch, st settlement) {
	if len(st.failIDs) > 0 {
		b.Queue(failSQL, st.failIDs, st.failErrs, st.failDelays)
	}
	if len(st.downIDs) > 0 {
		b.Queue(outageSQL, st.downIDs, broker.TruncateReason(r.unavailableReason(st.downErr)))
	}
}

// settled fills res from a batch settled in the database, and logs the
// parked rows.
func (r *Relay) settled(res *batchResult, p published, st settlement) {
	res.published = len(st.okIDs)
	res.failed = st.failed
	if p.perr == nil {
		return
	}
	res.err = p.perr
	var pe *broker.PublishError
	if !errors.As(p.perr, &pe) {
		res.err = fmt.Errorf("outbox: relay: publish: %w", p.perr)
	}
	res.outage = len(st.downIDs) > 0
	res.fatal = p.closed
	if len(st.failIDs) > 0 {
		r.log.Warn("outbox: relay: messages refused by the broker or its adapter, parking them with backoff",
			"broker", r.brokerName, "failed", len(st.failIDs), "first_id", st.failIDs[0], "err", st.failErrs[0])
	}
}

// observe calls RelayConfig.OnBatch for a batch that held messages or
// failed (not for one interrupted by ctx).
func (r *Relay) observe(ctx context.Context, start time.Time, res batchResult) {
	if r.cfg.OnBatch != nil && (res.claimed > 0 || (res.err != nil && ctx.Err() == nil)) {
		r.cfg.OnBatch(BatchStats{Claimed: res.claimed, Published: res.published, Failed: res.failed,
			Duration: time.Since(start), PublishDuration: res.publishDur, MarkDuration: res.markDur, Err: res.err})
	}
}

// prioritised returns msgs with each message that carries
// broker.HeaderPriority (Event.Priority) replaced by a copy whose Type is
// broker.PriorityType of it, so that only its priority's level of a
// priority queue is bound to it (broker.Topology.Expanded). msgs itself
// is returned when none does; a header that is not a priority (a row
// written by hand) publishes at priority 0.
func prioritised(msgs []*broker.Message) []*broker.Message {
	var out []*broker.Message
	for i, m := range msgs {
		p, err := broker.MessagePriority(m)
		if err != nil || p == 0 {
			continue
		}
		if out == nil {
			out = append([]*broker.Message(nil), msgs...)
		}
		c := *m
		c.Type = broker.PriorityType(p, m.Type)
		out[i] = &c
	}
	if out == nil {
		return msgs
	}
	return out
}
