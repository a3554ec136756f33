package sqs

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ferrymq/ferry/broker"
)

// Subscribe starts receiving from the queue: Config.ReceivePollers
// ReceiveMessage loops (default ceil(opts.Prefetch / 10), at most 16), of
// which one at a time long-polls (WaitTimeSeconds = Config.WaitTime) and
// the busy ones (their last receive came back full) receive without
// waiting; VisibilityTimeout = opts.AckDeadline (whole seconds, default
// 30 s), at most 10 messages per call and at most opts.Prefetch received
// and not settled (see the package documentation, "Consume"). Messages received and not yet
// handed out by Receive get a visibility heartbeat (every third of the
// deadline), so a slow handler does not let the tail of a batch go to
// another consumer; handed-out ones are kept by Delivery.Extend. With
// opts.Ordered (FIFO queues only) a message is handed out only after the
// earlier ones of its Key were settled.
func (b *Broker) Subscribe(ctx context.Context, queue string, opts broker.SubscribeOptions) (broker.Subscription, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	qi, ok := b.queues[queue]
	b.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s was not declared on this broker", broker.ErrUnknownQueue, queue)
	}
	if opts.Ordered && !b.cfg.FIFO {
		return nil, fmt.Errorf("%w: ordered subscription on %s: per-key order needs FIFO queues (Config.FIFO)", broker.ErrUnsupported, queue)
	}
	if opts.Prefetch <= 0 {
		opts.Prefetch = broker.DefaultPrefetch
	}
	if opts.AckDeadline <= 0 {
		opts.AckDeadline = 30 * time.Second
	}
	vis := visibilitySeconds(opts.AckDeadline)
	if vis < 1 {
		vis = 1
	}
	sctx, cancel := context.WithCancel(b.ctx)
	s := &subscription{b: b, qi: qi, opts: opts, vis: vis, ctx: sctx, cancel: cancel,
		changed: make(chan struct{}), held: map[string]int{}, polls: map[*int]time.Time{}}
	url, _ := qi.urls()
	s.acks = &acker{b: b, url: url}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		cancel()
		return nil, broker.ErrClosed
	}
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	pollers := b.cfg.ReceivePollers
	if pollers == 0 {
		pollers = min((opts.Prefetch+MaxBatchEntries-1)/MaxBatchEntries, DefaultMaxReceivePollers)
	}
	for i := 0; i < pollers; i++ {
		s.wg.Add(1)
		go s.poll()
	}
	s.wg.Add(1)
	go s.heartbeat()
	return s, nil
}

type subscription struct {
	b      *Broker
	qi     *queueInfo
	opts   broker.SubscribeOptions
	vis    int32 // visibility timeout, seconds
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	buf      []*delivery    // received, not handed out
	inflight int            // reserved by a poll + buffered + handed out unsettled
	held     map[string]int // Ordered: Key -> handed-out unsettled deliveries
	changed  chan struct{}  // closed and replaced on every change
	acks     *acker
	errLog   time.Time // last receive error logged
	// longPolling is set while one of the pollers' ReceiveMessage calls
	// waits (WaitTimeSeconds > 0): the others wait for it (poll).
	longPolling bool
	// polls holds, per ReceiveMessage call in flight, the time its long
	// poll ends on the server. Close cancels them on the client; the
	// server may still hand such an abandoned poll messages until then.
	polls map[*int]time.Time
}

