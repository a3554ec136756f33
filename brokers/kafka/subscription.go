package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ferrymq/ferry/broker"
)

// errRevoked is returned by a settlement of a delivery whose partition a
// rebalance gave to another member: that member reads the message again.
var errRevoked = errors.New("kafka: the partition of this delivery was assigned to another consumer by a rebalance; it will be delivered again")

// errRevokedSettle is errRevoked as a settlement returns it, classified
// for broker.SettleReason: the delivery's lease ended.
var errRevokedSettle = broker.SettleFault(broker.ReasonExpired, errRevoked)

// Subscribe joins the consumer group of queue (group ID = queue name) on
// the exchange's work topic and the queue's retry topics. Work-topic
// partitions feed Receive; retry-topic partitions are forwarded back to
// the work topic when due, each partition on its own goroutine. Offsets
// are committed explicitly: a partition's committed offset moves past a
// message only when it and every earlier message of the partition are
// settled. A new group starts at the earliest offset of every partition.
func (b *kafkaBroker) Subscribe(ctx context.Context, queue string, opts broker.SubscribeOptions) (broker.Subscription, error) {
	if b.closed.Load() {
		return nil, broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	qi, ok := b.queueInfo(queue)
	if !ok {
		return nil, fmt.Errorf("%w: kafka: queue %q was not declared on this broker", broker.ErrUnknownQueue, queue)
	}
	if opts.Prefetch <= 0 {
		opts.Prefetch = broker.DefaultPrefetch
	}
	if err := b.checkSessionTimeout(ctx); err != nil {
		return nil, err
	}
	topics := append([]string{qi.topic}, qi.retryTopics...)
	group, err := kafkago.NewConsumerGroup(kafkago.ConsumerGroupConfig{
		ID:                GroupID(queue),
		Brokers:           b.cfg.Brokers,
		Dialer:            b.dialer,
		Topics:            topics,
		HeartbeatInterval: time.Second,
		SessionTimeout:    b.cfg.SessionTimeout,
		RebalanceTimeout:  b.cfg.SessionTimeout,
		JoinGroupBackoff:  500 * time.Millisecond,
		// Offsets of a queue idle for a week stay (offsets.retention.minutes
		// default 7 days counts from when the group became empty).
		StartOffset: kafkago.FirstOffset,
		Timeout:     b.cfg.DialTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("kafka: subscribe %s: %w", queue, err)
	}
	s := &subscription{
		b:         b,
		q:         qi,
		opts:      opts,
		group:     group,
		parts:     map[partKey]*partState{},
		busy:      map[string]int{},
		changed:   make(chan struct{}),
		commitSig: make(chan struct{}, 1),
		stopped:   make(chan struct{}),
		loopsDone: make(chan struct{}),
		bufCap:    max(2*opts.Prefetch, 32),
	}
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		_ = group.Close()
		return nil, broker.ErrClosed
	}
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	go s.run()
	return s, nil
}

type partKey struct {
	topic     string
	partition int
}

// partState tracks one work-topic partition of this subscription, across
// generations while the partition stays ours.
type partState struct {
	key     partKey
	gen     *kafkago.Generation // the generation that owns it now; nil between generations
	floor   int64               // next offset after the settled prefix; -1 unknown
	commit  int64               // the last offset committed (or assigned); -1 unknown
	offsets []int64             // fetched, not yet in the settled prefix, ascending
	done    map[int64]bool
	pending int // fetched, not handed out
	revoked bool
}

func (p *partState) known(off int64) bool {
	if p.floor >= 0 && off < p.floor {
		return true
	}
	i := sort.Search(len(p.offsets), func(i int) bool { return p.offsets[i] >= off })
	return i < len(p.offsets) && p.offsets[i] == off
}

func (p *partState) track(off int64) { p.offsets = append(p.offsets, off) }

// finish marks off settled and moves the floor over the settled prefix.
func (p *partState) finish(off int64) {
	if p.floor >= 0 && off < p.floor {
		return // below what another member already committed
	}
	p.done[off] = true
	for len(p.offsets) > 0 && p.done[p.offsets[0]] {
		delete(p.done, p.offsets[0])
		p.floor = p.offsets[0] + 1
		p.offsets = p.offsets[1:]
	}
}

type subscription struct {
	b     *kafkaBroker
	q     *queueInfo
	opts  broker.SubscribeOptions
	group *kafkago.ConsumerGroup

	mu       sync.Mutex
	closed   bool // Close was called: Receive returns ErrClosed
	pending  []*delivery
	inflight int
	busy     map[string]int // keys with a delivery handed out (Ordered)
	parts    map[partKey]*partState
	changed  chan struct{} // closed and replaced on every change
	bufCap   int

	commitSig    chan struct{}
	lastRecreate atomic.Int64  // Unix ns of the last recreate
	stopped      chan struct{} // closed when the group is being shut down
	stopOnce     sync.Once
	loopsDone    chan struct{}
}

func (s *subscription) broadcastLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *subscription) signalCommit() {
	select {
	case s.commitSig <- struct{}{}:
	default:
	}
}

