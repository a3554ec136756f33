package sqs

import (
	"context"
	"strings"
	"time"

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
// receipt handles. Each call gets 3 s and is sent up to 3 times (the
// change is idempotent): ElasticMQ once left one unanswered for 10 s in a
// clean-clone make test, which failed the test on its own fault, not on
// the behaviour under test.
func LapseBuffered(ctx context.Context, sub broker.Subscription) ([]string, error) {
	s := sub.(*subscription)
	s.mu.Lock()
	buf := append([]*delivery(nil), s.buf...)
	s.mu.Unlock()
	var out []string
	for _, d := range buf {
		var err error
		for try := 0; try < 3; try++ {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_, err = s.b.client.ChangeMessageVisibility(cctx, &sqs.ChangeMessageVisibilityInput{
				QueueUrl: aws.String(d.url), ReceiptHandle: aws.String(d.receipt), VisibilityTimeout: 0})
			cancel()
			if err != nil && try > 0 && (strings.Contains(err.Error(), "MessageNotInflight") || strings.Contains(err.Error(), "ReceiptHandleIsInvalid")) {
				// The unanswered try was applied and the poll took the message again.
				err = nil
			}
			if err == nil || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			return nil, err
		}
		out = append(out, d.receipt)
	}
	return out, nil
}