func (s *subscription) signal() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Receive hands out the next buffered delivery (with Ordered, the next one
// whose Key has nothing unsettled), waiting for the pollers.
func (s *subscription) Receive(ctx context.Context) (broker.Delivery, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, broker.ErrClosed
		}
		for i, d := range s.buf {
			if s.opts.Ordered && d.msg.Key != "" && s.held[d.msg.Key] > 0 {
				continue
			}
			s.buf = append(s.buf[:i], s.buf[i+1:]...)
			if s.opts.Ordered && d.msg.Key != "" {
				s.held[d.msg.Key]++
			}
			if len(s.buf) == 0 {
				s.signal() // a poller waiting for a full batch's room polls now
			}
			s.mu.Unlock()
			s.b.mu.Lock()
			if s.b.closed {
				s.b.mu.Unlock()
				return nil, broker.ErrClosed
			}
			s.b.open[d] = struct{}{}
			s.b.mu.Unlock()
			return d, nil
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.ctx.Done():
			return nil, broker.ErrClosed
		case <-ch:
		}
	}
}

// release gives back d's prefetch slot (slot) and, with key, its Key's
// hold (Ordered) and its place among the deliveries Close makes visible
// again; each at most once per delivery (delivery.done keeps count).
func (s *subscription) release(d *delivery, slot, key bool) {
	if !slot && !key {
		return
	}
	if key {
		s.b.mu.Lock()
		delete(s.b.open, d)
		s.b.mu.Unlock()
	}
	s.mu.Lock()
	if slot {
		s.inflight--
	}
	if key && s.opts.Ordered && d.msg.Key != "" {
		if s.held[d.msg.Key]--; s.held[d.msg.Key] <= 0 {
			delete(s.held, d.msg.Key)
		}
	}
	s.signal()
	s.mu.Unlock()
}