// run follows the group's generations until the group is closed.
func (s *subscription) run() {
	defer close(s.loopsDone)
	go s.commitLoop()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-s.stopped
		cancel()
	}()
	failures := 0
	for {
		gen, err := s.group.Next(ctx)
		if err != nil {
			if errors.Is(err, kafkago.ErrGroupClosed) || ctx.Err() != nil {
				return
			}
			failures++
			if failures == 3 || failures%20 == 0 {
				s.b.log.Warn("consumer group: join failed; retrying", "queue", s.q.queue.Name, "attempts", failures, "error", err)
			}
			s.recreate(ctx, err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
			continue
		}
		failures = 0
		s.onGeneration(gen)
	}
}

// recreate declares the queue's exchange again when err says a topic is
// missing (an operator deleted it), at most every 2 s.
func (s *subscription) recreate(ctx context.Context, err error) {
	if !missingTopic(err) {
		return
	}
	now := time.Now().UnixNano()
	last := s.lastRecreate.Load()
	if now-last < int64(2*time.Second) || !s.lastRecreate.CompareAndSwap(last, now) {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if derr := s.b.redeclare(dctx, s.q.exchange); derr != nil {
		s.b.log.Warn("declaring missing topics again failed", "queue", s.q.queue.Name, "error", derr)
	}
}

// onGeneration adopts the assignments of a new generation: partitions no
// longer ours are revoked (their unsettled deliveries fail to settle and
// their prefetched messages are dropped), kept ones continue where they
// were, and a reader or forwarder starts for each assigned partition.
func (s *subscription) onGeneration(gen *kafkago.Generation) {
	s.mu.Lock()
	assigned := map[partKey]int64{}
	for topic, as := range gen.Assignments {
		for _, a := range as {
			assigned[partKey{topic, a.ID}] = a.Offset
		}
	}
	for k, ps := range s.parts {
		if _, ok := assigned[k]; !ok {
			ps.revoked = true
			ps.gen = nil
			delete(s.parts, k)
		}
	}
	kept := s.pending[:0]
	for _, d := range s.pending {
		if d.ps.revoked {
			continue
		}
		kept = append(kept, d)
	}
	s.pending = kept
	type start struct {
		ps     *partState
		key    partKey
		offset int64
	}
	var starts []start
	for k, off := range assigned {
		if k.topic != s.q.topic {
			starts = append(starts, start{nil, k, off})
			continue
		}
		ps := s.parts[k]
		if ps == nil {
			ps = &partState{key: k, floor: -1, commit: -1, done: map[int64]bool{}}
			s.parts[k] = ps
		}
		ps.gen = gen
		if off >= 0 {
			if ps.floor < off {
				// Another member moved on meanwhile: forget what we held
				// below its offset.
				i := sort.Search(len(ps.offsets), func(i int) bool { return ps.offsets[i] >= off })
				for _, o := range ps.offsets[:i] {
					delete(ps.done, o)
				}
				ps.offsets = append([]int64(nil), ps.offsets[i:]...)
				ps.floor = off
				kept := s.pending[:0]
				for _, d := range s.pending {
					if d.ps == ps && d.offset < off {
						ps.pending--
						continue
					}
					kept = append(kept, d)
				}
				s.pending = kept
			}
			ps.commit = off
		}
		starts = append(starts, start{ps, k, off})
	}
	s.broadcastLocked()
	s.mu.Unlock()
	s.signalCommit()
	for _, st := range starts {
		st := st
		if st.ps != nil {
			gen.Start(func(ctx context.Context) { s.readWork(ctx, st.ps, st.offset) })
		} else {
			gen.Start(func(ctx context.Context) { s.forward(ctx, gen, st.key, st.offset) })
		}
	}
}

func (s *subscription) newReader(topic string, partition int, offset int64) *kafkago.Reader {
	r := kafkago.NewReader(kafkago.ReaderConfig{
		Brokers:        s.b.cfg.Brokers,
		Topic:          topic,
		Partition:      partition,
		Dialer:         s.b.dialer,
		MinBytes:       1,
		MaxBytes:       s.b.maxBytes + 1<<20,
		MaxWait:        500 * time.Millisecond,
		QueueCapacity:  s.bufCap,
		ReadBackoffMin: 100 * time.Millisecond,
		ReadBackoffMax: time.Second,
		MaxAttempts:    3,
		// Report an offset past the end of the log (the topic was deleted
		// and created again) instead of waiting for the log to grow.
		OffsetOutOfRangeError: true,
	})
	if offset < 0 {
		offset = kafkago.FirstOffset
	}
	_ = r.SetOffset(offset)
	return r
}

// sleepCtx waits d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// readWork reads one work-topic partition for one generation and queues
// the messages of this queue for Receive; others (a Type the queue is not
// bound to, or a retry meant for another queue) are passed over and count
// as settled.
func (s *subscription) readWork(ctx context.Context, ps *partState, offset int64) {
	r := s.newReader(ps.key.topic, ps.key.partition, offset)
	defer func() { r.Close() }()
	// last is the last record read from this partition; suspect is set
	// when the partition went missing meanwhile (the topic may have been
	// deleted and created again), so the next record is checked to come
	// from the same log as last before it is trusted.
	var last *kafkago.Message
	suspect := false
	reset := func(why string) bool {
		var first int64
		var err error
		if ps, first, err = s.resetPartition(ctx, ps, why); err != nil {
			s.b.log.Warn("reset of a partition failed; retrying", "topic", ps.key.topic, "partition", ps.key.partition, "error", err)
			sleepCtx(ctx, time.Second)
			return false
		}
		r.Close()
		r = s.newReader(ps.key.topic, ps.key.partition, first)
		last, suspect = nil, false
		return true
	}
	// Every verifyEvery the log is checked even when nothing looked wrong:
	// a topic deleted and created again within one fetch's wait gives the
	// reader no error at all, and it reads on at its offset in the new log.
	nextCheck := time.Now().Add(verifyEvery)
	for {
		fctx, fcancel := context.WithDeadline(ctx, nextCheck)
		m, err := r.FetchMessage(fctx)
		fcancel()
		if err != nil && ctx.Err() == nil && fctx.Err() != nil {
			// Nothing arrived before the check was due.
			nextCheck = time.Now().Add(verifyEvery)
			if last != nil {
				stale, verr := s.idleLogGone(ctx, last)
				if verr == nil && stale {
					reset("the log ends before the record last read (topic created again)")
				}
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, kafkago.OffsetOutOfRange) {
				reset("the read position is past the end of the log (topic created again?)")
				continue
			}
			if missingTopic(err) {
				suspect = true
			}
			s.b.log.Debug("fetch failed; retrying", "topic", ps.key.topic, "partition", ps.key.partition, "error", err)
			s.recreate(ctx, err)
			if !sleepCtx(ctx, 500*time.Millisecond) {
				return
			}
			continue
		}
		// The reader reconnects by itself on UnknownTopicOrPartition and
		// NotLeaderForPartition (it counts them as rebalances) and goes on
		// at the same offset. If the topic was created again and its new
		// log already reaches that offset, the records before it would be
		// passed over unseen: check the log is still the one last came from.
		if st := r.Stats(); st.Rebalances > 0 || st.Errors > 0 {
			suspect = true
		}
		if time.Now().After(nextCheck) {
			suspect = true
		}
		if suspect && last != nil {
			suspect = false
			nextCheck = time.Now().Add(verifyEvery)
			same, verr := s.sameLogRetry(ctx, last)
			if verr != nil && ctx.Err() != nil {
				return
			}
			if verr != nil {
				s.b.log.Warn("could not check whether the topic was created again; reading on", "topic", ps.key.topic, "partition", ps.key.partition, "error", verr)
			} else if !same {
				reset("the record last read is no longer in the partition's log (topic created again)")
				continue
			}
		}
		last = &m
		msg, internal := fromRecord(m)
		if msg.ID == "" {
			// Not written by ferry: name it by its coordinates, which stay
			// the same on every redelivery.
			msg.ID = fmt.Sprintf("%s-%d-%d", m.Topic, m.Partition, m.Offset)
		}
		s.mu.Lock()
		for !s.closed && !ps.revoked && ps.pending >= s.bufCap {
			ch := s.changed
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-ch:
			}
			s.mu.Lock()
		}
		if s.closed || ps.revoked {
			s.mu.Unlock()
			<-ctx.Done()
			return
		}
		if ps.known(m.Offset) {
			s.mu.Unlock()
			continue
		}
		ps.track(m.Offset)
		if !s.wants(msg, internal) {
			ps.finish(m.Offset)
			s.mu.Unlock()
			s.signalCommit()
			continue
		}
		ps.pending++
		s.pending = append(s.pending, &delivery{s: s, ps: ps, offset: m.Offset, msg: msg, internal: internal})
		s.broadcastLocked()
		s.mu.Unlock()
	}
}

