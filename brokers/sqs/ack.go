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

// entryError is the refusal of one entry of a batch call (an entry of
// the answer's Failed list, or one missing from the answer).
type entryError struct {
	op     string // the batch call, e.g. "DeleteMessageBatch"
	code   string // the entry's Code; "" when it was missing from the answer
	msg    string
	sender bool // SenderFault
}

func (e *entryError) Error() string {
	if e.code == "" {
		return e.op + " left the entry out of its answer"
	}
	return fmt.Sprintf("%s refused the entry: %s: %s (sender fault %v)", e.op, e.code, e.msg, e.sender)
}

// ErrorCode returns the entry's Code, so settleReason classifies it as an
// API error.
func (e *entryError) ErrorCode() string { return e.code }

// settleReason classifies the error of a settlement call into a
// broker.Reason constant: SQS's error codes first (a receipt handle SQS no
// longer takes, a deleted queue, throttling, any other API error), then
// broker.SettleReason.
func settleReason(err error) string {
	var rhi *types.ReceiptHandleIsInvalid
	var coded interface{ ErrorCode() string }
	code := apiCode(err)
	if code == "" && errors.As(err, &coded) {
		code = coded.ErrorCode()
	}
	switch {
	case errors.Is(err, broker.ErrClosed):
		return broker.ReasonClosed
	case errors.As(err, &rhi), code == "ReceiptHandleIsInvalid", code == "InvalidReceiptHandle",
		code == "MessageNotInflight", code == "AWS.SimpleQueueService.MessageNotInflight":
		return broker.ReasonExpired
	case notExist(err):
		return broker.ReasonNotFound
	case throttleCodes[code]:
		return broker.ReasonThrottled
	case code != "":
		if r := broker.SettleReason(err); r == broker.ReasonTimeout || r == broker.ReasonCanceled {
			return r
		}
		return broker.ReasonRefused
	}
	return broker.SettleReason(err)
}

// settleErr wraps the error of a settlement with its classification
// (broker.SettleFault with settleReason), or returns nil.
func settleErr(err error) error {
	if err == nil {
		return nil
	}
	var se *broker.SettleError
	if errors.As(err, &se) || errors.Is(err, broker.ErrClosed) || errors.Is(err, broker.ErrAlreadyAcked) {
		return err
	}
	return broker.SettleFault(settleReason(err), err)
}

// ackLinger is how long an Ack waits for others to share its
// DeleteMessageBatch call.
const ackLinger = 2 * time.Millisecond

// acker batches the Acks of one queue into DeleteMessageBatch calls of up
// to 10 entries. An entry SQS lists as failed is deleted again on its own
// (DeleteMessage); if that fails too, its Ack returns the error (naming
// both refusals): a failed entry is never taken as success. When the
// DeleteMessage succeeds the Ack returns nil, and the batch's refusal is
// reported to the SettleObserver of the Ack's ctx with Recovered set
// (broker.ReportSettleFailure), so it is logged and counted all the same.
type acker struct {
	b       *Broker
	url     string
	mu      sync.Mutex
	pending []ackReq
	timer   *time.Timer
}

type ackReq struct {
	ctx     context.Context // the Ack's, for its SettleObserver
	id      string          // the message ID
	receipt string
	done    chan error
}

// delete deletes the message of receipt, sharing a batch call with the
// Acks of the next 2 ms; it returns when the deletion is known.
func (a *acker) delete(ctx context.Context, id, receipt string) error {
	req := ackReq{ctx: ctx, id: id, receipt: receipt, done: make(chan error, 1)}
	a.mu.Lock()
	a.pending = append(a.pending, req)
	if len(a.pending) >= MaxBatchEntries {
		batch := a.pending
		a.pending = nil
		if a.timer != nil {
			a.timer.Stop()
			a.timer = nil
		}
		go a.flush(batch)
	} else if a.timer == nil {
		a.timer = time.AfterFunc(ackLinger, func() {
			a.mu.Lock()
			batch := a.pending
			a.pending, a.timer = nil, nil
			a.mu.Unlock()
			if len(batch) > 0 {
				a.flush(batch)
			}
		})
	}
	a.mu.Unlock()
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *acker) flush(batch []ackReq) {
	ctx, cancel := context.WithTimeout(a.b.ctx, a.b.cfg.SettleTimeout)
	defer cancel()
	entries := make([]types.DeleteMessageBatchRequestEntry, len(batch))
	for i, r := range batch {
		entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String("a" + strconv.Itoa(i)), ReceiptHandle: aws.String(r.receipt)}
	}
	out, err := a.b.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(a.url), Entries: entries})
	if err != nil {
		for _, r := range batch {
			r.done <- fmt.Errorf("DeleteMessageBatch: %w", err)
		}
		return
	}
	ok := map[string]bool{}
	for _, s := range out.Successful {
		ok[aws.ToString(s.Id)] = true
	}
	refused := map[string]types.BatchResultErrorEntry{}
	for _, f := range out.Failed {
		refused[aws.ToString(f.Id)] = f
	}
	for i, r := range batch {
		id := "a" + strconv.Itoa(i)
		if ok[id] {
			r.done <- nil
			continue
		}
		// Failed or missing from the answer: once more on its own.
		berr := &entryError{op: "DeleteMessageBatch"}
		if f, found := refused[id]; found {
			berr.code, berr.msg, berr.sender = aws.ToString(f.Code), aws.ToString(f.Message), f.SenderFault
		}
		_, err := a.b.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(a.url), ReceiptHandle: aws.String(r.receipt)})
		if err != nil {
			err = fmt.Errorf("%v, and DeleteMessage failed: %w", berr, err)
		} else {
			broker.ReportSettleFailure(r.ctx, broker.SettleFailure{Op: broker.SettleAck, MessageID: r.id,
				Reason: settleReason(berr), Err: fmt.Errorf("sqs: ack %s: %w", r.id, berr), Recovered: true,
				Next: "deleted on its own with DeleteMessage, which SQS took: the message is acked"})
		}
		r.done <- err
	}
}