// poll receives while there is room under the prefetch. While the queue
// is busy (this poller's last receive came back full) it receives without
// waiting, as every busy poller of the subscription does at once; and it
// waits for room for a whole batch (10 messages, or Prefetch when
// smaller) while the buffer still feeds the handlers, or while the buffer
// is empty but another poller's receive is on its way: receiving what the
// settles free one by one would make a call per message or two (SQS bills
// each call, and a server's cost is mostly per call). Otherwise it
// long-polls, one poller of the subscription at a time: an idle queue
// costs one call per WaitTime, a trickle gathers in one poll what several
// would split, and a poll that comes back full makes its poller busy, so
// the next poller's long poll starts: under load every poller joins
// within a few round trips.
func (s *subscription) poll() {
	defer s.wg.Done()
	backoff := 100 * time.Millisecond
	busy := false
	full := min(MaxBatchEntries, s.opts.Prefetch)
	for {
		s.mu.Lock()
		for !s.closed && (s.inflight >= s.opts.Prefetch || (!busy && s.longPolling) ||
			(s.opts.Prefetch-s.inflight < full && ((busy && len(s.buf) > 0) || (len(s.buf) == 0 && len(s.polls) > 0)))) {
			ch := s.changed
			s.mu.Unlock()
			select {
			case <-s.ctx.Done():
				return
			case <-ch:
			}
			s.mu.Lock()
		}
		if s.closed {
			s.mu.Unlock()
			return
		}
		n := min(MaxBatchEntries, s.opts.Prefetch-s.inflight)
		s.inflight += n
		// While the queue is busy (the last receive was full) a receive
		// does not wait and takes the whole AckDeadline at once; an idle
		// queue is long-polled with the short visibility, raised on
		// arrival.
		wait, vis := int32(s.b.cfg.WaitTime/time.Second), min(s.vis, pollVisibility)
		if busy {
			wait, vis = 0, s.vis
		}
		if !busy {
			s.longPolling = true
		}
		token := new(int)
		s.polls[token] = time.Now().Add(time.Duration(wait)*time.Second + pollSlack)
		s.mu.Unlock()

		url, _ := s.qi.urls()
		answer := time.Duration(wait)*time.Second + pollAnswer
		if wait == 0 {
			answer = busyAnswer
		}
		rctx, rcancel := context.WithTimeout(s.ctx, answer)
		out, err := s.b.client.ReceiveMessage(rctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(url),
			MaxNumberOfMessages:         int32(n),
			WaitTimeSeconds:             wait,
			VisibilityTimeout:           vis,
			MessageAttributeNames:       attrNames,
			MessageSystemAttributeNames: sysAttrNames,
		})
		unanswered := err != nil && rctx.Err() != nil && s.ctx.Err() == nil
		rcancel()
		if !busy {
			s.mu.Lock()
			s.longPolling = false // the next long poll may start (during this one's extend)
			s.signal()
			s.mu.Unlock()
		}
		var got []*delivery
		if err == nil {
			for _, m := range out.Messages {
				got = append(got, s.newDelivery(url, m))
			}
			if s.vis > vis && len(got) > 0 {
				s.extend(url, got)
			}
		}
		busy = err == nil && len(got) == n
		s.mu.Lock()
		delete(s.polls, token)
		s.inflight -= n - len(got)
		if s.closed {
			s.mu.Unlock()
			if len(got) > 0 {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				s.b.release(ctx, url, got, s.b.abandonedUntil())
				cancel()
			}
			return
		}
		got = s.replaceBufferedLocked(got)
		s.buf = append(s.buf, got...)
		s.signal()
		s.mu.Unlock()
		if err == nil {
			backoff = 100 * time.Millisecond
			continue
		}
		if s.ctx.Err() != nil {
			return
		}
		if unanswered {
			// Most likely the queue was deleted under the poll: poll again
			// at once; a deleted queue answers that one with
			// QueueDoesNotExist, and a re-created one with messages.
			s.logErr("sqs: receive not answered within its wait; polling again", err)
			backoff = 100 * time.Millisecond
			continue
		}
		if notExist(err) {
			rctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
			if rerr := s.b.redeclare(rctx, s.qi); rerr != nil {
				s.logErr("sqs: re-declare queue", rerr)
			}
			cancel()
		} else {
			s.logErr("sqs: receive failed; retrying", err)
		}
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// replaceBufferedLocked returns the deliveries of got that are not
// already in the buffer. A message received again while an earlier
// receive of it still waits in the buffer (its visibility timeout ran out
// there: a heartbeat that came too late or that SQS refused) takes the
// earlier one's place, since only the newest receipt handle deletes it
// ("you must provide the most recently received receipt handle", SQS
// Developer Guide, "Amazon SQS visibility timeout"), and gives back its
// prefetch slot: one subscription never hands out two copies of a message
// it has not handed out yet. A copy of a message already handed out is
// handed out again (an at-least-once redelivery the worker's dedup
// absorbs). s.mu must be held.
func (s *subscription) replaceBufferedLocked(got []*delivery) []*delivery {
	if len(s.buf) == 0 {
		return got
	}
	fresh := got[:0]
	for _, d := range got {
		i := slices.IndexFunc(s.buf, func(b *delivery) bool { return b.sqsID == d.sqsID && b.url == d.url })
		if i < 0 || d.sqsID == "" {
			fresh = append(fresh, d)
			continue
		}
		s.b.log.Warn("sqs: a buffered message was received again (its visibility timeout ran out before it was handed out); keeping the newest receipt",
			"queue", s.qi.q.Name, "sqs_queue", s.qi.name, "id", d.msg.ID, "receive_count", d.receiveCnt)
		s.buf[i] = d
		s.inflight--
	}
	return fresh
}

// pollVisibility is the visibility timeout (seconds) a ReceiveMessage
// asks for; the adapter raises it to the AckDeadline right after the
// messages arrive. A long poll abandoned by a closing process (the server
// may still hand it messages after the client has gone) so hides them for
// 5 s, not for the whole AckDeadline.
const pollVisibility = 5

// pollAnswer is how long after its WaitTimeSeconds a ReceiveMessage the
// server has not answered is abandoned. SQS answers a long poll when its
// wait ends; ElasticMQ (seen with 1.6.11) never answers a long poll whose
// queue is deleted meanwhile, so without this the subscription would hang
// until the HTTP client's timeout (Config.WaitTime + 15 s) before it
// notices the deletion and declares the queue again. A message the server
// may still hand to an abandoned poll stays hidden for that poll's
// visibility timeout and then comes back.
const pollAnswer = 2 * time.Second

// busyAnswer bounds a receive that does not wait (WaitTimeSeconds 0, the
// queue is busy): generous, because the messages of an abandoned receive
// stay hidden for the whole AckDeadline and their receive counts as an
// attempt. A deleted queue answers such a receive at once.
const busyAnswer = 10 * time.Second

// pollSlack is added to a long poll's WaitTimeSeconds for the time it
// may take to reach the server and for the server's own rounding.
const pollSlack = time.Second

// extend sets the visibility of ds to the AckDeadline (batches of 10).
func (s *subscription) extend(url string, ds []*delivery) {
	for i := 0; i < len(ds); i += MaxBatchEntries {
		var entries []types.ChangeMessageVisibilityBatchRequestEntry
		for j, d := range ds[i:min(i+MaxBatchEntries, len(ds))] {
			entries = append(entries, types.ChangeMessageVisibilityBatchRequestEntry{
				Id: aws.String("h" + strconv.Itoa(j)), ReceiptHandle: aws.String(d.receipt), VisibilityTimeout: s.vis})
		}
		ctx, cancel := context.WithTimeout(s.ctx, time.Duration(pollVisibility)*time.Second)
		out, err := s.b.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{
			QueueUrl: aws.String(url), Entries: entries})
		cancel()
		if err == nil && len(out.Failed) > 0 {
			f := out.Failed[0]
			err = fmt.Errorf("%d of %d entries refused, first %s: %s", len(out.Failed), len(entries), aws.ToString(f.Code), aws.ToString(f.Message))
		}
		if err != nil && s.ctx.Err() == nil {
			s.logErr("sqs: visibility heartbeat", err)
		}
	}
}