// verifyEvery is how often a partition being read checks that its log is
// still the one its last record came from (readWork): the bound on how
// long a subscription reads a topic deleted and created again without
// seeing the new log's first records. A check is one ListOffsets while
// the partition is idle, one Fetch of the batch holding the last record
// while records flow.
const verifyEvery = 2 * time.Second

// sameLogRetry is sameLog, tried again every 500 ms for up to 10 s while
// it fails (a topic deleted and not yet created again, a leader not yet
// elected): reading on unchecked could pass over the new log's first
// records. It returns the last error when every try failed.
func (s *subscription) sameLogRetry(ctx context.Context, last *kafkago.Message) (bool, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		same, err := s.sameLog(ctx, last)
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return same, err
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return false, ctx.Err()
		}
	}
}

// idleLogGone reports whether last's partition, read to its end with
// nothing new, now ends before last (its high watermark is at or below
// last's offset): the topic was deleted and created again with a shorter
// log, which the reader would wait on forever. It is one ListOffsets.
func (s *subscription) idleLogGone(ctx context.Context, last *kafkago.Message) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := s.b.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{
		last.Topic: {kafkago.LastOffsetOf(last.Partition)}}})
	if err != nil {
		return false, err
	}
	for _, po := range res.Topics[last.Topic] {
		if po.Error != nil {
			return false, po.Error
		}
		if po.Partition == last.Partition {
			return po.LastOffset <= last.Offset, nil
		}
	}
	return false, fmt.Errorf("kafka: ListOffsets gave no offset for %s/%d", last.Topic, last.Partition)
}

