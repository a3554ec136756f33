package sqs

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ferrymq/ferry/broker"
)

// sendConcurrency bounds the SendMessageBatch calls of one Publish in
// flight at once.
const sendConcurrency = 8

// pending is one message bound for one queue.
type pending struct {
	idx   int // in the Publish batch
	entry types.SendMessageBatchRequestEntry
	size  int
}

// Publish routes each message to every declared queue (of the last
// declared exchange) whose bindings match its Type, and sends them with
// SendMessageBatch: at most 10 entries and at most the queue's
// MaximumMessageSize bytes per call. A message no queue matches fails with
// broker.ErrUnroutable, one larger than Capabilities.MaxMessageBytes or
// the queue's limit with broker.ErrMessageTooLarge, both before any call;
// an entry SQS lists under Failed fails with SQS's code and message,
// wrapping broker.ErrInvalidMessage when SQS says it is the sender's fault
// (the message's body or an attribute SQS refuses), broker.ErrNacked when
// it is the server's. Such per-message failures come back as a
// *broker.PublishError; the entries SQS accepted are never sent again. A
// call that failed as a whole (server unreachable, throttled, ctx done)
// makes Publish return that error, not a *broker.PublishError: none of the
// batch is known to be stored. A queue deleted under the process is
// declared again and the call repeated once.
func (b *Broker) Publish(ctx context.Context, msgs []*broker.Message) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sqs: publish: %w", err)
	}
	if len(msgs) == 0 {
		return nil
	}
	b.mu.Lock()
	var targets []*queueInfo
	if t, ok := b.topos[b.exchange]; ok {
		for _, q := range t.Queues {
			targets = append(targets, b.queues[q.Name])
		}
	}
	b.mu.Unlock()
	if len(targets) == 0 {
		return fmt.Errorf("sqs: publish: nothing declared: call Declare first")
	}
	maxBytes := b.Capabilities().MaxMessageBytes

	failed := map[int]error{}
	perQueue := map[*queueInfo][]pending{}
	for i, m := range msgs {
		var matched []*queueInfo
		for _, qi := range targets {
			for _, p := range qi.q.Bindings {
				if broker.MatchRoutingKey(p, m.Type) {
					matched = append(matched, qi)
					break
				}
			}
		}
		if len(matched) == 0 {
			failed[i] = fmt.Errorf("%w: no queue of exchange %s is bound to %q", broker.ErrUnroutable, b.exchange, m.Type)
			continue
		}
		if maxBytes > 0 && m.Size() > maxBytes {
			failed[i] = fmt.Errorf("%w: message %s is %d bytes, SQS queues take %d (MaximumMessageSize minus ferry's reserve)",
				broker.ErrMessageTooLarge, m.ID, m.Size(), maxBytes)
			continue
		}
		enc, err := encode(m, m.Headers)
		if err != nil {
			failed[i] = err
			continue
		}
		var tooBig error
		for _, qi := range matched {
			qi.mu.Lock()
			limit := qi.limit
			qi.mu.Unlock()
			if enc.size > limit {
				tooBig = fmt.Errorf("%w: message %s is %d bytes encoded for SQS, queue %s takes %d (MaximumMessageSize)",
					broker.ErrMessageTooLarge, m.ID, enc.size, qi.name, limit)
			}
		}
		if tooBig != nil {
			failed[i] = tooBig
			continue
		}
		for _, qi := range matched {
			e := types.SendMessageBatchRequestEntry{
				Id:                aws.String("m" + strconv.Itoa(i)),
				MessageBody:       aws.String(enc.body),
				MessageAttributes: enc.attrs,
			}
			if b.cfg.FIFO {
				g := m.Key
				if g == "" {
					g = m.ID
				}
				e.MessageGroupId = aws.String(fifoID(g))
				e.MessageDeduplicationId = aws.String(fifoID(m.ID))
			}
			perQueue[qi] = append(perQueue[qi], pending{idx: i, entry: e, size: enc.size})
		}
	}

	ctx, cancel := b.opCtx(ctx, b.cfg.PublishTimeout)
	defer cancel()
	var (
		mu      sync.Mutex
		callErr error
		wg      sync.WaitGroup
		sem     = make(chan struct{}, sendConcurrency)
	)
	record := func(entryErrs map[int]error, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if callErr == nil {
				callErr = err
			}
			return
		}
		for idx, e := range entryErrs {
			if _, dup := failed[idx]; !dup {
				failed[idx] = e
			}
		}
	}
	for qi, ps := range perQueue {
		qi.mu.Lock()
		limit := qi.limit
		qi.mu.Unlock()
		batches := splitBatches(ps, limit)
		if b.cfg.FIFO {
			// One queue's calls in order: a FIFO queue keeps the order
			// in which its calls arrive.
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, batch := range batches {
					sem <- struct{}{}
					entryErrs, err := b.sendBatch(ctx, qi, batch)
					<-sem
					record(entryErrs, err)
					if err != nil {
						return
					}
				}
			}()
			continue
		}
		for _, batch := range batches {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				record(b.sendBatch(ctx, qi, batch))
			}()
		}
	}
	wg.Wait()
	if callErr != nil {
		if b.ctx.Err() != nil {
			return broker.ErrClosed
		}
		return fmt.Errorf("sqs: publish: %w", callErr)
	}
	if len(failed) == 0 {
		return nil
	}
	pe := &broker.PublishError{}
	for idx, err := range failed {
		pe.Failed = append(pe.Failed, broker.FailedMessage{Index: idx, ID: msgs[idx].ID, Err: err})
	}
	sort.Slice(pe.Failed, func(i, j int) bool { return pe.Failed[i].Index < pe.Failed[j].Index })
	return pe
}

