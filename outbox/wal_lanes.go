package outbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferrymq/ferry/broker"
)

// This file is the WAL relay's publishing pipeline, between the stream
// reader (walRead, wal.go) and the database:
//
//	reader ─chunks─▶ dispatcher ─parts─▶ lane 1..Concurrency ─▶ broker
//	                      └──batches (in order)──▶ settler ─▶ DELETE, park; slot position
//
// The dispatcher cuts the chunks read into batches of up to
// Concurrency×BatchSize events (whole chunks, in commit order), waits
// until their transactions are visible and splits each batch into one part
// per lane by partition key: every event of a key goes to the same lane
// (FNV-1a of the key), the events without a key to the lanes with the
// fewest events. A lane publishes its parts one after the other, in batch
// order, each in calls of up to BatchSize (the shared path of publish.go),
// and takes its next part only once Publish returned for the one before:
// so a key's events reach the broker in commit order, without a lock,
// while the lanes publish different keys at once. Up to walInFlight
// batches are between the dispatcher and the settler.
//
// The settler takes the batches in the order they were cut. Once every
// lane reported its part of the first one, it settles it, together with
// the batches behind it whose parts are all reported too, in one database
// transaction (the confirmed rows deleted, the refused ones parked, the
// outage's reason recorded), and then moves the slot's confirmed position
// to the end of the last transaction wholly settled. A batch that is not
// complete (a part not published or not to be settled: an outage, the
// AfterPublish hook, a shutdown) is settled for what it holds but the
// position does not pass it, and the settler settles nothing after it:
// the stream stops and restarts from the confirmed position, whose events
// are published again with their message IDs.

// walInFlight is the most batches the WAL relay holds between cutting
// and settling them (being published by the lanes, or waiting for their
// settlement): up to walInFlight×Concurrency×BatchSize events in memory,
// besides the reader's queue.
const walInFlight = 4

// walTx is a chunk of one committed transaction's outbox events read from
// the WAL, in commit order: the reader hands a transaction over in chunks
// of up to BatchSize events as it decodes them (see walRead); the last
// chunk carries the transaction's end.
type walTx struct {
	xid  uint32        // the transaction id, to wait until it is visible (walAwaitVisible)
	last bool          // the transaction's last chunk
	end  pglogrepl.LSN // the transaction's end (last chunk only): the slot may confirm up to here once its events are settled
	ids  []int64
	msgs []*broker.Message
}

// walState is the WAL relay's position, shared by the stream reader and
// the settler.
type walState struct {
	confirmed atomic.Uint64 // LSN confirmed to the server (the end of the last settled transaction)
	mu        sync.Mutex
	received  int64 // transactions handed to the publisher (counted at their last chunk)
	settled   int64 // transactions settled
}

// settle records that txs more transactions were settled, the last
// ending at end (0: none).
func (st *walState) settle(end pglogrepl.LSN, txs int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if uint64(end) > st.confirmed.Load() {
		st.confirmed.Store(uint64(end))
	}
	st.settled += txs
}

// position returns the position to confirm to the server: the settled
// one, or serverEnd when nothing read is unsettled and no transaction is
// being read (everything up to the server's end has been decoded and held
// no event of ours).
func (st *walState) position(serverEnd pglogrepl.LSN, reading bool) uint64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	pos := st.confirmed.Load()
	if !reading && st.received == st.settled && uint64(serverEnd) > pos {
		pos = uint64(serverEnd)
		st.confirmed.Store(pos)
	}
	return pos
}

// walBatch is what the WAL relay settles at once: consecutive chunks, up
// to Concurrency×BatchSize events, split into one part per lane.
type walBatch struct {
	start time.Time
	txs   int64         // transactions whose last chunk it holds
	end   pglogrepl.LSN // the end of the last of them (0: none)
	done  chan struct{} // closed once every part was reported

	mu         sync.Mutex
	pending    int          // parts not yet reported
	chunks     []walPublish // what the lanes' Publish calls made of its events
	incomplete bool         // an event of it was not confirmed, or is not to be settled: the position must not pass it
}