// sameLog reports whether the record at last's offset is still last,
// that is whether last's partition was not deleted and created again
// since last was read. A record gone (the offset is past the log's end)
// or another record at that offset means a new log. It is one Fetch (at
// most one record batch) sent to the partition's leader.
func (s *subscription) sameLog(ctx context.Context, last *kafkago.Message) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := s.b.client.Fetch(ctx, &kafkago.FetchRequest{
		Topic: last.Topic, Partition: last.Partition, Offset: last.Offset,
		MinBytes: 1, MaxBytes: 1, MaxWait: 100 * time.Millisecond})
	switch {
	case err != nil:
		return false, err
	case errors.Is(res.Error, kafkago.OffsetOutOfRange):
		return false, nil
	case res.Error != nil:
		return false, res.Error
	case res.HighWatermark <= last.Offset:
		return false, nil
	}
	for {
		rec, err := res.Records.ReadRecord()
		if err != nil {
			// No record at last's offset in the batch that should hold it.
			if errors.Is(err, io.EOF) {
				return false, nil
			}
			return false, err
		}
		if rec.Offset < last.Offset {
			continue
		}
		if rec.Offset != last.Offset || !rec.Time.Equal(last.Time) {
			return false, nil
		}
		var id string
		for _, h := range rec.Headers {
			if h.Key == hdrID {
				id = string(h.Value)
				break
			}
		}
		if id != headerOf(last.Headers, hdrID) {
			return false, nil
		}
		key, kerr := kafkago.ReadAll(rec.Key)
		value, verr := kafkago.ReadAll(rec.Value)
		if err := errors.Join(kerr, verr); err != nil {
			return false, err
		}
		return bytes.Equal(key, last.Key) && bytes.Equal(value, last.Value), nil
	}
}

