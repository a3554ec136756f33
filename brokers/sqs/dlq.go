package sqs

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ferrymq/ferry/broker"
)

// DLQ returns the DLQ of queue. For a queue this broker did not declare,
// each method first finds the SQS queues: on Config.LookupExchange when
// set, else by listing the server's queues for a name ending in the DLQ's
// name whose ferry-queue tag names it (it must be unique). List and Purge
// read a DLQ whose work queue is gone; Replay needs the work queue.
func (b *Broker) DLQ(queue string) (broker.DeadLetterQueue, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if !validQueue(queue) {
		return nil, fmt.Errorf("%w: %q is not a valid queue name", broker.ErrUnknownQueue, queue)
	}
	b.mu.Lock()
	qi := b.queues[queue]
	b.mu.Unlock()
	return &dlq{b: b, queue: queue, qi: qi}, nil
}

type dlq struct {
	b     *Broker
	queue string
	qi    *queueInfo // nil until found
}

// resolve returns the queue's info, looking it up on the server for a
// queue not declared here. needWork asks for the work queue too.
func (q *dlq) resolve(ctx context.Context, needWork bool) (*queueInfo, error) {
	if err := q.b.check(); err != nil {
		return nil, err
	}
	if q.qi != nil && q.qi.declared {
		return q.qi, nil
	}
	dlqName := broker.DLQName(q.queue)
	var candidates []string
	if ex := q.b.cfg.LookupExchange; ex != "" {
		candidates = []string{QueueName(ex, dlqName, q.b.cfg.FIFO)}
	} else {
		suffix := "__" + clean(dlqName)
		if q.b.cfg.FIFO {
			suffix += ".fifo"
		}
		var token *string
		for {
			out, err := q.b.client.ListQueues(ctx, &sqs.ListQueuesInput{MaxResults: aws.Int32(1000), NextToken: token})
			if err != nil {
				return nil, fmt.Errorf("sqs: DLQ of %s: list queues: %w", q.queue, err)
			}
			for _, u := range out.QueueUrls {
				if n := path(u); strings.HasSuffix(n, suffix) {
					candidates = append(candidates, n)
				}
			}
			if out.NextToken == nil || aws.ToString(out.NextToken) == "" {
				break
			}
			token = out.NextToken
		}
	}
	var found []*queueInfo
	for _, n := range candidates {
		u, err := q.b.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(n)})
		if err != nil {
			if notExist(err) {
				continue
			}
			return nil, fmt.Errorf("sqs: DLQ of %s: %w", q.queue, err)
		}
		tags, err := q.b.client.ListQueueTags(ctx, &sqs.ListQueueTagsInput{QueueUrl: u.QueueUrl})
		if err != nil {
			return nil, fmt.Errorf("sqs: DLQ of %s: tags of %s: %w", q.queue, n, err)
		}
		if tags.Tags[tagQueue] != dlqName {
			continue
		}
		ex := tags.Tags[tagExchange]
		qi := &queueInfo{exchange: ex, q: broker.Queue{Name: q.queue}, dlqName: n, dlqURL: aws.ToString(u.QueueUrl),
			name: QueueName(ex, q.queue, q.b.cfg.FIFO)}
		found = append(found, qi)
	}
	switch {
	case len(found) == 0 && q.b.cfg.LookupExchange != "":
		return nil, fmt.Errorf("%w: no DLQ of queue %s (SQS queue %s) on exchange %s", broker.ErrUnknownQueue, q.queue,
			QueueName(q.b.cfg.LookupExchange, dlqName, q.b.cfg.FIFO), q.b.cfg.LookupExchange)
	case len(found) == 0:
		// No exchange to name one SQS queue: say the suffix searched for
		// (QueueName("", ...) is a name ferry never creates).
		suffix := "__" + clean(dlqName)
		if q.b.cfg.FIFO {
			suffix += ".fifo"
		}
		return nil, fmt.Errorf("%w: no DLQ of queue %s on any exchange (searched every exchange prefix: no SQS queue <exchange>%s tagged %s=%s)",
			broker.ErrUnknownQueue, q.queue, suffix, tagQueue, dlqName)
	case len(found) > 1:
		var names []string
		for _, f := range found {
			names = append(names, f.exchange)
		}
		return nil, fmt.Errorf("sqs: DLQ of %s: queue %s exists on several exchanges (%s): name one (--exchange)", q.queue, q.queue, strings.Join(names, ", "))
	}
	qi := found[0]
	if needWork {
		u, err := q.b.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(qi.name)})
		if err != nil {
			if notExist(err) {
				return nil, fmt.Errorf("%w: queue %s (SQS queue %s) does not exist, its DLQ %s does", broker.ErrUnknownQueue, q.queue, qi.name, qi.dlqName)
			}
			return nil, fmt.Errorf("sqs: DLQ of %s: %w", q.queue, err)
		}
		qi.url = aws.ToString(u.QueueUrl)
	}
	return qi, nil
}