// report records a lane's part of b: the calls it published, and whether
// all of the part's events were confirmed or refused (complete).
func (b *walBatch) report(chunks []walPublish, complete bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.chunks = append(b.chunks, chunks...)
	b.incomplete = b.incomplete || !complete
	b.pending--
	if b.pending == 0 {
		close(b.done)
	}
}

// isDone reports whether every part of b was reported.
func (b *walBatch) isDone() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// walPart is one lane's share of a batch, in commit order.
type walPart struct {
	b    *walBatch
	ids  []int64
	msgs []*broker.Message
}

// walPublish is one Publish call of a lane: its rows, what the broker
// made of them, and how they are to be settled.
type walPublish struct {
	ids []int64
	p   published
	st  settlement
}

// walPipeline is the stop switch shared by the dispatcher, the lanes and
// the settler: the first outage or fatal error stops them all.
type walPipeline struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	res    batchResult
}

// stop records res (a closed broker wins over an outage) and stops the
// pipeline.
func (pl *walPipeline) stop(res batchResult) {
	pl.mu.Lock()
	if !(pl.res.outage || pl.res.fatal) || (res.fatal && !pl.res.fatal) {
		pl.res = res
	}
	pl.mu.Unlock()
	pl.cancel()
}

func (pl *walPipeline) result() batchResult {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.res
}

// walPublish publishes the chunks read from the stream in commit order
// on Concurrency lanes and settles them in order (see the top of this
// file). It returns on an outage (the stream stops; what was not settled
// is read again from the slot), a closed broker (res.fatal), or when ctx
// is done, once the lanes and the settler have stopped.
func (r *Relay) walPublish(ctx context.Context, txs <-chan *walTx, st *walState, probe bool) batchResult {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pl := &walPipeline{cancel: cancel}
	var (
		lanes   = make([]chan walPart, r.cfg.Concurrency)
		slots   = make(chan struct{}, walInFlight)
		batches = make(chan *walBatch, walInFlight)
		wg      sync.WaitGroup
	)
	for i := range lanes {
		lane := make(chan walPart, walInFlight)
		lanes[i] = lane
		wg.Go(func() {
			for part := range lane {
				r.walPublishPart(pctx, part, pl)
			}
		})
	}
	settled := make(chan struct{})
	go func() {
		defer close(settled)
		r.walSettler(ctx, batches, slots, pl, st)
	}()
	r.walDispatch(pctx, txs, lanes, batches, slots, pl, probe)
	for _, lane := range lanes {
		close(lane)
	}
	close(batches)
	wg.Wait()
	<-settled
	if ctx.Err() != nil {
		return batchResult{}
	}
	return pl.result()
}