// headerOf returns the value of the first header named key, "" if none.
func headerOf(hs []kafkago.Header, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// resetPartition handles a log that is gone (why, logged: a read position
// past the end of the log, or the record last read no longer at its
// offset): the topic was deleted and created again (or truncated), so the
// offsets held belong to a log that is gone. It forgets them (deliveries of the old log
// can no longer be settled), starts a fresh state at the log's first
// offset and commits it.
func (s *subscription) resetPartition(ctx context.Context, old *partState, why string) (*partState, int64, error) {
	res, err := s.b.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{
		old.key.topic: {kafkago.FirstOffsetOf(old.key.partition)}}})
	if err != nil {
		return old, 0, err
	}
	first := int64(0)
	for _, po := range res.Topics[old.key.topic] {
		if po.Error != nil {
			return old, 0, po.Error
		}
		first = po.FirstOffset
	}
	s.b.log.Warn(why+"; reading it from its first offset",
		"queue", s.q.queue.Name, "topic", old.key.topic, "partition", old.key.partition, "offset", first)
	s.mu.Lock()
	old.revoked = true
	kept := s.pending[:0]
	for _, d := range s.pending {
		if d.ps != old {
			kept = append(kept, d)
		}
	}
	s.pending = kept
	ps := &partState{key: old.key, gen: old.gen, floor: first, commit: -1, done: map[int64]bool{}}
	s.parts[old.key] = ps
	s.broadcastLocked()
	s.mu.Unlock()
	s.signalCommit()
	return ps, first, nil
}

// wants reports whether the record is for this queue. A record without
// ferry's type header (written by another producer) is handed to every
// queue, so the worker can dead-letter it with a reason instead of the
// group silently passing over it.
func (s *subscription) wants(m *broker.Message, internal map[string]string) bool {
	if q, ok := internal[hdrQueue]; ok {
		return q == s.q.queue.Name
	}
	if _, ok := internal[hdrType]; !ok {
		return true
	}
	for _, p := range s.q.queue.Bindings {
		if broker.MatchRoutingKey(p, m.Type) {
			return true
		}
	}
	return false
}

// forwardBatch is the most records the retry forwarder writes back with
// one write: one produce request per partition (writerBatchSize).
const forwardBatch = writerBatchSize

// forwardDrain is how long the retry forwarder waits for one more record
// already fetched before it writes back the due records it holds.
const forwardDrain = 2 * time.Millisecond

// forward reads one retry-topic partition for one generation: it waits
// until the head record is due, writes it back to the work topic for this
// queue only, together with the records behind it that are due too (at
// most forwardBatch, in one write, as the relay publishes), and
// commits past them. Records that fall due together (a burst of retries
// of one level) thus come back together, not one acks=all round trip
// after another. Each partition (and each level, a topic of its own) has
// its own goroutine, so a wait blocks nothing else.
func (s *subscription) forward(ctx context.Context, gen *kafkago.Generation, k partKey, offset int64) {
	r := s.newReader(k.topic, k.partition, offset)
	defer func() { r.Close() }()
	var (
		held    *kafkago.Message // fetched, not yet due: the next batch's head
		heldErr error            // what a drain's FetchMessage reported instead of a record
	)
	for {
		var m kafkago.Message
		if held != nil {
			m, held = *held, nil
		} else {
			var err error
			if heldErr != nil {
				err, heldErr = heldErr, nil
			} else {
				m, err = r.FetchMessage(ctx)
			}
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				if errors.Is(err, kafkago.OffsetOutOfRange) {
					// The retry topic was created again: read it from its start.
					r.Close()
					r = s.newReader(k.topic, k.partition, kafkago.FirstOffset)
					continue
				}
				s.recreate(ctx, err)
				if !sleepCtx(ctx, 500*time.Millisecond) {
					return
				}
				continue
			}
		}
		rec, due := s.writeBack(m)
		if wait := time.Until(due); wait > 0 && !sleepCtx(ctx, wait) {
			return
		}
		recs, last := []kafkago.Message{rec}, m.Offset
		for len(recs) < forwardBatch {
			dctx, cancel := context.WithTimeout(ctx, forwardDrain)
			next, err := r.FetchMessage(dctx)
			cancel()
			if err != nil {
				if dctx.Err() == nil || ctx.Err() != nil {
					heldErr = err // the reader's own error: handled as the next fetch's
				}
				break // else nothing more fetched yet
			}
			rec, due := s.writeBack(next)
			if time.Until(due) > 0 {
				held = &next
				break
			}
			recs, last = append(recs, rec), next.Offset
		}
		if !s.writeBackAll(ctx, k, recs) {
			return
		}
		if err := gen.CommitOffsets(map[string]map[int]int64{k.topic: {k.partition: last + 1}}); err != nil && ctx.Err() == nil {
			s.b.log.Debug("retry forwarder: commit failed", "queue", s.q.queue.Name, "error", err)
		}
	}
}