func path(u string) string {
	if p, err := url.Parse(u); err == nil {
		u = p.Path
	}
	return u[strings.LastIndex(u, "/")+1:]
}

// dead is one message taken from the DLQ for a while.
type dead struct {
	dm      broker.DeadMessage
	receipt string
	sent    int64 // SentTimestamp, ms
}

// takeAll receives every message of the DLQ, hidden for 60 s, oldest
// first (by HeaderDeadAt, then SentTimestamp).
func (q *dlq) takeAll(ctx context.Context, url string) ([]dead, error) {
	var out []dead
	seen := map[string]bool{}
	for {
		r, err := q.b.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: MaxBatchEntries, WaitTimeSeconds: 0, VisibilityTimeout: 60,
			MessageAttributeNames: attrNames, MessageSystemAttributeNames: sysAttrNames})
		if err != nil {
			q.giveBack(url, out)
			return nil, fmt.Errorf("sqs: read DLQ of %s: %w", q.queue, err)
		}
		if len(r.Messages) == 0 {
			break
		}
		for _, sm := range r.Messages {
			if seen[aws.ToString(sm.MessageId)] {
				continue
			}
			seen[aws.ToString(sm.MessageId)] = true
			m, err := decode(sm, false)
			if err != nil {
				m = &broker.Message{ID: aws.ToString(sm.MessageId), Body: []byte(aws.ToString(sm.Body)), Attempt: 1}
			}
			sent, _ := strconv.ParseInt(sm.Attributes[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64)
			last := m.Headers[broker.HeaderLastError]
			if last == "" {
				last = "moved to the DLQ by SQS's RedrivePolicy (maxReceiveCount receives)"
			}
			out = append(out, dead{receipt: aws.ToString(sm.ReceiptHandle), sent: sent, dm: broker.DeadMessage{
				Message: m, LastError: last,
				FirstFailedAt: broker.ParseTime(m.Headers[broker.HeaderFirstFailedAt]),
				DeadAt:        broker.ParseTime(m.Headers[broker.HeaderDeadAt]),
			}})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if !a.dm.DeadAt.IsZero() && !b.dm.DeadAt.IsZero() && !a.dm.DeadAt.Equal(b.dm.DeadAt) {
			return a.dm.DeadAt.Before(b.dm.DeadAt)
		}
		return a.sent < b.sent
	})
	return out, nil
}

// giveBack makes the messages visible again.
func (q *dlq) giveBack(url string, ds []dead) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*q.b.cfg.SettleTimeout)
	defer cancel()
	for i := 0; i < len(ds); i += MaxBatchEntries {
		var entries []types.ChangeMessageVisibilityBatchRequestEntry
		for j, d := range ds[i:min(i+MaxBatchEntries, len(ds))] {
			entries = append(entries, types.ChangeMessageVisibilityBatchRequestEntry{
				Id: aws.String("g" + strconv.Itoa(j)), ReceiptHandle: aws.String(d.receipt), VisibilityTimeout: 0})
		}
		if _, err := q.b.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{
			QueueUrl: aws.String(url), Entries: entries}); err != nil {
			q.b.log.Warn("sqs: DLQ: make messages visible again", "queue", q.queue, "sqs_queue", path(url), "err", err)
		}
	}
}

