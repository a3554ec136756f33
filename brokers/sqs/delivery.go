package sqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ferrymq/ferry/broker"
)

const (
	stateOpen = iota
	stateSettling
	stateSettled
)

type delivery struct {
	s          *subscription
	url        string
	receipt    string
	sqsID      string // SQS's MessageId: the same on every receive of one message
	msg        *broker.Message
	firstRecv  time.Time
	receiveCnt int

	mu    sync.Mutex
	state int
	// slotFree and keyFree are set once the delivery gave back its
	// prefetch slot and (Ordered) its Key's hold; see done.
	slotFree, keyFree bool
}

func (s *subscription) newDelivery(url string, sm types.Message) *delivery {
	m, err := decode(sm, true)
	if err != nil {
		s.b.log.Warn("sqs: undecodable message; handing it out raw", "queue", s.qi.q.Name, "sqs_queue", s.qi.name, "err", err)
		m = &broker.Message{ID: aws.ToString(sm.MessageId), Body: []byte(aws.ToString(sm.Body)), Attempt: 1}
	}
	rc, _ := strconv.Atoi(sm.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
	return &delivery{s: s, url: url, receipt: aws.ToString(sm.ReceiptHandle), sqsID: aws.ToString(sm.MessageId), msg: m, receiveCnt: rc,
		firstRecv: msTime(sm.Attributes[string(types.MessageSystemAttributeNameApproximateFirstReceiveTimestamp)])}
}

func (d *delivery) Message() *broker.Message { return d.msg }

// begin moves the delivery to settling; done finishes it.
func (d *delivery) begin() error {
	if err := d.s.b.check(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != stateOpen {
		return broker.ErrAlreadyAcked
	}
	d.state = stateSettling
	return nil
}

// done ends a settle with its result. A settled delivery gives back its
// prefetch slot and its Key's hold. A failed settle leaves the delivery
// open (the caller may settle it again) but gives back its prefetch slot
// at once: the message returns to SQS's control (it comes back when its
// visibility timeout ends), and a subscription whose settles fail (the
// worker does not retry a failed Ack) must not run out of slots and stop
// receiving. With Ordered, the Key stays held after a failed settle, so a
// later message of the Key is not handed out before this one is settled
// or comes back, unless the error says the message is gone for good (its
// queue deleted, its receipt handle invalid): then the hold is given back
// too.
func (d *delivery) done(err error) error {
	d.mu.Lock()
	if err == nil {
		d.state = stateSettled
	} else {
		d.state = stateOpen
	}
	freeSlot := !d.slotFree
	freeKey := !d.keyFree && (err == nil || messageGone(err))
	d.slotFree = true
	d.keyFree = d.keyFree || freeKey
	d.mu.Unlock()
	d.s.release(d, freeSlot, freeKey)
	return err
}

// messageGone reports whether a settle's error says the message can no
// longer be settled by anyone holding this receipt: its queue does not
// exist (deleted under the process), or SQS refuses the receipt handle.
func messageGone(err error) bool {
	var rhi *types.ReceiptHandleIsInvalid
	return notExist(err) || errors.As(err, &rhi) || apiCode(err) == "ReceiptHandleIsInvalid"
}

// Ack deletes the message: DeleteMessageBatch shared with the Acks of the
// next 2 ms on the same subscription, an entry SQS refuses deleted again
// with DeleteMessage. It fails when the receipt
// handle expired (the visibility timeout ran out and the message may have
// gone to another consumer).
func (d *delivery) Ack(ctx context.Context) error {
	if err := d.begin(); err != nil {
		return err
	}
	ctx, cancel := d.s.b.opCtx(ctx, d.s.b.cfg.SettleTimeout)
	defer cancel()
	err := d.s.acks.delete(ctx, d.msg.ID, d.receipt)
	if err != nil {
		err = settleErr(fmt.Errorf("sqs: ack %s: %w", d.msg.ID, err))
	}
	return d.done(err)
}

// Retry hides the message for delay (ChangeMessageVisibility, whole
// seconds, at least 1 s, at most 12 h); SQS then hands it out again, only
// on this queue, with its receive count one higher. The message is not
// rewritten (Capabilities.RetryInPlace): reason is not carried.
func (d *delivery) Retry(ctx context.Context, delay time.Duration, reason string) error {
	if err := d.begin(); err != nil {
		return err
	}
	ctx, cancel := d.s.b.opCtx(ctx, d.s.b.cfg.SettleTimeout)
	defer cancel()
	secs := max(visibilitySeconds(delay), 1)
	_, err := d.s.b.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(d.url), ReceiptHandle: aws.String(d.receipt), VisibilityTimeout: secs})
	if err != nil {
		err = settleErr(fmt.Errorf("sqs: retry %s: ChangeMessageVisibility %ds: %w", d.msg.ID, secs, err))
	} else {
		d.s.b.log.Debug("sqs: retry", "message_id", d.msg.ID, "delay_s", secs, "reason", broker.TruncateReason(reason))
	}
	return d.done(err)
}