// writeBack returns the work-topic record for retry record m, addressed
// to this queue only, and the time m is due (zero when m has no due time:
// due at once).
func (s *subscription) writeBack(m kafkago.Message) (kafkago.Message, time.Time) {
	var due time.Time
	hs := make([]kafkago.Header, 0, len(m.Headers)+1)
	for _, h := range m.Headers {
		switch h.Key {
		case hdrDue:
			if ms, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
				due = time.UnixMilli(ms)
			}
			continue
		case hdrQueue:
			continue
		}
		hs = append(hs, h)
	}
	hs = append(hs, kafkago.Header{Key: hdrQueue, Value: []byte(s.q.queue.Name)})
	rec := kafkago.Message{Topic: s.q.topic, Key: m.Key, Value: m.Value, Headers: hs}
	if rec.Value == nil {
		rec.Value = []byte{}
	}
	return rec, due
}

// writeBackAll writes recs to the work topic (acks=all) until every one
// is written: after a failure it waits a second and writes again only
// the records the broker did not take. It reports false when ctx ends
// first (the records are then read again from the uncommitted offset).
func (s *subscription) writeBackAll(ctx context.Context, k partKey, recs []kafkago.Message) bool {
	for {
		wctx, cancel := context.WithTimeout(ctx, s.b.cfg.PublishTimeout)
		err := s.b.write(wctx, s.q.exchange, recs)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		var we kafkago.WriteErrors
		if errors.As(err, &we) && len(we) == len(recs) {
			failed := recs[:0:0]
			for i, e := range we {
				if e != nil {
					failed = append(failed, recs[i])
				}
			}
			if len(failed) > 0 {
				recs = failed
			}
		}
		s.b.log.Warn("retry forwarder: write back failed; retrying", "queue", s.q.queue.Name, "topic", k.topic, "records", len(recs), "error", err)
		if !sleepCtx(ctx, time.Second) {
			return false
		}
	}
}

// commitLoop commits the settled prefix of every partition, coalescing
// the settlements that happened meanwhile, and retries every second.
func (s *subscription) commitLoop() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-s.commitSig:
		case <-tick.C:
		case <-s.stopped:
			return
		}
		s.flush()
	}
}

// flush commits every partition whose floor moved past its commit.
func (s *subscription) flush() {
	s.mu.Lock()
	byGen := map[*kafkago.Generation]map[string]map[int]int64{}
	for _, ps := range s.parts {
		if ps.gen == nil || ps.floor < 0 || ps.floor <= ps.commit {
			continue
		}
		m := byGen[ps.gen]
		if m == nil {
			m = map[string]map[int]int64{}
			byGen[ps.gen] = m
		}
		if m[ps.key.topic] == nil {
			m[ps.key.topic] = map[int]int64{}
		}
		m[ps.key.topic][ps.key.partition] = ps.floor
	}
	s.mu.Unlock()
	for gen, offs := range byGen {
		if err := gen.CommitOffsets(offs); err != nil {
			s.b.log.Debug("commit failed; retrying", "queue", s.q.queue.Name, "error", err)
			continue
		}
		s.mu.Lock()
		for topic, ps := range offs {
			for p, off := range ps {
				if st := s.parts[partKey{topic, p}]; st != nil && st.gen == gen && off > st.commit {
					st.commit = off
				}
			}
		}
		s.mu.Unlock()
	}
}