// List receives the whole DLQ, sorts it oldest first and makes it visible
// again.
func (q *dlq) List(ctx context.Context, limit int) ([]broker.DeadMessage, error) {
	ctx, cancel := q.b.opCtx(ctx, q.b.cfg.PublishTimeout)
	defer cancel()
	qi, err := q.resolve(ctx, false)
	if err != nil {
		return nil, err
	}
	_, dlqURL := qi.urls()
	all, err := q.takeAll(ctx, dlqURL)
	if err != nil {
		return nil, err
	}
	q.giveBack(dlqURL, all)
	var out []broker.DeadMessage
	for _, d := range all {
		if limit > 0 && len(out) == limit {
			break
		}
		out = append(out, d.dm)
	}
	return out, nil
}

// Replay sends the chosen messages to the work queue (HeaderRetryCount,
// HeaderLastError and HeaderDeadAt removed), then deletes them from the
// DLQ.
func (q *dlq) Replay(ctx context.Context, ids []string) ([]string, error) {
	return q.move(ctx, ids, true)
}

// Purge deletes the chosen messages from the DLQ.
func (q *dlq) Purge(ctx context.Context, ids []string) ([]string, error) {
	return q.move(ctx, ids, false)
}

func (q *dlq) move(ctx context.Context, ids []string, replay bool) ([]string, error) {
	ctx, cancel := q.b.opCtx(ctx, q.b.cfg.PublishTimeout)
	defer cancel()
	qi, err := q.resolve(ctx, replay)
	if err != nil {
		return nil, err
	}
	_, dlqURL := qi.urls()
	all, err := q.takeAll(ctx, dlqURL)
	if err != nil {
		return nil, err
	}
	var keep []dead
	done := []string{}
	var firstErr error
	for i, d := range all {
		if firstErr != nil || (ids != nil && !slices.Contains(ids, d.dm.Message.ID)) {
			keep = append(keep, all[i])
			continue
		}
		if replay {
			h := map[string]string{}
			for k, v := range d.dm.Message.Headers {
				h[k] = v
			}
			delete(h, broker.HeaderRetryCount)
			delete(h, broker.HeaderLastError)
			delete(h, broker.HeaderDeadAt)
			m := d.dm.Message.Clone()
			if err := q.b.sendOne(ctx, qi, false, m, h, "replay-"+strconv.FormatInt(d.sent, 10)); err != nil {
				firstErr = fmt.Errorf("sqs: replay %s to %s: %w", m.ID, qi.name, err)
				keep = append(keep, all[i])
				continue
			}
		}
		if _, err := q.b.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(dlqURL), ReceiptHandle: aws.String(d.receipt)}); err != nil {
			firstErr = fmt.Errorf("sqs: delete %s from the DLQ %s: %w", d.dm.Message.ID, qi.dlqName, err)
			if !replay {
				keep = append(keep, all[i])
				continue
			}
		}
		done = append(done, d.dm.Message.ID)
	}
	q.giveBack(dlqURL, keep)
	if ids != nil {
		// Keep the order of the DLQ, one entry per ID.
		done = slices.Compact(done)
	}
	return done, firstErr
}

// Where implements broker.DeadLetterQueue: the SQS queue that holds the
// DLQ (QueueName of the exchange and <queue>.dlq), as the AWS console and
// ListQueues show it. For a queue this broker did not declare it looks
// the queue up first and returns that lookup's errors.
func (q *dlq) Where(ctx context.Context) (string, error) {
	ctx, cancel := q.b.opCtx(ctx, q.b.cfg.PublishTimeout)
	defer cancel()
	qi, err := q.resolve(ctx, false)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("SQS queue %q", qi.dlqName), nil
}
