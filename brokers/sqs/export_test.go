package sqs

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/ferrymq/ferry/broker"
)

// SendCalls returns the SendMessageBatch calls b made.
func SendCalls(b *Broker) int64 { return b.sendCalls.Load() }

// BufferedReceipts returns the receipt handles of the messages sub has
// received and not handed out yet, oldest first.
func BufferedReceipts(sub broker.Subscription) []string {
	s := sub.(*subscription)
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(s.buf))
	for i, d := range s.buf {
		out[i] = d.receipt
	}
	return out
}

// LapseBuffered makes the messages sub has received and not handed out
// visible again at once (ChangeMessageVisibility 0), as a visibility
// timeout that ran out before the heartbeat would; it returns their
// receipt handles.
func LapseBuffered(ctx context.Context, sub broker.Subscription) ([]string, error) {
	s := sub.(*subscription)
	s.mu.Lock()
	buf := append([]*delivery(nil), s.buf...)
	s.mu.Unlock()
	var out []string
	for _, d := range buf {
		if _, err := s.b.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
			QueueUrl: aws.String(d.url), ReceiptHandle: aws.String(d.receipt), VisibilityTimeout: 0}); err != nil {
			return nil, err
		}
		out = append(out, d.receipt)
	}
	return out, nil
}