// DeadLetter sends a copy to the queue's DLQ with HeaderLastError,
// HeaderDeadAt, HeaderRetryCount (receive count - 1) and
// HeaderFirstFailedAt (first receive), then deletes the message. The copy
// is stored before the delete; a failed delete leaves both, and the
// consumer's deduplication absorbs the redelivery.
func (d *delivery) DeadLetter(ctx context.Context, reason string) error {
	if err := d.begin(); err != nil {
		return err
	}
	ctx, cancel := d.s.b.opCtx(ctx, d.s.b.cfg.PublishTimeout)
	defer cancel()
	h := map[string]string{}
	for k, v := range d.msg.Headers {
		h[k] = v
	}
	h[broker.HeaderLastError] = broker.TruncateReason(reason)
	h[broker.HeaderDeadAt] = broker.FormatTime(time.Now())
	if d.msg.Attempt > 1 {
		h[broker.HeaderRetryCount] = strconv.Itoa(d.msg.Attempt - 1)
		if h[broker.HeaderFirstFailedAt] == "" && !d.firstRecv.IsZero() {
			h[broker.HeaderFirstFailedAt] = broker.FormatTime(d.firstRecv)
		}
	}
	err := d.s.b.sendOne(ctx, d.s.qi, true, d.msg, h, "dead-"+strconv.Itoa(d.receiveCnt))
	if err == nil {
		_, err = d.s.b.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(d.url), ReceiptHandle: aws.String(d.receipt)})
		if err != nil {
			err = settleErr(fmt.Errorf("sqs: dead-letter %s: stored in the DLQ, delete from the queue failed: %w", d.msg.ID, err))
		}
	} else {
		err = settleErr(fmt.Errorf("sqs: dead-letter %s: %w", d.msg.ID, err))
	}
	return d.done(err)
}

// Extend pushes the visibility timeout out by the subscription's
// AckDeadline from now (ChangeMessageVisibility).
func (d *delivery) Extend(ctx context.Context) error {
	if err := d.s.b.check(); err != nil {
		return err
	}
	d.mu.Lock()
	st := d.state
	d.mu.Unlock()
	if st == stateSettled {
		return broker.ErrAlreadyAcked
	}
	ctx, cancel := d.s.b.opCtx(ctx, d.s.b.cfg.SettleTimeout)
	defer cancel()
	_, err := d.s.b.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(d.url), ReceiptHandle: aws.String(d.receipt), VisibilityTimeout: d.s.vis})
	if err != nil {
		return settleErr(fmt.Errorf("sqs: extend %s: ChangeMessageVisibility: %w", d.msg.ID, err))
	}
	return nil
}

// sendOne stores m with headers h in qi's DLQ (dlq) or work queue with
// SendMessage, re-declaring qi once when the queue is gone. dedup
// distinguishes the copy from the original on FIFO queues (their
// deduplication would drop it within 5 minutes).
func (b *Broker) sendOne(ctx context.Context, qi *queueInfo, dlq bool, m *broker.Message, h map[string]string, dedup string) error {
	enc, err := encode(m, h)
	if err != nil {
		return err
	}
	in := func() *sqs.SendMessageInput {
		url, dlqURL := qi.urls()
		if dlq {
			url = dlqURL
		}
		in := &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(enc.body), MessageAttributes: enc.attrs}
		if b.cfg.FIFO {
			g := m.Key
			if g == "" {
				g = m.ID
			}
			in.MessageGroupId = aws.String(fifoID(g))
			in.MessageDeduplicationId = aws.String(fifoID(m.ID + "-" + dedup))
		}
		return in
	}
	_, err = b.client.SendMessage(ctx, in())
	if err != nil && notExist(err) && qi.declared && ctx.Err() == nil {
		if rerr := b.redeclare(ctx, qi); rerr != nil {
			return fmt.Errorf("SendMessage: %w; re-declare: %v", err, rerr)
		}
		_, err = b.client.SendMessage(ctx, in())
	}
	if err != nil {
		return fmt.Errorf("SendMessage: %w", err)
	}
	return nil
}