// Receive hands out the oldest fetched message that the prefetch bound
// and, with Ordered, its key allow.
func (s *subscription) Receive(ctx context.Context) (broker.Delivery, error) {
	for {
		s.mu.Lock()
		if s.closed || s.b.closed.Load() {
			s.mu.Unlock()
			return nil, broker.ErrClosed
		}
		if s.inflight < s.opts.Prefetch {
			for i, d := range s.pending {
				k := d.msg.Key
				if s.opts.Ordered && k != "" && s.busy[k] > 0 {
					continue
				}
				s.pending = append(s.pending[:i], s.pending[i+1:]...)
				d.ps.pending--
				s.inflight++
				if s.opts.Ordered && k != "" {
					s.busy[k]++
				}
				s.broadcastLocked()
				s.mu.Unlock()
				return d, nil
			}
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.b.done:
		case <-ch:
		}
	}
}

// settled releases d's prefetch slot and key, and marks its offset
// settled so the commit can move past it.
func (s *subscription) settled(d *delivery) error {
	s.mu.Lock()
	s.inflight--
	if s.opts.Ordered && d.msg.Key != "" {
		if s.busy[d.msg.Key]--; s.busy[d.msg.Key] <= 0 {
			delete(s.busy, d.msg.Key)
		}
	}
	revoked := d.ps.revoked
	if !revoked {
		d.ps.finish(d.offset)
	}
	last := s.closed && s.inflight == 0
	s.broadcastLocked()
	s.mu.Unlock()
	s.signalCommit()
	if last {
		go s.shutdown()
	}
	if revoked {
		return errRevokedSettle
	}
	return nil
}

// redeliver releases d's prefetch slot and key and queues a new delivery
// of the same record at the head of the pending messages.
func (s *subscription) redeliver(d *delivery) {
	s.mu.Lock()
	s.inflight--
	if s.opts.Ordered && d.msg.Key != "" {
		if s.busy[d.msg.Key]--; s.busy[d.msg.Key] <= 0 {
			delete(s.busy, d.msg.Key)
		}
	}
	if !s.closed && !d.ps.revoked {
		nd := &delivery{s: s, ps: d.ps, offset: d.offset, msg: d.msg, internal: d.internal}
		d.ps.pending++
		s.pending = append([]*delivery{nd}, s.pending...)
	}
	last := s.closed && s.inflight == 0
	s.broadcastLocked()
	s.mu.Unlock()
	if last {
		go s.shutdown()
	}
}

// Close stops handing out messages. The group stays joined until every
// delivery handed out is settled (so their offsets can still be
// committed), then leaves; messages fetched and not handed out are read
// again by the next member.
func (s *subscription) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for _, d := range s.pending {
		d.ps.pending--
	}
	s.pending = nil
	idle := s.inflight == 0
	s.broadcastLocked()
	s.mu.Unlock()
	if idle {
		go s.shutdown()
	}
	return nil
}

// shutdown commits what is settled and leaves the group. Called when the
// subscription is closed and idle, and by the broker's Close.
func (s *subscription) shutdown() {
	s.stopOnce.Do(func() {
		s.flush()
		close(s.stopped)
		done := make(chan struct{})
		go func() {
			_ = s.group.Close()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
		}
		s.b.mu.Lock()
		delete(s.b.subs, s)
		s.b.mu.Unlock()
	})
}

// delivery is one message handed out by Receive.
type delivery struct {
	s        *subscription
	ps       *partState
	offset   int64
	msg      *broker.Message
	internal map[string]string
	state    atomic.Int32 // 0 open, 1 settling, 2 settled
}

func (d *delivery) Message() *broker.Message { return d.msg }

func (d *delivery) begin() error {
	if d.s.b.closed.Load() {
		if d.state.Load() == 2 {
			return broker.ErrAlreadyAcked
		}
		return broker.ErrClosed
	}
	if !d.state.CompareAndSwap(0, 1) {
		return broker.ErrAlreadyAcked
	}
	return nil
}

