package broker

import (
	"context"
	"errors"
	"fmt"
	"sort"
)

// RefusedCallError is the error of one call to the broker that carried
// several messages and that the broker refused as a whole because of what
// it carried, without saying which message is at fault: a request the
// broker could not parse or calls invalid (SQS: an HTTP 400 other than
// throttling or authentication for the whole SendMessageBatch; Kafka: a
// produce request whose record batch is refused as MESSAGE_TOO_LARGE,
// CORRUPT_MESSAGE or INVALID_RECORD; RabbitMQ: a channel closed with
// PRECONDITION_FAILED by one of the messages pipelined on it). Sending the
// same call again fails the same way, so it is not an outage; sending the
// messages apart finds the one(s) at fault (see SendSplitting).
//
// Err is the broker's refusal; IsMessageFault reports true for a
// RefusedCallError whatever Err wraps. Adapters build it with RefusedCall
// and return it from a SendFunc; it never leaves Publish (SendSplitting
// turns it into the error of the one message at fault).
type RefusedCallError struct {
	// Err is the broker's refusal, e.g. the SDK's API error.
	Err error
}

// RefusedCall wraps err, the error of a whole call that the broker refused
// because of the messages it carried, in a *RefusedCallError.
func RefusedCall(err error) error { return &RefusedCallError{Err: err} }

// Error implements error.
func (e *RefusedCallError) Error() string { return e.Err.Error() }

// Unwrap returns ErrInvalidMessage and Err, so errors.Is finds both.
func (e *RefusedCallError) Unwrap() []error { return []error{ErrInvalidMessage, e.Err} }

// SendFunc sends the messages at the batch indexes idx (in that order) in
// the calls the adapter would make for them, and returns the indexes that
// the broker did not accept, each with its error; an index missing from
// the result was accepted. A message refused by the broker for itself
// (an entry of the broker's answer) gets its own message-fault error
// (IsMessageFault); the messages of a call refused as a whole because of
// what it carried get a *RefusedCallError (RefusedCall); the messages of a
// call that failed for the broker's own reasons (unreachable, 5xx,
// throttled, not authorised, ctx done) get that error. It is called with
// subsets of the original batch and must be safe to call again for
// messages it refused.
type SendFunc func(ctx context.Context, idx []int) map[int]error

// SendSplitting sends the batch indexes idx with send and finds the
// message(s) at fault in a call refused as a whole: the indexes that come
// back with a *RefusedCallError are sent again as two halves, the first
// half before the second (so a queue or partition keeps their order), and
// so on until a refusal concerns one message alone, which then fails with
// the broker's refusal (a message fault: ErrInvalidMessage is wrapped),
// while every other message of the refused calls is sent. One message at
// fault among n costs about 2·log2(n) further calls; the messages sent in
// a half that is accepted are not sent again. A refusal of one message
// that the broker reports as a RefusedCallError is that message's fault.
// When ctx ends before a refused group is split further, its messages fail
// with ctx's error (not a message fault: they may be innocent).
//
// The result maps every index that was not accepted to its error, as
// SendFunc's; pass it to PublishResult.
func SendSplitting(ctx context.Context, idx []int, send SendFunc) map[int]error {
	out := map[int]error{}
	var walk func(idx []int)
	walk = func(idx []int) {
		if len(idx) == 0 {
			return
		}
		res := send(ctx, idx)
		var refused []int
		for _, i := range idx {
			err, failed := res[i]
			if !failed {
				continue
			}
			var rc *RefusedCallError
			if errors.As(err, &rc) {
				if len(idx) == 1 {
					out[i] = fmt.Errorf("%w: %w", ErrInvalidMessage, rc.Err)
					continue
				}
				refused = append(refused, i)
				continue
			}
			out[i] = err
		}
		if len(refused) == 0 {
			return
		}
		if len(refused) == 1 && len(idx) > 1 {
			// Alone in the refused part of the call: send it alone once,
			// so the refusal is its own and not its neighbours'.
			walk(refused)
			return
		}
		if err := ctx.Err(); err != nil {
			for _, i := range refused {
				out[i] = fmt.Errorf("broker: publish: not sent apart after the broker refused the call that carried it: %w", err)
			}
			return
		}
		half := len(refused) / 2
		walk(refused[:half])
		walk(refused[half:])
	}
	walk(idx)
	return out
}

// PublishResult is what Publish returns for msgs when the messages at the
// indexes of failed were not accepted: nil when failed is empty; the error
// itself when every message failed with one and the same error value that
// is not a message fault (one call carried them all, or one cause such as
// ErrClosed or ctx failed every call), so nothing of the batch is stored;
// otherwise a *PublishError listing the failed messages in index order,
// each with its own error, the others being confirmed.
func PublishResult(msgs []*Message, failed map[int]error) error {
	if len(failed) == 0 {
		return nil
	}
	if len(failed) == len(msgs) {
		var first error
		same := true
		for _, err := range failed {
			if first == nil {
				first = err
			} else if err != first {
				same = false
				break
			}
		}
		if same && !IsMessageFault(first) {
			return first
		}
	}
	pe := &PublishError{Failed: make([]FailedMessage, 0, len(failed))}
	for i, err := range failed {
		id := ""
		if i >= 0 && i < len(msgs) && msgs[i] != nil {
			id = msgs[i].ID
		}
		pe.Failed = append(pe.Failed, FailedMessage{Index: i, ID: id, Err: err})
	}
	sort.Slice(pe.Failed, func(a, b int) bool { return pe.Failed[a].Index < pe.Failed[b].Index })
	return pe
}