// splitBatches cuts ps into SendMessageBatch calls of at most 10 entries
// whose sizes sum to at most limit bytes.
func splitBatches(ps []pending, limit int) [][]pending {
	var out [][]pending
	var cur []pending
	sum := 0
	for _, p := range ps {
		if len(cur) > 0 && (len(cur) == MaxBatchEntries || sum+p.size > limit) {
			out = append(out, cur)
			cur, sum = nil, 0
		}
		cur = append(cur, p)
		sum += p.size
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// sendBatch sends one batch and returns the per-entry failures by batch
// index, or the error of the call as a whole. Only the entries SQS listed
// neither as Successful nor as Failed count as failed with the call.
func (b *Broker) sendBatch(ctx context.Context, qi *queueInfo, batch []pending) (map[int]error, error) {
	entries := make([]types.SendMessageBatchRequestEntry, len(batch))
	byID := map[string]int{}
	msgID := map[string]string{} // entry ID -> ferry message ID
	for i, p := range batch {
		entries[i] = p.entry
		byID[aws.ToString(p.entry.Id)] = p.idx
		msgID[aws.ToString(p.entry.Id)] = aws.ToString(p.entry.MessageAttributes[attrID].StringValue)
	}
	url, _ := qi.urls()
	b.sendCalls.Add(1)
	out, err := b.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
	if err != nil && notExist(err) && ctx.Err() == nil {
		if rerr := b.redeclare(ctx, qi); rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		url, _ = qi.urls()
		out, err = b.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
	}
	if err != nil {
		return nil, fmt.Errorf("SendMessageBatch to %s: %w", qi.name, err)
	}
	res := map[int]error{}
	done := map[string]bool{}
	for _, s := range out.Successful {
		done[aws.ToString(s.Id)] = true
	}
	for _, f := range out.Failed {
		id := aws.ToString(f.Id)
		idx, ok := byID[id]
		if !ok {
			continue
		}
		done[id] = true
		// A sender fault is the message's own (its body or an attribute
		// SQS refuses): sending it again fails the same way. A server
		// fault may pass on a later try.
		kind, who := broker.ErrNacked, "server"
		if f.SenderFault {
			kind, who = broker.ErrInvalidMessage, "sender"
		}
		res[idx] = fmt.Errorf("%w: sqs: publish %s: SQS refused it for queue %s (%s fault): %s: %s",
			kind, msgID[id], qi.name, who, aws.ToString(f.Code), aws.ToString(f.Message))
	}
	for id, idx := range byID {
		if !done[id] {
			res[idx] = fmt.Errorf("%w: sqs: publish %s: SQS's answer for queue %s does not list entry %s", broker.ErrNacked, msgID[id], qi.name, id)
		}
	}
	return res, nil
}
