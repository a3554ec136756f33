package sqs

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/ferrymq/ferry/broker"
)

// Tags set on every queue ferry creates; Declare checks them and DLQ
// lookups use them.
const (
	tagExchange = "ferry-exchange"
	tagQueue    = "ferry-queue"
)

// QueueName returns the SQS queue name of the ferry queue queue on
// exchange: the exchange and the queue joined by "__", with '.' (not
// allowed in SQS names) replaced by '-', and ".fifo" appended when fifo. A
// name longer than 80 characters (SQS's limit) is cut and ends with a hash
// of the full names instead. The DLQ of queue is QueueName(exchange,
// broker.DLQName(queue), fifo), e.g. "notifications__notifications-send-dlq".
func QueueName(exchange, queue string, fifo bool) string {
	s := clean(exchange) + "__" + clean(queue)
	max := MaxQueueNameLen
	if fifo {
		max -= len(".fifo")
	}
	if len(s) > max {
		h := sha256.Sum256([]byte(exchange + "\x00" + queue))
		s = s[:max-17] + "-" + hex.EncodeToString(h[:8])
	}
	if fifo {
		s += ".fifo"
	}
	return s
}

func clean(s string) string { return strings.ReplaceAll(s, ".", "-") }

// validQueue reports whether name is a queue name Declare can accept.
func validQueue(name string) bool {
	t := broker.Topology{Exchange: "x", Queues: []broker.Queue{{Name: name, Bindings: []string{"x"}}}}
	return t.Validate() == nil
}

// fifoID returns s if it is a valid MessageGroupId/MessageDeduplicationId
// (at most 128 characters, letters, digits and ASCII punctuation), else a
// hash of it in that alphabet.
func fifoID(s string) string {
	ok := s != "" && len(s) <= 128
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = c > 0x20 && c < 0x7f
	}
	if ok {
		return s
	}
	h := sha256.Sum256([]byte(s))
	return "h-" + hex.EncodeToString(h[:20])
}