// logErr logs at most one receive error every 10 s.
func (s *subscription) logErr(msg string, err error) {
	s.mu.Lock()
	if time.Since(s.errLog) < 10*time.Second {
		s.mu.Unlock()
		return
	}
	s.errLog = time.Now()
	s.mu.Unlock()
	s.b.log.Warn(msg, "queue", s.qi.q.Name, "sqs_queue", s.qi.name, "err", err)
}

// heartbeat keeps the buffered (received, not handed out) messages
// invisible to other consumers.
func (s *subscription) heartbeat() {
	defer s.wg.Done()
	every := time.Duration(s.vis) * time.Second / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		buf := append([]*delivery(nil), s.buf...)
		s.mu.Unlock()
		byURL := map[string][]*delivery{}
		for _, d := range buf {
			byURL[d.url] = append(byURL[d.url], d)
		}
		for url, ds := range byURL {
			s.extend(url, ds)
		}
	}
}

// Close stops polling and makes the buffered messages visible again.
// Handed-out deliveries can still be settled.
//
// A long poll cancelled by Close goes on waiting on the server, which can
// still hand it a message (counting a receive) that then never reaches a
// consumer: SQS does not notice the client has gone. So the released
// messages become visible only once the cancelled polls have ended on the
// server (at most Config.WaitTime + 1 s after Close), never to one of them.
func (s *subscription) Close() error {
	s.shutdown(context.Background())
	return nil
}

func (s *subscription) shutdown(ctx context.Context) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.b.abandon(s.polls)
	buf := s.buf
	s.buf = nil
	s.inflight -= len(buf)
	s.signal()
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	if len(buf) > 0 {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		byURL := map[string][]*delivery{}
		for _, d := range buf {
			byURL[d.url] = append(byURL[d.url], d)
		}
		for url, ds := range byURL {
			s.b.release(ctx, url, ds, s.b.abandonedUntil())
		}
		cancel()
	}
	s.b.mu.Lock()
	delete(s.b.subs, s)
	s.b.mu.Unlock()
}
