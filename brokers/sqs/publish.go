package sqs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ferrymq/ferry/broker"
)

// pending is one message bound for one queue.
type pending struct {
	idx   int // in the Publish batch
	entry types.SendMessageBatchRequestEntry
	size  int
}

// Publish routes each message to every declared queue (of the last
// declared exchange) whose bindings match its Type, and sends them with
// SendMessageBatch: at most 10 entries and at most the queue's
// MaximumMessageSize bytes per call. A message without ID or Type fails
// with broker.ErrInvalidMessage, one no queue matches with
// broker.ErrUnroutable, one larger than Capabilities.MaxMessageBytes or
// the queue's limit with broker.ErrMessageTooLarge, all before any call;
// an entry SQS lists under Failed fails with SQS's code and message,
// wrapping broker.ErrInvalidMessage when SQS says it is the sender's fault
// (the message's body or an attribute SQS refuses), broker.ErrNacked when
// it is the server's.
//
// A call that fails as a whole is classified by refusedCall: an HTTP 4xx
// answer that is not throttling, authentication, authorisation or a
// missing queue (e.g. InvalidMessageContents, InvalidParameterValue,
// BatchRequestTooLong, or ElasticMQ's InvalidAction for a body its JSON
// parser refuses) is the messages' fault, and the call's entries are sent
// again in halves (broker.SendSplitting) until the message(s) at fault are
// found: they alone fail, wrapping broker.ErrInvalidMessage, and the
// others are sent. Anything else (no answer, ctx, HTTP 5xx or throttling
// after the SDK's 3 attempts, credentials, a queue that stays missing) is
// an outage: only the messages of that call fail with its error.
//
// Per-message outcomes come back as a *broker.PublishError; the messages
// of the calls SQS accepted are not listed and are never sent again. Only
// when every message failed with one call's error does Publish return
// that error itself. A message routed to several queues is listed when
// one of its sends failed (a message fault first), and the relay's
// publish-again then also reaches the queues that had it (consumers
// deduplicate). A queue deleted under the process is declared again and
// the call repeated once.
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
		// ID and Type travel as message attributes, whose value SQS
		// requires to be non-empty ("Name, type, value and the message
		// body must not be empty or null", SQS Developer Guide, "Amazon
		// SQS message attributes"). ElasticMQ refuses such an entry;
		// moto 5.1 accepts it and hands the message out without the
		// attribute, i.e. under SQS's MessageId (TestServersDiffer).
		switch {
		case m == nil:
			failed[i] = fmt.Errorf("%w: sqs: publish: nil message", broker.ErrInvalidMessage)
			continue
		case m.ID == "":
			failed[i] = fmt.Errorf("%w: sqs: publish: Message.ID is required (it is the ferry-id attribute, and SQS takes no empty attribute value)", broker.ErrInvalidMessage)
			continue
		case m.Type == "":
			failed[i] = fmt.Errorf("%w: sqs: publish %s: Message.Type is required (it is the ferry-type attribute, and SQS takes no empty attribute value)", broker.ErrInvalidMessage, m.ID)
			continue
		}
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
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for qi, ps := range perQueue {
		byIdx := make(map[int]pending, len(ps))
		idx := make([]int, len(ps))
		for j, p := range ps {
			byIdx[p.idx] = p
			idx[j] = p.idx
		}
		// Each queue's calls on their own: a refusal of a whole call that
		// is the messages' fault is split up to find them
		// (broker.SendSplitting), and an accepted call is never sent again.
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := broker.SendSplitting(ctx, idx, func(ctx context.Context, idx []int) map[int]error {
				sub := make([]pending, len(idx))
				for j, i := range idx {
					sub[j] = byIdx[i]
				}
				return b.sendQueue(ctx, qi, sub)
			})
			mu.Lock()
			defer mu.Unlock()
			for i, err := range res {
				// A message for several queues fails when one of its
				// sends failed; a message fault wins, so the row is
				// parked with its reason.
				if old, dup := failed[i]; !dup || (!broker.IsMessageFault(old) && broker.IsMessageFault(err)) {
					failed[i] = err
				}
			}
		}()
	}
	wg.Wait()
	if len(failed) > 0 && b.ctx.Err() != nil {
		for i, err := range failed {
			if !broker.IsMessageFault(err) {
				failed[i] = broker.ErrClosed
			}
		}
	}
	return broker.PublishResult(msgs, failed)
}

// sendQueue sends ps to one queue in SendMessageBatch calls (splitBatches),
// up to Config.SendConcurrency of them at once, and returns the messages not
// accepted by batch index. On a FIFO queue the calls go one after another
// (a FIFO queue keeps the order in which its calls arrive), and after a
// call that failed the later ones are not made: their messages fail with
// that call's error, a refusal of the messages included, so that they are
// sent after the refused ones are sorted out.
func (b *Broker) sendQueue(ctx context.Context, qi *queueInfo, ps []pending) map[int]error {
	qi.mu.Lock()
	limit := qi.limit
	qi.mu.Unlock()
	batches := splitBatches(ps, limit)
	out := map[int]error{}
	var mu sync.Mutex
	record := func(batch []pending, entryErrs map[int]error, err error) {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range batch {
			if err != nil {
				out[p.idx] = err
			} else if e, ok := entryErrs[p.idx]; ok {
				out[p.idx] = e
			}
		}
	}
	if b.cfg.FIFO {
		for k, batch := range batches {
			entryErrs, err := b.sendBatch(ctx, qi, batch)
			record(batch, entryErrs, err)
			if err != nil {
				for _, rest := range batches[k+1:] {
					record(rest, nil, err)
				}
				break
			}
		}
		return out
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, b.cfg.SendConcurrency)
	for _, batch := range batches {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			entryErrs, err := b.sendBatch(ctx, qi, batch)
			record(batch, entryErrs, err)
		}()
	}
	wg.Wait()
	return out
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
		err = fmt.Errorf("sqs: publish: SendMessageBatch of %d message(s) to %s: %w", len(batch), qi.name, err)
		if refusedCall(err) {
			err = broker.RefusedCall(err)
		}
		return nil, err
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

// refusedCall reports whether err, the error of a whole SendMessageBatch
// call, is a refusal of what the call carried (its messages' fault): an
// HTTP 4xx answer other than 401, 403, 408 and 429 whose code is not in
// outageCodes, e.g. InvalidMessageContents, InvalidParameterValue,
// BatchRequestTooLong or ElasticMQ's InvalidAction for a body its JSON
// parser refuses. Anything else is an outage: no answer (connection,
// timeout, ctx), HTTP 5xx (after the SDK's retries), throttling,
// authentication and authorisation, a missing queue.
func refusedCall(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var re *awshttp.ResponseError
	if !errors.As(err, &re) {
		return false // no HTTP answer
	}
	switch st := re.HTTPStatusCode(); {
	case st < 400 || st >= 500, st == http.StatusUnauthorized, st == http.StatusForbidden,
		st == http.StatusRequestTimeout, st == http.StatusTooManyRequests:
		return false
	}
	return !outageCodes[apiCode(err)]
}
