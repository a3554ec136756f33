package sqs

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// ackLinger is how long an Ack waits for others to share its
// DeleteMessageBatch call.
const ackLinger = 2 * time.Millisecond

// acker batches the Acks of one queue into DeleteMessageBatch calls of up
// to 10 entries. An entry SQS lists as failed is deleted again on its own
// (DeleteMessage); if that fails too, its Ack returns the error: a failed
// entry is never taken as success.
type acker struct {
	b       *Broker
	url     string
	mu      sync.Mutex
	pending []ackReq
	timer   *time.Timer
}

type ackReq struct {
	receipt string
	done    chan error
}

// delete deletes the message of receipt, sharing a batch call with the
// Acks of the next 2 ms; it returns when the deletion is known.
func (a *acker) delete(ctx context.Context, receipt string) error {
	req := ackReq{receipt: receipt, done: make(chan error, 1)}
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
	for i, r := range batch {
		if ok["a"+strconv.Itoa(i)] {
			r.done <- nil
			continue
		}
		// Failed or missing from the answer: once more on its own.
		_, err := a.b.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(a.url), ReceiptHandle: aws.String(r.receipt)})
		if err != nil {
			err = fmt.Errorf("DeleteMessageBatch refused the entry and DeleteMessage failed: %w", err)
		}
		r.done <- err
	}
}