// walDispatch cuts the chunks into batches, waits until their
// transactions are visible and hands each lane its part, until ctx is
// done or the visibility query fails.
func (r *Relay) walDispatch(ctx context.Context, txs <-chan *walTx, lanes []chan walPart, batches chan<- *walBatch, slots chan struct{}, pl *walPipeline, probe bool) {
	maxEvents := len(lanes) * r.cfg.BatchSize
	var pending []*walTx
	var probeTimer <-chan time.Time
	if probe {
		// A stream with nothing to publish tells nothing about the
		// broker: give the probe back after a poll interval, so that the
		// claim loops try again meanwhile.
		t := time.NewTimer(r.cfg.PollInterval)
		defer t.Stop()
		probeTimer = t.C
	}
	for {
		for len(pending) == 0 {
			select {
			case <-ctx.Done():
				return
			case tx := <-txs:
				pending = append(pending, tx)
			case <-probeTimer:
				r.endProbe(probe)
				probe, probeTimer = false, nil
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		n := 0
		for _, tx := range pending {
			n += len(tx.ids)
		}
	gather:
		for n < maxEvents {
			select {
			case tx := <-txs:
				pending = append(pending, tx)
				n += len(tx.ids)
			default:
				break gather
			}
		}
		// Whole chunks up to maxEvents events (at least one).
		b := &walBatch{start: time.Now(), done: make(chan struct{})}
		var (
			take, events int
			xids         []int64
		)
		for take < len(pending) && (take == 0 || events+len(pending[take].ids) <= maxEvents) {
			tx := pending[take]
			events += len(tx.ids)
			if len(xids) == 0 || xids[len(xids)-1] != int64(tx.xid) {
				xids = append(xids, int64(tx.xid))
			}
			if tx.last {
				b.txs, b.end = b.txs+1, tx.end
			}
			take++
		}
		if err := r.walAwaitVisible(ctx, xids); err != nil {
			if ctx.Err() == nil {
				pl.stop(batchResult{err: err, outage: true, dbFault: true})
			}
			return
		}
		parts := r.walSplit(pending[:take], events, len(lanes))
		for _, p := range parts {
			if len(p.ids) > 0 {
				b.pending++
			}
		}
		batches <- b // never blocks: at most walInFlight batches hold a slot
		for i, p := range parts {
			if len(p.ids) > 0 {
				p.b = b
				lanes[i] <- p // never blocks either
			}
		}
		r.log.Debug("outbox: wal relay: dispatched", "events", events, "first_id", pending[0].ids[0], "transactions_ended", b.txs)
		// Dispatched: the lanes' publishes end the probe (setAvailable,
		// or an outage).
		probe, probeTimer = false, nil
		clear(pending[:take])
		pending = append(pending[:0], pending[take:]...)
	}
}

// walSplit splits events (of chunks, in commit order) into the parts of
// lanes lanes: by FNV-1a of the partition key, so that a key's events all
// go to one lane in commit order; the events without a key (which have no
// order) to the lanes with the fewest events so far.
func (r *Relay) walSplit(chunks []*walTx, events, lanes int) []walPart {
	parts := make([]walPart, lanes)
	if lanes == 1 {
		parts[0].ids = make([]int64, 0, events)
		parts[0].msgs = make([]*broker.Message, 0, events)
		for _, tx := range chunks {
			parts[0].ids = append(parts[0].ids, tx.ids...)
			parts[0].msgs = append(parts[0].msgs, tx.msgs...)
		}
		return parts
	}
	lane := make([]int, 0, events)
	counts := make([]int, lanes)
	keyless := false
	for _, tx := range chunks {
		for _, m := range tx.msgs {
			if m.Key == "" {
				lane = append(lane, -1)
				keyless = true
				continue
			}
			l := int(fnv1a(m.Key) % uint32(lanes))
			lane = append(lane, l)
			counts[l]++
		}
	}
	if keyless {
		for i, l := range lane {
			if l >= 0 {
				continue
			}
			least := 0
			for j := 1; j < lanes; j++ {
				if counts[j] < counts[least] {
					least = j
				}
			}
			lane[i] = least
			counts[least]++
		}
	}
	for i := range parts {
		parts[i].ids = make([]int64, 0, counts[i])
		parts[i].msgs = make([]*broker.Message, 0, counts[i])
	}
	i := 0
	for _, tx := range chunks {
		for j, m := range tx.msgs {
			p := &parts[lane[i]]
			p.ids = append(p.ids, tx.ids[j])
			p.msgs = append(p.msgs, m)
			i++
		}
	}
	return parts
}

// fnv1a is the 32-bit FNV-1a hash of s.
func fnv1a(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// walPublishPart publishes a lane's part of a batch in calls of up to
// BatchSize and reports it to the batch. A part is complete when each of
// its events was confirmed or refused for a reason of its own; the first
// call the broker failed (or the hook, or a closed broker) stops the
// pipeline, and the rest of the part is not published (another event of
// the same key must not overtake it).
func (r *Relay) walPublishPart(ctx context.Context, part walPart, pl *walPipeline) {
	var calls []walPublish
	complete := true
	for off := 0; off < len(part.ids); off += r.cfg.BatchSize {
		if ctx.Err() != nil {
			complete = false
			break
		}
		end := min(off+r.cfg.BatchSize, len(part.ids))
		w, res := r.walPublishBatch(ctx, part.ids[off:end], part.msgs[off:end])
		if w != nil {
			calls = append(calls, *w)
		}
		if res.outage || res.fatal {
			pl.stop(res)
		}
		if w == nil || res.outage || res.fatal {
			complete = false
			break
		}
		r.setAvailable()
	}
	part.b.report(calls, complete)
}

// walPublishBatch publishes one call's messages and classifies the
// broker's answer (the shared path of publish.go). It returns the call to
// settle; nil when nothing of it is to be settled: interrupted by ctx, the
// broker closed before confirming anything (res.fatal), or the test hook
// failed (res.outage, as if the relay had crashed). res.outage with a
// call means the broker failed some of its messages, res.fatal that it was
// closed meanwhile.
func (r *Relay) walPublishBatch(ctx context.Context, ids []int64, msgs []*broker.Message) (*walPublish, batchResult) {
	start := time.Now()
	p := r.publish(ctx, msgs)
	if p.fatal {
		res := batchResult{claimed: len(msgs), publishDur: p.publishDur, err: p.perr, fatal: true}
		r.observe(ctx, start, res)
		return nil, res
	}
	if r.cfg.AfterPublish != nil {
		if err := r.cfg.AfterPublish(ctx, ids); err != nil {
			res := batchResult{claimed: len(msgs), publishDur: p.publishDur, err: fmt.Errorf("outbox: relay: after publish: %w", err), outage: true}
			r.observe(ctx, start, res)
			return nil, res
		}
	}
	if ctx.Err() != nil {
		return nil, batchResult{} // not settled: read again from the slot by the next stream
	}
	st := r.classify(ids, make([]int, len(ids)), p.perr, false)
	res := batchResult{outage: len(st.downIDs) > 0, fatal: p.closed, err: p.perr}
	if _, blocked := broker.BlockedReason(st.downErr); res.outage && !blocked {
		// No room on the broker is logged once by setUnavailable, not once
		// per retry.
		r.log.Warn("outbox: wal relay: broker unavailable, stopping the stream (the slot keeps the WAL)", "broker", r.brokerName, "err", st.downErr)
	}
	return &walPublish{ids: ids, p: p, st: st}, res
}

// walSettler settles the batches in the order they were cut (see the top
// of this file), releasing a slot for each as soon as its parts were
// reported, until batches is closed. The database side of settling (the
// confirmed rows deleted) and the move of the slot's position are
// gathered over RelayConfig.SettleInterval (walPending), so that at low
// rates, where every batch holds a few events, the relay commits once per
// interval rather than once per batch.
func (r *Relay) walSettler(ctx context.Context, batches <-chan *walBatch, slots <-chan struct{}, pl *walPipeline, st *walState) {
	var (
		queue   []*walBatch
		open    = true
		stopped bool
		pend    walPending
		timer   *time.Timer
		due     <-chan time.Time
	)
	flush := func() {
		if timer != nil {
			timer.Stop()
			timer, due = nil, nil
		}
		if !stopped && !r.walFlush(ctx, &pend, pl, st) {
			stopped = true
		}
		pend = walPending{}
	}
	for open || len(queue) > 0 {
		if len(queue) == 0 {
			select {
			case b, ok := <-batches:
				if !ok {
					open = false
					continue
				}
				queue = append(queue, b)
			case <-due:
				flush()
				continue
			}
		}
		select {
		case <-queue[0].done: // the lanes report every part, also when stopping
		case <-due:
			flush()
			<-queue[0].done
		}
	pull:
		for open {
			select {
			case b, ok := <-batches:
				if !ok {
					open = false
					break pull
				}
				queue = append(queue, b)
			default:
				break pull
			}
		}
		n := 1
		for n < len(queue) && !queue[n-1].incomplete && queue[n].isDone() {
			n++
		}
		if !stopped {
			pend.add(r, queue[:n])
		}
		for range n {
			<-slots
		}
		clear(queue[:n])
		queue = append(queue[:0], queue[n:]...)
		switch {
		case stopped:
		case pend.urgent || len(pend.all.okIDs) >= walSettleRows || r.cfg.SettleInterval < 0 || !open:
			flush()
		case timer == nil:
			timer = time.NewTimer(r.cfg.SettleInterval)
			due = timer.C
		}
	}
	if len(pend.batches) > 0 {
		flush()
	}
}

// walSettleRows bounds the confirmed rows the WAL relay gathers before it
// settles them, whatever RelayConfig.SettleInterval: the size of one
// DELETE's id array (8 bytes each).
const walSettleRows = 8192

// walPending is what the WAL relay has gathered to settle in one database
// transaction: consecutive batches whose parts were all reported, the
// last possibly incomplete (then urgent: it is settled at once).
type walPending struct {
	batches []walSettled
	all     settlement
	// urgent: a batch is incomplete, or an event was refused or met an
	// outage: parked rows and the outage's reason are recorded at once,
	// and the settler settles nothing after an incomplete batch.
	urgent bool
}

// walSettled is one batch gathered in a walPending: what observe and the
// position need of it once its settlement committed.
type walSettled struct {
	start      time.Time
	res        batchResult
	confirmed  time.Time // the last confirm of its Publish calls (zero: none)
	txs        int64
	end        pglogrepl.LSN
	incomplete bool
}

// add gathers group (consecutive reported batches, only the last of which
// may be incomplete) into p, and lets their messages go.
func (p *walPending) add(r *Relay, group []*walBatch) {
	for _, b := range group {
		s := walSettled{start: b.start, txs: b.txs, end: b.end, incomplete: b.incomplete}
		for _, c := range b.chunks {
			p.all.okIDs = append(p.all.okIDs, c.st.okIDs...)
			p.all.failIDs = append(p.all.failIDs, c.st.failIDs...)
			p.all.failErrs = append(p.all.failErrs, c.st.failErrs...)
			p.all.failDelays = append(p.all.failDelays, c.st.failDelays...)
			p.all.downIDs = append(p.all.downIDs, c.st.downIDs...)
			if p.all.downErr == nil {
				p.all.downErr = c.st.downErr
			}
			p.urgent = p.urgent || len(c.st.failIDs) > 0 || len(c.st.downIDs) > 0
			var cr batchResult
			r.settled(&cr, c.p, c.st)
			s.res.claimed += len(c.ids)
			s.res.published += cr.published
			s.res.failed += cr.failed
			s.res.publishDur = max(s.res.publishDur, c.p.publishDur)
			if s.res.err == nil {
				s.res.err = cr.err
			}
			if c.p.confirmedAt.After(s.confirmed) {
				s.confirmed = c.p.confirmedAt
			}
		}
		p.urgent = p.urgent || b.incomplete
		p.batches = append(p.batches, s)
	}
}

// walFlush settles p in one database transaction: the confirmed rows
// deleted (the WAL relay's only write per event), the refused ones
// parked, the outage's reason recorded; then the confirmed position moves
// past the transactions of its complete batches. It reports whether the
// settler may go on: false after an incomplete batch or when the database
// failed (which stops the pipeline as an outage).
func (r *Relay) walFlush(ctx context.Context, p *walPending, pl *walPipeline, st *walState) bool {
	all := p.all
	if len(all.okIDs)+len(all.failIDs)+len(all.downIDs) > 0 {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		if len(all.okIDs) > 0 {
			b.Queue(walDeleteSQL, all.okIDs)
		}
		r.queueSettlement(b, all)
		b.Queue("COMMIT")
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		br := r.cfg.Pool.SendBatch(mctx, b)
		var deleted int64 = -1
		_, err := br.Exec() // BEGIN
		if err == nil && len(all.okIDs) > 0 {
			var tag pgconn.CommandTag
			tag, err = br.Exec()
			deleted = tag.RowsAffected()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		cancel()
		if err != nil {
			res := batchResult{err: fmt.Errorf("outbox: wal relay: settle: %w", err), outage: true, dbFault: true}
			for _, s := range p.batches {
				res.claimed = s.res.claimed
				r.observe(ctx, s.start, res)
			}
			pl.stop(res)
			return false
		}
		if deleted >= 0 && deleted < int64(len(all.okIDs)) {
			// Rows deleted meanwhile (ferry outbox drop, a reset, or
			// settled by a stream before an outage): nothing to do;
			// logged for the record.
			r.log.Warn("outbox: wal relay: some confirmed rows were already gone", "deleted", deleted, "confirmed", len(all.okIDs))
		}
	}
	var (
		end pglogrepl.LSN
		txs int64
	)
	for _, s := range p.batches {
		res := s.res
		if !s.confirmed.IsZero() {
			res.markDur = time.Since(s.confirmed)
		}
		r.observe(ctx, s.start, res)
		if s.incomplete {
			break
		}
		txs += s.txs
		if s.end != 0 {
			end = s.end
		}
	}
	st.settle(end, txs)
	return len(p.batches) == 0 || !p.batches[len(p.batches)-1].incomplete
}