// Ack marks the offset settled; the commit follows asynchronously once
// every earlier offset of the partition is settled too (a crash before it
// means a redelivery, which consumers deduplicate).
func (d *delivery) Ack(ctx context.Context) error {
	if err := d.begin(); err != nil {
		return err
	}
	d.state.Store(2)
	return d.s.settled(d)
}

// Retry writes the message to the retry topic of the level for delay (the
// shortest level at least as long, else the longest) with the retry
// headers and its due time, then settles it. The retry forwarder writes it
// back to the work topic for this queue only when it is due.
func (d *delivery) Retry(ctx context.Context, delay time.Duration, reason string) error {
	if err := d.begin(); err != nil {
		return err
	}
	if d.ps.revoked {
		d.state.Store(2)
		return d.s.settled(d) // errRevoked
	}
	delays := d.s.q.queue.Delays()
	level := len(delays) - 1
	for i, l := range delays {
		if l >= delay {
			level = i
			break
		}
	}
	now := time.Now()
	hs := copyHeaders(d.msg.Headers)
	hs[broker.HeaderRetryCount] = strconv.Itoa(d.msg.Attempt)
	hs[broker.HeaderLastError] = broker.TruncateReason(reason)
	if hs[broker.HeaderFirstFailedAt] == "" {
		hs[broker.HeaderFirstFailedAt] = broker.FormatTime(now)
	}
	due := now.Add(delays[level])
	rec := toRecord(d.s.q.retryTopics[level], d.msg, hs, kafkago.Header{Key: hdrDue, Value: []byte(strconv.FormatInt(due.UnixMilli(), 10))})
	if err := d.writeSettle(ctx, rec); err != nil {
		return fmt.Errorf("kafka: retry %s to %s: %w", d.msg.ID, d.s.q.retryTopics[level], err)
	}
	return d.s.settled(d)
}

// DeadLetter writes the message to the queue's compacted DLQ topic, keyed
// by its ID, with HeaderLastError and HeaderDeadAt, then settles it.
func (d *delivery) DeadLetter(ctx context.Context, reason string) error {
	if err := d.begin(); err != nil {
		return err
	}
	if d.ps.revoked {
		d.state.Store(2)
		return d.s.settled(d) // errRevoked
	}
	rec := dlqRecord(d.s.q.dlqTopic, d.s.q.topic, d.msg, reason, time.Now())
	if err := d.writeSettle(ctx, rec); err != nil {
		return fmt.Errorf("kafka: dead-letter %s to %s: %w", d.msg.ID, d.s.q.dlqTopic, err)
	}
	return d.s.settled(d)
}

// writeSettle writes rec (acks=all). When the write fails, the delivery
// is given up and its message handed out again by Receive (as a broker
// redelivers after a failed settlement): its offset stays unsettled, and
// its prefetch slot is free.
func (d *delivery) writeSettle(ctx context.Context, rec kafkago.Message) error {
	ctx, cancel := d.s.b.opContext(ctx)
	defer cancel()
	err := ctx.Err()
	if err == nil {
		err = d.s.b.write(ctx, d.s.q.exchange, []kafkago.Message{rec})
	}
	if err != nil {
		d.state.Store(2)
		d.s.redeliver(d)
		if d.s.b.closed.Load() {
			return broker.ErrClosed
		}
		return err
	}
	d.state.Store(2)
	return nil
}

// Extend is a no-op that reports whether the delivery can still be
// settled. kafka-go sends the group heartbeats from its own goroutine
// (every second here), independent of handlers, and has no
// max.poll.interval.ms, so a long handler never makes this member look
// dead; only a rebalance (a member joining or leaving) can move the
// partition, and then Extend returns an error saying so.
func (d *delivery) Extend(ctx context.Context) error {
	if d.s.b.closed.Load() {
		return broker.ErrClosed
	}
	if d.state.Load() == 2 {
		return broker.ErrAlreadyAcked
	}
	if d.ps.revoked {
		return errRevokedSettle
	}
	return nil
}

func copyHeaders(h map[string]string) map[string]string {
	out := make(map[string]string, len(h)+3)
	for k, v := range h {
		out[k] = v
	}
	return out
}
